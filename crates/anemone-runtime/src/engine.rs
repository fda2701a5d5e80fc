//! A loaded model ready to serve many requests (synchronous; the async HTTP layer lives in
//! `anemone-serve`): prompts to ids (plain or chat), one session per in-flight request, stop
//! strings, cancellation, and **prefix reuse** — sessions are kept after a request with the ids
//! they hold, and a request whose ids extend a kept session's continues from there (the next
//! turn of a chat, a shared system prompt) instead of prefilling again. Kept sessions are evicted
//! least recently used first, within a byte budget.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anemone_backend::Backend;
use anemone_checkpoint::TokenizerBundle;
use anemone_models::reference::{ReferenceModel, ReferenceOptions};

use crate::backend::{run_on_backend, BackendChoice, PipelineTask};
use crate::chat::ChatMessage;
use crate::error::RuntimeError;
use crate::generate::{continue_generation_observed, GenerationOptions};
use crate::logprobs::{token_logprob, TokenLogprob};
use crate::model::LogitsModel;
use crate::pipeline::{LoadTimings, Pipeline, PipelineError, PipelineOptions};
use crate::stops::StopFilter;
use crate::{prompt, SamplerConfig, TextStream};

/// Sees released text and the log-probabilities of the tokens that made it.
pub type OnText<'a> = dyn FnMut(&str, &[TokenLogprob]) -> Result<(), RuntimeError> + 'a;

/// A session a request owns while it runs.
pub type BoxedSession = Box<dyn LogitsModel + Send>;

/// Where sessions come from: a checkpoint's reference forward or a bundle's pipeline.
trait SessionSource: Send + Sync {
    fn new_session(&self) -> Result<BoxedSession, RuntimeError>;
    /// Bytes a session holding `position` ids occupies.
    fn session_bytes(&self, position: usize) -> usize;
    fn vocab_size(&self) -> usize;
}

struct ReferenceSource {
    model: ReferenceModel,
}

impl SessionSource for ReferenceSource {
    fn new_session(&self) -> Result<BoxedSession, RuntimeError> {
        Ok(Box::new(self.model.fork()))
    }
    fn session_bytes(&self, position: usize) -> usize {
        position * self.model.kv_bytes_per_token()
    }
    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }
}

/// A bundle's pipeline, alive for the rest of the process (a server or benchmark loads its
/// models once), so its sessions can be kept and moved between threads.
struct BundleSource<B: Backend> {
    pipeline: &'static Pipeline<B>,
    bytes_per_session: usize,
}

impl<B: Backend> SessionSource for BundleSource<B> {
    fn new_session(&self) -> Result<BoxedSession, RuntimeError> {
        let session = self.pipeline.session().map_err(|e| RuntimeError::Backend {
            backend: self.pipeline.backend().name(),
            source: Box::new(e),
        })?;
        Ok(Box::new(session))
    }
    fn session_bytes(&self, _position: usize) -> usize {
        // Bundle states are allocated for the whole context.
        self.bytes_per_session
    }
    fn vocab_size(&self) -> usize {
        self.pipeline.vocab_size()
    }
}

/// What a request asks to continue.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Plain text (the tokenizer's special tokens and BOS as the model wants them).
    Text(String),
    /// Messages rendered with the model's chat template, the assistant's turn opened.
    Chat(Vec<ChatMessage>),
    /// Token ids as given.
    Ids(Vec<u32>),
}

/// Why a completion ended, as OpenAI's `finish_reason` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence id or a stop string.
    Stop,
    /// `max_tokens` were generated.
    Length,
}

impl FinishReason {
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub prompt_ids: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    /// Report each generated token's log-probability and this many most likely alternatives
    /// (`None`: no log-probabilities).
    pub logprobs: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct Completion {
    pub text: String,
    pub generated_ids: Vec<u32>,
    pub prompt_tokens: usize,
    /// Prompt ids found in a kept session's state (not prefilled).
    pub cached_tokens: usize,
    pub finish_reason: FinishReason,
    /// With [`CompletionRequest::logprobs`]: one entry per token of `text` (end-of-sequence ids
    /// and tokens cut by a stop string have none).
    pub logprobs: Vec<TokenLogprob>,
    /// From the start of the request's work to its first token.
    pub ttft_seconds: f64,
    pub decode_seconds: f64,
}

/// Kept sessions and the ids each holds.
struct Kept {
    ids: Vec<u32>,
    session: BoxedSession,
    bytes: usize,
    last_used: u64,
}

#[derive(Default)]
struct KeptSessions {
    entries: Vec<Kept>,
    clock: u64,
}

/// A model loaded for serving.
pub struct Engine {
    source: Box<dyn SessionSource>,
    tokenizer: Option<TokenizerBundle>,
    stop_ids: Vec<u32>,
    context_len: usize,
    kv_memory: usize,
    kept: Mutex<KeptSessions>,
    kind: &'static str,
    /// Bundles: where the load time went.
    load_timings: Option<LoadTimings>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("kind", &self.kind)
            .field("context_len", &self.context_len)
            .finish()
    }
}

/// Errors of [`Engine::open`]: the path's loading error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{}: {source}", path.display())]
    Checkpoint {
        path: std::path::PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{}: {source}", path.display())]
    Bundle {
        path: std::path::PathBuf,
        #[source]
        source: Box<PipelineError>,
    },
}

impl Engine {
    /// Loads a bundle (a directory with `anemone.json`) on `choice`, or a checkpoint (Hugging
    /// Face directory or GGUF file) for the fp32 reference forward with `choice.threads`.
    /// `kv_memory`: bytes of kept sessions (0 turns prefix reuse off). `verify_hashes`: check a
    /// bundle's files against its manifest first.
    pub fn open(
        path: &Path,
        choice: &BackendChoice,
        kv_memory: usize,
        verify_hashes: bool,
    ) -> Result<Self, EngineError> {
        if path.join(anemone_models::bundle::MANIFEST_FILE).is_file() {
            let options = PipelineOptions {
                host_threads: choice.threads,
                verify_hashes,
                ..PipelineOptions::default()
            };
            let bundle = |source: PipelineError| EngineError::Bundle {
                path: path.to_path_buf(),
                source: Box::new(source),
            };
            let (source, tokenizer, stop_ids, context_len, timings) =
                run_on_backend(path, choice, &options, LeakPipeline).map_err(bundle)?;
            let mut engine = Self::new(
                source,
                tokenizer,
                stop_ids,
                context_len,
                kv_memory,
                "bundle",
            );
            engine.load_timings = Some(timings);
            return Ok(engine);
        }
        let checkpoint_error =
            |source: Box<dyn std::error::Error + Send + Sync>| EngineError::Checkpoint {
                path: path.to_path_buf(),
                source,
            };
        let checkpoint =
            anemone_models::open_checkpoint(path).map_err(|e| checkpoint_error(Box::new(e)))?;
        let options = ReferenceOptions {
            threads: choice.threads,
            context_len: None,
            // a session decodes token by token: see the field
            huge_pages: true,
        };
        let model = ReferenceModel::load(&checkpoint, &options)
            .map_err(|e| checkpoint_error(Box::new(e)))?;
        let stop_ids = prompt::stop_ids(
            &checkpoint.config.eos_token_ids,
            checkpoint.tokenizer.as_ref(),
        );
        let context_len = model.context_len();
        Ok(Self::new(
            Box::new(ReferenceSource { model }),
            checkpoint.tokenizer,
            stop_ids,
            context_len,
            kv_memory,
            "checkpoint",
        ))
    }

    fn new(
        source: Box<dyn SessionSource>,
        tokenizer: Option<TokenizerBundle>,
        stop_ids: Vec<u32>,
        context_len: usize,
        kv_memory: usize,
        kind: &'static str,
    ) -> Self {
        Self {
            source,
            tokenizer,
            stop_ids,
            context_len,
            kv_memory,
            kept: Mutex::new(KeptSessions::default()),
            kind,
            load_timings: None,
        }
    }

    /// Bundles: where the load time went (`None` for a checkpoint).
    pub fn load_timings(&self) -> Option<LoadTimings> {
        self.load_timings
    }

    /// `checkpoint` (reference forward) or `bundle`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    pub fn context_len(&self) -> usize {
        self.context_len
    }

    pub fn vocab_size(&self) -> usize {
        self.source.vocab_size()
    }

    pub fn tokenizer(&self) -> Option<&TokenizerBundle> {
        self.tokenizer.as_ref()
    }

    /// The prompt's ids (the chat template applied for [`Prompt::Chat`]).
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, RuntimeError> {
        let tokenizer = || {
            self.tokenizer.as_ref().ok_or(RuntimeError::NoTokenizer {
                needed_for: "a text prompt",
            })
        };
        let ids = match prompt {
            Prompt::Ids(ids) => ids.clone(),
            Prompt::Text(text) => prompt::encode_plain(tokenizer()?, text)?,
            Prompt::Chat(messages) => {
                let bundle = tokenizer()?;
                let rendered = prompt::render_chat(bundle, messages)?;
                bundle
                    .tokenizer
                    .encode(rendered, false)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|e| RuntimeError::Tokenizer {
                        operation: "encode",
                        problem: e.to_string(),
                    })?
            }
        };
        if ids.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        Ok(ids)
    }

    /// Bytes the kept sessions hold now, and how many there are.
    pub fn kept_usage(&self) -> (usize, usize) {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        (
            kept.entries.iter().map(|k| k.bytes).sum(),
            kept.entries.len(),
        )
    }

    /// Runs one request on a session of its own (a kept one when the prompt extends its ids).
    /// `on_text` sees released text as soon as it is complete (stop strings held back), with the
    /// log-probabilities of the tokens that made it (when asked for); it or `cancel` stops
    /// generation with [`RuntimeError::Cancelled`], and the session is kept for reuse either way.
    pub fn complete(
        &self,
        request: &CompletionRequest,
        cancel: &AtomicBool,
        on_text: &mut OnText<'_>,
    ) -> Result<Completion, RuntimeError> {
        let started = Instant::now();
        let prompt = &request.prompt_ids;
        let mut session = match self.take_kept(prompt) {
            Some(session) => session,
            None => self.source.new_session()?,
        };
        let held_before = session.position();
        let options = GenerationOptions {
            max_tokens: request.max_tokens,
            sampler: request.sampler.clone(),
            force_ids: None,
            capture_logits: false,
            stop_ids: self.stop_ids.clone(),
        };
        let mut stream = self
            .tokenizer
            .as_ref()
            .map(|b| TextStream::new(&b.tokenizer));
        let mut filter = StopFilter::new(&request.stop);
        let mut text = String::new();
        let mut first_token_at = None;
        let mut stopped_by_string = false;
        let mut generated = Vec::new();
        // Log-probabilities of tokens whose text is not released yet, and of the released ones.
        let mut pending: Vec<TokenLogprob> = Vec::new();
        let mut logprobs: Vec<TokenLogprob> = Vec::new();
        let mut on_token = |id: u32, logits: &[f32]| -> Result<(), RuntimeError> {
            first_token_at.get_or_insert_with(Instant::now);
            generated.push(id);
            if cancel.load(Ordering::Relaxed) {
                return Err(RuntimeError::Cancelled);
            }
            if self.stop_ids.contains(&id) {
                return Ok(());
            }
            if let Some(top) = request.logprobs {
                pending.push(token_logprob(logits, id, top));
            }
            let piece = match stream.as_mut() {
                Some(s) => s.push(id)?,
                None => Some(format!("{id} ")),
            };
            if let Some(piece) = piece {
                let (release, stopped) = filter.push(&piece);
                if !release.is_empty() {
                    text.push_str(&release);
                    on_text(&release, &pending)?;
                    logprobs.append(&mut pending);
                }
                if stopped {
                    stopped_by_string = true;
                    return Err(RuntimeError::Cancelled);
                }
            }
            Ok(())
        };
        let result =
            continue_generation_observed(session.as_mut(), prompt, &options, &mut on_token);
        match result {
            Ok(_) => {}
            Err(RuntimeError::Cancelled) if stopped_by_string => {}
            Err(e) => {
                self.keep_after_error(prompt, session, &e);
                return Err(e);
            }
        }
        let finish_reason = match (stopped_by_string, generated.last()) {
            (true, _) => FinishReason::Stop,
            (false, Some(last)) if self.stop_ids.contains(last) => FinishReason::Stop,
            (false, _) => FinishReason::Length,
        };
        if !stopped_by_string {
            if let Some(rest) = match stream.as_mut() {
                Some(s) => s.finish()?,
                None => None,
            } {
                let (release, _) = filter.push(&rest);
                text.push_str(&release);
                on_text(&release, &pending)?;
                logprobs.append(&mut pending);
            }
            let rest = filter.finish();
            if !rest.is_empty() || !pending.is_empty() {
                text.push_str(&rest);
                on_text(&rest, &pending)?;
                logprobs.append(&mut pending);
            }
        }
        let first = first_token_at.unwrap_or_else(Instant::now);
        let kept_ids = held_ids(prompt, &generated, session.position());
        self.keep(kept_ids, session);
        Ok(Completion {
            text,
            prompt_tokens: prompt.len(),
            cached_tokens: held_before,
            generated_ids: generated,
            finish_reason,
            logprobs,
            ttft_seconds: first.duration_since(started).as_secs_f64(),
            decode_seconds: first.elapsed().as_secs_f64(),
        })
    }

    /// A cancelled session still holds a valid prefix; any other failure discards it.
    fn keep_after_error(&self, prompt: &[u32], session: BoxedSession, error: &RuntimeError) {
        if matches!(error, RuntimeError::Cancelled) && session.position() <= prompt.len() {
            let ids = prompt[..session.position()].to_vec();
            self.keep(ids, session);
        }
    }

    /// Removes and returns the kept session holding the longest proper prefix of `prompt`.
    fn take_kept(&self, prompt: &[u32]) -> Option<BoxedSession> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let best = kept
            .entries
            .iter()
            .enumerate()
            .filter(|(_, k)| !k.ids.is_empty() && k.ids.len() < prompt.len())
            .filter(|(_, k)| prompt.starts_with(&k.ids))
            .max_by_key(|(_, k)| k.ids.len())
            .map(|(i, _)| i)?;
        let entry = kept.entries.swap_remove(best);
        tracing::debug!(reused = entry.ids.len(), "prefix reuse");
        Some(entry.session)
    }

    fn keep(&self, ids: Vec<u32>, session: BoxedSession) {
        if ids.is_empty() || session.position() != ids.len() {
            return;
        }
        let bytes = self.source.session_bytes(ids.len());
        if bytes > self.kv_memory {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.clock += 1;
        let last_used = kept.clock;
        kept.entries.retain(|k| k.ids != ids);
        kept.entries.push(Kept {
            ids,
            session,
            bytes,
            last_used,
        });
        while kept.entries.iter().map(|k| k.bytes).sum::<usize>() > self.kv_memory {
            let oldest = kept
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, k)| k.last_used)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => drop(kept.entries.swap_remove(i)),
                None => break,
            }
        }
    }
}

/// The ids a session at `position` holds: the prompt, then the generated ids that were fed.
fn held_ids(prompt: &[u32], generated: &[u32], position: usize) -> Vec<u32> {
    prompt
        .iter()
        .chain(generated)
        .take(position)
        .copied()
        .collect()
}

/// Leaks the opened pipeline (it lives as long as the process) and wraps it as a session source.
struct LeakPipeline;

impl PipelineTask for LeakPipeline {
    type Output = (
        Box<dyn SessionSource>,
        Option<TokenizerBundle>,
        Vec<u32>,
        usize,
        LoadTimings,
    );

    fn run<B: Backend>(self, pipeline: Pipeline<B>) -> Self::Output {
        let pipeline: &'static Pipeline<B> = Box::leak(Box::new(pipeline));
        let config = &pipeline.manifest().config;
        // K and V per layer, as the backend holds the bundle's fp16-declared KV state
        let bytes_per_session = 2
            * config.num_hidden_layers
            * config.kv_dim()
            * pipeline.context()
            * pipeline
                .backend()
                .state_element_bytes(anemone_mil::DType::F16);
        let tokenizer = pipeline.tokenizer().cloned();
        (
            Box::new(BundleSource {
                pipeline,
                bytes_per_session,
            }),
            tokenizer,
            pipeline.stop_ids(),
            pipeline.context(),
            pipeline.load_timings(),
        )
    }
}

/// Timings of one [`Engine::timed_run`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct TimedRun {
    pub prompt_tokens: usize,
    /// Seconds of the prompt's forward pass (ends with the first token's logits).
    pub prefill_s: f64,
    /// Seconds of each single-token step after the first token.
    pub token_s: Vec<f64>,
    /// The token each single-token step fed (the greedy path; what a peer engine is
    /// teacher-forced along to do the same work).
    pub fed: Vec<u32>,
}

impl Engine {
    /// A benchmark run on a fresh session: `prompt_ids` prefilled, then `gen` greedy tokens
    /// (end-of-sequence ids do not stop it), every step timed.
    pub fn timed_run(&self, prompt_ids: &[u32], gen: usize) -> Result<TimedRun, RuntimeError> {
        if prompt_ids.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        if prompt_ids.len() + gen > self.context_len {
            return Err(RuntimeError::ContextOverflow {
                prompt_len: prompt_ids.len(),
                new_tokens: gen,
                context_len: self.context_len,
            });
        }
        let mut session = self.source.new_session()?;
        let mut sampler = crate::Sampler::new(SamplerConfig::default())?;
        let started = Instant::now();
        let mut logits = session.feed(prompt_ids)?;
        let prefill_s = started.elapsed().as_secs_f64();
        let mut token_s = Vec::with_capacity(gen);
        let mut fed = Vec::with_capacity(gen);
        for _ in 1..gen {
            let token = sampler.sample(&logits);
            let step = Instant::now();
            logits = session.feed(&[token])?;
            token_s.push(step.elapsed().as_secs_f64());
            fed.push(token);
        }
        Ok(TimedRun {
            prompt_tokens: prompt_ids.len(),
            prefill_s,
            token_s,
            fed,
        })
    }
}
