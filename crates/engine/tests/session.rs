//! Session: chunked prefill refuses input that does not fit before any chunk is written,
//! and gives the same logits whatever the chunk size.

use frink_engine::Session;
use frink_models::{KvType, Logits, Model};

fn llama() -> Option<(Model, Vec<u32>)> {
    let dir = frink_testdata::require("fixtures/tiny/llama", "session tests")?;
    let ids = frink_testdata::fixture_input_ids(&dir);
    Some((Model::load(dir.join("model.gguf")).unwrap(), ids))
}

#[test]
fn overflow_is_refused_before_the_first_chunk() {
    let Some((model, ids)) = llama() else {
        return;
    };
    let mut s = Session::new(&model, 30, KvType::F32).with_batch(7);
    s.eval(&ids[..20], Logits::None).unwrap();
    let before = s.cache().clone();
    // 11 more tokens need 31 positions: refused although the first chunk of 7 would fit.
    let err = s.eval(&ids[..11], Logits::All).unwrap_err();
    assert!(err.to_string().contains("31 positions needed"), "{err}");
    assert_eq!(s.n_past(), 20);
    assert_eq!(s.cache(), &before);
}

#[test]
fn chunk_size_does_not_change_logits() {
    let Some((model, ids)) = llama() else {
        return;
    };
    let logits = |batch: usize| {
        let mut s = Session::new(&model, 32, KvType::F16).with_batch(batch);
        s.eval(&ids, Logits::All).unwrap()
    };
    let whole = logits(512);
    for batch in [1, 7] {
        assert!(
            logits(batch) == whole,
            "chunks of {batch} differ from one batch"
        );
    }
}
