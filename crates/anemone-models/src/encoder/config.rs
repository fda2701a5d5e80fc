//! The encoder config (what a family maps `config.json` to) and the pooling that turns a
//! sequence of hidden states into one embedding (sentence-transformers' `modules.json` and
//! `1_Pooling/config.json`).

use std::path::Path;

use anemone_checkpoint::hf::JsonFields;
use serde::{Deserialize, Serialize};

use super::EncoderError;

/// A bidirectional encoder. BERT family ([`EncoderLayout::PostLn`]): word + position
/// (+ token-type) embeddings and LayerNorm, then layers of self-attention and an erf-GELU MLP,
/// each followed by a residual LayerNorm. ModernBERT ([`EncoderLayout::PreLnRope`]): word
/// embeddings and LayerNorm, then pre-LN layers with rotary attention (global or local window)
/// and a GeGLU MLP, then a final LayerNorm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncoderConfig {
    /// The family name (`bert`), as the registry and bundle manifests record it.
    pub architecture: String,
    /// `model_type` of `config.json` (`bert`, `roberta`, `xlm-roberta`, …).
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    /// 0 when the checkpoint has no token-type embedding.
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    /// Position id of the first token (RoBERTa: `pad_token_id + 1`; BERT: 0).
    pub position_offset: usize,
    pub pad_token_id: u32,
    /// Prefix of every tensor name (`""`, `bert.`, `roberta.`), found in the checkpoint.
    pub tensor_prefix: String,
    /// Labels of a sequence-classification head (`id2label` in id order); empty without one.
    pub labels: Vec<String>,
    /// How the layers are built; absent in manifests written before ModernBERT (= post-LN).
    #[serde(default)]
    pub layout: EncoderLayout,
}

/// The layer recipe of an encoder family.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EncoderLayout {
    /// BERT: absolute positions, LayerNorm after each residual, erf-GELU MLP.
    #[default]
    PostLn,
    /// ModernBERT: rotary positions, LayerNorm before attention (none in layer 0) and before
    /// the MLP, GeGLU MLP, a final LayerNorm; global and local-window attention alternate.
    PreLnRope(RopeLayout),
}

/// Whether a ModernBERT layer attends to every token or to a window around each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionSpan {
    Global,
    Local,
}

/// How a ModernBERT classification head pools the final states (`classifier_pooling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadPooling {
    Cls,
    Mean,
}

/// ModernBERT's rotary and attention settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeLayout {
    /// RoPE base of global layers (`global_rope_theta`).
    pub global_rope_theta: f64,
    /// RoPE base of local layers (`local_rope_theta`).
    pub local_rope_theta: f64,
    /// A local layer's query attends to keys at distance ≤ this (`local_attention / 2`).
    pub local_window: usize,
    /// One entry per layer.
    pub layer_spans: Vec<AttentionSpan>,
    pub norm_bias: bool,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub classifier_bias: bool,
    pub head_pooling: HeadPooling,
}

impl EncoderConfig {
    /// Longest input (in tokens, special tokens included) the position table allows.
    pub fn max_tokens(&self) -> usize {
        self.max_position_embeddings
            .saturating_sub(self.position_offset)
    }

    pub fn tensor(&self, name: &str) -> String {
        format!("{}{name}", self.tensor_prefix)
    }

    /// The rotary layout of a ModernBERT-style encoder.
    pub fn rope(&self) -> Option<&RopeLayout> {
        match &self.layout {
            EncoderLayout::PostLn => None,
            EncoderLayout::PreLnRope(r) => Some(r),
        }
    }

    /// Whether the last layer is followed by a final LayerNorm (so every layer's own output is
    /// an intermediate state).
    pub fn has_final_norm(&self) -> bool {
        self.rope().is_some()
    }
}

/// How token states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolingMode {
    /// Mean over the input's tokens (padding excluded).
    Mean,
    /// The first token (`[CLS]` / `<s>`).
    Cls,
    /// The input's last token.
    LastToken,
    /// Element-wise maximum over the input's tokens.
    Max,
}

impl PoolingMode {
    pub fn name(self) -> &'static str {
        match self {
            PoolingMode::Mean => "mean",
            PoolingMode::Cls => "cls",
            PoolingMode::LastToken => "last_token",
            PoolingMode::Max => "max",
        }
    }
}

/// Pooling plus L2 normalisation, and where the setting came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pooling {
    pub mode: PoolingMode,
    pub normalize: bool,
    /// `1_Pooling/config.json` (and `modules.json`), or `default (no modules.json)`.
    pub source: String,
}

impl Pooling {
    /// Pools `hidden` (`[n, h]`, the input's own tokens) into one vector.
    pub fn apply(&self, hidden: &[f32], n: usize, h: usize) -> Vec<f32> {
        let rows = || hidden.chunks_exact(h).take(n);
        let mut out = match self.mode {
            PoolingMode::Mean => {
                let mut acc = vec![0f64; h];
                for row in rows() {
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a += v as f64;
                    }
                }
                acc.iter().map(|&a| (a / n.max(1) as f64) as f32).collect()
            }
            PoolingMode::Cls => hidden[..h].to_vec(),
            PoolingMode::LastToken => hidden[(n - 1) * h..n * h].to_vec(),
            PoolingMode::Max => {
                let mut acc = vec![f32::NEG_INFINITY; h];
                for row in rows() {
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a = a.max(v);
                    }
                }
                acc
            }
        };
        if self.normalize {
            let norm = out.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
            // sentence-transformers' F.normalize clamps the norm at 1e-12
            let inv = 1.0 / norm.max(1e-12);
            for v in &mut out {
                *v = (*v as f64 * inv) as f32;
            }
        }
        out
    }
}

const MODULES: &str = "modules.json";
const POOLING_TYPE: &str = "sentence_transformers.models.Pooling";
const NORMALIZE_TYPE: &str = "sentence_transformers.models.Normalize";

/// Reads the sentence-transformers pipeline of `dir`: the Pooling module's config and whether a
/// Normalize module follows. Without `modules.json`: mean pooling, no normalisation (what
/// sentence-transformers builds for a bare transformers checkpoint).
pub fn read_pooling(dir: &Path) -> Result<Pooling, EncoderError> {
    let modules_path = dir.join(MODULES);
    if !modules_path.is_file() {
        return Ok(Pooling {
            mode: PoolingMode::Mean,
            normalize: false,
            source: "default (no modules.json)".into(),
        });
    }
    let modules = read_json(&modules_path)?;
    let list = modules.as_array().ok_or_else(|| EncoderError::Pooling {
        path: modules_path.clone(),
        problem: "expected a JSON array of modules".into(),
    })?;
    fn kind(m: &serde_json::Value) -> &str {
        m.get("type").and_then(|t| t.as_str()).unwrap_or("")
    }
    let normalize = list.iter().any(|m| kind(m) == NORMALIZE_TYPE);
    let Some(pool) = list.iter().find(|m| kind(m) == POOLING_TYPE) else {
        return Err(EncoderError::Pooling {
            path: modules_path,
            problem: format!("no `{POOLING_TYPE}` module"),
        });
    };
    let rel = pool.get("path").and_then(|p| p.as_str()).unwrap_or("");
    let config_path = dir.join(rel).join("config.json");
    let json = read_json(&config_path)?;
    let fields = JsonFields::new(&config_path, &json)?;
    let flag =
        |name: &str| -> Result<bool, EncoderError> { Ok(fields.bool_opt(name)?.unwrap_or(false)) };
    let mut modes = Vec::new();
    for (field, mode) in [
        ("pooling_mode_mean_tokens", Some(PoolingMode::Mean)),
        ("pooling_mode_cls_token", Some(PoolingMode::Cls)),
        ("pooling_mode_lasttoken", Some(PoolingMode::LastToken)),
        ("pooling_mode_max_tokens", Some(PoolingMode::Max)),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ] {
        if flag(field)? {
            match mode {
                Some(m) => modes.push(m),
                None => return Err(fields.unsupported(field, "true").into()),
            }
        }
    }
    let mode = match modes.as_slice() {
        [one] => *one,
        [] => {
            return Err(EncoderError::Pooling {
                path: config_path,
                problem: "no pooling_mode_* is true".into(),
            })
        }
        _ => {
            return Err(EncoderError::Pooling {
                path: config_path,
                problem:
                    "several pooling modes at once (concatenated embeddings) are not supported"
                        .into(),
            })
        }
    };
    Ok(Pooling {
        mode,
        normalize,
        source: format!("{MODULES} + {rel}/config.json"),
    })
}

fn read_json(path: &Path) -> Result<serde_json::Value, EncoderError> {
    let bytes = std::fs::read(path).map_err(|source| EncoderError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| EncoderError::Json {
        path: path.to_path_buf(),
        source,
    })
}
