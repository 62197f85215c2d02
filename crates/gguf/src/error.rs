//! Typed errors of the GGUF reader and writer.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing a GGUF file.
///
/// Every variant raised while parsing carries the byte offset in the file where the
/// offending field starts, so a damaged file can be diagnosed with a hex dump.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened, mapped or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic {found:02x?} at byte 0 (expected \"GGUF\")")]
    BadMagic { found: [u8; 4] },
    /// The version field names a version this reader does not implement.
    #[error("unsupported GGUF version {version} at byte 4 (supported: 2, 3{})", if *.big_endian { "; this file is big-endian, only little-endian is supported" } else { "" })]
    UnsupportedVersion { version: u32, big_endian: bool },
    /// A field runs past the end of the file.
    #[error("truncated file: {what} at byte {offset} needs {needed} bytes, but the file ends at byte {file_len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    /// A metadata value has a type id outside the GGUF specification.
    #[error("unknown metadata value type {type_id} for key {key:?} at byte {offset}")]
    UnknownValueType {
        key: String,
        type_id: u32,
        offset: u64,
    },
    /// A tensor has a ggml type id this reader does not know.
    #[error("tensor {tensor:?} has unknown ggml type id {type_id} at byte {offset}")]
    UnknownTensorType {
        tensor: String,
        type_id: u32,
        offset: u64,
    },
    /// A metadata field is malformed (bad UTF-8, nesting too deep, duplicate key, wrong type
    /// of a key the reader itself interprets such as `general.alignment`).
    #[error("invalid metadata at byte {offset}: {detail}")]
    InvalidMetadata { offset: u64, detail: String },
    /// A tensor info is malformed or its data does not fit the file.
    #[error("invalid tensor {tensor:?} (info at byte {offset}): {detail}")]
    InvalidTensor {
        tensor: String,
        offset: u64,
        detail: String,
    },
    /// A split model (`split.count` > 1, llama.cpp's `gguf-split`) whose shards are missing
    /// or disagree.
    #[error("{path}: split model: {detail}")]
    Split { path: PathBuf, detail: String },
    /// The writer was given inconsistent input.
    #[error("cannot write GGUF: {0}")]
    Write(String),
}

/// Result alias of this crate.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
