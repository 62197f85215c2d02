//! LoRA adapters against shared/fixtures/tiny/llama_lora (a PEFT adapter converted by
//! llama.cpp; transformers' logits with it at scales 1 and 0.5 are the reference), the
//! identities an adapter must keep (scale 0 and a zero B change nothing), a batch whose
//! sequences use different adapters, and the refusals of malformed adapters.

use std::path::{Path, PathBuf};

use frink_gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use frink_models::{KvType, Logits, Model, SeqState, Sequence};
use frink_testdata::{fixture_input_ids, read_f32, rel_max_diff};

fn dir() -> Option<PathBuf> {
    frink_testdata::require("fixtures/tiny/llama_lora", "lora")
}

fn with_adapter(dir: &Path, scale: f32) -> Model {
    let mut m = Model::load(dir.join("model.gguf")).unwrap();
    m.add_lora(dir.join("adapter.gguf"), scale).unwrap();
    m
}

fn logits(model: &Model, ids: &[u32]) -> Vec<f32> {
    let mut s = SeqState::new(&model.config, 64, KvType::F32);
    model.forward(&mut s, ids, Logits::All).unwrap()
}

/// At scales 1 and 0.5 the logits match transformers + PEFT (measured 1.2e-6 and
/// 1.1e-6; llama.cpp 1.2e-6 and 1.1e-6; the adapter moves them by 0.40 and 0.23, so 1e-4
/// separates right from wrong).
#[test]
fn adapter_logits_match_transformers() {
    let Some(dir) = dir() else { return };
    let ids = fixture_input_ids(&dir);
    for (scale, file) in [
        (1.0, "logits_hf_lora_scale1.bin"),
        (0.5, "logits_hf_lora_scale0.5.bin"),
    ] {
        let got = logits(&with_adapter(&dir, scale), &ids);
        let err = rel_max_diff(&got, &read_f32(&dir.join(file)));
        eprintln!("scale {scale}: max|Δ|/max|ref| vs transformers = {err:.2e}");
        assert!(err < 1e-4, "scale {scale}: {err}");
    }
}

/// Scale 0, and an adapter whose B is all zeros, give the base model's logits exactly;
/// the adapter at scale 1 does not (the feature changes the output).
#[test]
fn scale_zero_and_a_zero_b_change_nothing() {
    let Some(dir) = dir() else { return };
    let ids = fixture_input_ids(&dir);
    let base = logits(&Model::load(dir.join("model.gguf")).unwrap(), &ids);
    assert!(logits(&with_adapter(&dir, 0.0), &ids) == base);
    assert!(rel_max_diff(&logits(&with_adapter(&dir, 1.0), &ids), &base) > 0.1);
    let zero_b = rebuilt(&dir.join("adapter.gguf"), |name, ty, shape, data| {
        let data = if name.ends_with(".lora_b") {
            vec![0; data.len()]
        } else {
            data
        };
        Some((name.to_string(), ty, shape.to_vec(), data))
    });
    let mut m = Model::load(dir.join("model.gguf")).unwrap();
    let a = frink_models::lora::LoraAdapter::from_gguf(zero_b, "zero-b".into(), &m).unwrap();
    m.adapters.push(a);
    m.lora_scales.push(1.0);
    assert!(logits(&m, &ids) == base);
}

/// One batch of three sequences: the adapter at 1, at 0.5, and none: each equals the
/// same sequence evaluated alone with its own adapter setting.
#[test]
fn sequences_with_different_adapters_share_a_batch() {
    let Some(dir) = dir() else { return };
    let ids = fixture_input_ids(&dir);
    let model = with_adapter(&dir, 0.0);
    let sets: [&[(usize, f32)]; 3] = [&[(0, 1.0)], &[(0, 0.5)], &[]];
    let alone: Vec<Vec<f32>> = sets
        .iter()
        .map(|set| {
            let mut s = SeqState::new(&model.config, 64, KvType::F32);
            let mut seq = [Sequence {
                state: &mut s,
                tokens: &ids,
                logits: Logits::All,
                lora: Some(set),
                embd: &[],
                rope_shift: 0,
                token_types: &[],
            }];
            model.forward_batch(&mut seq).unwrap().pop().unwrap()
        })
        .collect();
    let together = in_one_batch(&model, &ids, &sets);
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert!(a == t, "sequence {i}");
    }
    assert!(alone[0] != alone[1] && alone[1] != alone[2]);
}

/// An F16 adapter is kept in f16 and read by exact widening: its logits equal those of
/// the same values stored as F32 bit for bit (a rounding on the way would show here), and
/// alone and beside an adapter-free sequence in one batch; the F16 copy of the fixture's
/// F32 adapter still moves the logits (by 0.40, as the original).
#[test]
fn an_f16_adapter_equals_its_f32_widening() {
    let Some(dir) = dir() else { return };
    let ids = fixture_input_ids(&dir);
    let f16_bytes = |data: &[u8]| -> Vec<u8> {
        data.chunks_exact(4)
            .flat_map(|c| {
                half::f16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_le_bytes()
            })
            .collect()
    };
    let as_f16 = rebuilt(&dir.join("adapter.gguf"), |name, ty, shape, data| {
        assert_eq!(ty, GgmlType::F32);
        Some((
            name.to_string(),
            GgmlType::F16,
            shape.to_vec(),
            f16_bytes(&data),
        ))
    });
    let tmp = tempfile::tempdir().unwrap();
    let p16 = tmp.path().join("f16.gguf");
    std::fs::write(
        &p16,
        GgufWriter::from_file(&as_f16).unwrap().to_bytes().unwrap(),
    )
    .unwrap();
    let widened = rebuilt(&p16, |name, ty, shape, data| {
        assert_eq!(ty, GgmlType::F16);
        let data = data
            .chunks_exact(2)
            .flat_map(|c| {
                half::f16::from_le_bytes([c[0], c[1]])
                    .to_f32()
                    .to_le_bytes()
            })
            .collect();
        Some((name.to_string(), GgmlType::F32, shape.to_vec(), data))
    });
    let load = |file: GgufFile| {
        let mut m = Model::load(dir.join("model.gguf")).unwrap();
        let a = frink_models::lora::LoraAdapter::from_gguf(file, "a".into(), &m).unwrap();
        m.adapters.push(a);
        m.lora_scales.push(1.0);
        m
    };
    let (m16, m32) = (load(GgufFile::open(&p16).unwrap()), load(widened));
    let kept_f16 = m16.adapters[0]
        .weights
        .values()
        .all(|w| matches!(w.a, frink_models::lora::LoraData::F16(_)));
    assert!(kept_f16, "an F16 adapter is kept in f16");
    let (l16, l32) = (logits(&m16, &ids), logits(&m32, &ids));
    assert!(l16 == l32, "f16 storage vs its f32 widening");
    let base = logits(&Model::load(dir.join("model.gguf")).unwrap(), &ids);
    assert!(rel_max_diff(&l16, &base) > 0.1);
    let together = in_one_batch(&m16, &ids, &[&[(0, 1.0)], &[]]);
    assert!(together[0] == l16 && together[1] == base);
}

/// `ids` evaluated once per adapter set, all in one forward batch: each sequence's logits.
fn in_one_batch(model: &Model, ids: &[u32], sets: &[&[(usize, f32)]]) -> Vec<Vec<f32>> {
    let mut states: Vec<SeqState> = sets
        .iter()
        .map(|_| SeqState::new(&model.config, 64, KvType::F32))
        .collect();
    let mut batch: Vec<Sequence<'_>> = states
        .iter_mut()
        .zip(sets)
        .map(|(state, set)| Sequence {
            state,
            tokens: ids,
            logits: Logits::All,
            lora: Some(set),
            embd: &[],
            rope_shift: 0,
            token_types: &[],
        })
        .collect();
    model.forward_batch(&mut batch).unwrap()
}

/// The adapter file with each tensor passed through `edit` (`None` drops it).
fn rebuilt(
    path: &Path,
    edit: impl Fn(&str, GgmlType, &[u64], Vec<u8>) -> Option<(String, GgmlType, Vec<u64>, Vec<u8>)>,
) -> GgufFile {
    let f = GgufFile::open(path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    for t in f.tensors() {
        if let Some((n, ty, shape, data)) = edit(
            &t.info.name,
            t.info.ggml_type,
            &t.info.shape,
            t.data.to_vec(),
        ) {
            w.add_tensor(n, ty, &shape, data).unwrap();
        }
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

/// Each malformed adapter is refused with an error naming what is wrong, never a panic.
#[test]
fn malformed_adapters_are_refused_by_name() {
    let Some(dir) = dir() else { return };
    let model = Model::load(dir.join("model.gguf")).unwrap();
    let path = dir.join("adapter.gguf");
    let load =
        |f: GgufFile| frink_models::lora::LoraAdapter::from_gguf(f, "variant".into(), &model);
    let expect = |f: GgufFile, what: &str| {
        let e = load(f).map(|_| ()).unwrap_err().to_string();
        eprintln!("{what}: {e}");
        assert!(e.contains(what), "{e}");
    };
    // Another architecture.
    let mut f = GgufFile::open(&path).unwrap();
    f.set_metadata("general.architecture", MetaValue::String("qwen2".into()));
    expect(f, "general.architecture");
    // Not an adapter.
    let mut f = GgufFile::open(&path).unwrap();
    f.set_metadata("general.type", MetaValue::String("model".into()));
    expect(f, "general.type");
    // A tensor naming no base matrix.
    expect(
        rebuilt(&path, |n, ty, s, d| {
            Some((n.replace("blk.0.attn_q", "blk.0.attn_z"), ty, s.to_vec(), d))
        }),
        "blk.0.attn_z.weight",
    );
    // A pair missing its half.
    expect(
        rebuilt(&path, |n, ty, s, d| {
            (n != "blk.1.ffn_up.weight.lora_b").then(|| (n.to_string(), ty, s.to_vec(), d))
        }),
        "blk.1.ffn_up.weight",
    );
    // A wrong rank on one side.
    expect(
        rebuilt(&path, |n, ty, s, d| {
            if n == "blk.0.attn_k.weight.lora_a" {
                let mut s = s.to_vec();
                s[1] = 2;
                Some((n.to_string(), ty, s, d[..d.len() / 2].to_vec()))
            } else {
                Some((n.to_string(), ty, s.to_vec(), d))
            }
        }),
        "blk.0.attn_k.weight",
    );
    // An unexpected tensor.
    expect(
        rebuilt(&path, |n, ty, s, d| {
            Some((
                n.replace("blk.0.ffn_gate.weight.lora_a", "blk.0.extra"),
                ty,
                s.to_vec(),
                d,
            ))
        }),
        "blk.0.extra",
    );
    // A truncated file: the reader's error.
    let bytes = std::fs::read(&path).unwrap();
    let cut = GgufFile::from_bytes(bytes[..bytes.len() / 2].to_vec());
    assert!(cut.is_err());
    // Through Model::add_lora: a missing file is an error too.
    let mut m = Model::load(dir.join("model.gguf")).unwrap();
    assert!(m.add_lora(dir.join("no-such.gguf"), 1.0).is_err());
    assert!(m.adapters.is_empty());
}

/// An adapter on the routed experts (and attention) of the qwen2_moe fixture equals the
/// same model with `W + s·B·A` merged into its F32 weights (computed here in f64): each
/// expert's slice gets its own pair, on the rows that chose it (measured 6.5e-7; the
/// adapter moves the logits by 0.98, so 1e-4 separates right from wrong). In one batch
/// beside a sequence without it, each gives its own logits exactly.
#[test]
fn expert_adapters_equal_merged_weights() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/qwen2_moe", "expert lora") else {
        return;
    };
    let base_path = dir.join("model.gguf");
    let base = GgufFile::open(&base_path).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let lora_path = tmp.path().join("experts.gguf");
    let targets = [
        "ffn_gate_exps.weight",
        "ffn_down_exps.weight",
        "attn_q.weight",
    ];
    let (rank, alpha, scale) = (4u64, 8.0f32, 0.75f32);
    frink_testdata::write_lora(&base, &targets, rank, alpha, 0.3, 7, &lora_path);
    let ids = fixture_input_ids(&dir);
    let mut adapted = Model::load(&base_path).unwrap();
    adapted.add_lora(&lora_path, scale).unwrap();
    let got = logits(&adapted, &ids);

    // The merged model: every adapted F32 tensor W (rows of n_in per output, per expert)
    // plus s · B·A.
    let lora = GgufFile::open(&lora_path).unwrap();
    let s = (scale * alpha / rank as f32) as f64;
    let merged = rebuilt(&base_path, |name, ty, shape, data| {
        let (Some(a), Some(b)) = (
            lora.tensor(&format!("{name}.lora_a")),
            lora.tensor(&format!("{name}.lora_b")),
        ) else {
            return Some((name.to_string(), ty, shape.to_vec(), data));
        };
        assert_eq!(ty, GgmlType::F32);
        let f = |d: &[u8]| -> Vec<f64> {
            d.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect()
        };
        let (mut w, a, b) = (f(&data), f(a.data), f(b.data));
        let (n_in, n_out, r) = (shape[0] as usize, shape[1] as usize, rank as usize);
        let n_exp = shape.get(2).copied().unwrap_or(1) as usize;
        for e in 0..n_exp {
            let (a, b) = (&a[e * r * n_in..], &b[e * n_out * r..]);
            for o in 0..n_out {
                for i in 0..n_in {
                    let d: f64 = (0..r).map(|j| b[o * r + j] * a[j * n_in + i]).sum();
                    w[(e * n_out + o) * n_in + i] += s * d;
                }
            }
        }
        let data = w.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
        Some((name.to_string(), ty, shape.to_vec(), data))
    });
    let want = logits(&Model::from_gguf(merged).unwrap(), &ids);
    let base_logits = logits(&Model::load(&base_path).unwrap(), &ids);
    let err = rel_max_diff(&got, &want);
    let effect = rel_max_diff(&want, &base_logits);
    eprintln!(
        "expert adapter vs merged weights: {err:.2e} (the adapter moves the logits by {effect:.2})"
    );
    assert!(err < 1e-4, "{err}");
    assert!(effect > 1e-2, "{effect}");
    let together = in_one_batch(&adapted, &ids, &[&[(0, scale)], &[]]);
    assert!(together[0] == got && together[1] == base_logits);
    // Token by token (a decode step's one row takes every expert in two dispatches, with
    // each expert's adapter pair): the same bits as the batched prefill.
    let mut s = SeqState::new(&adapted.config, 64, KvType::F32);
    let mut stepped = Vec::new();
    for &t in &ids {
        stepped.extend(adapted.forward(&mut s, &[t], Logits::All).unwrap());
    }
    assert!(stepped == got, "decode steps with expert adapters");
}
