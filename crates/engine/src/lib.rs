//! frink's engine: sessions over a loaded model, KV caches, sampling, the generation loop
//! and stop conditions.

mod generate;
mod perplexity;
pub mod sampling;
mod session;

pub use generate::{
    generate, FinishReason, Flow, GenerateParams, Generation, StopMatcher, Timings,
};
pub use perplexity::{perplexity, Perplexity};
pub use session::{Session, DEFAULT_BATCH};
