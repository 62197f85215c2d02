//! Named intermediates against transformers: each layer's output (`l_out`) of the tiny
//! fixtures equals transformers' hidden states (tests/data/hidden, made by its
//! make_hidden.py from the fixtures' own model.gguf, whose transformers logits equal the
//! fixtures' recorded ones exactly), and a deliberately broken model (one norm skipped) is
//! caught at the layer where it is broken, not before.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use frink_models::taps::{first_departure, Taps, TAP_NAMES};
use frink_models::{KvType, Logits, Model, SeqState};
use frink_testdata::{fixture_input_ids, read_f32};

/// Fixtures with recorded hidden states, and their layer counts.
const WITH_HIDDEN: &[(&str, usize)] = &[
    ("llama", 2),
    ("qwen2", 2),
    ("qwen3", 3),
    ("gemma2", 4),
    ("gemma3", 6),
];

/// Measured (f32 KV cache): every layer of the five fixtures at 3.6e-7..1.04e-6; a skipped
/// norm moves its layer by 0.064 (gemma3, blk.3.ffn_norm) and every later one as much.
const TOLERANCE: f32 = 1e-4;

fn hidden(name: &str) -> Vec<Vec<f32>> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/hidden/{name}.bin"));
    let all = read_f32(&file);
    let n = fixture_input_ids(&fixture(name).unwrap()).len();
    let width = all.len() / WITH_HIDDEN.iter().find(|f| f.0 == name).unwrap().1 / n;
    all.chunks_exact(n * width).map(<[f32]>::to_vec).collect()
}

fn fixture(name: &str) -> Option<PathBuf> {
    frink_testdata::require(&format!("fixtures/tiny/{name}"), "intermediates")
}

/// The fixture's input evaluated in one batch with `taps`; returns the logits.
fn run(model: &mut Model, dir: &Path, taps: Option<Arc<Taps>>) -> Vec<f32> {
    let ids = fixture_input_ids(dir);
    model.set_taps(taps);
    let mut state = SeqState::new(&model.config, 64, KvType::F32);
    model.forward(&mut state, &ids, Logits::All).unwrap()
}

fn l_out_taps() -> Arc<Taps> {
    Arc::new(Taps::new(Some(vec!["l_out".into()]), None, None).unwrap())
}

#[test]
fn every_layer_equals_transformers_hidden_states() {
    for &(name, n_layers) in WITH_HIDDEN {
        let Some(dir) = fixture(name) else { return };
        let mut model = Model::load(dir.join("model.gguf")).unwrap();
        assert_eq!(model.config.plan.layers.len(), n_layers, "{name}");
        let taps = l_out_taps();
        run(&mut model, &dir, Some(taps.clone()));
        let (errors, first) = first_departure(&taps.take(), &hidden(name), TOLERANCE);
        println!("{name}: {errors:?}");
        assert_eq!(errors.len(), n_layers, "{name}: every layer compared");
        assert_eq!(first, None, "{name}: {errors:?}");
    }
}

/// The acceptance check: gemma3's layer 3 with its FFN norm skipped (the weights' norm
/// removed after load, as a build that forgot it would compute) is found as the first
/// layer that departs; layers 0-2 still agree.
#[test]
fn a_skipped_norm_is_found_at_its_layer() {
    let Some(dir) = fixture("gemma3") else { return };
    let mut model = Model::load(dir.join("model.gguf")).unwrap();
    let good = run(&mut model, &dir, None);
    assert!(model.weights.layers[3].ffn_norm.take().is_some());
    let taps = l_out_taps();
    let broken = run(&mut model, &dir, Some(taps.clone()));
    assert_ne!(good, broken, "skipping the norm changes the logits");
    let (errors, first) = first_departure(&taps.take(), &hidden("gemma3"), TOLERANCE);
    println!("gemma3 without blk.3.ffn_norm: {errors:?}");
    assert_eq!(first, Some(3), "{errors:?}");
    assert!(errors[..3].iter().all(|(_, e)| *e <= TOLERANCE));
}

/// Recording changes nothing: the logits keep their bits with every intermediate tapped,
/// and every name is recorded for every layer (and `inp_embd`, `result_norm` once).
#[test]
fn taps_record_every_name_and_change_no_bit() {
    let Some(dir) = fixture("qwen3") else { return };
    let mut model = Model::load(dir.join("model.gguf")).unwrap();
    let plain = run(&mut model, &dir, None);
    let taps = Arc::new(Taps::all());
    let tapped = run(&mut model, &dir, Some(taps.clone()));
    assert_eq!(
        plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        tapped.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let records = taps.take();
    for name in TAP_NAMES {
        let n = records.iter().filter(|r| r.name == name).count();
        let want = if matches!(name, "inp_embd" | "result_norm") {
            1
        } else {
            3
        };
        assert_eq!(n, want, "{name}");
    }
    // l_out of the last layer, normed, is result_norm's input: the same rows.
    let ids = fixture_input_ids(&dir);
    let last = records
        .iter()
        .find(|r| r.name == "l_out" && r.layer == Some(2))
        .unwrap();
    assert_eq!(last.positions, (0..ids.len()).collect::<Vec<_>>());
    assert_eq!(last.width, model.config.n_embd);
}
