//! The fp32 reference forward of an encoder (plain `[tokens, hidden]` layout): the oracle the
//! encoder bundles are gated against. It runs an input's own tokens only, which is what a padded
//! batch with an attention mask computes for them. BERT-family layers are post-LN; ModernBERT's
//! ([`super::EncoderLayout::PreLnRope`]) are pre-LN with rotary positions, a GeGLU MLP and
//! local-window attention in some layers.

use super::{AttentionSpan, EncoderCheckpoint, EncoderConfig, EncoderError, HeadPooling};
use super::{Pooling, Result};
use crate::families::bert::is_roberta;
use crate::reference::kernels::{matmul_t, softmax};
use crate::reference::rope::Rope;

/// One linear layer: `w` is `[out, in]` (Hugging Face order), `b` is `[out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub n_out: usize,
    pub n_in: usize,
}

impl Linear {
    pub(crate) fn load(
        ck: &EncoderCheckpoint,
        name: &str,
        n_out: usize,
        n_in: usize,
    ) -> Result<Self> {
        Self::load_with_bias(ck, name, n_out, n_in, true)
    }

    /// A linear layer whose bias is zero when the checkpoint has none (`bias: false`).
    pub(crate) fn load_with_bias(
        ck: &EncoderCheckpoint,
        name: &str,
        n_out: usize,
        n_in: usize,
        bias: bool,
    ) -> Result<Self> {
        Ok(Linear {
            w: ck.load_f32(&format!("{name}.weight"))?,
            b: if bias {
                ck.load_f32(&format!("{name}.bias"))?
            } else {
                vec![0.0; n_out]
            },
            n_out,
            n_in,
        })
    }

    /// Rows `[start, start + n)` of the output (a slice of a fused projection).
    pub(crate) fn rows(&self, start: usize, n: usize) -> Linear {
        Linear {
            w: self.w[start * self.n_in..(start + n) * self.n_in].to_vec(),
            b: self.b[start..start + n].to_vec(),
            n_out: n,
            n_in: self.n_in,
        }
    }

    /// `x·wᵀ + b` for `rows` rows.
    pub fn apply(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * self.n_out];
        matmul_t(x, &self.w, &mut y, rows, self.n_in, self.n_out);
        for row in y.chunks_exact_mut(self.n_out) {
            for (v, b) in row.iter_mut().zip(&self.b) {
                *v += b;
            }
        }
        y
    }
}

/// LayerNorm weight and bias.
#[derive(Debug, Clone)]
pub struct Norm {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
}

impl Norm {
    pub(crate) fn load(ck: &EncoderCheckpoint, name: &str) -> Result<Self> {
        Self::load_with_bias(ck, name, true)
    }

    /// A LayerNorm whose bias is zero when the checkpoint has none (`norm_bias: false`).
    pub(crate) fn load_with_bias(ck: &EncoderCheckpoint, name: &str, bias: bool) -> Result<Self> {
        let w = ck.load_f32(&format!("{name}.weight"))?;
        let b = if bias {
            ck.load_f32(&format!("{name}.bias"))?
        } else {
            vec![0.0; w.len()]
        };
        Ok(Norm { w, b })
    }

    /// LayerNorm of every row of `x` in place (statistics in f64).
    pub fn apply(&self, x: &mut [f32], eps: f64) {
        let h = self.w.len();
        for row in x.chunks_exact_mut(h) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / h as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / h as f64;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, w), b) in row.iter_mut().zip(&self.w).zip(&self.b) {
                *v = ((*v as f64 - mean) * inv) as f32 * w + b;
            }
        }
    }
}

/// One layer. Post-LN (BERT): `attn_norm` follows the attention residual and `out_norm` the MLP
/// residual. Pre-LN (ModernBERT): `attn_norm` precedes attention (`None`: identity, layer 0) and
/// `out_norm` precedes the MLP.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub attn_out: Linear,
    pub attn_norm: Option<Norm>,
    pub intermediate: Linear,
    /// GeGLU: the MLP is `output(gelu(intermediate(x)) · gate(x))` (ModernBERT's `Wi` halves).
    pub gate: Option<Linear>,
    pub output: Linear,
    pub out_norm: Norm,
}

/// A classification head.
#[derive(Debug, Clone)]
pub enum Head {
    /// BERT: `tanh(pooler.dense(h₀))` → `classifier`.
    BertPooler { pooler: Linear, classifier: Linear },
    /// RoBERTa: `tanh(classifier.dense(h₀))` → `classifier.out_proj`.
    Roberta { dense: Linear, out_proj: Linear },
    /// ModernBERT: pool (first token or mean) → `head.dense` → GELU → `head.norm` → `classifier`.
    ModernBert {
        pooling: HeadPooling,
        dense: Linear,
        norm: Norm,
        eps: f64,
        classifier: Linear,
    },
}

impl Head {
    /// Logits from the final hidden states of one input (`[tokens, hidden]` rows).
    pub fn logits(&self, hidden: &[f32], tokens: usize) -> Vec<f32> {
        let (a, b) = match self {
            Head::BertPooler { pooler, classifier } => (pooler, classifier),
            Head::Roberta { dense, out_proj } => (dense, out_proj),
            Head::ModernBert {
                pooling,
                dense,
                norm,
                eps,
                classifier,
            } => {
                let h = dense.n_in;
                let pooled = match pooling {
                    HeadPooling::Cls => hidden[..h].to_vec(),
                    HeadPooling::Mean => {
                        let mut acc = vec![0f64; h];
                        for row in hidden.chunks_exact(h).take(tokens) {
                            acc.iter_mut().zip(row).for_each(|(a, &v)| *a += v as f64);
                        }
                        acc.iter()
                            .map(|&a| (a / tokens.max(1) as f64) as f32)
                            .collect()
                    }
                };
                let mut x = dense.apply(&pooled, 1);
                x.iter_mut().for_each(|v| *v = gelu(*v));
                norm.apply(&mut x, *eps);
                return classifier.apply(&x, 1);
            }
        };
        let mut h = a.apply(&hidden[..a.n_in], 1);
        h.iter_mut().for_each(|v| *v = v.tanh());
        b.apply(&h, 1)
    }
}

/// Every weight of an encoder in f32.
#[derive(Debug, Clone)]
pub struct EncoderWeights {
    pub word: Vec<f32>,
    /// Absolute position table (`None` with rotary positions).
    pub position: Option<Vec<f32>>,
    pub token_type: Option<Vec<f32>>,
    pub embed_norm: Norm,
    pub layers: Vec<LayerWeights>,
    /// ModernBERT's `final_norm`.
    pub final_norm: Option<Norm>,
    pub head: Option<Head>,
}

impl EncoderWeights {
    pub fn load(ck: &EncoderCheckpoint) -> Result<Self> {
        if ck.config.rope().is_some() {
            return crate::families::modernbert::load_weights(ck);
        }
        let c = &ck.config;
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let t = |n: &str| c.tensor(n);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let p = t(&format!("encoder.layer.{l}"));
            layers.push(LayerWeights {
                query: Linear::load(ck, &format!("{p}.attention.self.query"), h, h)?,
                key: Linear::load(ck, &format!("{p}.attention.self.key"), h, h)?,
                value: Linear::load(ck, &format!("{p}.attention.self.value"), h, h)?,
                attn_out: Linear::load(ck, &format!("{p}.attention.output.dense"), h, h)?,
                attn_norm: Some(Norm::load(ck, &format!("{p}.attention.output.LayerNorm"))?),
                intermediate: Linear::load(ck, &format!("{p}.intermediate.dense"), i, h)?,
                gate: None,
                output: Linear::load(ck, &format!("{p}.output.dense"), h, i)?,
                out_norm: Norm::load(ck, &format!("{p}.output.LayerNorm"))?,
            });
        }
        let n = c.labels.len();
        let head = if n == 0 {
            None
        } else if is_roberta(&c.model_type) {
            Some(Head::Roberta {
                dense: Linear::load(ck, "classifier.dense", h, h)?,
                out_proj: Linear::load(ck, "classifier.out_proj", n, h)?,
            })
        } else {
            Some(Head::BertPooler {
                pooler: Linear::load(ck, &t("pooler.dense"), h, h)?,
                classifier: Linear::load(ck, "classifier", n, h)?,
            })
        };
        Ok(EncoderWeights {
            word: ck.load_f32(&t("embeddings.word_embeddings.weight"))?,
            position: Some(ck.load_f32(&t("embeddings.position_embeddings.weight"))?),
            token_type: if c.type_vocab_size > 0 {
                Some(ck.load_f32(&t("embeddings.token_type_embeddings.weight"))?)
            } else {
                None
            },
            embed_norm: Norm::load(ck, &t("embeddings.LayerNorm"))?,
            layers,
            final_norm: None,
            head,
        })
    }

    /// Word + position + token-type embeddings of `ids` (types all 0 when `type_ids` is
    /// `None`), before the embedding LayerNorm: what the host computes for the ANE graph.
    /// `[ids.len(), hidden]`.
    pub fn embed_raw(
        &self,
        config: &EncoderConfig,
        index: usize,
        ids: &[u32],
        type_ids: Option<&[u32]>,
    ) -> Result<Vec<f32>> {
        super::bundle::embed_tables(
            config,
            super::bundle::Tables {
                word: &self.word,
                position: self.position.as_deref(),
                token_type: self.token_type.as_deref(),
            },
            index,
            ids,
            type_ids,
        )
    }
}

/// The residual stream of one input: after the embeddings (entry 0) and after every layer.
#[derive(Debug, Clone)]
pub struct EncoderTrace {
    pub tokens: usize,
    pub hidden_states: Vec<Vec<f32>>,
}

impl EncoderTrace {
    pub fn last(&self) -> &[f32] {
        self.hidden_states
            .last()
            .map(|v| v.as_slice())
            .unwrap_or(&[])
    }
}

/// The fp32 reference encoder.
#[derive(Debug, Clone)]
pub struct EncoderReference {
    pub config: EncoderConfig,
    pub pooling: Pooling,
    pub weights: EncoderWeights,
}

impl EncoderReference {
    pub fn load(ck: &EncoderCheckpoint) -> Result<Self> {
        Ok(EncoderReference {
            config: ck.config.clone(),
            pooling: ck.pooling.clone(),
            weights: EncoderWeights::load(ck)?,
        })
    }

    /// Runs input `index` (its token ids, special tokens included; token types all 0).
    pub fn forward(&self, index: usize, ids: &[u32]) -> Result<EncoderTrace> {
        self.forward_typed(index, ids, None)
    }

    /// Runs input `index` with its token types (a text pair's second segment is type 1).
    pub fn forward_typed(
        &self,
        index: usize,
        ids: &[u32],
        type_ids: Option<&[u32]>,
    ) -> Result<EncoderTrace> {
        let c = &self.config;
        let eps = c.layer_norm_eps;
        let (n, d) = (ids.len(), c.head_dim);
        if n == 0 {
            return Err(EncoderError::EmptyInput { index });
        }
        let mut x = self.weights.embed_raw(c, index, ids, type_ids)?;
        self.weights.embed_norm.apply(&mut x, eps);
        let mut hidden_states = vec![x.clone()];
        let rope = c.rope().map(|r| {
            let tables = |theta: f64| {
                let rope = Rope::plain(d, theta);
                (0..n).map(|p| rope.cos_sin(p)).collect::<Vec<_>>()
            };
            (r, tables(r.global_rope_theta), tables(r.local_rope_theta))
        });
        for (li, w) in self.weights.layers.iter().enumerate() {
            let Some((layout, global, local)) = &rope else {
                // Post-LN (BERT).
                let attn = self.attention(w, &x, n, None, None);
                x.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);
                if let Some(norm) = &w.attn_norm {
                    norm.apply(&mut x, eps);
                }
                let out = mlp(w, &x, n);
                x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
                w.out_norm.apply(&mut x, eps);
                hidden_states.push(x.clone());
                continue;
            };
            // Pre-LN with rotary positions (ModernBERT).
            let (tables, window) = match layout.layer_spans.get(li) {
                Some(AttentionSpan::Local) => (local, Some(layout.local_window)),
                Some(AttentionSpan::Global) | None => (global, None),
            };
            let mut normed = x.clone();
            if let Some(norm) = &w.attn_norm {
                norm.apply(&mut normed, eps);
            }
            let attn = self.attention(w, &normed, n, Some(tables), window);
            x.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);
            let mut normed = x.clone();
            w.out_norm.apply(&mut normed, eps);
            let out = mlp(w, &normed, n);
            x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
            hidden_states.push(x.clone());
        }
        if let Some(norm) = &self.weights.final_norm {
            norm.apply(&mut x, eps);
            hidden_states.push(x);
        }
        Ok(EncoderTrace {
            tokens: n,
            hidden_states,
        })
    }

    /// Self-attention of `x` (`[n, hidden]`) through `w`'s output projection; `rope` rotates
    /// queries and keys by position; `window` limits each query to keys at distance ≤ window.
    fn attention(
        &self,
        w: &LayerWeights,
        x: &[f32],
        n: usize,
        rope: Option<&[(Vec<f32>, Vec<f32>)]>,
        window: Option<usize>,
    ) -> Vec<f32> {
        let c = &self.config;
        let (h, heads, d) = (c.hidden_size, c.num_attention_heads, c.head_dim);
        let mut q = w.query.apply(x, n);
        let mut k = w.key.apply(x, n);
        let v = w.value.apply(x, n);
        if let Some(tables) = rope {
            for (p, (cos, sin)) in tables.iter().enumerate().take(n) {
                Rope::apply(&mut q[p * h..(p + 1) * h], d, cos, sin);
                Rope::apply(&mut k[p * h..(p + 1) * h], d, cos, sin);
            }
        }
        let scale = 1.0 / (d as f32).sqrt();
        let mut ctx = vec![0f32; n * h];
        let mut scores = vec![0f32; n];
        for head in 0..heads {
            let o = head * d;
            for i in 0..n {
                let qi = &q[i * h + o..i * h + o + d];
                for (j, s) in scores.iter_mut().enumerate() {
                    if window.is_some_and(|w| i.abs_diff(j) > w) {
                        *s = f32::NEG_INFINITY;
                        continue;
                    }
                    let kj = &k[j * h + o..j * h + o + d];
                    *s = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                }
                softmax(&mut scores);
                let out = &mut ctx[i * h + o..i * h + o + d];
                for (j, &p) in scores.iter().enumerate() {
                    let vj = &v[j * h + o..j * h + o + d];
                    out.iter_mut().zip(vj).for_each(|(a, b)| *a += p * b);
                }
            }
        }
        w.attn_out.apply(&ctx, n)
    }

    /// The pooled (and, per the config, normalised) embedding of input `index`.
    pub fn embed(&self, index: usize, ids: &[u32]) -> Result<Vec<f32>> {
        let trace = self.forward(index, ids)?;
        Ok(self
            .pooling
            .apply(trace.last(), trace.tokens, self.config.hidden_size))
    }

    /// Classification logits of a model with a head (`None` without one).
    pub fn logits(&self, trace: &EncoderTrace) -> Option<Vec<f32>> {
        self.weights
            .head
            .as_ref()
            .map(|head| head.logits(trace.last(), trace.tokens))
    }
}

/// The MLP: `output(gelu(intermediate(x)))`, or GeGLU `output(gelu(intermediate(x)) · gate(x))`.
fn mlp(w: &LayerWeights, x: &[f32], n: usize) -> Vec<f32> {
    let mut inter = w.intermediate.apply(x, n);
    inter.iter_mut().for_each(|v| *v = gelu(*v));
    if let Some(gate) = &w.gate {
        let g = gate.apply(x, n);
        inter.iter_mut().zip(&g).for_each(|(a, b)| *a *= b);
    }
    w.output.apply(&inter, n)
}

/// Exact (erf) GELU.
pub fn gelu(v: f32) -> f32 {
    let x = v as f64;
    (0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}
