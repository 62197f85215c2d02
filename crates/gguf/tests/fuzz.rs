//! Property-based fuzzing of the reader, bounded so it runs in CI: random mutations and
//! truncations of a valid file, and random bytes after a valid header, must never panic.
//! The case counts are printed (`--nocapture`) for the record.

use std::sync::atomic::{AtomicUsize, Ordering};

use frink_gguf::{GgmlType, GgufFile, GgufWriter, MetaArray, MetaValue};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

fn seed_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetaValue::String("llama".into()))
        .add_metadata("n", MetaValue::U32(3))
        .add_metadata(
            "v",
            MetaValue::Array(MetaArray::String(vec!["ab".into(), "c".into()])),
        )
        .add_metadata("f", MetaValue::Array(MetaArray::F32(vec![1.0, 2.0])))
        .add_metadata(
            "nest",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::U8(vec![1]),
                MetaArray::Bool(vec![true]),
            ])),
        );
    w.add_tensor("t0", GgmlType::F16, &[8, 2], vec![1; 32])
        .unwrap();
    w.add_tensor("t1", GgmlType::Q4_K, &[256], vec![2; 144])
        .unwrap();
    w.to_bytes().unwrap()
}

fn check(bytes: Vec<u8>, cases: &AtomicUsize) {
    cases.fetch_add(1, Ordering::Relaxed);
    if let Ok(f) = GgufFile::from_bytes(bytes) {
        for t in f.tensors() {
            assert_eq!(t.data.len() as u64, t.info.n_bytes);
        }
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // 50k cases per property (about a second in release); FRINK_FUZZ_CASES overrides.
        cases: std::env::var("FRINK_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[test]
fn mutated_files_never_panic() {
    let strategy = (
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
        proptest::option::of(any::<prop::sample::Index>()),
    );
    let cases = AtomicUsize::new(0);
    let mut runner = TestRunner::new(config());
    runner
        .run(&strategy, |(edits, cut)| {
            let mut b = seed_file();
            for (i, v) in edits {
                let i = i.index(b.len());
                b[i] = v;
            }
            if let Some(c) = cut {
                let n = c.index(b.len());
                b.truncate(n);
            }
            check(b, &cases);
            Ok(())
        })
        .unwrap();
    eprintln!(
        "fuzz: {} mutated/truncated files parsed without panic",
        cases.load(Ordering::Relaxed)
    );
}

#[test]
fn random_bodies_never_panic() {
    let strategy = (
        proptest::collection::vec(any::<u8>(), 0..512),
        0u64..4,
        0u64..4,
    );
    let cases = AtomicUsize::new(0);
    let mut runner = TestRunner::new(config());
    runner
        .run(&strategy, |(body, n_tensors, n_kv)| {
            let mut b = b"GGUF".to_vec();
            b.extend_from_slice(&3u32.to_le_bytes());
            b.extend_from_slice(&n_tensors.to_le_bytes());
            b.extend_from_slice(&n_kv.to_le_bytes());
            b.extend_from_slice(&body);
            check(b, &cases);
            Ok(())
        })
        .unwrap();
    eprintln!(
        "fuzz: {} random bodies parsed without panic",
        cases.load(Ordering::Relaxed)
    );
}
