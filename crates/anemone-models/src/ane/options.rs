//! Conversion options of the ANE graph builders: compute precision, RMSNorm form, KV-state layout,
//! and the static shapes (context, prefill length) every function is built for.

use serde::{Deserialize, Serialize};

use super::AneError;

/// Compute and weight precision of the converted graph: the one precision type of the workspace.
pub use anemone_mil::Precision;

/// How RMSNorm (and QK-norm) is written in the graph. All three are the same function in exact
/// arithmetic; they differ in fp16 overflow behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NormForm {
    /// `x · rsqrt(mean(x²) + eps) · w`: `x²` overflows fp16 once |x| > 256.
    Naive,
    /// `layer_norm(concat([x, −x]))`, first half, `· w`: the concatenation has mean 0, so layer
    /// norm's variance is `mean(x²)`, computed inside one op.
    #[default]
    LayernormTrick,
    /// `m = max(max|x|, 1e-3)`, `(x/m) · rsqrt(mean((x/m)²) + (√eps/m)²) · w`: exact for any
    /// `m > 0`, and `(x/m)² ≤ 1` never overflows.
    MaxScaled,
}

impl NormForm {
    pub fn name(self) -> &'static str {
        match self {
            NormForm::Naive => "naive",
            NormForm::LayernormTrick => "layernorm-trick",
            NormForm::MaxScaled => "max-scaled",
        }
    }
}

/// How the KV cache of a chunk's layers is held in Core ML states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StateLayout {
    /// One state `kv_cache` holding K and V of every layer of the chunk (the layout ANEMLL ships).
    #[default]
    Unified,
    /// Two states, `k_cache` and `v_cache`, each holding every layer of the chunk.
    Split,
}

impl StateLayout {
    pub fn name(self) -> &'static str {
        match self {
            StateLayout::Unified => "unified",
            StateLayout::Split => "split",
        }
    }
}

/// Where the final norm and the LM head run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LmHeadPlacement {
    /// On the host, from `host.safetensors`.
    #[default]
    Host,
    /// As its own package, split by vocabulary into slices of at most [`MAX_ANE_DIM`] outputs.
    Package,
}

/// Dimensions above this are risky on the Neural Engine (docs/ARCHITECTURE.md, "What the
/// Neural Engine accepts").
pub const MAX_ANE_DIM: usize = 16384;
/// State dims the ANE tiles (context, head_dim) are kept a multiple of this.
pub const STATE_ALIGN: usize = 32;
/// Additive mask value for hidden positions: finite, so fp16 softmax never sees −inf.
pub const MASK_NEG: f32 = -1e4;

/// Static shapes and forms of the chunk graphs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkOptions {
    /// Tokens the KV state holds (a multiple of 32).
    pub context: usize,
    /// Tokens per `prefill` call.
    pub prefill_len: usize,
    pub precision: Precision,
    pub norm: NormForm,
    pub state_layout: StateLayout,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        ChunkOptions {
            context: 512,
            prefill_len: 64,
            precision: Precision::Fp16,
            norm: NormForm::MaxScaled,
            state_layout: StateLayout::Unified,
        }
    }
}

impl ChunkOptions {
    /// Checks the options against each other and the model's maximum positions.
    pub fn validate(&self, max_positions: usize) -> Result<(), AneError> {
        let bad = |option: &'static str, problem: String| Err(AneError::Option { option, problem });
        if self.context == 0 || !self.context.is_multiple_of(STATE_ALIGN) {
            return bad(
                "context",
                format!(
                    "{} is not a positive multiple of {STATE_ALIGN} (the KV state's sequence dim must be)",
                    self.context
                ),
            );
        }
        if self.context > MAX_ANE_DIM {
            return bad(
                "context",
                format!(
                    "{} exceeds {MAX_ANE_DIM}, the largest dim the ANE takes",
                    self.context
                ),
            );
        }
        if max_positions > 0 && self.context > max_positions {
            return bad(
                "context",
                format!(
                    "{} exceeds the model's max_position_embeddings {max_positions}",
                    self.context
                ),
            );
        }
        if self.prefill_len == 0 || self.prefill_len > self.context {
            return bad(
                "prefill-len",
                format!(
                    "{} must be between 1 and the context {}",
                    self.prefill_len, self.context
                ),
            );
        }
        Ok(())
    }

    /// head_dim as held in the KV state: rounded up to a multiple of [`STATE_ALIGN`] (the padding
    /// rows stay zero and are never read).
    pub fn padded_head_dim(head_dim: usize) -> usize {
        head_dim.div_ceil(STATE_ALIGN) * STATE_ALIGN
    }
}

macro_rules! parse_by_name {
    ($ty:ty, $what:literal, [$($v:expr),+]) => {
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                let all = [$($v),+];
                all.iter().copied().find(|v| v.name() == s).ok_or_else(|| {
                    let names: Vec<&str> = all.iter().map(|v| v.name()).collect();
                    format!("unknown {} `{s}` (one of: {})", $what, names.join(", "))
                })
            }
        }
    };
}

parse_by_name!(
    NormForm,
    "norm form",
    [
        NormForm::Naive,
        NormForm::LayernormTrick,
        NormForm::MaxScaled
    ]
);
parse_by_name!(
    StateLayout,
    "state layout",
    [StateLayout::Unified, StateLayout::Split]
);
parse_by_name!(
    LmHeadPlacement,
    "LM head placement",
    [LmHeadPlacement::Host, LmHeadPlacement::Package]
);

impl LmHeadPlacement {
    pub fn name(self) -> &'static str {
        match self {
            LmHeadPlacement::Host => "host",
            LmHeadPlacement::Package => "package",
        }
    }
}
