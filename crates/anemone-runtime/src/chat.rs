//! Chat templates rendered like Hugging Face transformers' `apply_chat_template`: Jinja with
//! `trim_blocks` and `lstrip_blocks`, the variables `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`, the function `raise_exception`, the `tojson` filter and Python string
//! methods (`.strip()`, `.startswith()`, `.split()`, …).

use crate::error::RuntimeError;
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

const TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, RuntimeError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|source| RuntimeError::ChatTemplate { source })?;
        Ok(Self {
            env,
            bos_token: bos_token.map(str::to_string),
            eos_token: eos_token.map(str::to_string),
        })
    }

    /// The prompt text for `messages`, ending with the assistant's turn header when
    /// `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, RuntimeError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|source| RuntimeError::ChatTemplate { source })?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_deref().unwrap_or(""),
                eos_token => self.eos_token.as_deref().unwrap_or(""),
            })
            .map_err(|source| RuntimeError::ChatTemplate { source })
    }
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_methods_trimming_and_exceptions() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {{ m.content.strip() | upper }}{% if m.role.startswith('us') %}!{% endif %}\n{% endfor %}{{ bos_token }}",
            Some("<s>"),
            None,
        )
        .unwrap();
        let out = t
            .render(&[ChatMessage::new("user", "  hi  ")], false)
            .unwrap();
        assert_eq!(out, "  HI!<s>", "as jinja2 renders it");
        let t =
            ChatTemplate::new("{{ raise_exception('roles must alternate') }}", None, None).unwrap();
        let err = t.render(&[], true).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
        assert!(matches!(
            ChatTemplate::new("{% if %}", None, None),
            Err(RuntimeError::ChatTemplate { .. })
        ));
    }
}
