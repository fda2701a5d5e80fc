//! Gate prompts: the built-in set (with the canary), prompt files, and their token ids.

use std::path::Path;

use anemone_checkpoint::TokenizerBundle;
use serde::Deserialize;

use super::GateError;
use crate::prompt::encode_plain;

/// One prompt as given: text or ids, an optional expected continuation (a canary), an optional
/// path to teacher-force along (else the reference's greedy path).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct GatePrompt {
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default, alias = "ids")]
    pub prompt_ids: Option<Vec<u32>>,
    /// The bundle's greedy continuation must start with this text (checked only when the
    /// reference's does too).
    #[serde(default)]
    pub expect: Option<String>,
    /// Tokens to feed after the prompt, one per step (e.g. transformers' greedy ids).
    #[serde(default, alias = "greedy_ids")]
    pub force_ids: Option<Vec<u32>>,
}

impl GatePrompt {
    pub fn text(prompt: &str) -> Self {
        GatePrompt {
            prompt: Some(prompt.to_string()),
            ..GatePrompt::default()
        }
    }

    pub fn ids(ids: &[u32]) -> Self {
        GatePrompt {
            prompt_ids: Some(ids.to_vec()),
            ..GatePrompt::default()
        }
    }
}

/// The canary: a fact every real instruct model of this family gets right.
pub const CANARY_PROMPT: &str = "The capital of France is";
pub const CANARY_EXPECT: &str = " Paris";

/// Built-in prompts: the canary, code, narrative, a list.
pub fn default_prompts() -> Vec<GatePrompt> {
    let mut canary = GatePrompt::text(CANARY_PROMPT);
    canary.expect = Some(CANARY_EXPECT.to_string());
    vec![
        canary,
        GatePrompt::text("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
        GatePrompt::text("Once upon a time, in a small village by the sea, there lived"),
        GatePrompt::text("The three primary colors are"),
    ]
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptItem {
    Text(String),
    Full(GatePrompt),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptFile {
    List(Vec<PromptItem>),
    Object { prompts: Vec<PromptItem> },
}

/// Reads a prompts file: JSON (a list of strings or `{prompt|prompt_ids, expect?, force_ids?}`
/// objects, or an object with such a `prompts` list — the real-model fixture files qualify), or
/// plain text with one prompt per non-empty line.
pub fn read_prompts(path: &Path) -> Result<Vec<GatePrompt>, GateError> {
    let text = std::fs::read_to_string(path).map_err(|e| GateError::Prompts {
        path: path.to_path_buf(),
        problem: e.to_string(),
    })?;
    let prompts: Vec<GatePrompt> = if text.trim_start().starts_with(['[', '{']) {
        let file: PromptFile = serde_json::from_str(&text).map_err(|e| GateError::Prompts {
            path: path.to_path_buf(),
            problem: format!("not a prompts list: {e}"),
        })?;
        let items = match file {
            PromptFile::List(items) | PromptFile::Object { prompts: items } => items,
        };
        items
            .into_iter()
            .map(|item| match item {
                PromptItem::Text(t) => GatePrompt::text(&t),
                PromptItem::Full(p) => p,
            })
            .collect()
    } else {
        text.lines()
            .map(str::trim_end)
            .filter(|l| !l.trim().is_empty())
            .map(GatePrompt::text)
            .collect()
    };
    if prompts.is_empty() {
        return Err(GateError::Prompts {
            path: path.to_path_buf(),
            problem: "no prompts".into(),
        });
    }
    Ok(prompts)
}

/// A prompt with its ids decided.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedPrompt {
    /// The text, or the ids when given as ids.
    pub label: String,
    pub ids: Vec<u32>,
    pub expect: Option<String>,
    pub force_ids: Option<Vec<u32>>,
}

/// Token ids of every prompt (ids as given win over text; text needs `tokenizer`).
pub fn resolve(
    prompts: &[GatePrompt],
    tokenizer: Option<&TokenizerBundle>,
) -> Result<Vec<ResolvedPrompt>, GateError> {
    prompts
        .iter()
        .enumerate()
        .map(|(index, p)| {
            let (label, ids) = match (&p.prompt_ids, &p.prompt) {
                (Some(ids), text) => (
                    text.clone().unwrap_or_else(|| format!("{ids:?}")),
                    ids.clone(),
                ),
                (None, Some(text)) => {
                    let tok = tokenizer.ok_or(GateError::NoTokenizer { prompt: index })?;
                    (text.clone(), encode_plain(tok, text)?)
                }
                (None, None) => {
                    return Err(GateError::EmptyPrompt { prompt: index });
                }
            };
            if ids.is_empty() {
                return Err(GateError::EmptyPrompt { prompt: index });
            }
            Ok(ResolvedPrompt {
                label,
                ids,
                expect: p.expect.clone(),
                force_ids: p.force_ids.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<GatePrompt> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        std::fs::write(&path, text).unwrap();
        read_prompts(&path).unwrap()
    }

    #[test]
    fn prompt_files_in_every_accepted_shape() {
        assert_eq!(
            parse("one\n\n two \n"),
            vec![GatePrompt::text("one"), GatePrompt::text(" two")]
        );
        assert_eq!(
            parse(r#"["a", {"prompt_ids": [1, 2]}]"#),
            vec![GatePrompt::text("a"), GatePrompt::ids(&[1, 2])]
        );
        let fixture = parse(
            r#"{"model": "m", "prompts": [{"prompt": "x", "prompt_ids": [5], "greedy_ids": [6, 7], "text": " the continuation"}]}"#,
        );
        assert_eq!(fixture.len(), 1);
        assert_eq!(fixture[0].prompt.as_deref(), Some("x"));
        assert_eq!(fixture[0].prompt_ids, Some(vec![5]));
        assert_eq!(fixture[0].force_ids, Some(vec![6, 7]));
    }

    #[test]
    fn empty_and_invalid_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        std::fs::write(&path, "\n\n").unwrap();
        assert!(matches!(
            read_prompts(&path),
            Err(GateError::Prompts { .. })
        ));
        std::fs::write(&path, "[{\"prompt\": 3}]").unwrap();
        let e = read_prompts(&path).unwrap_err().to_string();
        assert!(e.contains("p.json"), "{e}");
    }
}
