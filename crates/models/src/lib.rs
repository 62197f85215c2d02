//! frink's models: [`ModelConfig`] from GGUF metadata, the architecture table
//! ([`arch::ARCHS`]), weight loading with tensor accounting ([`Model::load`]), the KV cache
//! and the decoder forward pass ([`Model::forward`]).

pub mod arch;
pub mod config;
mod error;
pub mod experts;
mod forward;
pub mod kernels;
pub mod kv;
mod model;
pub mod pool;

pub use config::{
    alibi_slopes, Gating, MlaConfig, ModelConfig, MoeConfig, Pooling, RopeParams, YarnParams,
};
pub use error::{ModelError, Result};
pub use forward::{route, Logits, Sequence};
pub use kv::{KvCache, KvType};
pub use model::{
    DenseFfn, Experts, FfnWeights, LayerWeights, MlaWeights, Model, MoeFfn, MoeStats, NormWeights,
    QkvWeights, Weights,
};
