//! One sequence through a [`Pipeline`]: the KV states of every chunk, the position, and the
//! prefill/decode scheduling of new tokens.

use std::collections::HashMap;

use anemone_backend::{Backend, Tensor};
use anemone_mil::DType;
use anemone_models::ane::{io::chunk_inputs, lm_head, names};

use super::{backend_error, Pipeline, PipelineError};
use crate::error::RuntimeError;
use crate::model::LogitsModel;

/// What one traced feed saw.
#[derive(Debug, Clone)]
pub struct FeedTrace {
    /// `[vocab]`: the logits after the last id fed.
    pub logits: Vec<f32>,
    /// Per chunk, `[ids.len(), hidden]` row-major: the chunk's output (the residual stream after
    /// its last layer) at each new position.
    pub chunk_outputs: Vec<Vec<f32>>,
    /// Per chunk, the first op whose output held a non-finite value during this feed, as
    /// `name (type)` (only backends that see inside a package name one).
    pub first_non_finite_ops: Vec<Option<String>>,
}

/// What a traced feed collects per chunk while it runs its windows.
struct ChunkTrace {
    outputs: Vec<Vec<f32>>,
    first_non_finite_ops: Vec<Option<String>>,
}

/// The KV states of one sequence. Feeding appends tokens; [`Session::reset`] starts over.
pub struct Session<'p, B: Backend> {
    pipeline: &'p Pipeline<B>,
    chunk_states: Vec<B::State>,
    head_state: Option<B::State>,
    position: usize,
}

impl<'p, B: Backend> Session<'p, B> {
    pub(crate) fn new(pipeline: &'p Pipeline<B>) -> Result<Self, PipelineError> {
        let mut s = Session {
            pipeline,
            chunk_states: Vec::new(),
            head_state: None,
            position: 0,
        };
        s.fresh_states()?;
        Ok(s)
    }

    fn fresh_states(&mut self) -> Result<(), PipelineError> {
        let p = self.pipeline;
        self.chunk_states = p
            .chunks
            .iter()
            .map(|c| {
                p.backend
                    .new_state(&c.package, names::DECODE)
                    .map_err(|e| backend_error(&p.backend, &c.path, names::DECODE, e))
            })
            .collect::<Result<_, _>>()?;
        self.head_state = match &p.lm_head {
            Some((path, package)) => Some(
                p.backend
                    .new_state(package, lm_head::FUNCTION)
                    .map_err(|e| backend_error(&p.backend, path, lm_head::FUNCTION, e))?,
            ),
            None => None,
        };
        self.position = 0;
        Ok(())
    }

    pub fn pipeline(&self) -> &'p Pipeline<B> {
        self.pipeline
    }

    /// Tokens fed since the last reset.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Forgets every token. States are zeroed, not just masked: a stale inf or NaN times a zero
    /// attention weight is still NaN.
    pub fn reset(&mut self) {
        let p = self.pipeline;
        for s in self.chunk_states.iter_mut().chain(self.head_state.as_mut()) {
            p.backend.reset_state(s);
        }
        self.position = 0;
    }

    /// Appends `ids` and returns the `[vocab]` logits after the last of them.
    pub fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>, PipelineError> {
        Ok(self.run(ids, false)?.logits)
    }

    /// Like [`Session::feed`], also returning every chunk's output at every new position.
    pub fn feed_traced(&mut self, ids: &[u32]) -> Result<FeedTrace, PipelineError> {
        self.run(ids, true)
    }

    fn check(&self, ids: &[u32]) -> Result<(), PipelineError> {
        if ids.is_empty() {
            return Err(PipelineError::EmptyInput);
        }
        let context = self.pipeline.context();
        if self.position + ids.len() > context {
            return Err(PipelineError::ContextOverflow {
                position: self.position,
                requested: ids.len(),
                context,
            });
        }
        let vocab_size = self.pipeline.vocab_size();
        if let Some(&token) = ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(PipelineError::TokenOutOfRange { token, vocab_size });
        }
        Ok(())
    }

    fn run(&mut self, ids: &[u32], trace: bool) -> Result<FeedTrace, PipelineError> {
        self.check(ids)?;
        let p = self.pipeline;
        let h = p.manifest.config.hidden_size;
        let layout = p.manifest.kv_layout();
        let prefill_len = p.manifest.conversion.prefill_len;
        let traced_chunks = if trace { p.chunks.len() } else { 0 };
        let mut chunk_trace = ChunkTrace {
            outputs: vec![Vec::new(); traced_chunks],
            first_non_finite_ops: vec![None; traced_chunks],
        };
        let mut last_hidden = Vec::new();
        let mut done = 0;
        while done < ids.len() {
            let remaining = ids.len() - done;
            let first = self.position + done;
            // the prefill window writes all prefill_len KV slots (padding included): it must fit
            // the context and not cross the end of a sliding layers' ring; a lone token, a tail
            // near the end of the context or the last slots before a ring's end go through decode
            let (function, t) = if remaining >= 2 && layout.prefill_fits(first, prefill_len) {
                (names::PREFILL, prefill_len)
            } else {
                (names::DECODE, 1)
            };
            let real = remaining.min(t);
            let window = &ids[done..done + real];
            let hidden = self.run_window(
                function,
                t,
                first,
                window,
                trace.then_some(&mut chunk_trace),
            )?;
            last_hidden = column(&hidden, h, t, real - 1);
            done += real;
        }
        self.position += ids.len();
        let logits = self.head(&last_hidden)?;
        Ok(FeedTrace {
            logits,
            chunk_outputs: chunk_trace.outputs,
            first_non_finite_ops: chunk_trace.first_non_finite_ops,
        })
    }

    /// Runs `window` (at most `t` ids, padded to `t`) at positions `first..` through every chunk
    /// with `function`; returns the last chunk's output `[hidden, t]`.
    fn run_window(
        &mut self,
        function: &str,
        t: usize,
        first: usize,
        window: &[u32],
        mut trace: Option<&mut ChunkTrace>,
    ) -> Result<Vec<f32>, PipelineError> {
        let p = self.pipeline;
        let config = &p.manifest.config;
        let h = config.hidden_size;
        let dtype = p.activation_dtype;
        let mut hidden = vec![0f32; h * t];
        let embedding_scale = config.embedding_scale();
        for (col, &id) in window.iter().enumerate() {
            for (c, v) in p.host.embedding(id).iter().enumerate() {
                hidden[c * t + col] = *v * embedding_scale;
            }
        }
        let input = |name: &str, dtype: DType, shape: Vec<usize>, data: Vec<f32>| {
            Tensor::new(dtype, shape, data).map_err(|e| PipelineError::Output {
                package: p.dir.clone(),
                function: function.to_string(),
                output: name.to_string(),
                problem: format!("building the input: {e}"),
            })
        };
        let mut inputs: HashMap<String, Tensor> = HashMap::new();
        let layout = p.manifest.kv_layout();
        for i in chunk_inputs(config, &layout, first, t, p.manifest.conversion.mask_value) {
            let dtype = if i.int32 { DType::I32 } else { dtype };
            inputs.insert(i.name.into(), input(i.name, dtype, i.shape, i.values)?);
        }
        for (index, chunk) in p.chunks.iter().enumerate() {
            inputs.insert(
                names::HIDDEN_IN.into(),
                input(names::HIDDEN_IN, dtype, vec![1, h, 1, t], hidden)?,
            );
            let state = &mut self.chunk_states[index];
            let (mut outputs, first_non_finite) = if trace.is_some() {
                p.backend
                    .predict_checked(&chunk.package, function, &inputs, state)
            } else {
                p.backend
                    .predict(&chunk.package, function, &inputs, state)
                    .map(|outputs| (outputs, None))
            }
            .map_err(|e| backend_error(&p.backend, &chunk.path, function, e))?;
            let out = take_output(
                &mut outputs,
                &chunk.path,
                function,
                names::HIDDEN_OUT,
                h * t,
            )?;
            if let Some(trace) = trace.as_deref_mut() {
                for col in 0..window.len() {
                    trace.outputs[index].extend(column(&out, h, t, col));
                }
                let first = &mut trace.first_non_finite_ops[index];
                if first.is_none() {
                    *first = first_non_finite;
                }
            }
            hidden = out;
        }
        Ok(hidden)
    }

    /// Logits of one hidden vector: host final norm + LM head, or the LM-head package.
    fn head(&mut self, x: &[f32]) -> Result<Vec<f32>, PipelineError> {
        let p = self.pipeline;
        let Some((path, package)) = &p.lm_head else {
            let host = &p.host;
            return Ok(match &p.host_pool {
                Some(pool) => pool.install(|| host.logits(x)),
                None => host.logits(x),
            });
        };
        let entry = p
            .manifest
            .lm_head
            .as_ref()
            .ok_or_else(|| PipelineError::Manifest {
                dir: p.dir.clone(),
                problem: "lm_head package loaded without a manifest entry".into(),
            })?;
        let h = x.len();
        let tensor =
            Tensor::new(p.activation_dtype, vec![1, h, 1, 1], x.to_vec()).map_err(|e| {
                PipelineError::Output {
                    package: path.clone(),
                    function: lm_head::FUNCTION.into(),
                    output: lm_head::INPUT.into(),
                    problem: format!("building the input: {e}"),
                }
            })?;
        let inputs = HashMap::from([(lm_head::INPUT.to_string(), tensor)]);
        let state = self
            .head_state
            .as_mut()
            .ok_or_else(|| PipelineError::Manifest {
                dir: p.dir.clone(),
                problem: "lm_head package without a state".into(),
            })?;
        let mut outputs = p
            .backend
            .predict(package, lm_head::FUNCTION, &inputs, state)
            .map_err(|e| backend_error(&p.backend, path, lm_head::FUNCTION, e))?;
        let mut logits = Vec::with_capacity(p.vocab_size());
        for (i, (first, len)) in entry.vocab_slices.iter().enumerate() {
            if *first != logits.len() {
                return Err(PipelineError::Manifest {
                    dir: p.dir.clone(),
                    problem: format!(
                        "lm_head vocab slice {i} starts at {first}, expected {}",
                        logits.len()
                    ),
                });
            }
            let name = format!("logits_{i}");
            logits.extend(take_output(
                &mut outputs,
                path,
                lm_head::FUNCTION,
                &name,
                *len,
            )?);
        }
        if logits.len() != p.vocab_size() {
            return Err(PipelineError::Manifest {
                dir: p.dir.clone(),
                problem: format!(
                    "lm_head vocab slices cover {} ids, the vocabulary has {}",
                    logits.len(),
                    p.vocab_size()
                ),
            });
        }
        Ok(logits)
    }
}

fn take_output(
    outputs: &mut HashMap<String, Tensor>,
    package: &std::path::Path,
    function: &str,
    name: &str,
    numel: usize,
) -> Result<Vec<f32>, PipelineError> {
    let bad = |problem: String| PipelineError::Output {
        package: package.to_path_buf(),
        function: function.to_string(),
        output: name.to_string(),
        problem,
    };
    let t = outputs.remove(name).ok_or_else(|| {
        bad(format!(
            "missing (outputs: {:?})",
            outputs.keys().collect::<Vec<_>>()
        ))
    })?;
    if t.data.len() != numel {
        return Err(bad(format!("{} values, expected {numel}", t.data.len())));
    }
    Ok(t.data)
}

/// Column `col` of a `[rows, t]` row-major matrix (one token's vector in the BC1S layout).
fn column(data: &[f32], rows: usize, t: usize, col: usize) -> Vec<f32> {
    (0..rows).map(|r| data[r * t + col]).collect()
}

impl<B: Backend> LogitsModel for Session<'_, B> {
    fn reset(&mut self) {
        Session::reset(self)
    }

    fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        let backend = self.pipeline.backend.name();
        Session::feed(self, ids).map_err(|e| RuntimeError::Backend {
            backend,
            source: Box::new(e),
        })
    }

    fn vocab_size(&self) -> usize {
        self.pipeline.vocab_size()
    }

    fn context_len(&self) -> usize {
        self.pipeline.context()
    }

    fn position(&self) -> usize {
        self.position
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_reads_one_token_of_bc1s() {
        // [rows=2, t=3]
        let d = [1., 2., 3., 4., 5., 6.];
        assert_eq!(column(&d, 2, 3, 1), vec![2., 5.]);
    }
}
