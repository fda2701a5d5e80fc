//! The generation loop: prefill the prompt, then pick (or force) one token at a time, with EOS
//! stop, per-step logits capture and prefill/decode throughput.

use crate::error::RuntimeError;
use crate::model::LogitsModel;
use crate::sampler::{Sampler, SamplerConfig};
use std::time::Instant;

#[derive(Debug, Clone, Default)]
pub struct GenerationOptions {
    /// Tokens to generate at most (ignored when `force_ids` is set).
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Teacher forcing: step `i` takes `force_ids[i]` instead of sampling, so step `i`'s logits are
    /// those after the prompt and `force_ids[..i]`. One step per forced id; no EOS stop.
    pub force_ids: Option<Vec<u32>>,
    /// Keep the logits that chose every generated token.
    pub capture_logits: bool,
    /// Generation ends after any of these ids (the id itself is kept in the output).
    pub stop_ids: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop id was generated.
    Eos,
    /// `max_tokens` were generated.
    MaxTokens,
    /// Every forced id was fed.
    ForcedIds,
}

#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    /// `[generated_ids.len(), vocab]` row-major when captured, else empty: row `i` is the logits
    /// that chose `generated_ids[i]`.
    pub logits: Vec<f32>,
    pub vocab_size: usize,
    pub stop_reason: StopReason,
    pub prefill_seconds: f64,
    /// Wall time of the single-token steps (everything after the prefill).
    pub decode_seconds: f64,
    /// Single-token forward passes run (one fewer than the generated tokens, at most).
    pub decode_steps: usize,
    /// Prompt ids that were already in the model's state (not prefilled again).
    pub reused_tokens: usize,
}

impl Generation {
    pub fn prefill_tok_s(&self) -> f64 {
        rate(
            self.prompt_ids.len() - self.reused_tokens,
            self.prefill_seconds,
        )
    }

    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decode_steps, self.decode_seconds)
    }
}

fn rate(tokens: usize, seconds: f64) -> f64 {
    if tokens == 0 || seconds <= 0.0 {
        0.0
    } else {
        tokens as f64 / seconds
    }
}

/// Runs `prompt_ids` through `model` from an empty state and generates. `on_token` sees every
/// token as soon as it is chosen (for streaming).
///
/// Fails before running anything when the prompt plus the requested tokens exceed the model's
/// context: output is never silently truncated.
pub fn generate(
    model: &mut dyn LogitsModel,
    prompt_ids: &[u32],
    options: &GenerationOptions,
    on_token: &mut dyn FnMut(u32) -> Result<(), RuntimeError>,
) -> Result<Generation, RuntimeError> {
    check_request(model, prompt_ids, options)?;
    model.reset();
    continue_generation(model, prompt_ids, options, on_token)
}

/// Like [`generate`] on a model that already holds a prefix of `prompt_ids` (a kept session:
/// the previous turn of a chat, a shared system prompt): only the ids after `model.position()`
/// are fed. The model must hold fewer ids than the prompt (the last one is fed to get logits);
/// the caller guarantees the held ids are exactly `prompt_ids[..model.position()]`.
///
/// `on_token` may return [`RuntimeError::Cancelled`] to stop; the model then holds the prompt
/// and the tokens fed so far ([`LogitsModel::position`] says how many).
pub fn continue_generation(
    model: &mut dyn LogitsModel,
    prompt_ids: &[u32],
    options: &GenerationOptions,
    on_token: &mut dyn FnMut(u32) -> Result<(), RuntimeError>,
) -> Result<Generation, RuntimeError> {
    continue_generation_observed(model, prompt_ids, options, &mut |id, _| on_token(id))
}

/// A per-token callback that also sees the logits the token was chosen from.
pub type ObservedToken<'a> = dyn FnMut(u32, &[f32]) -> Result<(), RuntimeError> + 'a;

/// [`continue_generation`] whose callback also sees the logits each token was chosen from
/// (for log-probabilities), without keeping them.
pub fn continue_generation_observed(
    model: &mut dyn LogitsModel,
    prompt_ids: &[u32],
    options: &GenerationOptions,
    on_token: &mut ObservedToken<'_>,
) -> Result<Generation, RuntimeError> {
    let steps = check_request(model, prompt_ids, options)?;
    let held = model.position();
    if held >= prompt_ids.len() {
        return Err(RuntimeError::PrefixTooLong {
            held,
            prompt_len: prompt_ids.len(),
        });
    }
    let mut sampler = Sampler::new(options.sampler.clone())?;
    let vocab_size = model.vocab_size();

    let started = Instant::now();
    let mut logits = model.feed(&prompt_ids[held..])?;
    let prefill_seconds = started.elapsed().as_secs_f64();

    let decode_started = Instant::now();
    let mut generated_ids = Vec::with_capacity(steps);
    let mut captured = Vec::new();
    let mut decode_steps = 0;
    let mut stop_reason = match options.force_ids {
        Some(_) => StopReason::ForcedIds,
        None => StopReason::MaxTokens,
    };
    for step in 0..steps {
        if logits.len() != vocab_size {
            return Err(RuntimeError::LogitsLength {
                expected: vocab_size,
                found: logits.len(),
            });
        }
        let token = match &options.force_ids {
            Some(forced) => forced[step],
            None => sampler.sample(&logits),
        };
        if options.capture_logits {
            captured.extend_from_slice(&logits);
        }
        generated_ids.push(token);
        on_token(token, &logits)?;
        if options.force_ids.is_none() && options.stop_ids.contains(&token) {
            stop_reason = StopReason::Eos;
            break;
        }
        if step + 1 == steps {
            break;
        }
        logits = model.feed(&[token])?;
        decode_steps += 1;
    }
    let decode_seconds = decode_started.elapsed().as_secs_f64();
    Ok(Generation {
        prompt_ids: prompt_ids.to_vec(),
        generated_ids,
        logits: captured,
        vocab_size,
        stop_reason,
        prefill_seconds,
        decode_seconds,
        decode_steps,
        reused_tokens: held,
    })
}

/// The number of steps the request asks for, once the prompt is known to be non-empty and to
/// fit in the context with them.
fn check_request(
    model: &dyn LogitsModel,
    prompt_ids: &[u32],
    options: &GenerationOptions,
) -> Result<usize, RuntimeError> {
    if prompt_ids.is_empty() {
        return Err(RuntimeError::EmptyPrompt);
    }
    let steps = options
        .force_ids
        .as_ref()
        .map_or(options.max_tokens, Vec::len);
    let context_len = model.context_len();
    if prompt_ids.len() + steps > context_len {
        return Err(RuntimeError::ContextOverflow {
            prompt_len: prompt_ids.len(),
            new_tokens: steps,
            context_len,
        });
    }
    Ok(steps)
}
