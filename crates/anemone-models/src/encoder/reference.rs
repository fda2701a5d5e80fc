//! The fp32 reference forward of a BERT-family encoder (plain `[tokens, hidden]` layout): the
//! oracle the encoder bundles are gated against. It runs an input's own tokens only, which is
//! what a padded batch with an attention mask computes for them.

use super::{EncoderCheckpoint, EncoderConfig, EncoderError, Pooling, Result};
use crate::families::bert::is_roberta;
use crate::reference::kernels::{matmul_t, softmax};

/// One linear layer: `w` is `[out, in]` (Hugging Face order), `b` is `[out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub n_out: usize,
    pub n_in: usize,
}

impl Linear {
    fn load(ck: &EncoderCheckpoint, name: &str, n_out: usize, n_in: usize) -> Result<Self> {
        Ok(Linear {
            w: ck.load_f32(&format!("{name}.weight"))?,
            b: ck.load_f32(&format!("{name}.bias"))?,
            n_out,
            n_in,
        })
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
    fn load(ck: &EncoderCheckpoint, name: &str) -> Result<Self> {
        Ok(Norm {
            w: ck.load_f32(&format!("{name}.weight"))?,
            b: ck.load_f32(&format!("{name}.bias"))?,
        })
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

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub attn_out: Linear,
    pub attn_norm: Norm,
    pub intermediate: Linear,
    pub output: Linear,
    pub out_norm: Norm,
}

/// A classification head on the first token's final state.
#[derive(Debug, Clone)]
pub enum Head {
    /// BERT: `tanh(pooler.dense(h₀))` → `classifier`.
    BertPooler { pooler: Linear, classifier: Linear },
    /// RoBERTa: `tanh(classifier.dense(h₀))` → `classifier.out_proj`.
    Roberta { dense: Linear, out_proj: Linear },
}

impl Head {
    pub fn logits(&self, first: &[f32]) -> Vec<f32> {
        let (a, b) = match self {
            Head::BertPooler { pooler, classifier } => (pooler, classifier),
            Head::Roberta { dense, out_proj } => (dense, out_proj),
        };
        let mut h = a.apply(first, 1);
        h.iter_mut().for_each(|v| *v = v.tanh());
        b.apply(&h, 1)
    }
}

/// Every weight of an encoder in f32.
#[derive(Debug, Clone)]
pub struct EncoderWeights {
    pub word: Vec<f32>,
    pub position: Vec<f32>,
    pub token_type: Option<Vec<f32>>,
    pub embed_norm: Norm,
    pub layers: Vec<LayerWeights>,
    pub head: Option<Head>,
}

impl EncoderWeights {
    pub fn load(ck: &EncoderCheckpoint) -> Result<Self> {
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
                attn_norm: Norm::load(ck, &format!("{p}.attention.output.LayerNorm"))?,
                intermediate: Linear::load(ck, &format!("{p}.intermediate.dense"), i, h)?,
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
            position: ck.load_f32(&t("embeddings.position_embeddings.weight"))?,
            token_type: if c.type_vocab_size > 0 {
                Some(ck.load_f32(&t("embeddings.token_type_embeddings.weight"))?)
            } else {
                None
            },
            embed_norm: Norm::load(ck, &t("embeddings.LayerNorm"))?,
            layers,
            head,
        })
    }

    /// Word + position + token-type (type 0) embeddings of `ids`, before the embedding
    /// LayerNorm: what the host computes for the ANE graph. `[ids.len(), hidden]`.
    pub fn embed_raw(&self, config: &EncoderConfig, index: usize, ids: &[u32]) -> Result<Vec<f32>> {
        super::bundle::embed_tables(
            config,
            &self.word,
            &self.position,
            self.token_type.as_deref(),
            index,
            ids,
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

    /// Runs input `index` (its token ids, special tokens included).
    pub fn forward(&self, index: usize, ids: &[u32]) -> Result<EncoderTrace> {
        let c = &self.config;
        let eps = c.layer_norm_eps;
        let (n, h, heads, d) = (ids.len(), c.hidden_size, c.num_attention_heads, c.head_dim);
        if n == 0 {
            return Err(EncoderError::EmptyInput { index });
        }
        let mut x = self.weights.embed_raw(c, index, ids)?;
        self.weights.embed_norm.apply(&mut x, eps);
        let mut hidden_states = vec![x.clone()];
        let scale = 1.0 / (d as f32).sqrt();
        for w in &self.weights.layers {
            let q = w.query.apply(&x, n);
            let k = w.key.apply(&x, n);
            let v = w.value.apply(&x, n);
            let mut ctx = vec![0f32; n * h];
            let mut scores = vec![0f32; n];
            for head in 0..heads {
                let o = head * d;
                for i in 0..n {
                    let qi = &q[i * h + o..i * h + o + d];
                    for (j, s) in scores.iter_mut().enumerate() {
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
            let attn = w.attn_out.apply(&ctx, n);
            x.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);
            w.attn_norm.apply(&mut x, eps);
            let mut inter = w.intermediate.apply(&x, n);
            inter.iter_mut().for_each(|v| *v = gelu(*v));
            let out = w.output.apply(&inter, n);
            x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
            w.out_norm.apply(&mut x, eps);
            hidden_states.push(x.clone());
        }
        Ok(EncoderTrace {
            tokens: n,
            hidden_states,
        })
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
        let h = self.config.hidden_size;
        self.weights
            .head
            .as_ref()
            .map(|head| head.logits(&trace.last()[..h]))
    }
}

/// Exact (erf) GELU.
pub fn gelu(v: f32) -> f32 {
    let x = v as f64;
    (0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}
