//! Keys and values in a shared block pool (`KvPool`, `SeqState::pooled`) give every logit
//! the bits of a sequence's own contiguous cache: for every tiny architecture fixture and
//! the quantized ones, with f32, f16 and Q8_0 caches, a 37-token prefill (positions cross
//! blocks mid-chunk) then decode steps, two sequences sharing the pool with their blocks
//! interleaved and out of order, one of them reading a block of the other's (a shared
//! prefix). A sequence without blocks for its positions is refused before anything is
//! written. The block table changes what is read: a table naming another sequence's
//! blocks changes the logits.

use frink_models::{KvPool, KvType, Logits, Model, ModelError, SeqState, Sequence, KV_BLOCK};

fn models() -> Vec<(String, Model)> {
    let mut out = Vec::new();
    if let Some(t) = frink_testdata::require("fixtures/tiny", "KV pool") {
        for name in frink_testdata::fixture_names(&t) {
            let path = t.join(&name).join("model.gguf");
            // Fixtures this build refuses by name (their own tests say so) are skipped.
            if let Ok(m) = Model::load(&path) {
                out.push((name, m));
            }
        }
    }
    if let Some(q) = frink_testdata::require("fixtures/quant", "KV pool") {
        for ty in ["Q4_K_M", "Q8_0"] {
            out.push((
                ty.into(),
                Model::load(q.join(ty).join("llama.gguf")).unwrap(),
            ));
        }
    }
    out
}

fn ids(model: &Model, s: u32, len: usize) -> Vec<u32> {
    frink_testdata::spread_ids(model.config.n_vocab, s, len)
}

const CTX: usize = 64;

/// Logits of `tokens` evaluated as a prefill of `split` tokens then one token per step,
/// in a contiguous cache.
fn contiguous(model: &Model, kv: KvType, tokens: &[u32], split: usize) -> Vec<f32> {
    let mut st = SeqState::new(&model.config, CTX, kv);
    let mut out = model
        .forward(&mut st, &tokens[..split], Logits::All)
        .unwrap();
    for t in &tokens[split..] {
        out.extend(
            model
                .forward(&mut st, std::slice::from_ref(t), Logits::All)
                .unwrap(),
        );
    }
    out
}

#[test]
fn pooled_and_contiguous_caches_give_the_same_logits() {
    let models = models();
    let mut checked = 0;
    for (name, model) in &models {
        let c = &model.config;
        if !c.plan.layers.iter().any(|l| l.mixer.has_attention()) {
            continue;
        }
        for kv in frink_testdata::KV_TYPES.map(|t| t.parse::<KvType>().unwrap()) {
            if kv.check_heads(c).is_err() {
                continue;
            }
            let (a, b) = (ids(model, 0, 41), ids(model, 1, 41));
            let (want_a, want_b) = (contiguous(model, kv, &a, 37), contiguous(model, kv, &b, 37));
            let mut pool = KvPool::new(c, 12, kv);
            let mut sa = SeqState::pooled(c, CTX, &pool);
            let mut sb = SeqState::pooled(c, CTX, &pool);
            // Interleaved and out of order: a gets 9, 2, 5; b gets 0, 11, 7.
            *sa.table_mut() = vec![9, 2, 5];
            *sb.table_mut() = vec![0, 11, 7];
            let mut got_a = Vec::new();
            let mut got_b = Vec::new();
            // Prefill both in one batch, then decode both together.
            let mut steps: Vec<(std::ops::Range<usize>, Logits)> = vec![(0..37, Logits::All)];
            steps.extend((37..41).map(|i| (i..i + 1, Logits::All)));
            for (r, logits) in steps {
                let mut seqs = [
                    Sequence {
                        state: &mut sa,
                        tokens: &a[r.clone()],
                        logits,
                        lora: None,
                        embd: &[],
                        rope_shift: 0,
                        token_types: &[],
                    },
                    Sequence {
                        state: &mut sb,
                        tokens: &b[r],
                        logits,
                        lora: None,
                        embd: &[],
                        rope_shift: 0,
                        token_types: &[],
                    },
                ];
                let out = model.forward_batch_in(Some(&mut pool), &mut seqs).unwrap();
                got_a.extend(&out[0]);
                got_b.extend(&out[1]);
            }
            let same = |x: &[f32], y: &[f32]| {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
            };
            assert!(same(&got_a, &want_a), "{name} {kv:?}: pooled a differs");
            assert!(same(&got_b, &want_b), "{name} {kv:?}: pooled b differs");

            // A third sequence sharing a's first two blocks (positions 0..32, written
            // by a) continues from position 32 in blocks of its own: the prefix is read,
            // never written, and gives a's own continuation.
            if !c.plan.is_recurrent() {
                let mut sc = SeqState::pooled(c, CTX, &pool);
                sc.adopt(vec![9, 2, 3], 2 * KV_BLOCK);
                let mut seqs = [Sequence {
                    state: &mut sc,
                    tokens: &a[2 * KV_BLOCK..37],
                    logits: Logits::All,
                    lora: None,
                    embd: &[],
                    rope_shift: 0,
                    token_types: &[],
                }];
                let out = model.forward_batch_in(Some(&mut pool), &mut seqs).unwrap();
                let nv = c.n_vocab;
                assert!(
                    same(&out[0], &want_a[2 * KV_BLOCK * nv..37 * nv]),
                    "{name} {kv:?}: a shared prefix block"
                );
                // Another sequence's block in the table (the second, which a sliding
                // window of 16 still sees from positions 32..37): other keys, other logits.
                let mut sd = SeqState::pooled(c, CTX, &pool);
                sd.adopt(vec![9, 0, 4], 2 * KV_BLOCK);
                let mut seqs = [Sequence {
                    state: &mut sd,
                    tokens: &a[2 * KV_BLOCK..37],
                    logits: Logits::All,
                    lora: None,
                    embd: &[],
                    rope_shift: 0,
                    token_types: &[],
                }];
                let out = model.forward_batch_in(Some(&mut pool), &mut seqs).unwrap();
                assert!(
                    !same(&out[0], &want_a[2 * KV_BLOCK * nv..37 * nv]),
                    "{name}: table read"
                );
            }
            checked += 1;
        }
    }
    eprintln!("{checked} (model, KV type) pairs checked");
    if frink_testdata::shared_dir().is_some() {
        assert!(checked >= 40, "only {checked} pairs checked");
    }
}

#[test]
fn a_pooled_sequence_without_blocks_is_refused_before_writing() {
    let Some(t) = frink_testdata::require("fixtures/tiny", "KV pool") else {
        return;
    };
    let model = Model::load(t.join("llama").join("model.gguf")).unwrap();
    let c = &model.config;
    let mut pool = KvPool::new(c, 4, KvType::F32);
    let before = pool.clone();
    let mut s = SeqState::pooled(c, CTX, &pool);
    *s.table_mut() = vec![1];
    let toks = ids(&model, 0, KV_BLOCK + 1);
    let mut seqs = [Sequence {
        state: &mut s,
        tokens: &toks,
        logits: Logits::Last,
        lora: None,
        embd: &[],
        rope_shift: 0,
        token_types: &[],
    }];
    let err = model
        .forward_batch_in(Some(&mut pool), &mut seqs)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::KvBlocks {
                needed: 17,
                held: 16
            }
        ),
        "{err}"
    );
    // Without its pool.
    let err = model.forward_batch_in(None, &mut seqs).unwrap_err();
    assert!(matches!(err, ModelError::KvBlocks { .. }), "{err}");
    assert!(pool == before, "nothing was written");
    assert_eq!(seqs[0].state.n_past(), 0);
}
