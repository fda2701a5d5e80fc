//! Multimodal Gemma 3 checkpoints (`model_type` gemma3, `Gemma3ForConditionalGeneration`)
//! converted as their text decoder: the config's `text_config` is read as a `gemma3_text`
//! config, and the language model's tensors (`language_model.model.*` as transformers saves
//! them, or `model.language_model.*`) are presented under the text decoder's names. The vision
//! tower and the projector are not read; top-level keys are known or refused by name.

use anemone_checkpoint::hf::JsonFields;
use anemone_checkpoint::{Result, TensorInfo, TensorStore};
use serde_json::Value;

/// Top-level keys of a `gemma3` config.json besides `text_config`: the vision side (not
/// converted) and keys that leave the text decoder alone.
const KNOWN_KEYS: &[&str] = &[
    "_name_or_path",
    "architectures",
    "model_type",
    "text_config",
    "vision_config",
    "boi_token_index",
    "eoi_token_index",
    "image_token_index",
    "mm_tokens_per_image",
    "initializer_range",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "tie_word_embeddings",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "use_cache",
];

/// The `gemma3_text` config inside a `gemma3` one (with the top-level `tie_word_embeddings`,
/// which is what ties the conditional model's LM head).
pub fn text_config(f: &JsonFields) -> Result<Value> {
    for (key, value) in f.object {
        if !KNOWN_KEYS.contains(&key.as_str()) && !value.is_null() {
            return Err(f.unsupported(
                key,
                format!("{value} (a multimodal gemma3 key anemone does not implement)"),
            ));
        }
    }
    let mut text = match f.get("text_config") {
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(f.bad("text_config", "expected an object")),
        None => {
            return Err(f.bad(
                "text_config",
                "missing (a gemma3 config holds its text decoder there)",
            ))
        }
    };
    match text.get("model_type").and_then(Value::as_str) {
        None | Some("gemma3_text") => {}
        Some(other) => {
            return Err(f.bad(
                "text_config.model_type",
                format!("`{other}`, expected gemma3_text"),
            ))
        }
    }
    text.remove("model_type");
    if let Some(tie) = f.get("tie_word_embeddings").filter(|v| !v.is_null()) {
        text.insert("tie_word_embeddings".into(), tie.clone());
    }
    Ok(Value::Object(text))
}

/// The prefixes a conditional checkpoint stores its language model under: `(decoder prefix, LM
/// head name)`.
const LAYOUTS: &[(&str, &str)] = &[
    // transformers' saved layout (4.x, and 5.x writing legacy names)
    ("language_model.model.", "language_model.lm_head.weight"),
    // transformers 5's module layout
    ("model.language_model.", "lm_head.weight"),
];

/// A conditional checkpoint's language model under the text decoder's names (`model.*`,
/// `lm_head.weight`); every other tensor (vision tower, projector) hidden. `None` when `base`
/// holds a text decoder already.
pub fn language_model(
    base: Box<dyn TensorStore>,
) -> std::result::Result<Box<dyn TensorStore>, Box<dyn TensorStore>> {
    let names = base.names();
    match LAYOUTS
        .iter()
        .find(|(prefix, _)| names.iter().any(|n| n.starts_with(prefix)))
    {
        Some(&(prefix, head)) => Ok(Box::new(LanguageModel { base, prefix, head })),
        None => Err(base),
    }
}

struct LanguageModel {
    base: Box<dyn TensorStore>,
    prefix: &'static str,
    head: &'static str,
}

impl LanguageModel {
    /// The stored name of a text decoder name.
    fn stored(&self, name: &str) -> Option<String> {
        if name == "lm_head.weight" {
            Some(self.head.to_string())
        } else {
            name.strip_prefix("model.")
                .map(|rest| format!("{}{rest}", self.prefix))
        }
    }
}

impl TensorStore for LanguageModel {
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .base
            .names()
            .into_iter()
            .filter_map(|n| {
                if n == self.head {
                    Some("lm_head.weight".to_string())
                } else {
                    n.strip_prefix(self.prefix)
                        .map(|rest| format!("model.{rest}"))
                }
            })
            .collect();
        names.sort();
        names
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.base.info(&self.stored(name)?)
    }

    fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        match self.stored(name) {
            Some(stored) => self.base.load_f32(&stored),
            None => Err(anemone_checkpoint::CheckpointError::MissingTensor { name: name.into() }),
        }
    }

    fn load_f32_into(&self, name: &str, out: &mut [f32]) -> anemone_checkpoint::Result<()> {
        match self.stored(name) {
            Some(stored) => self.base.load_f32_into(&stored, out),
            None => Err(anemone_checkpoint::CheckpointError::MissingTensor { name: name.into() }),
        }
    }
}
