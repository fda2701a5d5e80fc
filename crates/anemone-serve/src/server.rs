//! The HTTP layer: routes, bearer auth, admission (a session per request, a bounded queue,
//! 429 beyond it), generation on blocking threads, SSE streaming, cancellation and shutdown.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anemone_runtime::encoder::Encoder;
use anemone_runtime::engine::{Completion, CompletionRequest, Engine, Prompt};
use anemone_runtime::logprobs::TokenLogprob;
use anemone_runtime::{RuntimeError, SamplerConfig};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::logprobs::LogprobsWriter;
use crate::metrics::Metrics;
use crate::openai::{
    ApiError, ChatRequest, Checked, CompletionRequest as OaCompletion, LogprobsStyle, Sampling,
};

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub addr: SocketAddr,
    /// Requests generating at once.
    pub max_sessions: usize,
    /// Requests waiting for a session; beyond them, 429.
    pub queue: usize,
    pub api_key: Option<String>,
    /// Largest request body, bytes (413 above).
    pub body_limit: usize,
    /// After SIGTERM/ctrl-c, in-flight generations get this long to finish, then are cancelled.
    pub shutdown_grace: Duration,
}

/// The models served, by name: decoders (completions) and encoders (embeddings).
#[derive(Default)]
pub struct Models {
    pub decoders: BTreeMap<String, Arc<Engine>>,
    pub encoders: BTreeMap<String, Arc<Encoder>>,
}

pub(crate) struct AppState {
    models: BTreeMap<String, Arc<Engine>>,
    pub(crate) encoders: BTreeMap<String, Arc<Encoder>>,
    config: ServeConfig,
    permits: Arc<Semaphore>,
    metrics: Metrics,
    shutting_down: Arc<AtomicBool>,
    created: u64,
}

pub(crate) type Shared = Arc<AppState>;

/// Serves `models` until SIGTERM or ctrl-c; then stops accepting, lets in-flight work finish
/// within the grace period (cancelling what remains) and returns. `on_listening` gets the bound
/// address (port 0 picks a free one).
pub async fn serve(
    config: ServeConfig,
    models: Models,
    on_listening: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.addr).await?;
    on_listening(listener.local_addr()?);
    let shutting_down = Arc::new(AtomicBool::new(false));
    let state = Arc::new(AppState {
        permits: Arc::new(Semaphore::new(config.max_sessions.max(1))),
        models: models.decoders,
        encoders: models.encoders,
        metrics: Metrics::default(),
        shutting_down: Arc::clone(&shutting_down),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        config: config.clone(),
    });
    let app = router(state);
    let grace = config.shutdown_grace;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            tracing::info!("shutting down: no new connections, finishing in-flight work");
            let flag = Arc::clone(&shutting_down);
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                flag.store(true, Ordering::Relaxed);
            });
        })
        .await
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("cannot listen for SIGTERM: {e}");
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn router(state: Shared) -> Router {
    let limit = state.config.body_limit;
    let authed = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/v1/models", get(list_models))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .merge(authed)
        .fallback(|request: Request| async move {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("no route {} {}", request.method(), request.uri().path()),
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn auth(State(state): State<Shared>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            let endpoint = request.uri().path().to_string();
            state.metrics.record_response(&endpoint, 401);
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or wrong API key: send `Authorization: Bearer KEY`",
            )
            .with_code("invalid_api_key")
            .into_response();
        }
    }
    next.run(request).await
}

async fn list_models(State(state): State<Shared>) -> Json<serde_json::Value> {
    let data: Vec<_> = state
        .models
        .iter()
        .map(|(name, engine)| {
            json!({"id": name, "object": "model", "created": state.created, "owned_by": "anemone",
                   "kind": engine.kind(), "context_length": engine.context_len()})
        })
        .chain(state.encoders.keys().map(|name| {
            json!({"id": name, "object": "model", "created": state.created, "owned_by": "anemone",
                   "kind": "encoder"})
        }))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn metrics(State(state): State<Shared>) -> Response {
    let (mut bytes, mut sessions) = (0, 0);
    for engine in state.models.values() {
        let (b, s) = engine.kept_usage();
        bytes += b;
        sessions += s;
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(bytes, sessions),
    )
        .into_response()
}

pub(crate) fn respond(
    state: &AppState,
    endpoint: &str,
    result: Result<Response, ApiError>,
) -> Response {
    let response = result.unwrap_or_else(IntoResponse::into_response);
    state
        .metrics
        .record_response(endpoint, response.status().as_u16());
    response
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is over the server's size limit".to_string()
        } else {
            rejection.body_text()
        };
        ApiError::new(status, "invalid_request_error", message)
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("request body is not a valid request: {e}"),
        )
    })
}

/// The decoder `name` (404 when nothing is served under it; 400 for an encoder).
fn find_model(state: &AppState, name: &str) -> Result<Arc<Engine>, ApiError> {
    if state.encoders.contains_key(name) {
        return Err(ApiError::invalid(
            "model",
            format!("model `{name}` is an encoder: it serves /v1/embeddings, not text generation"),
        ));
    }
    state
        .models
        .get(name)
        .cloned()
        .ok_or_else(|| unknown_model(state, name))
}

/// 404 naming the model and every served one.
pub(crate) fn unknown_model(state: &AppState, name: &str) -> ApiError {
    {
        let known: Vec<&str> = state
            .models
            .keys()
            .chain(state.encoders.keys())
            .map(String::as_str)
            .collect();
        ApiError {
            param: Some("model"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!(
                    "model `{name}` does not exist (served: {})",
                    known.join(", ")
                ),
            )
        }
        .with_code("model_not_found")
    }
}

/// Whether a decoder is served as `name`.
pub(crate) fn is_decoder(state: &AppState, name: &str) -> bool {
    state.models.contains_key(name)
}

#[derive(Clone, Copy)]
enum Api {
    Chat,
    Text,
}

impl Api {
    fn logprobs_style(self) -> LogprobsStyle {
        match self {
            Api::Chat => LogprobsStyle::Chat,
            Api::Text => LogprobsStyle::Completion,
        }
    }

    fn endpoint(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Text => "/v1/completions",
        }
    }
}

async fn chat_completions(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = parse::<ChatRequest>(body).and_then(|r| {
        let prompt = r.prompt()?;
        Ok((r.sampling, prompt))
    });
    run_request(state, Api::Chat, prepared).await
}

async fn completions(State(state): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    let prepared = parse::<OaCompletion>(body).and_then(|r| {
        let prompt = r.prompt()?;
        Ok((r.sampling, prompt))
    });
    run_request(state, Api::Text, prepared).await
}

/// Everything a generation needs, checked before it waits for a session.
struct Job {
    engine: Arc<Engine>,
    request: CompletionRequest,
    model: String,
    stream: bool,
    include_usage: bool,
}

fn prepare(
    state: &AppState,
    api: Api,
    sampling: Sampling,
    prompt: Prompt,
) -> Result<Job, ApiError> {
    let engine = find_model(state, &sampling.model)?;
    let Checked {
        max_tokens,
        temperature,
        top_p,
        seed,
        stop,
        logprobs,
    } = sampling.check(api.logprobs_style())?;
    let prompt_param = match prompt {
        Prompt::Chat(_) => "messages",
        Prompt::Text(_) | Prompt::Ids(_) => "prompt",
    };
    let prompt_ids = engine
        .encode(&prompt)
        .map_err(|e| ApiError::invalid(prompt_param, e.to_string()))?;
    let context = engine.context_len();
    if prompt_ids.len() >= context {
        return Err(ApiError::invalid(
            prompt_param,
            format!(
                "the prompt is {} tokens, the model's context is {context}: it must be shorter \
                 (prompts are never truncated)",
                prompt_ids.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let room = context - prompt_ids.len();
    let max_tokens = match max_tokens {
        Some(n) if n > room => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                    "max_tokens {n} plus the prompt's {} tokens exceed the model's context of \
                     {context} (at most {room} new tokens fit)",
                    prompt_ids.len()
                ),
            )
            .with_code("context_length_exceeded"))
        }
        Some(n) => n,
        None => room,
    };
    if let Some(id) = prompt_ids
        .iter()
        .find(|&&id| id as usize >= engine.vocab_size())
    {
        return Err(ApiError::invalid(
            "prompt",
            format!("token id {id} is outside the model's vocabulary"),
        ));
    }
    Ok(Job {
        request: CompletionRequest {
            prompt_ids,
            max_tokens,
            sampler: SamplerConfig {
                temperature,
                top_k: None,
                top_p,
                seed,
            },
            stop,
            logprobs,
        },
        model: sampling.model,
        stream: sampling.stream,
        include_usage: sampling.stream_options.is_some_and(|o| o.include_usage),
        engine,
    })
}

/// Sets the flag when dropped: the response (or its stream) is gone, so is the client.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Counts a request as queued while it waits for a session.
struct Queued<'a>(&'a Metrics);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) async fn admit(state: &AppState) -> Result<OwnedSemaphorePermit, ApiError> {
    if let Ok(permit) = Arc::clone(&state.permits).try_acquire_owned() {
        return Ok(permit);
    }
    let waiting = state.metrics.queued.fetch_add(1, Ordering::Relaxed);
    let guard = Queued(&state.metrics);
    if waiting >= state.config.queue {
        drop(guard);
        state.metrics.rejected_full.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "server busy: {} session(s) generating and {} request(s) queued; retry later",
                    state.config.max_sessions, state.config.queue
                ),
            )
        });
    }
    let permit = Arc::clone(&state.permits)
        .acquire_owned()
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "shutting down",
            )
        })?;
    drop(guard);
    Ok(permit)
}

enum Update {
    /// Released text and, when asked for, the `logprobs` object of its tokens.
    Text(String, Option<serde_json::Value>),
    Done(Result<Completion, RuntimeError>),
}

async fn run_request(
    state: Shared,
    api: Api,
    prepared: Result<(Sampling, Prompt), ApiError>,
) -> Response {
    let job = match prepared.and_then(|(s, p)| prepare(&state, api, s, p)) {
        Ok(job) => job,
        Err(e) => return respond(&state, api.endpoint(), Err(e)),
    };
    let permit = match admit(&state).await {
        Ok(p) => p,
        Err(e) => return respond(&state, api.endpoint(), Err(e)),
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<Update>(32);
    spawn_generation(&state, api, &job, Arc::clone(&cancel), tx, permit);
    let guard = CancelOnDrop(cancel);
    let id = format!(
        "{}-{}",
        match api {
            Api::Chat => "chatcmpl",
            Api::Text => "cmpl",
        },
        request_id()
    );
    if job.stream {
        state.metrics.record_response(api.endpoint(), 200);
        return stream_response(api, job, id, rx, guard).into_response();
    }
    let result = collect(rx).await;
    drop(guard);
    let response = result
        .map(|c| {
            let logprobs = job.request.logprobs.map(|_| {
                LogprobsWriter::new(&job.engine, api.logprobs_style()).render(&c.logprobs)
            });
            Json(full_body(api, &job.model, &id, state.created, &c, logprobs)).into_response()
        })
        .map_err(|e| generation_error(&e));
    respond(&state, api.endpoint(), response)
}

fn spawn_generation(
    state: &Shared,
    api: Api,
    job: &Job,
    cancel: Arc<AtomicBool>,
    tx: mpsc::Sender<Update>,
    permit: OwnedSemaphorePermit,
) {
    let engine = Arc::clone(&job.engine);
    let request = job.request.clone();
    let state = Arc::clone(state);
    let stream = job.stream;
    tokio::task::spawn_blocking(move || {
        state.metrics.active.fetch_add(1, Ordering::Relaxed);
        let shutdown = Arc::clone(&state.shutting_down);
        let mut writer = LogprobsWriter::new(&engine, api.logprobs_style());
        let with_logprobs = request.logprobs.is_some();
        let mut on_text = |piece: &str, logprobs: &[TokenLogprob]| -> Result<(), RuntimeError> {
            if shutdown.load(Ordering::Relaxed) || tx.is_closed() {
                return Err(RuntimeError::Cancelled);
            }
            if stream {
                let logprobs = with_logprobs.then(|| writer.render(logprobs));
                tx.blocking_send(Update::Text(piece.to_string(), logprobs))
                    .map_err(|_| RuntimeError::Cancelled)?;
            }
            Ok(())
        };
        let result = engine.complete(&request, &cancel, &mut on_text);
        match &result {
            Ok(c) => state.metrics.record_completion(
                c.prompt_tokens,
                c.cached_tokens,
                c.generated_ids.len(),
                c.ttft_seconds,
                c.decode_seconds,
            ),
            Err(RuntimeError::Cancelled) => {
                state.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                tracing::info!("generation cancelled");
            }
            Err(e) => tracing::warn!("generation failed: {e}"),
        }
        state.metrics.active.fetch_sub(1, Ordering::Relaxed);
        drop(permit);
        let _ = tx.blocking_send(Update::Done(result));
    });
}

async fn collect(mut rx: mpsc::Receiver<Update>) -> Result<Completion, RuntimeError> {
    while let Some(update) = rx.recv().await {
        if let Update::Done(result) = update {
            return result;
        }
    }
    Err(RuntimeError::Cancelled)
}

fn generation_error(e: &RuntimeError) -> ApiError {
    match e {
        RuntimeError::Cancelled => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "generation cancelled (server shutting down)",
        ),
        other => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("generation failed: {other}"),
        ),
    }
}

fn request_id() -> String {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{t:x}{n:x}")
}

fn usage(c: &Completion) -> serde_json::Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.generated_ids.len(),
        "total_tokens": c.prompt_tokens + c.generated_ids.len(),
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
    })
}

fn full_body(
    api: Api,
    model: &str,
    id: &str,
    created: u64,
    c: &Completion,
    logprobs: Option<serde_json::Value>,
) -> serde_json::Value {
    let finish = c.finish_reason.name();
    match api {
        Api::Chat => json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
                         "logprobs": logprobs, "finish_reason": finish}],
            "usage": usage(c),
        }),
        Api::Text => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": c.text, "logprobs": logprobs,
                         "finish_reason": finish}],
            "usage": usage(c),
        }),
    }
}

fn chunk(
    api: Api,
    model: &str,
    id: &str,
    text: Option<&str>,
    finish: Option<&str>,
    logprobs: Option<serde_json::Value>,
) -> serde_json::Value {
    match api {
        Api::Chat => {
            let delta = match text {
                Some(t) => json!({"content": t}),
                None if finish.is_none() => json!({"role": "assistant", "content": ""}),
                None => json!({}),
            };
            json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                "finish_reason": finish}]})
        }
        Api::Text => json!({"id": id, "object": "text_completion", "created": 0, "model": model,
                   "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": logprobs,
                                "finish_reason": finish}]}),
    }
}

/// Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`. Dropping the stream
/// (the client went away) cancels the generation through the guard it owns.
fn stream_response(
    api: Api,
    job: Job,
    id: String,
    rx: mpsc::Receiver<Update>,
    guard: CancelOnDrop,
) -> Sse<impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>>> {
    let model = job.model;
    let include_usage = job.include_usage;
    let first = matches!(api, Api::Chat).then(|| chunk(api, &model, &id, None, None, None));
    let state = (rx, guard, first, false, Vec::<Event>::new());
    let events = futures_util::stream::unfold(
        state,
        move |(mut rx, guard, mut first, done, mut pending)| {
            let (model, id) = (model.clone(), id.clone());
            async move {
                if let Some(value) = first.take() {
                    return Some((
                        Ok(Event::default().data(value.to_string())),
                        (rx, guard, None, done, pending),
                    ));
                }
                if let Some(event) = pending.pop() {
                    return Some((Ok(event), (rx, guard, None, done, pending)));
                }
                if done {
                    return None;
                }
                let event = match rx.recv().await {
                    Some(Update::Text(t, logprobs)) => Event::default()
                        .data(chunk(api, &model, &id, Some(&t), None, logprobs).to_string()),
                    Some(Update::Done(Ok(c))) => {
                        // Sent in reverse: `pending` is popped from the end.
                        pending.push(Event::default().data("[DONE]"));
                        if include_usage {
                            let mut u = chunk(api, &model, &id, None, None, None);
                            u["choices"] = json!([]);
                            u["usage"] = usage(&c);
                            pending.push(Event::default().data(u.to_string()));
                        }
                        let end = chunk(api, &model, &id, None, Some(c.finish_reason.name()), None);
                        return Some((
                            Ok(Event::default().data(end.to_string())),
                            (rx, guard, None, true, pending),
                        ));
                    }
                    Some(Update::Done(Err(e))) => {
                        pending.push(Event::default().data("[DONE]"));
                        let body = generation_error(&e).body();
                        return Some((
                            Ok(Event::default().data(body.to_string())),
                            (rx, guard, None, true, pending),
                        ));
                    }
                    None => return None,
                };
                Some((Ok(event), (rx, guard, None, false, pending)))
            }
        },
    );
    Sse::new(events)
}
