//! `POST /v1/embeddings` for encoder models: `input` as a string, a list of strings, a list of
//! token ids or a list of such lists; `encoding_format` `float` or `base64` (little-endian f32,
//! as OpenAI sends it); `usage` counts the input tokens. Each request takes a session slot like
//! a generation; inputs are tokenized and checked before it waits for one. An input longer
//! than the model's largest length bucket is a 400 naming both lengths (never truncated).

use std::sync::Arc;

use anemone_models::encoder::EncoderError;
use anemone_runtime::encoder::{Encoder, EncoderRunError};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::openai::ApiError;
use crate::server::{admit, is_decoder, parse, respond, unknown_model, Shared};

const ENDPOINT: &str = "/v1/embeddings";
/// Most inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: EmbeddingInput,
    #[serde(default)]
    pub encoding_format: Option<String>,
    #[serde(default)]
    pub dimensions: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Float,
    Base64,
}

struct Job {
    encoder: Arc<Encoder>,
    model: String,
    ids: Vec<Vec<u32>>,
    format: Format,
    dimensions: Option<usize>,
}

fn prepare(state: &Shared, request: EmbeddingRequest) -> Result<Job, ApiError> {
    let Some(encoder) = state.encoders.get(&request.model).cloned() else {
        if is_decoder(state, &request.model) {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "model `{}` is a decoder; /v1/embeddings serves encoder models",
                    request.model
                ),
            ));
        }
        return Err(unknown_model(state, &request.model));
    };
    let format = match request.encoding_format.as_deref() {
        None | Some("float") => Format::Float,
        Some("base64") => Format::Base64,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format `{other}`: must be `float` or `base64`"),
            ))
        }
    };
    let dimensions = match request.dimensions {
        None => None,
        Some(d) if d >= 1 => Some(d as usize),
        Some(d) => {
            return Err(ApiError::invalid(
                "dimensions",
                format!("dimensions = {d}: must be at least 1"),
            ))
        }
    };
    let ids = match request.input {
        EmbeddingInput::Text(text) => encoder.tokenize(&[text]).map_err(input_error)?,
        EmbeddingInput::Texts(texts) => {
            check_count(texts.len())?;
            encoder.tokenize(&texts).map_err(input_error)?
        }
        EmbeddingInput::Ids(ids) => vec![ids],
        EmbeddingInput::IdLists(lists) => {
            check_count(lists.len())?;
            lists
        }
    };
    if let Some(index) = ids.iter().position(Vec::is_empty) {
        return Err(ApiError::invalid(
            "input",
            format!("input {index}: no tokens (nothing to embed)"),
        ));
    }
    if let Some(buckets) = encoder.buckets() {
        for (index, list) in ids.iter().enumerate() {
            buckets
                .pick(index, list.len())
                .map_err(|e| input_error(e.into()))?;
        }
    }
    Ok(Job {
        encoder,
        model: request.model,
        ids,
        format,
        dimensions,
    })
}

fn check_count(n: usize) -> Result<(), ApiError> {
    match n {
        0 => Err(ApiError::invalid("input", "`input` is an empty list")),
        n if n > MAX_INPUTS => Err(ApiError::invalid(
            "input",
            format!("{n} inputs given; at most {MAX_INPUTS} per request"),
        )),
        _ => Ok(()),
    }
}

/// Problems of the request's inputs are 400s (a too-long one names both lengths); anything
/// else is the server's.
fn input_error(e: EncoderRunError) -> ApiError {
    match &e {
        EncoderRunError::Encoder(EncoderError::TooLong { .. }) => {
            ApiError::invalid("input", e.to_string()).with_code("context_length_exceeded")
        }
        EncoderRunError::Encoder(
            EncoderError::EmptyInput { .. }
            | EncoderError::TokenId { .. }
            | EncoderError::Tokenizer { .. },
        ) => ApiError::invalid("input", e.to_string()),
        _ => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("embedding failed: {e}"),
        ),
    }
}

pub(crate) async fn embeddings(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let mut job = match parse::<EmbeddingRequest>(body).and_then(|r| prepare(&state, r)) {
        Ok(job) => job,
        Err(e) => return respond(&state, ENDPOINT, Err(e)),
    };
    let permit = match admit(&state).await {
        Ok(p) => p,
        Err(e) => return respond(&state, ENDPOINT, Err(e)),
    };
    let encoder = Arc::clone(&job.encoder);
    let ids = std::mem::take(&mut job.ids);
    let result = tokio::task::spawn_blocking(move || {
        let result = encoder.embed_ids(&ids);
        drop(permit);
        result
    })
    .await;
    let result = match result {
        Ok(Ok(embedded)) => response_body(&job, embedded).map(|v| Json(v).into_response()),
        Ok(Err(e)) => Err(input_error(e)),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("embedding task failed: {e}"),
        )),
    };
    respond(&state, ENDPOINT, result)
}

fn response_body(
    job: &Job,
    embedded: Vec<anemone_runtime::encoder::Embedded>,
) -> Result<Value, ApiError> {
    let mut data = Vec::with_capacity(embedded.len());
    let mut tokens = 0;
    for e in embedded {
        tokens += e.tokens;
        if let Some(d) = job.dimensions {
            if d != e.embedding.len() {
                return Err(ApiError::invalid(
                    "dimensions",
                    format!(
                        "dimensions = {d}: model `{}` makes {}-dimensional embeddings and does \
                         not shorten them",
                        job.model,
                        e.embedding.len()
                    ),
                ));
            }
        }
        let embedding = match job.format {
            Format::Float => json!(e.embedding),
            Format::Base64 => {
                let bytes: Vec<u8> = e.embedding.iter().flat_map(|v| v.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        };
        data.push(json!({"object": "embedding", "index": e.index, "embedding": embedding}));
    }
    Ok(json!({
        "object": "list",
        "data": data,
        "model": job.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}
