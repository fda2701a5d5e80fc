//! The tokenizer of a checkpoint together with its chat template and special tokens.

/// A `tokenizers::Tokenizer` plus what generation needs around it.
#[derive(Clone)]
pub struct TokenizerBundle {
    pub tokenizer: tokenizers::Tokenizer,
    /// Jinja chat template (Hugging Face `tokenizer_config.json` / GGUF `tokenizer.chat_template`).
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Whether a BOS token is prepended when encoding a plain prompt.
    pub add_bos: bool,
}

impl std::fmt::Debug for TokenizerBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizerBundle")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("chat_template", &self.chat_template.is_some())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}
