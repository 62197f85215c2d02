//! Split models (llama.cpp's `gguf-split` layout: `NAME-0000k-of-0000N.gguf`, the first
//! holding the metadata and `split.count`, each its share of the tensors): a tiny fixture
//! cut into three shards loads and gives the same logits, bit for bit, as the whole file;
//! a missing or mislabelled shard is refused by name.

use frink_gguf::{GgufError, GgufFile};
use frink_models::{KvType, Logits, Model, SeqState};
use frink_testdata::fixture_input_ids;

/// Writes `file` as `n` shards named `tiny-0000k-of-0000n.gguf` in `dir`
/// ([`frink_testdata::split_gguf`]); returns the first's path.
fn split(file: &GgufFile, dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let shards = frink_testdata::split_gguf(file, "tiny", n);
    for (name, bytes) in &shards {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    dir.join(&shards[0].0)
}

#[test]
fn a_split_model_loads_and_computes_as_the_whole_file() {
    let Some(fixture) = frink_testdata::require("fixtures/tiny/llama", "split models") else {
        return;
    };
    let whole = fixture.join("model.gguf");
    let dir = tempfile::tempdir().unwrap();
    let first = split(&GgufFile::open(&whole).unwrap(), dir.path(), 3);
    let ids = fixture_input_ids(&fixture);
    let logits = |path: &std::path::Path| {
        let model = Model::load(path).unwrap();
        let mut cache = SeqState::new(&model.config, 64, KvType::F32);
        model.forward(&mut cache, &ids, Logits::All).unwrap()
    };
    let a = logits(&whole);
    let b = logits(&first);
    assert_eq!(a, b, "the split model computes differently");
    let f = GgufFile::open(&first).unwrap();
    assert_eq!(
        f.tensor_infos().len(),
        GgufFile::open(&whole).unwrap().tensor_infos().len()
    );
    // The safe twin reads the same shards.
    let r = GgufFile::read(&first).unwrap();
    for (x, y) in f.tensors().zip(r.tensors()) {
        assert_eq!(x.data, y.data, "{}", x.info.name);
    }

    // A missing shard, and a shard that says it is another, are refused by name.
    std::fs::remove_file(dir.path().join("tiny-00003-of-00003.gguf")).unwrap();
    let e = GgufFile::open(&first).unwrap_err();
    assert!(
        matches!(e, GgufError::Split { .. }) && e.to_string().contains("shard 3"),
        "{e}"
    );
    std::fs::copy(
        dir.path().join("tiny-00002-of-00003.gguf"),
        dir.path().join("tiny-00003-of-00003.gguf"),
    )
    .unwrap();
    let e = GgufFile::open(&first).unwrap_err();
    assert!(e.to_string().contains("shard 3 of 3"), "{e}");
    // Opening a later shard names the first.
    let e = GgufFile::open(dir.path().join("tiny-00002-of-00003.gguf")).unwrap_err();
    assert!(e.to_string().contains("open the first"), "{e}");
}
