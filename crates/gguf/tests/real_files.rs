//! The reader against files written by llama.cpp's converter and quantizer
//! (shared/fixtures): every tensor's name, type and shape as the fixture's meta.json lists
//! them, mmap and in-memory parses agreeing, and the writer reproducing each file byte for
//! byte from what the reader returned.

use std::path::{Path, PathBuf};

use frink_gguf::{GgufFile, GgufWriter};

fn gguf_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for kind in ["tiny", "quant"] {
        let mut dirs: Vec<_> = std::fs::read_dir(root.join(kind))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        dirs.sort();
        for dir in dirs {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "gguf") {
                    out.push(p);
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn fixtures_parse_and_match_their_meta() {
    let Some(root) = frink_testdata::require("fixtures", "fixtures_parse_and_match_their_meta")
    else {
        return;
    };
    let files = gguf_files(&root);
    // 33 tiny fixtures (and the LoRA fixture's adapter) + 21 quant types x 2 models.
    assert_eq!(
        files.len(),
        33 + 1 + 21 * 2,
        "fixture set changed: {files:?}"
    );
    let mut checked_tensors = 0;
    for path in &files {
        let f = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let twin = GgufFile::read(path).unwrap();
        assert_eq!(f.metadata(), twin.metadata());
        assert_eq!(f.tensor_infos(), twin.tensor_infos());
        assert_eq!(f.version(), 3);

        // meta.json lists every tensor with type and shape (tiny: one model per dir,
        // quant: per model file under "models").
        let dir = path.parent().unwrap();
        let meta = frink_testdata::read_meta(dir);
        let adapter = path.file_name().is_some_and(|n| n == "adapter.gguf");
        let listed = if adapter {
            meta["lora"]["adapter_gguf_tensors"].clone()
        } else if let Some(t) = meta.get("gguf_tensors") {
            t.clone()
        } else {
            let stem = path.file_stem().unwrap().to_str().unwrap();
            meta["models"][stem]["tensors"].clone()
        };
        let listed = listed
            .as_array()
            .unwrap_or_else(|| panic!("{}: no tensor list", dir.display()));
        assert_eq!(listed.len(), f.tensor_infos().len(), "{}", path.display());
        for (want, got) in listed.iter().zip(f.tensor_infos()) {
            assert_eq!(want["name"], got.name.as_str());
            assert_eq!(want["type"], got.ggml_type.name(), "{}", got.name);
            let shape: Vec<u64> = want["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(shape, got.shape, "{}", got.name);
            checked_tensors += 1;
        }
        let arch_key = if adapter {
            "/lora/adapter_gguf_metadata/general.architecture"
        } else {
            "/gguf_metadata/general.architecture"
        };
        if let Some(arch) = meta.pointer(arch_key) {
            assert_eq!(f.architecture(), arch.as_str());
        }
    }
    eprintln!("checked {} files, {checked_tensors} tensors", files.len());
}

#[test]
fn writer_reproduces_fixture_files_byte_for_byte() {
    let Some(root) = frink_testdata::require("fixtures", "writer_reproduces_fixture_files") else {
        return;
    };
    for path in gguf_files(&root) {
        let original = std::fs::read(&path).unwrap();
        let f = GgufFile::from_bytes(original.clone()).unwrap();
        let w = GgufWriter::from_file(&f).unwrap();
        let rewritten = w.to_bytes().unwrap();
        assert!(rewritten == original, "{}: rewrite differs", path.display());
    }
}
