//! The fp32 reference forward of the Llama / Qwen2 / Qwen3 decoder family, in the plain `(S, C)`
//! layout: the oracle every converted graph is compared with.
//!
//! One [`ReferenceModel`] holds the weights, a KV cache and a thread pool. [`ReferenceModel::forward`]
//! appends tokens to the cache (a batched causal prefill for several ids, a matrix-vector decode for
//! one) and returns logits; [`ReferenceModel::forward_traced`] also returns the residual stream after
//! every layer.

mod arena;
mod attend;
mod cache;
mod forward;
pub mod kernels;
mod matmul;
mod matvec;
pub(crate) mod rope;
mod scratch;
use anemone_backend::team;
mod weights;

use anemone_checkpoint::{Checkpoint, CheckpointError, DecoderConfig};

pub use forward::Trace;
pub use matvec::{rows_serial, rows_serial_f16};

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("tensor `{tensor}` has shape {found:?}, the reference forward expects {expected:?}")]
    TensorShape {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{tensor}` loaded {found} values, its shape implies {expected}")]
    TensorLength {
        tensor: String,
        expected: usize,
        found: usize,
    },
    #[error("decoder config: {problem}")]
    Config { problem: String },
    #[error(
        "context overflow: {requested} new token(s) at position {position} exceed the context \
         length {context_len}"
    )]
    ContextOverflow {
        position: usize,
        requested: usize,
        context_len: usize,
    },
    #[error("token id {token} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfRange { token: u32, vocab_size: usize },
    #[error("forward called with no token ids")]
    EmptyInput,
    #[error("cannot start a thread pool of {threads} thread(s): {problem}")]
    ThreadPool { threads: usize, problem: String },
}

/// Which positions' logits [`ReferenceModel::forward`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// `[vocab]`: the logits after the last id fed.
    LastPosition,
    /// `[ids.len(), vocab]`, row-major: the logits after each id fed.
    AllPositions,
}

#[derive(Debug, Clone, Default)]
pub struct ReferenceOptions {
    /// Worker threads for the matrix products; `None` = all available cores.
    pub threads: Option<usize>,
    /// Tokens the KV cache may hold; `None` = the config's `max_position_embeddings`.
    pub context_len: Option<usize>,
    /// Hold the weights in transparent huge pages (Linux, unless `ANEMONE_HUGE_PAGES=off`):
    /// single-token decode, which streams every weight per token, runs 15–25% faster on the
    /// project's host; the load is slower (the kernel clears each 2 MiB page as it is first
    /// written — on a VM that hands freed memory back to its host, ≈ 1.3 s a GB). For sessions
    /// that generate, not for prompt-at-once forwards (`gate`, `bisect`).
    pub huge_pages: bool,
}

/// The fp32 reference decoder with its KV cache.
pub struct ReferenceModel {
    config: DecoderConfig,
    weights: std::sync::Arc<weights::Weights>,
    cache: cache::KvCache,
    /// The ids in the cache (LongRoPE re-encodes them at the switch to the long factors).
    history: Vec<u32>,
    rope: rope::Ropes,
    context_len: usize,
    pool: std::sync::Arc<rayon::ThreadPool>,
    /// The one-token steps' parallel regions (decode matvecs, attention heads): as wide as
    /// `pool`, shared by every model of that width.
    team: std::sync::Arc<team::Team>,
}

impl std::fmt::Debug for ReferenceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceModel")
            .field("architecture", &self.config.architecture)
            .field("layers", &self.config.num_hidden_layers)
            .field("context_len", &self.context_len)
            .field("position", &self.cache.len())
            .finish()
    }
}

impl ReferenceModel {
    /// Loads every weight as f32 from `checkpoint` and sets up an empty cache.
    pub fn load(checkpoint: &Checkpoint, options: &ReferenceOptions) -> Result<Self, ForwardError> {
        weights::check_config(&checkpoint.config)?;
        let max = checkpoint.config.max_position_embeddings;
        let context_len = match options.context_len {
            None => max,
            Some(n) if n <= max => n,
            Some(n) => {
                return Err(ForwardError::Config {
                    problem: format!("context length {n} exceeds max_position_embeddings {max}"),
                })
            }
        };
        // LongRoPE picks its factors per forward call (by its last position), not by context
        let config = checkpoint.config.clone();
        if context_len == 0 {
            return Err(ForwardError::Config {
                problem: "context length is 0 (max_position_embeddings missing?)".into(),
            });
        }
        let threads = options.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("anemone-ref-{i}"))
            .build()
            .map_err(|e| ForwardError::ThreadPool {
                threads,
                problem: e.to_string(),
            })?;
        let team = team::Team::shared(threads).map_err(|e| ForwardError::ThreadPool {
            threads,
            problem: e.to_string(),
        })?;
        let started = std::time::Instant::now();
        let weights = weights::Weights::load(checkpoint, options.huge_pages)?;
        tracing::debug!(
            elapsed_s = started.elapsed().as_secs_f64(),
            "reference weights loaded"
        );
        Ok(Self {
            cache: cache::KvCache::new(config.num_hidden_layers, config.kv_dim()),
            history: Vec::new(),
            rope: rope::Ropes::new(&config),
            config,
            weights: std::sync::Arc::new(weights),
            context_len,
            pool: std::sync::Arc::new(pool),
            team,
        })
    }

    /// A second sequence over the same weights and thread pool, with an empty KV cache (what a
    /// server needs for concurrent sessions without a copy of the weights each).
    pub fn fork(&self) -> Self {
        Self {
            config: self.config.clone(),
            weights: std::sync::Arc::clone(&self.weights),
            cache: cache::KvCache::new(self.config.num_hidden_layers, self.config.kv_dim()),
            history: Vec::new(),
            rope: rope::Ropes::new(&self.config),
            context_len: self.context_len,
            pool: std::sync::Arc::clone(&self.pool),
            team: std::sync::Arc::clone(&self.team),
        }
    }

    /// Bytes the KV cache holds per position (keys and values of every layer, f32).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.config.num_hidden_layers * self.config.kv_dim() * std::mem::size_of::<f32>()
    }

    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// Maximum number of tokens the cache holds.
    pub fn context_len(&self) -> usize {
        self.context_len
    }

    /// Tokens already in the cache (the position of the next token fed).
    pub fn position(&self) -> usize {
        self.cache.len()
    }

    /// Empties the KV cache.
    pub fn reset(&mut self) {
        self.cache.clear();
        self.history.clear();
    }

    /// The ids one forward call runs and how many of them were already cached: `ids`, or, when
    /// they take a LongRoPE sequence past `original_max_position_embeddings` while the cache holds
    /// short-rotated keys, the whole sequence after emptying the cache (transformers' Phi-3
    /// `generate` does so; [`DecoderConfig::long_rope_reencode`]).
    fn piece(&mut self, ids: &[u32]) -> (Vec<u32>, usize) {
        let position = self.cache.len();
        self.history.extend_from_slice(ids);
        if self
            .config
            .long_rope_reencode(position, position + ids.len())
        {
            tracing::debug!(
                position,
                "LongRoPE switches to the long factors: re-encoding"
            );
            self.cache.clear();
            (self.history.clone(), position)
        } else {
            (ids.to_vec(), 0)
        }
    }

    /// Appends `ids` to the sequence and returns logits (see [`LogitsFor`]).
    pub fn forward(&mut self, ids: &[u32], which: LogitsFor) -> Result<Vec<f32>, ForwardError> {
        self.check_input(ids)?;
        let (run, skip) = self.piece(ids);
        let (pool, rope, cache) = (&self.pool, &self.rope, &mut self.cache);
        let model = forward::Model {
            config: &self.config,
            weights: &self.weights,
            team: &self.team,
        };
        let logits = pool.install(|| forward::run(model, rope, cache, &run, which, None));
        Ok(match which {
            LogitsFor::LastPosition => logits,
            LogitsFor::AllPositions => logits[skip * self.config.vocab_size..].to_vec(),
        })
    }

    /// Like `forward` with [`LogitsFor::AllPositions`], also returning the residual stream before
    /// the first layer and after each layer for the new positions.
    pub fn forward_traced(&mut self, ids: &[u32]) -> Result<Trace, ForwardError> {
        self.check_input(ids)?;
        let (run, skip) = self.piece(ids);
        let (pool, rope, cache) = (&self.pool, &self.rope, &mut self.cache);
        let model = forward::Model {
            config: &self.config,
            weights: &self.weights,
            team: &self.team,
        };
        let config = model.config;
        let mut hidden_states = Vec::with_capacity(config.num_hidden_layers + 1);
        let logits = pool.install(|| {
            forward::run(
                model,
                rope,
                cache,
                &run,
                LogitsFor::AllPositions,
                Some(&mut hidden_states),
            )
        });
        let h = config.hidden_size;
        Ok(Trace {
            logits: logits[skip * config.vocab_size..].to_vec(),
            hidden_states: hidden_states
                .into_iter()
                .map(|layer| layer[skip * h..].to_vec())
                .collect(),
        })
    }

    fn check_input(&self, ids: &[u32]) -> Result<(), ForwardError> {
        if ids.is_empty() {
            return Err(ForwardError::EmptyInput);
        }
        let position = self.cache.len();
        if position + ids.len() > self.context_len {
            return Err(ForwardError::ContextOverflow {
                position,
                requested: ids.len(),
                context_len: self.context_len,
            });
        }
        if let Some(&token) = ids.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(ForwardError::TokenOutOfRange {
                token,
                vocab_size: self.config.vocab_size,
            });
        }
        Ok(())
    }
}
