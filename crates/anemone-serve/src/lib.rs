//! `anemone serve`: an OpenAI-compatible HTTP server (axum + tokio) over the synchronous
//! [`anemone_runtime::engine::Engine`], and the load generator behind `anemone bench --url`.
//! The async code lives here only; generation, sessions, prefix reuse and sampling stay in
//! `anemone-runtime`.

pub mod embeddings;
pub mod loadgen;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod server;

pub use server::{serve, Models, ServeConfig};
