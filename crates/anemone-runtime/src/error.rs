//! Errors of the generation runtime.

use anemone_models::reference::ForwardError;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("reference forward: {0}")]
    Reference(#[from] ForwardError),
    /// A backend other than the reference forward failed (the converted-bundle pipeline, …).
    #[error("{backend}: {source}")]
    Backend {
        backend: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "prompt of {prompt_len} tokens plus {new_tokens} new tokens needs {} positions, beyond the \
         context length {context_len}",
        prompt_len + new_tokens
    )]
    ContextOverflow {
        prompt_len: usize,
        new_tokens: usize,
        context_len: usize,
    },
    #[error("the prompt is empty: at least one token id is needed")]
    EmptyPrompt,
    #[error("the model returned {found} logits, its vocabulary has {expected}")]
    LogitsLength { expected: usize, found: usize },
    #[error("invalid sampling option {option}: {problem}")]
    Sampler {
        option: &'static str,
        problem: String,
    },
    #[error("the checkpoint has no tokenizer: {needed_for} needs one (use token ids instead)")]
    NoTokenizer { needed_for: &'static str },
    #[error("the checkpoint's tokenizer has no chat template")]
    NoChatTemplate,
    #[error("chat template: {source:#}")]
    ChatTemplate {
        #[source]
        source: minijinja::Error,
    },
    #[error("tokenizer: {operation}: {problem}")]
    Tokenizer {
        operation: &'static str,
        problem: String,
    },
    #[error("writing generated text: {source}")]
    Stream {
        #[source]
        source: std::io::Error,
    },
    /// The consumer of the tokens asked generation to stop (a client went away, shutdown).
    #[error("generation cancelled")]
    Cancelled,
    #[error(
        "the model already holds {held} ids, not fewer than the prompt's {prompt_len}: nothing \
         left to feed"
    )]
    PrefixTooLong { held: usize, prompt_len: usize },
}
