//! Dequantization against independent references, bit for bit.
//!
//! - `shared/fixtures/quant/*/dequant/`: the first 4 rows of three tensors per quantized
//!   fixture, dequantized by gguf-py (bit-identical to ggml's `to_float`, per the fixture
//!   README).
//! - `tests/data/` (committed): rows for the types that have no fixture rows (IQ2_S,
//!   Q8_K, TQ1_0, TQ2_0, MXFP4) and random-byte blocks of every type, made by
//!   `tools/make_test_data.py` (see tests/data/README.md).
//! - Every tensor of every fixture GGUF dequantizes without error to finite values.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use frink_gguf::{GgmlType, GgufFile, Tensor, TensorInfo};
use frink_quant::{dequantize, dequantize_tensor, is_supported, QuantError, SUPPORTED};
use serde_json::Value;

/// Reads a little-endian f32 file as bit patterns.
fn read_f32_bits(path: &Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes.len() % 4, 0, "{}", path.display());
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Dequantizes `raw` as `ty` and compares with the f32 file bit for bit, naming the first
/// mismatch. Returns the number of values compared.
fn check_case(
    label: &str,
    ty: GgmlType,
    raw_path: &Path,
    f32_path: &Path,
    rows: usize,
    row_len: usize,
) -> usize {
    let raw = std::fs::read(raw_path).unwrap_or_else(|e| panic!("{}: {e}", raw_path.display()));
    let want = read_f32_bits(f32_path);
    assert_eq!(want.len(), rows * row_len, "{label}: reference length");
    assert_eq!(
        raw.len() as u64,
        ty.row_bytes(row_len as u64).expect("whole blocks") * rows as u64,
        "{label}: raw length"
    );
    let mut got = vec![0f32; want.len()];
    dequantize(ty, &raw, &mut got).unwrap_or_else(|e| panic!("{label}: {e}"));
    if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i]) {
        panic!(
            "{label} ({ty}): first mismatch at index {i} (row {}, column {}): got {:e} ({:#010x}), want {:e} ({:#010x})",
            i / row_len,
            i % row_len,
            got[i],
            got[i].to_bits(),
            f32::from_bits(want[i]),
            want[i],
        );
    }
    want.len()
}

/// The quantized-fixture directories (`shared/fixtures/quant/<TYPE>/`), sorted.
fn fixture_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .expect("read fixtures/quant")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn type_named(v: &Value, label: &str) -> GgmlType {
    let name = v
        .as_str()
        .unwrap_or_else(|| panic!("{label}: type is not a string"));
    GgmlType::from_name(name).unwrap_or_else(|| panic!("{label}: unknown type {name}"))
}

fn types(names: &[&str]) -> BTreeSet<GgmlType> {
    names
        .iter()
        .map(|n| GgmlType::from_name(n).expect(n))
        .collect()
}

/// Types that have golden rows in the shared fixtures.
const FIXTURE_TYPES: &[&str] = &[
    "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ4_NL", "IQ4_XS", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S",
];

/// Runs every `dequant` entry of every fixture's meta.json; returns the types covered.
fn run_fixture_rows(root: &Path) -> BTreeSet<GgmlType> {
    let mut covered = BTreeSet::new();
    let (mut cases, mut values) = (0, 0);
    for dir in fixture_dirs(root) {
        let meta = read_json(&dir.join("meta.json"));
        let entries = meta["dequant"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no dequant list", dir.display()));
        assert!(!entries.is_empty(), "{}: empty dequant list", dir.display());
        for entry in entries {
            let label = format!(
                "{}/{}:{}",
                dir.display(),
                entry["model_file"],
                entry["tensor"]
            );
            let ty = type_named(&entry["type"], &label);
            assert_eq!(
                entry["ggml_type_id"].as_u64(),
                Some(u64::from(ty.id())),
                "{label}: type id"
            );
            let rows = entry["rows"].as_u64().expect("rows") as usize;
            let row_len = entry["row_elements"].as_u64().expect("row_elements") as usize;
            let raw = dir.join(entry["raw_file"].as_str().expect("raw_file"));
            let f32 = dir.join(entry["f32_file"].as_str().expect("f32_file"));
            values += check_case(&label, ty, &raw, &f32, rows, row_len);
            cases += 1;
            covered.insert(ty);
        }
    }
    eprintln!("fixture dequant rows: {cases} tensors x 4 rows, {values} values bit-identical");
    covered
}

#[test]
fn fixture_rows_are_bit_exact() {
    let Some(root) = frink_testdata::require("fixtures/quant", "fixture_rows_are_bit_exact") else {
        return;
    };
    let covered = run_fixture_rows(&root);
    assert_eq!(covered, types(FIXTURE_TYPES), "types with fixture rows");
}

/// The committed reference rows in tests/data.
fn local_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Runs every case of tests/data/manifest.json; returns (types covered, types with a
/// case that is not random bytes).
fn run_local_rows() -> (BTreeSet<GgmlType>, BTreeSet<GgmlType>) {
    let dir = local_data();
    let manifest = read_json(&dir.join("manifest.json"));
    let (mut all, mut structured) = (BTreeSet::new(), BTreeSet::new());
    let (mut cases, mut values) = (0, 0);
    for case in manifest["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let ty = type_named(&case["type"], name);
        let rows = case["rows"].as_u64().expect("rows") as usize;
        let row_len = case["row_elements"].as_u64().expect("row_elements") as usize;
        let raw = dir.join(case["raw_file"].as_str().expect("raw_file"));
        let f32 = dir.join(case["f32_file"].as_str().expect("f32_file"));
        values += check_case(name, ty, &raw, &f32, rows, row_len);
        cases += 1;
        all.insert(ty);
        if !name.ends_with(".random") {
            structured.insert(ty);
        }
    }
    eprintln!("tests/data: {cases} cases x 4 rows, {values} values bit-identical");
    (all, structured)
}

#[test]
fn committed_reference_rows_are_bit_exact() {
    let (all, structured) = run_local_rows();
    // Random-byte blocks for every supported type.
    assert_eq!(
        all,
        SUPPORTED.iter().copied().collect(),
        "types with random-block cases"
    );
    // Real or quantizer-made rows for the types the fixtures lack.
    assert_eq!(
        structured,
        types(&["IQ2_S", "TQ1_0", "TQ2_0", "MXFP4"]),
        "types with structured cases"
    );
}

/// Every supported type except F32 (whose "dequantization" is a copy) is checked against
/// rows that came from a quantizer or a real file, not only random bytes; Q8_K, an
/// activation format no file stores, has only random blocks.
#[test]
fn every_supported_type_has_a_structured_reference() {
    let Some(root) = frink_testdata::require(
        "fixtures/quant",
        "every_supported_type_has_a_structured_reference",
    ) else {
        return;
    };
    let mut covered = run_fixture_rows(&root);
    covered.extend(run_local_rows().1);
    let missing: Vec<_> = SUPPORTED.iter().filter(|t| !covered.contains(t)).collect();
    assert_eq!(format!("{missing:?}"), "[F32, Q8_K]");
}

#[test]
fn every_fixture_tensor_dequantizes_to_finite_values() {
    let Some(root) = frink_testdata::require(
        "fixtures/quant",
        "every_fixture_tensor_dequantizes_to_finite_values",
    ) else {
        return;
    };
    let (mut files, mut tensors, mut values) = (0, 0, 0usize);
    let mut seen = BTreeSet::new();
    for dir in fixture_dirs(&root) {
        let mut ggufs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("read dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
            .collect();
        ggufs.sort();
        assert!(!ggufs.is_empty(), "{}: no .gguf", dir.display());
        for path in ggufs {
            let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            files += 1;
            for t in file.tensors() {
                let label = format!("{}:{} ({})", path.display(), t.info.name, t.info.ggml_type);
                let v = dequantize_tensor(&t).unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_eq!(v.len() as u64, t.info.n_elements(), "{label}");
                if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                    panic!("{label}: value {i} is {}", v[i]);
                }
                seen.insert(t.info.ggml_type);
                tensors += 1;
                values += v.len();
            }
        }
    }
    eprintln!("{files} files, {tensors} tensors, {values} values dequantized, all finite");
    let mut want = types(FIXTURE_TYPES);
    want.extend(types(&["F32", "IQ2_S"]));
    assert_eq!(seen, want, "tensor types found in the fixture files");
}

/// The raw rows in the fixtures are the first rows of the named tensor in the GGUF, so
/// the golden rows and the whole-tensor path test the same bytes.
#[test]
fn fixture_raw_rows_match_the_gguf() {
    let Some(root) = frink_testdata::require("fixtures/quant", "fixture_raw_rows_match_the_gguf")
    else {
        return;
    };
    for dir in fixture_dirs(&root) {
        let meta = read_json(&dir.join("meta.json"));
        for entry in meta["dequant"].as_array().expect("dequant") {
            let file = GgufFile::open(dir.join(entry["model_file"].as_str().expect("model_file")))
                .expect("open");
            let name = entry["tensor"].as_str().expect("tensor");
            let t = file
                .tensor(name)
                .unwrap_or_else(|| panic!("{}: no tensor {name}", dir.display()));
            let raw = std::fs::read(dir.join(entry["raw_file"].as_str().expect("raw_file")))
                .expect("raw");
            assert_eq!(&t.data[..raw.len()], &raw[..], "{}: {name}", dir.display());
        }
    }
}

#[test]
fn length_mismatches_are_errors() {
    let ty = GgmlType::Q4_K;
    let mut out = vec![0f32; 256];
    // One byte short of a block.
    let err = dequantize(ty, &[0u8; 143], &mut out).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::LengthMismatch {
                data_len: 143,
                out_len: 256,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "Q4_K: 143 bytes of data and room for 256 values do not match (a Q4_K block is 144 bytes for 256 values)"
    );
    // Whole blocks, but the output is too short or too long.
    assert!(dequantize(ty, &[0u8; 288], &mut out).is_err());
    let mut long = vec![0f32; 257];
    assert!(dequantize(ty, &[0u8; 144], &mut long).is_err());
    // The output is left untouched on error.
    let mut out = vec![7f32; 32];
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 33], &mut out).is_err());
    assert!(out.iter().all(|&v| v == 7.0));
    // Empty input and output is zero blocks: fine.
    assert_eq!(dequantize(ty, &[], &mut []), Ok(()));
}

#[test]
fn unsupported_types_are_named() {
    let unsupported: Vec<GgmlType> = GgmlType::all().filter(|t| !is_supported(*t)).collect();
    assert_eq!(format!("{unsupported:?}"), "[Q8_1, I8, I16, I32, I64, F64]");
    for ty in unsupported {
        let n = ty.type_size();
        let err = dequantize(ty, &vec![0u8; n], &mut vec![0f32; ty.block_size()]).unwrap_err();
        assert_eq!(err, QuantError::Unsupported(ty));
        assert_eq!(
            err.to_string(),
            format!("tensor type {} is not supported", ty.name())
        );
    }
}

fn info(name: &str, ty: GgmlType, shape: &[u64], n_bytes: u64) -> TensorInfo {
    TensorInfo {
        name: name.to_string(),
        ggml_type: ty,
        shape: shape.to_vec(),
        offset: 0,
        n_bytes,
        info_offset: 0,
    }
}

#[test]
fn dequantize_tensor_checks_type_and_shape() {
    // A 2x64 Q8_0 tensor: d = 1.0, quants 0..64 per row.
    let mut data = Vec::new();
    for _row in 0..2 {
        for block in 0..2 {
            data.extend_from_slice(&0x3c00u16.to_le_bytes());
            data.extend((0..32).map(|j| (block * 32 + j) as u8));
        }
    }
    let good = info("t", GgmlType::Q8_0, &[64, 2], data.len() as u64);
    let v = dequantize_tensor(&Tensor {
        info: &good,
        data: &data,
    })
    .expect("valid tensor");
    let want: Vec<f32> = (0..2).flat_map(|_| (0..64).map(|j| j as f32)).collect();
    assert_eq!(v, want);

    let unsupported = info("ids", GgmlType::I32, &[4], 16);
    let err = dequantize_tensor(&Tensor {
        info: &unsupported,
        data: &[0u8; 16],
    })
    .unwrap_err();
    assert_eq!(err.to_string(), "tensor type I32 is not supported");

    // ne0 = 48 is not a whole number of 32-element blocks, though 4 rows of 48 make 6 blocks.
    let ragged = info("r", GgmlType::Q8_0, &[48, 4], 204);
    let err = dequantize_tensor(&Tensor {
        info: &ragged,
        data: &[0u8; 204],
    })
    .unwrap_err();
    assert!(matches!(err, QuantError::TensorShape { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("tensor r: shape [48, 4] of type Q8_0"),
        "{err}"
    );

    // Byte count disagreeing with the shape.
    let short = info("s", GgmlType::Q8_0, &[64, 2], 100);
    let err = dequantize_tensor(&Tensor {
        info: &short,
        data: &data[..100],
    })
    .unwrap_err();
    assert!(matches!(err, QuantError::TensorShape { .. }), "{err:?}");
}
