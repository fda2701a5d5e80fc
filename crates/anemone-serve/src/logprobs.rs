//! Log-probabilities in OpenAI's two shapes: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}], "refusal": null}` and the legacy completions' `{tokens, token_logprobs,
//! top_logprobs, text_offset}`. Token strings are the token's bytes read as UTF-8 (lossy: a
//! token holding part of a character shows U+FFFD; `bytes` has the exact bytes).

use anemone_runtime::engine::Engine;
use anemone_runtime::logprobs::{token_bytes, TokenLogprob};
use serde_json::{json, Map, Value};

use crate::openai::LogprobsStyle;

/// Turns token ids into their text and bytes for one request.
pub struct LogprobsWriter<'e> {
    engine: &'e Engine,
    style: LogprobsStyle,
    /// Characters of completion text before the next token (legacy `text_offset`).
    offset: usize,
}

impl<'e> LogprobsWriter<'e> {
    pub fn new(engine: &'e Engine, style: LogprobsStyle) -> Self {
        Self {
            engine,
            style,
            offset: 0,
        }
    }

    fn token(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = match self.engine.tokenizer() {
            Some(bundle) => token_bytes(&bundle.tokenizer, id),
            None => id.to_string().into_bytes(),
        };
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// The `logprobs` object of a choice (whole response or one streamed chunk) for `tokens`.
    pub fn render(&mut self, tokens: &[TokenLogprob]) -> Value {
        match self.style {
            LogprobsStyle::Chat => {
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|t| {
                        let (token, bytes) = self.token(t.id);
                        let top: Vec<Value> = t
                            .top
                            .iter()
                            .map(|&(id, logprob)| {
                                let (token, bytes) = self.token(id);
                                json!({"token": token, "logprob": logprob, "bytes": bytes})
                            })
                            .collect();
                        json!({"token": token, "logprob": t.logprob, "bytes": bytes,
                               "top_logprobs": top})
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            LogprobsStyle::Completion => {
                let (mut names, mut values, mut tops, mut offsets) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for t in tokens {
                    let (token, _) = self.token(t.id);
                    let mut top = Map::new();
                    for &(id, logprob) in &t.top {
                        top.insert(self.token(id).0, json!(logprob));
                    }
                    // The chosen token is always listed, as OpenAI does (up to logprobs + 1).
                    top.insert(token.clone(), json!(t.logprob));
                    offsets.push(self.offset);
                    self.offset += token.chars().count();
                    names.push(token);
                    values.push(t.logprob);
                    tops.push(Value::Object(top));
                }
                json!({"tokens": names, "token_logprobs": values, "top_logprobs": tops,
                       "text_offset": offsets})
            }
        }
    }
}
