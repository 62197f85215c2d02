//! A corpus of damaged and hostile GGUF files: every one must yield a typed error (or, for
//! harmless damage such as a changed character in a name, a file that still validates),
//! never a panic, an out-of-bounds read, an unbounded allocation or a hang.

use std::panic::{catch_unwind, AssertUnwindSafe};

use frink_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MetaArray, MetaValue};

/// A small file that uses every metadata value type, nested arrays and several tensor types.
fn sample() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetaValue::String("llama".into()))
        .add_metadata("u8", MetaValue::U8(7))
        .add_metadata("i8", MetaValue::I8(-7))
        .add_metadata("u16", MetaValue::U16(700))
        .add_metadata("i16", MetaValue::I16(-700))
        .add_metadata("u32", MetaValue::U32(70000))
        .add_metadata("i32", MetaValue::I32(-70000))
        .add_metadata("f32", MetaValue::F32(1.5))
        .add_metadata("bool", MetaValue::Bool(true))
        .add_metadata("u64", MetaValue::U64(1 << 40))
        .add_metadata("i64", MetaValue::I64(-(1 << 40)))
        .add_metadata("f64", MetaValue::F64(-2.25))
        .add_metadata(
            "strings",
            MetaValue::Array(MetaArray::String(vec!["a".into(), "bc".into(), "".into()])),
        )
        .add_metadata(
            "nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::I32(vec![1, 2]),
                MetaArray::String(vec!["x".into()]),
            ])),
        )
        .add_metadata(
            "bools",
            MetaValue::Array(MetaArray::Bool(vec![true, false])),
        );
    w.add_tensor("a", GgmlType::F32, &[4, 2], vec![0; 32])
        .unwrap();
    w.add_tensor("b", GgmlType::Q4_0, &[64, 3], vec![0x11; 18 * 2 * 3])
        .unwrap();
    w.add_tensor("c", GgmlType::Q8_0, &[32], vec![0x22; 34])
        .unwrap();
    w.to_bytes().unwrap()
}

/// Parses `bytes`, turning a panic into a test failure that names the case.
fn parse(bytes: Vec<u8>, case: &str) -> Result<GgufFile, GgufError> {
    match catch_unwind(AssertUnwindSafe(|| {
        let f = GgufFile::from_bytes(bytes)?;
        // Touch every tensor's data: the slices must be in bounds.
        for t in f.tensors() {
            assert_eq!(t.data.len() as u64, t.info.n_bytes);
        }
        Ok(f)
    })) {
        Ok(r) => r,
        Err(_) => panic!("parser panicked on case {case}"),
    }
}

fn put_u32(b: &mut [u8], at: u64, v: u32) {
    b[at as usize..at as usize + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: u64, v: u64) {
    b[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
}

/// Byte offsets of one tensor info's fields: (n_dims, first dim, type, data offset).
fn tensor_fields(f: &GgufFile, name: &str) -> (u64, u64, u64, u64) {
    let t = f.tensor(name).unwrap().info;
    let n_dims_at = t.info_offset + 8 + t.name.len() as u64;
    let dims_at = n_dims_at + 4;
    let type_at = dims_at + 8 * t.shape.len() as u64;
    (n_dims_at, dims_at, type_at, type_at + 4)
}

/// Byte offset of the value of metadata key `key` (just after its type id).
fn value_at(bytes: &[u8], key: &str) -> u64 {
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(key.as_bytes());
    let pos = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    (pos + needle.len() + 4) as u64
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    let good = sample();
    let f = parse(good.clone(), "intact").unwrap();
    let data_end = f
        .tensor_infos()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.n_bytes)
        .max()
        .unwrap();
    for len in 0..data_end as usize {
        let err = parse(good[..len].to_vec(), &format!("truncated to {len}"))
            .expect_err(&format!("truncated to {len} bytes parsed"));
        assert!(
            matches!(
                err,
                GgufError::Truncated { .. } | GgufError::InvalidTensor { .. }
            ),
            "truncated to {len}: {err}"
        );
    }
    eprintln!("truncation corpus: {data_end} cases");
}

#[test]
fn every_header_byte_damaged_never_panics() {
    let good = sample();
    let data_offset = parse(good.clone(), "intact").unwrap().data_offset() as usize;
    let (mut errors, mut parsed) = (0, 0);
    for pos in 0..data_offset {
        for v in [
            0x00u8,
            0xff,
            good[pos] ^ 0x80,
            good[pos] ^ 0x01,
            good[pos].wrapping_add(1),
        ] {
            let mut b = good.clone();
            b[pos] = v;
            match parse(b, &format!("byte {pos} = {v:#x}")) {
                Ok(_) => parsed += 1,
                Err(_) => errors += 1,
            }
        }
    }
    eprintln!(
        "flipped-byte corpus: {} cases ({errors} errors, {parsed} still valid)",
        errors + parsed
    );
    assert!(errors > parsed, "most header damage must be detected");
}

#[test]
fn real_fixture_truncated_and_damaged_never_panics() {
    let Some(path) =
        frink_testdata::require("fixtures/tiny/llama/model.gguf", "real_fixture_damaged")
    else {
        return;
    };
    let good = std::fs::read(path).unwrap();
    let data_offset = parse(good.clone(), "intact").unwrap().data_offset() as usize;
    let mut cases = 0;
    // Every header offset, then every 997th byte of the data section.
    let lens = (0..data_offset).chain((data_offset..good.len()).step_by(997));
    for len in lens {
        assert!(parse(good[..len].to_vec(), &format!("truncated to {len}")).is_err());
        cases += 1;
    }
    for pos in (0..data_offset).step_by(3) {
        let mut b = good.clone();
        b[pos] ^= 0xff;
        let _ = parse(b, &format!("byte {pos} inverted"));
        cases += 1;
    }
    eprintln!("real-file damage corpus: {cases} cases");
}

#[test]
fn bad_magic_and_versions() {
    let mut b = sample();
    b[0] = b'X';
    assert!(matches!(parse(b, "magic"), Err(GgufError::BadMagic { .. })));
    for (v, big) in [(1u32, false), (4, false), (0, false), (0x0300_0000, true)] {
        let mut b = sample();
        put_u32(&mut b, 4, v);
        match parse(b, "version") {
            Err(GgufError::UnsupportedVersion {
                version,
                big_endian,
            }) => {
                assert_eq!((version, big_endian), (v, big))
            }
            other => panic!("version {v}: {other:?}"),
        }
    }
    let mut v2 = GgufWriter::new();
    v2.set_version(2);
    assert_eq!(parse(v2.to_bytes().unwrap(), "v2").unwrap().version(), 2);
}

#[test]
fn huge_counts_and_lengths_fail_before_allocating() {
    let good = sample();
    // Tensor count and metadata count.
    for at in [8u64, 16] {
        for v in [u64::MAX, u64::MAX / 2, 1 << 40] {
            let mut b = good.clone();
            put_u64(&mut b, at, v);
            assert!(matches!(
                parse(b, "count"),
                Err(GgufError::Truncated { .. })
            ));
        }
    }
    // A string length (the first key's) and an array length.
    let mut b = good.clone();
    put_u64(&mut b, 24, u64::MAX);
    assert!(matches!(
        parse(b, "key length"),
        Err(GgufError::Truncated { .. })
    ));
    let strings = value_at(&good, "strings");
    for v in [u64::MAX, 1 << 61, 1 << 33] {
        let mut b = good.clone();
        put_u64(&mut b, strings + 4, v);
        let err = parse(b, "array length").unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
        assert!(err.to_string().contains("\"strings\""), "{err}");
    }
    // A string element's own length.
    let mut b = good.clone();
    put_u64(&mut b, strings + 12, u64::MAX - 3);
    assert!(matches!(
        parse(b, "element length"),
        Err(GgufError::Truncated { .. })
    ));
}

#[test]
fn unknown_value_types_are_named() {
    let good = sample();
    let at = value_at(&good, "u32") - 4;
    let mut b = good.clone();
    put_u32(&mut b, at, 13);
    match parse(b, "value type") {
        Err(GgufError::UnknownValueType {
            key,
            type_id,
            offset,
        }) => {
            assert_eq!((key.as_str(), type_id, offset), ("u32", 13, at))
        }
        other => panic!("{other:?}"),
    }
    let mut b = good.clone();
    put_u32(&mut b, value_at(&good, "strings"), 0xdead);
    assert!(matches!(
        parse(b, "elem type"),
        Err(GgufError::UnknownValueType {
            type_id: 0xdead,
            ..
        })
    ));
}

#[test]
fn bad_bool_utf8_duplicate_key_and_alignment() {
    let good = sample();
    let mut b = good.clone();
    b[value_at(&good, "bool") as usize] = 2;
    assert!(matches!(
        parse(b, "bool"),
        Err(GgufError::InvalidMetadata { .. })
    ));

    let mut b = good.clone();
    b[value_at(&good, "strings") as usize + 20] = 0xff; // inside "a"
    let err = parse(b, "utf8").unwrap_err();
    assert!(err.to_string().contains("UTF-8"), "{err}");

    // Rename key "i8" to "u8": a duplicate.
    let mut b = good.clone();
    let at = value_at(&good, "i8") as usize - 4 - 2;
    b[at] = b'u';
    let err = parse(b, "duplicate").unwrap_err();
    assert!(err.to_string().contains("duplicate key \"u8\""), "{err}");

    for bad in [
        MetaValue::U32(0),
        MetaValue::U32(48),
        MetaValue::U64(32),
        MetaValue::String("32".into()),
    ] {
        let mut w = GgufWriter::new();
        w.add_metadata("general.alignment", bad.clone());
        let err = parse(w.to_bytes().unwrap(), "alignment").unwrap_err();
        assert!(
            err.to_string().contains("general.alignment"),
            "{bad:?}: {err}"
        );
    }
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", MetaValue::U32(64));
    w.add_tensor("t", GgmlType::F32, &[3], vec![0; 12]).unwrap();
    let f = parse(w.to_bytes().unwrap(), "alignment 64").unwrap();
    assert_eq!((f.alignment(), f.data_offset() % 64), (64, 0));
}

#[test]
fn nesting_depth_is_bounded() {
    let mut a = MetaArray::U8(vec![1]);
    for _ in 0..frink_gguf::MAX_ARRAY_DEPTH - 1 {
        a = MetaArray::Array(vec![a]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("deep", MetaValue::Array(a.clone()));
    let f = parse(w.to_bytes().unwrap(), "max depth").unwrap();
    assert_eq!(f.get("deep"), Some(&MetaValue::Array(a.clone())));
    let mut w = GgufWriter::new();
    w.add_metadata("deep", MetaValue::Array(MetaArray::Array(vec![a])));
    let err = parse(w.to_bytes().unwrap(), "too deep").unwrap_err();
    assert!(err.to_string().contains("nest deeper"), "{err}");
}

#[test]
fn hostile_tensor_infos() {
    let good = sample();
    let f = parse(good.clone(), "intact").unwrap();
    let (n_dims_at, dims_at, type_at, offset_at) = tensor_fields(&f, "b");
    let expect_tensor_err = |b: Vec<u8>, case: &str, needle: &str| {
        let err = parse(b, case).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(needle), "{case}: {msg}");
    };
    // Zero and too many dimensions; a zero-sized dimension.
    for (n, needle) in [
        (0u32, "0 dimensions"),
        (5, "5 dimensions"),
        (u32::MAX, "dimensions"),
    ] {
        let mut b = good.clone();
        put_u32(&mut b, n_dims_at, n);
        expect_tensor_err(b, "n_dims", needle);
    }
    let mut b = good.clone();
    put_u64(&mut b, dims_at + 8, 0);
    expect_tensor_err(b, "zero dim", "dimension 1 is zero");
    // Element count overflow and a row that is not a whole number of blocks.
    let mut b = good.clone();
    put_u64(&mut b, dims_at + 8, u64::MAX / 32);
    expect_tensor_err(b, "overflow", "overflows");
    let mut b = good.clone();
    put_u64(&mut b, dims_at, 48);
    expect_tensor_err(
        b,
        "partial block",
        "not a multiple of the Q4_0 block size 32",
    );
    // Unknown and retired type ids.
    for id in [4u32, 31, 1000] {
        let mut b = good.clone();
        put_u32(&mut b, type_at, id);
        match parse(b, "type") {
            Err(GgufError::UnknownTensorType {
                tensor,
                type_id,
                offset,
            }) => {
                assert_eq!((tensor.as_str(), type_id, offset), ("b", id, type_at))
            }
            other => panic!("type {id}: {other:?}"),
        }
    }
    // Misaligned, overlapping and out-of-file data.
    let b_off = f.tensor("b").unwrap().info.offset;
    let mut b = good.clone();
    put_u64(&mut b, offset_at, b_off + 1);
    expect_tensor_err(b, "misaligned", "not a multiple of the alignment 32");
    let mut b = good.clone();
    put_u64(&mut b, offset_at, 0);
    expect_tensor_err(b, "overlap", "overlaps tensor");
    for off in [u64::MAX - 31, 1 << 40, b_off + 4096] {
        let mut b = good.clone();
        put_u64(&mut b, offset_at, off);
        expect_tensor_err(b, "past end", "runs past the end of the file");
    }
    // A larger shape whose data runs past the end.
    let mut b = good.clone();
    put_u64(&mut b, dims_at + 8, 1000);
    expect_tensor_err(b, "past end by shape", "runs past the end of the file");
    // Duplicate names ("c" renamed "b").
    let (c_n_dims_at, ..) = tensor_fields(&f, "c");
    let mut b = good.clone();
    b[c_n_dims_at as usize - 1] = b'b';
    expect_tensor_err(b, "duplicate", "duplicate tensor name");
}

#[test]
fn writer_refuses_inconsistent_tensors() {
    let mut w = GgufWriter::new();
    assert!(w.add_tensor("x", GgmlType::F32, &[], vec![]).is_err());
    assert!(w.add_tensor("x", GgmlType::F32, &[2, 0], vec![]).is_err());
    assert!(w
        .add_tensor("x", GgmlType::Q4_0, &[16], vec![0; 9])
        .is_err());
    assert!(w.add_tensor("x", GgmlType::F16, &[3], vec![0; 5]).is_err());
    assert!(w.add_tensor("x", GgmlType::F16, &[3], vec![0; 6]).is_ok());
}

#[test]
fn writer_round_trips_every_value_type() {
    let f = parse(sample(), "sample").unwrap();
    let get = |k: &str| f.get(k).unwrap().clone();
    assert_eq!(get("u8"), MetaValue::U8(7));
    assert_eq!(get("i8"), MetaValue::I8(-7));
    assert_eq!(get("u16"), MetaValue::U16(700));
    assert_eq!(get("i16"), MetaValue::I16(-700));
    assert_eq!(get("u32"), MetaValue::U32(70000));
    assert_eq!(get("i32"), MetaValue::I32(-70000));
    assert_eq!(get("f32"), MetaValue::F32(1.5));
    assert_eq!(get("bool"), MetaValue::Bool(true));
    assert_eq!(get("u64"), MetaValue::U64(1 << 40));
    assert_eq!(get("i64"), MetaValue::I64(-(1 << 40)));
    assert_eq!(get("f64"), MetaValue::F64(-2.25));
    assert_eq!(
        get("nested"),
        MetaValue::Array(MetaArray::Array(vec![
            MetaArray::I32(vec![1, 2]),
            MetaArray::String(vec!["x".into()])
        ]))
    );
    assert_eq!(get("bools").as_array().unwrap().len(), 2);
    assert_eq!(f.metadata().len(), 15);
    let b = f.tensor("b").unwrap();
    assert_eq!((b.info.n_bytes, b.data[0], b.info.n_rows()), (108, 0x11, 3));
    assert_eq!(f.tensor("c").unwrap().data, &[0x22; 34][..]);
    // mmap and in-memory parses agree on a written file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.gguf");
    std::fs::write(&path, sample()).unwrap();
    let mapped = GgufFile::open(&path).unwrap();
    assert_eq!(mapped.metadata(), f.metadata());
    assert_eq!(mapped.tensor_infos(), f.tensor_infos());
    // An empty file is a truncation error, not a mapping failure.
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(GgufError::Truncated { .. })
    ));
    assert!(matches!(
        GgufFile::open(dir.path().join("missing")),
        Err(GgufError::Io { .. })
    ));
}

/// Removing a key returns its value, and every other key still finds its own value (the
/// index is rebuilt past the removed position); removing it again finds nothing.
#[test]
fn remove_metadata_keeps_every_other_key() {
    let mut f = GgufFile::from_bytes(sample()).unwrap();
    let before: Vec<(String, MetaValue)> = f.metadata().to_vec();
    let got = f.remove_metadata("f32");
    assert_eq!(got, Some(MetaValue::F32(1.5)));
    assert!(f.get("f32").is_none());
    assert!(f.remove_metadata("f32").is_none());
    assert_eq!(f.metadata().len(), before.len() - 1);
    for (k, v) in before.iter().filter(|(k, _)| k != "f32") {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    assert_eq!(f.tensors().count(), 3);
}
