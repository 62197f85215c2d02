//! The quantized and bf16 KV caches (`--cache-type-k` / `--cache-type-v`: q8_0, q4_0,
//! q4_1, q5_0, q5_1, iq4_nl, bf16, and keys and values of different types) on the catalog
//! models (head sizes 64 and 256; the tiny fixtures' 16-wide heads cannot be cut into
//! 32-value blocks and are refused): what they store are ggml blocks of exactly the keys
//! and values an f32 cache holds, they take ggml's bytes, and their logits do not depend
//! on how the positions were batched, while differing from the f16 cache's (the feature
//! acts).

use frink_models::kernels::hadamard_rotate;
use frink_models::{CacheType, KvType, Logits, Model, SeqState, Sequence};

fn catalog() -> Vec<(&'static str, Model)> {
    let store = frink_store::Store::from_env().unwrap();
    ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]
        .into_iter()
        .map(|n| (n, Model::load(store.resolve(n).unwrap()).unwrap()))
        .collect()
}

fn ids(model: &Model, s: u32, len: usize) -> Vec<u32> {
    frink_testdata::spread_ids(model.config.n_vocab, s, len)
}

/// The types tested: each type for keys and values, and two mixed pairs.
fn kv_types() -> Vec<KvType> {
    let mut t: Vec<KvType> = CacheType::ALL
        .into_iter()
        .filter(|t| *t != CacheType::F16 && *t != CacheType::F32)
        .map(KvType::both)
        .collect();
    t.push(KvType {
        k: CacheType::Q4_0,
        v: CacheType::F16,
    });
    t.push(KvType {
        k: CacheType::F16,
        v: CacheType::IQ4_NL,
    });
    t
}

/// Layer 0's keys and values depend only on the tokens, whatever the cache type: a
/// quantized cache's bytes equal `quantize_for_cache` (frink-quant's cache quantizer) of
/// the f32 cache's rows rotated per head as llama.cpp rotates a quantized
/// cache (keys by the largest power-of-two block from 64 dividing the head, values by
/// 64, each only when its own type is quantized), every position; a bf16 cache's are
/// the rows rounded to bf16. Each takes ggml's bytes per element (Q8_0: 34/64 of f16).
#[test]
fn quantized_caches_hold_ggml_blocks_and_their_bytes() {
    for (name, model) in catalog() {
        let c = &model.config;
        let toks = ids(&model, 0, 20);
        let mut f32s = SeqState::new(c, 32, KvType::F32);
        model.forward(&mut f32s, &toks, Logits::Last).unwrap();
        let f16_bytes = SeqState::new(c, 1024, KvType::F16).bytes() as f64;
        for kv in kv_types() {
            let mut qs = SeqState::new(c, 32, kv);
            model.forward(&mut qs, &toks, Logits::Last).unwrap();
            let l0 = (0..c.n_layer)
                .find(|&il| qs.layers[il].kv.is_some())
                .unwrap();
            let rot_k = kv.key_rotation(c.head_dim_k);
            let rot_v = kv.value_rotation(c.head_dim_v);
            assert_eq!(
                rot_k.is_some(),
                kv.k.is_quantized(),
                "{name}: heads of 64 and 256"
            );
            assert_eq!(rot_v.is_some(), kv.v.is_quantized(), "{name}");
            // Each position's row read back (the stores keep rows head-major in blocks
            // of 16) against the f32 rows rotated, quantized and dequantized: a head is
            // whole blocks, so quantizing position-major rows makes the same blocks.
            let (k, v) = qs.kv(l0).read_rows(None, 0, toks.len());
            let (fk, fv) = f32s.kv(l0).read_rows(None, 0, toks.len());
            for (dim, rot, f, t, back) in [
                (c.k_dim(), rot_k, fk, kv.k, k),
                (c.v_dim(), rot_v, fv, kv.v, v),
            ] {
                let n = toks.len() * dim;
                let mut rows = f[..n].to_vec();
                if let Some(b) = rot {
                    hadamard_rotate(&mut rows, b);
                }
                let mut want = vec![0u8; t.bytes(n).unwrap()];
                frink_quant::quantize::quantize_for_cache(t.ggml(), &rows, &mut want).unwrap();
                let mut want_f = vec![0f32; n];
                frink_quant::dequantize(t.ggml(), &want, &mut want_f).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(
                    bits(&back) == bits(&want_f),
                    "{name} {}: {t} rows",
                    kv.name()
                );
            }
            let ratio = SeqState::new(c, 1024, kv).bytes() as f64 / f16_bytes;
            let want = (kv.k.bytes(32 * c.k_dim()).unwrap() + kv.v.bytes(32 * c.v_dim()).unwrap())
                as f64
                / (64 * (c.k_dim() + c.v_dim())) as f64;
            eprintln!("{name} {}: KV bytes / f16 = {ratio:.4}", kv.name());
            assert!(
                (ratio - want).abs() < 1e-3,
                "{name} {}: {ratio} vs {want}",
                kv.name()
            );
        }
    }
}

/// Chunks of 1, 7 and 512 positions, and a decode step beside 3 other sequences, give the
/// same bits with each quantized or bf16 cache (rows are quantized one by one, whatever
/// the batch); the logits differ from an f16 cache's (measured max|Δ| over 40 positions
/// of random tokens with Q8_0: smollm2 1.5, gemma3-270m 19.5, qwen2.5-coder-0.5b 2.9).
#[test]
fn quantized_caches_are_batch_invariant_and_change_the_logits() {
    for (name, model) in catalog() {
        for kv in kv_types() {
            let c = &model.config;
            let seq = ids(&model, 0, 40);
            let run = |kv: KvType, chunk: usize| {
                let mut s = SeqState::new(c, 64, kv);
                let mut got = Vec::new();
                for part in seq.chunks(chunk) {
                    got.extend(model.forward(&mut s, part, Logits::All).unwrap());
                }
                got
            };
            let reference = run(kv, 512);
            for chunk in [1, 7] {
                assert!(run(kv, chunk) == reference, "{name}: chunks of {chunk}");
            }
            let f16 = run(KvType::F16, 512);
            let d = f16
                .iter()
                .zip(&reference)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            eprintln!("{name}: max|Δ| f16 vs {} = {d}", kv.name());
            assert!(d > 1e-3, "{name}: the cache type changed nothing");

            let mut states: Vec<SeqState> = (0..4).map(|_| SeqState::new(c, 64, kv)).collect();
            for (s, st) in states.iter_mut().enumerate() {
                let prompt = if s == 2 {
                    seq[..39].to_vec()
                } else {
                    ids(&model, 10 + s as u32, 3 + 4 * s)
                };
                model.forward(st, &prompt, Logits::None).unwrap();
            }
            let next: Vec<[u32; 1]> = (0..4)
                .map(|s| if s == 2 { [seq[39]] } else { [7] })
                .collect();
            let mut batch: Vec<Sequence<'_>> = states
                .iter_mut()
                .zip(&next)
                .map(|(state, t)| Sequence {
                    state,
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
                out[2] == reference[39 * c.n_vocab..],
                "{name}: inside a decode batch"
            );
        }
    }
}
