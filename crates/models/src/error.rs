//! Errors of model loading and evaluation.

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `general.architecture` names an architecture frink does not implement.
    #[error("unsupported architecture {0:?} (supported: {1})")]
    UnsupportedArchitecture(String, String),
    /// A metadata key the architecture needs is missing or has the wrong type.
    #[error("metadata {key}: {detail}")]
    Metadata { key: String, detail: String },
    /// The file asks for a feature frink does not implement (named), so running it would
    /// answer wrongly.
    #[error("unsupported feature: {0}")]
    Unsupported(String),
    /// A tensor the graph needs is missing or has the wrong shape.
    #[error("tensor {name}: {detail}")]
    Tensor { name: String, detail: String },
    /// Tensors in the file that the architecture's graph does not read; `layout` names
    /// the metadata that decided which tensors the layers read (`key = value`), if any.
    #[error("{arch} graph does not read {} tensor(s) of the file: {}{}", .names.len(), .names.join(", "),
        if .layout.is_empty() { String::new() } else { format!(" (the layer layout follows {})", .layout.join(", ")) })]
    UnusedTensors {
        arch: String,
        names: Vec<String>,
        layout: Vec<String>,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    /// Positions past the KV cache.
    #[error("context full: {needed} positions needed, the KV cache holds {n_ctx}")]
    ContextFull { needed: usize, n_ctx: usize },
    /// Positions past the blocks a pooled sequence holds (its caller allocates them first),
    /// or a pooled sequence evaluated without its pool.
    #[error("KV pool: {needed} positions needed, the sequence holds blocks for {held}")]
    KvBlocks { needed: usize, held: usize },
    /// More rows in one step than a sequence's sliding-window ring holds beyond the window
    /// ([`crate::SeqState::max_step`]).
    #[error("sliding-window KV cache: a step of {rows} rows passes the {max} it holds")]
    WindowStep { rows: usize, max: usize },
    /// A step whose windowed layers need rows given back already (a caller's window table
    /// cut too far).
    #[error("sliding-window KV cache: the step needs rows from position {first}, the sequence holds them from {held_from}")]
    WindowRows { first: usize, held_from: usize },
    #[error(transparent)]
    Gguf(#[from] frink_gguf::GgufError),
    #[error(transparent)]
    Quant(#[from] frink_quant::QuantError),
}

/// Result alias of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
