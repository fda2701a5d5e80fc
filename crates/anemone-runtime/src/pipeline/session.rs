//! One sequence through a [`Pipeline`]: the KV states of every chunk, the position, and the
//! prefill/decode scheduling of new tokens.

use std::collections::HashMap;

use anemone_backend::{Backend, Tensor};
use anemone_checkpoint::RopeFactors;
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
    /// Per window width (`prefill_len`, 1): the two activation buffers chunks hand the residual
    /// stream through (ping-pong: chunk `i` reads one and writes the other).
    buffers: HashMap<usize, [B::Buffer; 2]>,
    /// `[1, hidden, 1, 1]`: the LM-head package's input when the last window was wider than one
    /// (the backend copies the last token's position into it).
    head_input: Option<B::Buffer>,
    position: usize,
    /// The ids fed since the last reset (LongRoPE re-encodes them at its switch).
    history: Vec<u32>,
}

impl<'p, B: Backend> Session<'p, B> {
    pub(crate) fn new(pipeline: &'p Pipeline<B>) -> Result<Self, PipelineError> {
        let mut s = Session {
            pipeline,
            chunk_states: Vec::new(),
            head_state: None,
            buffers: HashMap::new(),
            head_input: None,
            position: 0,
            history: Vec::new(),
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
        self.history.clear();
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
        self.history.clear();
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
        if p.manifest
            .config
            .long_rope_reencode(self.position, self.position + ids.len())
        {
            return self.reencode(ids, trace);
        }
        if ids.len() >= 2 {
            // a prompt (a single id is a decode step, which reads the head every token)
            p.host.start_prompt();
        }
        let layout = p.manifest.kv_layout();
        let prefill_len = p.manifest.conversion.prefill_len;
        let traced_chunks = if trace { p.chunks.len() } else { 0 };
        let mut chunk_trace = ChunkTrace {
            outputs: vec![Vec::new(); traced_chunks],
            first_non_finite_ops: vec![None; traced_chunks],
        };
        // the last window: its function, width and the column of the last id fed
        let mut last_window = (names::DECODE, 1, 0);
        // LongRoPE's factors: by the end of this whole piece (transformers' per-call choice)
        let factors = p.manifest.config.rope_factors(self.position + ids.len());
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
            self.run_window(
                function,
                t,
                first,
                factors,
                window,
                trace.then_some(&mut chunk_trace),
            )?;
            last_window = (function, t, real - 1);
            done += real;
        }
        self.position += ids.len();
        self.history.extend_from_slice(ids);
        let (function, t, col) = last_window;
        let logits = self.head(function, t, col)?;
        Ok(FeedTrace {
            logits,
            chunk_outputs: chunk_trace.outputs,
            first_non_finite_ops: chunk_trace.first_non_finite_ops,
        })
    }

    /// LongRoPE's switch to the long factors while the states hold keys rotated with the short
    /// ones: the whole sequence is fed again from empty states, as transformers' Phi-3
    /// `generate` does (`DecoderConfig::long_rope_reencode`). On an error the session is reset.
    fn reencode(&mut self, ids: &[u32], trace: bool) -> Result<FeedTrace, PipelineError> {
        let mut all = std::mem::take(&mut self.history);
        let skip = all.len();
        all.extend_from_slice(ids);
        tracing::debug!(
            position = skip,
            "LongRoPE switches to the long factors: re-encoding"
        );
        self.reset();
        let mut out = self.run(&all, trace).inspect_err(|_| self.reset())?;
        let h = self.pipeline.manifest.config.hidden_size;
        for chunk in &mut out.chunk_outputs {
            chunk.drain(..skip * h);
        }
        Ok(out)
    }

    /// Runs `window` (at most `t` ids, padded to `t`) at positions `first..` through every chunk
    /// with `function` and the fed piece's RoPE `factors`; the last chunk's output `[1, hidden,
    /// 1, t]` is left in the window width's buffer `chunks.len() % 2`.
    fn run_window(
        &mut self,
        function: &str,
        t: usize,
        first: usize,
        factors: RopeFactors,
        window: &[u32],
        mut trace: Option<&mut ChunkTrace>,
    ) -> Result<(), PipelineError> {
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
        let mask_value = p.manifest.conversion.mask_value;
        for i in chunk_inputs(config, &layout, first, t, factors, mask_value) {
            let dtype = if i.int32 { DType::I32 } else { dtype };
            inputs.insert(i.name.into(), input(i.name, dtype, i.shape, i.values)?);
        }
        let shape = [1, h, 1, t];
        let buffers = match self.buffers.entry(t) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let new = || {
                    p.backend
                        .new_buffer(dtype, &shape)
                        .map_err(|e| backend_error(&p.backend, &p.dir, "(buffer)", e))
                };
                e.insert([new()?, new()?])
            }
        };
        let embedded = input(names::HIDDEN_IN, dtype, shape.to_vec(), hidden)?;
        p.backend
            .write_buffer(&mut buffers[0], &embedded)
            .map_err(|e| backend_error(&p.backend, &p.dir, "(buffer)", e))?;
        for (index, chunk) in p.chunks.iter().enumerate() {
            let [even, odd] = buffers;
            let (from, to) = if index % 2 == 0 {
                (even, odd)
            } else {
                (odd, even)
            };
            let state = &mut self.chunk_states[index];
            let (_, first_non_finite) = p
                .backend
                .predict_buffers(
                    &chunk.package,
                    function,
                    &mut inputs,
                    &mut [(names::HIDDEN_IN, from)],
                    &mut [(names::HIDDEN_OUT, &mut *to)],
                    state,
                    trace.is_some(),
                )
                .map_err(|e| backend_error(&p.backend, &chunk.path, function, e))?;
            if let Some(trace) = trace.as_deref_mut() {
                let out = read_buffer(p, to, &chunk.path, function, h * t)?;
                for col in 0..window.len() {
                    trace.outputs[index].extend(column(&out, h, t, col));
                }
                let first = &mut trace.first_non_finite_ops[index];
                if first.is_none() {
                    *first = first_non_finite;
                }
            }
        }
        Ok(())
    }

    /// Logits of the last id fed, at column `col` of the last chunk's output of a `function`
    /// window `t` wide: the host reads that column and runs the final norm + LM head, or the
    /// LM-head package takes it straight from the backend's buffer (copied by the backend into
    /// a one-wide buffer when `t > 1`): the hidden state never goes through the host.
    fn head(&mut self, function: &str, t: usize, col: usize) -> Result<Vec<f32>, PipelineError> {
        let p = self.pipeline;
        let h = p.manifest.config.hidden_size;
        let last_path = p.chunks.last().map_or(&p.dir, |c| &c.path);
        let last = self
            .buffers
            .get_mut(&t)
            .map(|pair| &mut pair[p.chunks.len() % 2])
            .ok_or_else(|| PipelineError::Manifest {
                dir: p.dir.clone(),
                problem: format!("no activation buffer of width {t} after a window"),
            })?;
        let Some((path, package)) = &p.lm_head else {
            let hidden = read_buffer(p, last, last_path, function, h * t)?;
            let x = column(&hidden, h, t, col);
            let host = &p.host;
            return Ok(match &p.host_team {
                Some(team) => host.logits(&x, Some(team)),
                None => host.logits(&x, anemone_exec::team::current().as_deref()),
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
        let input = if t == 1 {
            last
        } else {
            let head_input = match &mut self.head_input {
                Some(b) => b,
                None => self.head_input.insert(
                    p.backend
                        .new_buffer(p.activation_dtype, &[1, h, 1, 1])
                        .map_err(|e| backend_error(&p.backend, path, "(buffer)", e))?,
                ),
            };
            p.backend
                .copy_position(last, col, head_input)
                .map_err(|e| backend_error(&p.backend, path, "(buffer)", e))?;
            head_input
        };
        let state = self
            .head_state
            .as_mut()
            .ok_or_else(|| PipelineError::Manifest {
                dir: p.dir.clone(),
                problem: "lm_head package without a state".into(),
            })?;
        let (mut outputs, _) = p
            .backend
            .predict_buffers(
                package,
                lm_head::FUNCTION,
                &mut HashMap::new(),
                &mut [(lm_head::INPUT, input)],
                &mut [],
                state,
                false,
            )
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

/// A chunk output's values from its buffer (the host reads only these: the final hidden state
/// when the host runs the LM head, and every chunk's output when tracing).
fn read_buffer<B: Backend>(
    p: &Pipeline<B>,
    buffer: &B::Buffer,
    package: &std::path::Path,
    function: &str,
    numel: usize,
) -> Result<Vec<f32>, PipelineError> {
    let t = p
        .backend
        .read_buffer(buffer)
        .map_err(|e| backend_error(&p.backend, package, function, e))?;
    if t.data.len() != numel {
        return Err(PipelineError::Output {
            package: package.to_path_buf(),
            function: function.to_string(),
            output: names::HIDDEN_OUT.to_string(),
            problem: format!("{} values, expected {numel}", t.data.len()),
        });
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
