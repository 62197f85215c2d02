//! frink's engine: sessions over a loaded model, KV caches, sampling, stop conditions.

pub mod sampling;
mod session;

pub use session::{Session, DEFAULT_BATCH};
