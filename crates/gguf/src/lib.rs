//! frink's GGUF reader and writer.
//!
//! [`GgufFile::open`] memory-maps a GGUF v2/v3 file and validates everything it will later
//! hand out: a damaged or hostile file yields a [`GgufError`] naming the field and its byte
//! offset, never a panic, an out-of-bounds read or an unbounded allocation.
//! [`GgufWriter`] builds files for tests and tools. [`GgmlType`] holds the ggml tensor types
//! and their block layouts.

mod error;
mod reader;
mod summary;
mod types;
mod value;
mod writer;

pub use error::{GgufError, Result};
pub use reader::{GgufFile, Tensor, TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
pub use summary::{file_type_name, human_bytes, parameter_size};
pub use types::{GgmlType, QK_K};
pub use value::{MetaArray, MetaValue, ValueType};
pub use writer::GgufWriter;
