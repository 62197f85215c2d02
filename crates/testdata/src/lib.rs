//! Locating the reference data that tests compare against.
//!
//! The data lives in `shared/` beside the checkout (`golden/`, `fixtures/`), or wherever
//! `$FRINK_TEST_DATA` points. Where it is absent a test skips with a visible notice on
//! stderr, except under `CI=true`, where its absence fails the run: a check that silently
//! skips is a check that cannot fail.

use std::path::{Path, PathBuf};

/// The reference data directory, if present.
///
/// Order: `$FRINK_TEST_DATA`, then `shared/` next to the workspace root (the checkout's
/// parent directory).
pub fn shared_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("FRINK_TEST_DATA") {
        let dir = PathBuf::from(dir);
        return dir.is_dir().then_some(dir);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = workspace.join("../shared");
    dir.is_dir().then(|| dir.canonicalize().unwrap_or(dir))
}

/// `shared/<rel>` for a test named `test`, or `None` after printing a skip notice.
///
/// Panics under `CI=true` when the data is missing, so CI cannot pass by skipping.
pub fn require(rel: &str, test: &str) -> Option<PathBuf> {
    let found = shared_dir().map(|d| d.join(rel)).filter(|p| p.exists());
    if found.is_none() {
        let msg = format!(
            "reference data shared/{rel} not found (set FRINK_TEST_DATA or place shared/ beside the checkout)"
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{test}: {msg}; CI=true requires it");
        }
        eprintln!("SKIPPED {test}: {msg}");
    }
    found
}
