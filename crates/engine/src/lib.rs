//! frink's engine: sessions over a loaded model, KV caches, sampling, the generation loop
//! and stop conditions, and the continuous-batching scheduler of the server.

pub mod constraint;
mod draft;
pub mod embed;
pub mod gbnf;
mod generate;
pub mod image;
pub mod kld;
pub mod kv_blocks;
mod perplexity;
pub mod safe_fs;
pub mod sampling;
pub mod scheduler;
mod session;
pub mod state_file;

pub use draft::{check_same_vocabulary, load_draft_model, DraftModel};
pub use generate::{
    generate, generate_with, partial_match_len, Adaptive, FinishReason, FinishRule, Flow,
    GenerateError, GenerateParams, Generation, NgramLookup, PredictionLookup, Propose, Speculation,
    StepCost, StopMatcher, Timings,
};
pub use perplexity::{perplexity, perplexity_with, Perplexity};
pub use sampling::SpecSampling;
pub use session::{check_kv_memory, meminfo_bytes, Session, DEFAULT_BATCH};
