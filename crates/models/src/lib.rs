//! frink's models: [`ModelConfig`] from GGUF metadata, the architecture table
//! ([`arch::ARCHS`]) and the layer plan compiled from it ([`plan::Plan`]), weight loading
//! with tensor accounting ([`Model::load`]), each sequence's state ([`SeqState`]: KV cache
//! and recurrent state), the blocks ([`blocks`]) and the forward pass ([`Model::forward`]).

pub mod arch;
pub mod blocks;
pub mod config;
mod error;
pub mod experts;
mod forward;
pub mod imatrix;
pub mod kernels;
pub mod kv;
mod kv_type;
mod load;
pub mod lora;
mod model;
pub mod overrides;
pub mod plan;
pub mod pool;
pub mod rope;
pub mod shift;
pub mod state;
pub mod state_io;
pub mod taps;
pub mod tune;
pub mod vision;

pub use blocks::attention::{AttentionWeights, QkvWeights};
pub use blocks::encoder::EncoderInput;
pub use blocks::ffn::DenseFfn;
pub use blocks::mla::MlaWeights;
pub use blocks::moe::{route, MoeFfn};
pub use blocks::{FfnWeights, MixerWeights};
pub use config::{
    alibi_slopes, Gating, MlaConfig, ModelConfig, MoeConfig, Pooling, RopeParams, SizeSources,
    SsmConfig, YarnParams,
};
pub use error::{ModelError, Result};
pub use forward::{EmbdRows, Logits, Sequence};
pub use kv::{
    window_blocks, CacheType, KvPool, KvType, CACHE_BLOCK, EVICTED, KV_BLOCK, WINDOW_STEP,
};
pub use model::{Experts, LayerWeights, Model, MoeStats, NormWeights, Weights};
pub use state::{Checkpoint, LayerState, RecurrentLayer, SeqState};
