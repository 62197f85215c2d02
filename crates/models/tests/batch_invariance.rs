//! Batch invariance: a sequence's logits have exactly the same bits computed alone, inside
//! a batch of 7 other sequences (in prefill and in a decode step), with prefill chunks of
//! 1, 7 and 512 tokens, and with 1 or 2 compute threads. Checked on every weight format
//! with an integer dot kernel (the quant fixtures), on the dequantizing path (F16, IQ4_XS),
//! on two mixture-of-experts files, on the tiny qwen2 and gemma3 fixtures (biases, Q/K
//! norm, sliding window), on llama4 (chunked attention, NoPE, weights on the expert
//! inputs), on gemma4 (per-layer embeddings, KV sharing, heads of two sizes) and on the recurrent and hybrid fixtures (mamba, mamba2, lfm2, falcon_h1,
//! granitemoehybrid, qwen3_next).

use frink_models::tune::DecodePath;
use frink_models::{pool, KvType, Logits, Model, SeqState, Sequence};
use frink_quant::dot::pack::PrefetchHint;

fn models() -> Vec<(String, Model)> {
    let mut out = Vec::new();
    if let Some(q) = frink_testdata::require("fixtures/quant", "batch invariance") {
        for ty in [
            "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K",
            "F16", "IQ4_XS",
        ] {
            let m = Model::load(q.join(ty).join("llama.gguf")).unwrap();
            out.push((ty.to_string(), m));
        }
        // Mixture of experts: each expert over the rows that chose it.
        for ty in ["Q4_K_M", "Q8_0"] {
            let m = Model::load(q.join(ty).join("qwen2_moe.gguf")).unwrap();
            out.push((format!("{ty} qwen2_moe"), m));
        }
    }
    if let Some(t) = frink_testdata::require("fixtures/tiny", "batch invariance") {
        // The recurrent families: each sequence's own conv window and scan state.
        for arch in ["qwen2", "gemma3", "llama4", "gemma4"]
            .into_iter()
            .chain(frink_testdata::RECURRENT_FIXTURES)
        {
            let m = Model::load(t.join(arch).join("model.gguf")).unwrap();
            out.push((arch.to_string(), m));
        }
    }
    out
}

/// Deterministic token ids: sequence `s`, `len` tokens.
fn ids(model: &Model, s: u32, len: usize) -> Vec<u32> {
    frink_testdata::spread_ids(model.config.n_vocab, s, len)
}

const CTX: usize = 64;

fn alone(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = SeqState::new(&model.config, CTX, KvType::F16);
    model.forward(&mut cache, tokens, Logits::All).unwrap()
}

#[test]
fn logits_do_not_depend_on_batch_chunks_or_threads() {
    let models = models();
    for (name, model) in &models {
        let nv = model.config.n_vocab;
        let seq = ids(model, 0, 40);
        let reference = alone(model, &seq);

        // Prefill chunks of 1 (token-by-token decode), 7 and 512.
        for chunk in [1, 7, 512] {
            let mut cache = SeqState::new(&model.config, CTX, KvType::F16);
            let mut got = Vec::new();
            for part in seq.chunks(chunk) {
                got.extend(model.forward(&mut cache, part, Logits::All).unwrap());
            }
            assert!(got == reference, "{name}: chunks of {chunk} differ");
        }

        // Inside a prefill batch of 7 other sequences of other lengths, some of them with
        // earlier tokens already cached.
        let mut caches: Vec<SeqState> = (0..8)
            .map(|_| SeqState::new(&model.config, CTX, KvType::F16))
            .collect();
        let others: Vec<Vec<u32>> = (1..8).map(|s| ids(model, s, 3 + 5 * s as usize)).collect();
        for (s, cache) in caches.iter_mut().enumerate().skip(1).step_by(2) {
            model
                .forward(cache, &ids(model, 100 + s as u32, s), Logits::None)
                .unwrap();
        }
        let mut batch: Vec<Sequence<'_>> = Vec::new();
        let mut rest = caches.iter_mut();
        let mut mine = rest.next();
        for (i, (cache, toks)) in rest.zip(&others).enumerate() {
            if i == 3 {
                batch.push(Sequence {
                    state: mine.take().unwrap(),
                    tokens: &seq,
                    logits: Logits::All,
                    lora: None,
                    embd: &[],
                    rope_shift: 0,
                    token_types: &[],
                });
            }
            batch.push(Sequence {
                state: cache,
                tokens: toks,
                logits: if i % 2 == 0 {
                    Logits::Last
                } else {
                    Logits::All
                },
                lora: None,
                embd: &[],
                rope_shift: 0,
                token_types: &[],
            });
        }
        let out = model.forward_batch(&mut batch).unwrap();
        assert_eq!(out.len(), 8);
        assert!(out[3] == reference, "{name}: inside a prefill batch of 8");

        // A decode step of 8 sequences: the last token of ours among 7 others.
        let mut caches: Vec<SeqState> = (0..8)
            .map(|_| SeqState::new(&model.config, CTX, KvType::F16))
            .collect();
        for (s, cache) in caches.iter_mut().enumerate() {
            let prompt = if s == 5 {
                seq[..39].to_vec()
            } else {
                ids(model, 200 + s as u32, 2 + 3 * s)
            };
            model.forward(cache, &prompt, Logits::None).unwrap();
        }
        let next: Vec<[u32; 1]> = (0..8)
            .map(|s| if s == 5 { [seq[39]] } else { [s as u32 + 1] })
            .collect();
        let mut batch: Vec<Sequence<'_>> = caches
            .iter_mut()
            .zip(&next)
            .map(|(cache, t)| Sequence {
                state: cache,
                tokens: t,
                logits: Logits::Last,
                lora: None,
                embd: &[],
                rope_shift: 0,
                token_types: &[],
            })
            .collect();
        let out = model.forward_batch(&mut batch).unwrap();
        assert!(
            out[5] == reference[39 * nv..],
            "{name}: inside a decode batch of 8"
        );
    }
    assert!(models.is_empty() || models.len() == 24);
}

/// 1 vs 2 compute threads. The pool is process-wide, so this is its own test binary
/// section: other tests may run their steps on either pool, which changes nothing either.
#[test]
fn thread_count_does_not_change_logits() {
    for (name, model) in &models() {
        let seq = ids(model, 0, 40);
        pool::set_threads(2);
        let two = alone(model, &seq);
        pool::set_threads(1);
        let one = alone(model, &seq);
        pool::set_threads(2);
        assert!(one == two, "{name}: 1 vs 2 threads");
    }
}

/// Weights repacked in eight-row groups (`Model::set_repack`, what `Model::load` does on a
/// machine whose best kernels are AVX2 or AVX-512) give every logit the bits of the
/// stored layout: a 40-token prefill, then a decode step of three sequences. Forced on
/// whatever the machine (elsewhere the packed products run the scalar twin). Every
/// format with a packed layout is covered (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K: the
/// Q4_K_M and Q5_K_M files mix in Q6_K; Q2_K / Q3_K_M hold Q4_K / Q6_K too) and the MoE
/// files' experts.
#[test]
fn repacked_weights_give_the_same_logits() {
    let mut packed = Vec::new();
    for (name, mut model) in models() {
        let run = |model: &Model| {
            let seqs: Vec<Vec<u32>> = (0..3).map(|s| ids(model, s, 41)).collect();
            let mut caches: Vec<SeqState> = (0..3)
                .map(|_| SeqState::new(&model.config, CTX, KvType::F16))
                .collect();
            let mut out = Vec::new();
            for (c, s) in caches.iter_mut().zip(&seqs) {
                out.extend(model.forward(c, &s[..40], Logits::All).unwrap());
            }
            let mut batch: Vec<Sequence<'_>> = caches
                .iter_mut()
                .zip(&seqs)
                .map(|(c, s)| Sequence {
                    state: c,
                    tokens: &s[40..],
                    logits: Logits::Last,
                    lora: None,
                    embd: &[],
                    rope_shift: 0,
                    token_types: &[],
                })
                .collect();
            out.extend(model.forward_batch(&mut batch).unwrap().concat());
            out
        };
        model.set_repack(false);
        let stored = run(&model);
        model.set_repack(true);
        if model.repacked_bytes() > 0 {
            packed.push(name.clone());
        }
        let repacked = run(&model);
        assert!(
            stored
                .iter()
                .zip(&repacked)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: repacked weights changed a logit"
        );
        // Every decode path the machine may choose (frink_models::tune): the stored rows
        // with the packed copies kept, and each prefetch hint of the packed kernels.
        for path in DecodePath::ALL {
            model.set_decode_path(path);
            let got = run(&model);
            assert!(
                stored
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: decode path {} changed a logit",
                path.name()
            );
        }
        model.set_decode_path(DecodePath::Packed(PrefetchHint::Nta));
    }
    eprintln!("repacked: {packed:?}");
    if frink_testdata::shared_dir().is_some() {
        for ty in [
            "Q4_0",
            "Q4_1",
            "Q5_0",
            "Q5_1",
            "Q8_0",
            "Q4_K_M",
            "Q6_K",
            "Q4_K_M qwen2_moe",
        ] {
            assert!(packed.iter().any(|n| n == ty), "{ty} was not repacked");
        }
    }
}

/// [`Model::calibrate`] times every path it can run, keeps the fastest set, and tries
/// nothing when there is one candidate; the stored candidate alone is all a model without
/// packed copies can take.
#[test]
fn calibration_times_every_path_and_keeps_the_fastest() {
    let Some((name, mut model)) = models().into_iter().find(|(n, _)| n == "Q4_K_M") else {
        return;
    };
    model.set_repack(true);
    let c = model.calibrate(&DecodePath::ALL, 2).unwrap();
    if model.repacked_bytes() > 0 {
        assert_eq!(c.timings.len(), DecodePath::ALL.len(), "{name}: {c:?}");
        assert!(c.rounds >= 3, "{c:?}");
        assert!(c.timings.iter().all(|(_, t)| t.is_finite() && *t > 0.0));
        let fastest = c
            .timings
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap()
            .0;
        assert_eq!(c.best, fastest);
        assert_eq!(model.decode_path(), c.best);
    }
    let one = model.calibrate(&[DecodePath::Stored], 1).unwrap();
    assert!(one.timings.is_empty() && one.best == DecodePath::Stored);
    assert_eq!(model.decode_path(), DecodePath::Stored);
    model.set_repack(false);
    let c = model.calibrate(&DecodePath::ALL, 1).unwrap();
    assert!(
        c.timings.is_empty() && c.best == DecodePath::Stored,
        "{c:?}"
    );
}
