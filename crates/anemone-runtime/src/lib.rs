//! Generation runtime: the [`LogitsModel`] trait every model implements, the registry of
//! backends a bundle runs on ([`backend::BackendKind`]), sampling, chat
//! templates, incremental detokenization and the generation loop.

// Library code reports failures as errors; tests may unwrap (docs/ARCHITECTURE.md, "Lint gates").
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::panic,
        clippy::todo,
        clippy::unimplemented,
        clippy::dbg_macro
    )
)]

pub mod backend;
pub mod chat;
pub mod encoder;
pub mod encoder_backend;
pub mod engine;
pub mod error;
pub mod gate;
pub mod generate;
pub mod logprobs;
pub mod model;
pub use anemone_backend::npy;
pub mod pipeline;
pub mod prompt;
pub mod sampler;
pub mod stops;
pub mod stream;
pub mod token_bytes;

pub use chat::{ChatMessage, ChatTemplate};
pub use error::RuntimeError;
pub use generate::{continue_generation, generate, Generation, GenerationOptions, StopReason};
pub use model::LogitsModel;
pub use sampler::{Sampler, SamplerConfig};
pub use stream::TextStream;
pub use token_bytes::TokenBytes;
