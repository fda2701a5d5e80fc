//! Prompt text to token ids, plain or through the chat template.

use crate::chat::{ChatMessage, ChatTemplate};
use crate::error::RuntimeError;
use anemone_checkpoint::TokenizerBundle;

/// Token ids of a plain prompt: the tokenizer's own special tokens, plus BOS when the checkpoint
/// asks for it and the tokenizer did not already add it.
pub fn encode_plain(bundle: &TokenizerBundle, text: &str) -> Result<Vec<u32>, RuntimeError> {
    let mut ids = encode(bundle, text, true)?;
    if bundle.add_bos {
        if let Some(bos) = bundle
            .bos_token
            .as_deref()
            .and_then(|t| bundle.tokenizer.token_to_id(t))
        {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
    }
    Ok(ids)
}

/// Token ids of `text` as the one user message of a chat, with the assistant's turn opened —
/// what transformers' `apply_chat_template(…, add_generation_prompt=True, tokenize=True)` gives.
pub fn encode_chat(bundle: &TokenizerBundle, text: &str) -> Result<Vec<u32>, RuntimeError> {
    let rendered = render_chat(bundle, &[ChatMessage::new("user", text)])?;
    encode(bundle, &rendered, false)
}

/// The chat template of `bundle` applied to `messages` with the generation prompt added.
pub fn render_chat(
    bundle: &TokenizerBundle,
    messages: &[ChatMessage],
) -> Result<String, RuntimeError> {
    let source = bundle
        .chat_template
        .as_deref()
        .ok_or(RuntimeError::NoChatTemplate)?;
    ChatTemplate::new(
        source,
        bundle.bos_token.as_deref(),
        bundle.eos_token.as_deref(),
    )?
    .render(messages, true)
}

/// Ids that end generation: the config's EOS ids plus the tokenizer's EOS token.
pub fn stop_ids(eos_token_ids: &[u32], bundle: Option<&TokenizerBundle>) -> Vec<u32> {
    let mut ids = eos_token_ids.to_vec();
    if let Some(id) = bundle.and_then(|b| {
        b.eos_token
            .as_deref()
            .and_then(|t| b.tokenizer.token_to_id(t))
    }) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

fn encode(
    bundle: &TokenizerBundle,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<u32>, RuntimeError> {
    bundle
        .tokenizer
        .encode(text, add_special_tokens)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| RuntimeError::Tokenizer {
            operation: "encode",
            problem: e.to_string(),
        })
}
