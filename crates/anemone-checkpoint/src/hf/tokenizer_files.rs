//! `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` / `chat_template.json` and
//! `generation_config.json` → [`TokenizerBundle`] and the special token ids.

use super::fields::JsonFields as Fields;
use super::read_json;
use crate::error::{CheckpointError, Result};
use crate::tokenizer::TokenizerBundle;
use serde_json::Value;
use std::path::{Path, PathBuf};
use tokenizers::processors::sequence::Sequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::Tokenizer;

/// What the tokenizer-side files of a directory say.
#[derive(Debug, Default)]
pub struct TokenizerFiles {
    pub bundle: Option<TokenizerBundle>,
    /// `eos_token_id` of generation_config.json (empty when absent).
    pub generation_eos_ids: Vec<u32>,
    pub generation_bos_id: Option<u32>,
    /// The tokenizer's BOS / EOS tokens as ids (when a tokenizer was found and knows them).
    pub tokenizer_bos_id: Option<u32>,
    pub tokenizer_eos_id: Option<u32>,
    /// Every file that was read.
    pub paths: Vec<PathBuf>,
}

/// Reads whichever tokenizer-side files exist in `dir`; none of them is required.
pub fn read_tokenizer_files(dir: &Path) -> Result<TokenizerFiles> {
    let mut out = TokenizerFiles::default();

    let generation_path = dir.join("generation_config.json");
    if generation_path.is_file() {
        let json = read_json(&generation_path)?;
        let fields = Fields::new(&generation_path, &json)?;
        out.generation_eos_ids = fields.token_ids("eos_token_id")?;
        out.generation_bos_id = fields.token_id("bos_token_id")?;
        out.paths.push(generation_path);
    }

    let config_path = dir.join("tokenizer_config.json");
    let tokenizer_config = if config_path.is_file() {
        let json = read_json(&config_path)?;
        out.paths.push(config_path.clone());
        Some(json)
    } else {
        None
    };
    let config_fields = tokenizer_config
        .as_ref()
        .map(|json| Fields::new(&config_path, json))
        .transpose()?;

    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        if dir.join("tokenizer.model").is_file() || dir.join("vocab.json").is_file() {
            tracing::warn!(
                dir = %dir.display(),
                "only a slow tokenizer (tokenizer.model / vocab.json) is present; anemone reads tokenizer.json, so the checkpoint has no tokenizer"
            );
        }
        return Ok(out);
    }
    let mut tokenizer =
        Tokenizer::from_file(&tokenizer_path).map_err(|e| CheckpointError::Tokenizer {
            problem: format!("{}: {e}", tokenizer_path.display()),
        })?;
    out.paths.push(tokenizer_path.clone());

    let (bos_token, eos_token, add_bos_token) = match &config_fields {
        Some(f) => (
            special_token(f, "bos_token")?,
            special_token(f, "eos_token")?,
            f.bool_opt("add_bos_token")?,
        ),
        None => (None, None, None),
    };
    out.tokenizer_bos_id = bos_token.as_deref().and_then(|t| tokenizer.token_to_id(t));
    out.tokenizer_eos_id = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t));

    if let (Some(wanted), Some(bos), Some(bos_id)) =
        (add_bos_token, &bos_token, out.tokenizer_bos_id)
    {
        apply_add_bos(&mut tokenizer, &tokenizer_path, wanted, bos, bos_id)?;
    }
    let add_bos = match out.tokenizer_bos_id {
        Some(bos_id) => encode_adds_bos(&tokenizer, bos_id),
        None => false,
    };

    let chat_template = chat_template(dir, config_fields.as_ref(), &mut out.paths)?;
    out.bundle = Some(TokenizerBundle {
        tokenizer,
        chat_template,
        bos_token,
        eos_token,
        add_bos,
    });
    Ok(out)
}

/// A special token given as a string or as an AddedToken object `{"content": ..., ...}`.
fn special_token(f: &Fields, field: &str) -> Result<Option<String>> {
    match f.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(f.bad(field, "AddedToken object without a string `content`")),
        },
        Some(other) => Err(f.bad(
            field,
            format!("expected a string or an AddedToken object, found {other}"),
        )),
    }
}

/// Whether encoding with special tokens puts `bos_id` first (and plain encoding does not).
fn encode_adds_bos(tokenizer: &Tokenizer, bos_id: u32) -> bool {
    let first = |special: bool| {
        tokenizer
            .encode("a", special)
            .ok()
            .and_then(|e| e.get_ids().first().copied())
    };
    first(true) == Some(bos_id) && first(false) != Some(bos_id)
}

/// Makes the post-processor agree with an explicit `add_bos_token`, as transformers does for
/// tokenizers that carry that flag.
fn apply_add_bos(
    tokenizer: &mut Tokenizer,
    path: &Path,
    wanted: bool,
    bos: &str,
    bos_id: u32,
) -> Result<()> {
    if encode_adds_bos(tokenizer, bos_id) == wanted {
        return Ok(());
    }
    let template_error = |e: tokenizers::Error| CheckpointError::Tokenizer {
        problem: format!("{}: building the BOS post-processor: {e}", path.display()),
    };
    if wanted {
        let template = TemplateProcessing::builder()
            .try_single(format!("{bos} $A"))
            .map_err(|e| template_error(e.into()))?
            .try_pair(format!("{bos} $A {bos} $B"))
            .map_err(|e| template_error(e.into()))?
            .special_tokens(vec![(bos.to_string(), bos_id)])
            .build()
            .map_err(|e| template_error(e.into()))?;
        let processor = match tokenizer.get_post_processor().cloned() {
            Some(existing) => Sequence::new(vec![existing, template.into()]).into(),
            None => template.into(),
        };
        tokenizer.with_post_processor(Some::<tokenizers::PostProcessorWrapper>(processor));
    } else {
        // The post-processor adds BOS although the config says not to; only ids matter here,
        // and no post-processor leaves them as the model and pre-tokenizer produce them.
        tokenizer.with_post_processor(None::<tokenizers::PostProcessorWrapper>);
    }
    Ok(())
}

/// The chat template: `chat_template.jinja` (transformers 5) first, then `chat_template` in
/// tokenizer_config.json (a string, or a list of `{name, template}` of which `default` is used),
/// then `chat_template.json`.
fn chat_template(
    dir: &Path,
    config: Option<&Fields>,
    paths: &mut Vec<PathBuf>,
) -> Result<Option<String>> {
    let jinja_path = dir.join("chat_template.jinja");
    if jinja_path.is_file() {
        let text = std::fs::read_to_string(&jinja_path).map_err(|source| CheckpointError::Io {
            path: jinja_path.clone(),
            source,
        })?;
        paths.push(jinja_path);
        return Ok(Some(text));
    }
    if let Some(f) = config {
        if let Some(template) = template_field(f)? {
            return Ok(Some(template));
        }
    }
    let json_path = dir.join("chat_template.json");
    if json_path.is_file() {
        let json = read_json(&json_path)?;
        let template = template_field(&Fields::new(&json_path, &json)?)?;
        paths.push(json_path);
        return Ok(template);
    }
    Ok(None)
}

fn template_field(f: &Fields) -> Result<Option<String>> {
    const FIELD: &str = "chat_template";
    match f.get(FIELD) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(items)) => {
            for item in items {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_string())),
                    (Some(_), Some(_)) => {}
                    _ => {
                        return Err(f.bad(
                            FIELD,
                            "list entries must be {\"name\": string, \"template\": string}",
                        ))
                    }
                }
            }
            tracing::warn!(path = %f.path.display(), "chat_template list has no `default` entry; no template used");
            Ok(None)
        }
        Some(other) => Err(f.bad(
            FIELD,
            format!("expected a string or a list, found {}", kind(other)),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
