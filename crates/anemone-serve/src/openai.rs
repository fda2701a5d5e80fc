//! The OpenAI request bodies anemone reads, their validation, and the error shape
//! (`{"error": {"message", "type", "param", "code"}}`) every failure is answered in.

use anemone_runtime::engine::Prompt;
use anemone_runtime::ChatMessage;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

/// A failed request: the HTTP status and OpenAI's error object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        response
    }
}

/// `content` of a message: a string or a list of parts of which the text ones are read.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// `stop`: one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and length fields both endpoints share.
#[derive(Debug, Deserialize)]
pub struct Sampling {
    pub model: String,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    /// Chat: `true`/`false`; completions: how many alternatives (0..=5).
    #[serde(default)]
    pub logprobs: Option<serde_json::Value>,
    /// Chat only: alternatives per token (0..=20; needs `logprobs: true`).
    #[serde(default)]
    pub top_logprobs: Option<serde_json::Value>,
}

/// Which endpoint's `logprobs` convention a request follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogprobsStyle {
    /// `/v1/chat/completions`: `logprobs: bool` and `top_logprobs: 0..=20`.
    Chat,
    /// `/v1/completions` (legacy): `logprobs: 0..=5`, the number of alternatives.
    Completion,
}

/// Most alternatives `/v1/completions` returns per token (OpenAI's limit).
pub const MAX_COMPLETION_LOGPROBS: i64 = 5;

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub sampling: Sampling,
    pub messages: Vec<Message>,
}

/// `prompt` of `/v1/completions`: text, a one-element list of text, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum CompletionPrompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub sampling: Sampling,
    pub prompt: CompletionPrompt,
}

pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

impl ChatRequest {
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "`messages` is empty"));
        }
        let mut out = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(ApiError::invalid(
                    "messages",
                    format!(
                        "messages[{i}].role `{}` is not one of {}",
                        m.role,
                        ROLES.join(", ")
                    ),
                ));
            }
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    "messages",
                                    format!(
                                        "messages[{i}].content[{j}]: part type `{kind}` is not \
                                         supported (text parts only)"
                                    ),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            out.push(ChatMessage::new(m.role.clone(), content));
        }
        Ok(Prompt::Chat(out))
    }
}

impl CompletionRequest {
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        match &self.prompt {
            CompletionPrompt::Text(t) => Ok(Prompt::Text(t.clone())),
            CompletionPrompt::Texts(ts) if ts.len() == 1 => Ok(Prompt::Text(ts[0].clone())),
            CompletionPrompt::Texts(ts) => Err(ApiError::invalid(
                "prompt",
                format!(
                    "{} prompts given; one prompt per request is served",
                    ts.len()
                ),
            )),
            CompletionPrompt::Ids(ids) => Ok(Prompt::Ids(ids.clone())),
        }
    }
}

/// The checked sampling fields.
#[derive(Debug, Clone)]
pub struct Checked {
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
}

impl Sampling {
    pub fn check(&self, style: LogprobsStyle) -> Result<Checked, ApiError> {
        let logprobs = self.check_logprobs(style)?;
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid(
                    "n",
                    format!("n = {n}: only n = 1 is supported"),
                ));
            }
        }
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(v), _) => Some(("max_completion_tokens", v)),
            (None, Some(v)) => Some(("max_tokens", v)),
            (None, None) => None,
        };
        let max_tokens = match max_tokens {
            Some((name, v)) if v < 1 => {
                return Err(ApiError::invalid(
                    if name == "max_tokens" {
                        "max_tokens"
                    } else {
                        "max_completion_tokens"
                    },
                    format!("{name} = {v}: must be at least 1"),
                ))
            }
            Some((_, v)) => Some(usize::try_from(v).unwrap_or(usize::MAX)),
            None => None,
        };
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                format!("temperature = {temperature}: must be between 0 and 2"),
            ));
        }
        let top_p = match self.top_p {
            Some(p) if !(p > 0.0 && p <= 1.0) => {
                return Err(ApiError::invalid(
                    "top_p",
                    format!("top_p = {p}: must be above 0 and at most 1"),
                ))
            }
            Some(p) if p < 1.0 => Some(p as f32),
            Some(_) | None => None,
        };
        let seed = match self.seed {
            Some(s) if s < 0 => {
                return Err(ApiError::invalid(
                    "seed",
                    format!("seed = {s}: must not be negative"),
                ))
            }
            Some(s) => Some(s as u64),
            None => None,
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() > 4 => {
                return Err(ApiError::invalid(
                    "stop",
                    format!("{} stop strings given; at most 4", v.len()),
                ))
            }
            Some(Stop::Many(v)) => v.clone(),
        };
        Ok(Checked {
            max_tokens,
            temperature: temperature as f32,
            top_p,
            seed,
            stop,
            logprobs,
        })
    }

    /// `None`: no log-probabilities; `Some(n)`: the chosen token's and `n` alternatives.
    fn check_logprobs(&self, style: LogprobsStyle) -> Result<Option<usize>, ApiError> {
        use serde_json::Value;
        let int = |param: &'static str, v: &Value, max: i64| -> Result<usize, ApiError> {
            match v.as_i64() {
                Some(n) if (0..=max).contains(&n) => Ok(n as usize),
                Some(_) | None => Err(ApiError::invalid(
                    param,
                    format!("{param} = {v}: must be an integer from 0 to {max}"),
                )),
            }
        };
        let top = match &self.top_logprobs {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        };
        match style {
            LogprobsStyle::Chat => {
                let on = match &self.logprobs {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                    Some(Value::Bool(true)) => true,
                    Some(v) => {
                        return Err(ApiError::invalid(
                            "logprobs",
                            format!("logprobs = {v}: must be true or false (chat completions)"),
                        ))
                    }
                };
                let max = anemone_runtime::logprobs::MAX_TOP_LOGPROBS as i64;
                match (on, top) {
                    (true, Some(v)) => Ok(Some(int("top_logprobs", v, max)?)),
                    (true, None) => Ok(Some(0)),
                    (false, Some(v)) => Err(ApiError::invalid(
                        "top_logprobs",
                        format!("top_logprobs = {v} needs logprobs: true"),
                    )),
                    (false, None) => Ok(None),
                }
            }
            LogprobsStyle::Completion => {
                if let Some(v) = top {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        format!(
                            "top_logprobs = {v}: not a field of /v1/completions (its `logprobs` \
                             is the number of alternatives, 0 to {MAX_COMPLETION_LOGPROBS})"
                        ),
                    ));
                }
                match &self.logprobs {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => Ok(Some(int("logprobs", v, MAX_COMPLETION_LOGPROBS)?)),
                }
            }
        }
    }
}
