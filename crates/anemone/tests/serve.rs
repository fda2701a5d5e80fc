//! `anemone serve` end to end: a real server process on 127.0.0.1 over a tiny oracle checkpoint
//! given a word-level tokenizer and a chat template, driven over HTTP.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::serve::{post, start, tiny_model, Server};

/// The server still answers: `/health` and a one-token completion.
fn assert_serving(base: &str) {
    let health = reqwest::blocking::get(format!("{base}/health")).unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let (s, b) = post(
        base,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "w7 w8", "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["usage"]["completion_tokens"], 1, "{b}");
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
fn assert_error(status: u16, body: &Value, want: u16, kind: &str) -> String {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

fn chat(base: &str, prompt: &str, max_tokens: usize) -> String {
    let (status, body) = post(
        base,
        "/v1/chat/completions",
        &json!({"model": "tiny",
        "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}),
    );
    assert_eq!(status, 200, "{body}");
    body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn errors_come_in_openai_shape_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let server = start(dir.path(), &["--body-limit-kib", "4", "--kv-memory", "0"]);
    let base = &server.base;
    let client = reqwest::blocking::Client::new();
    assert_serving(base);

    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .body("{not json")
        .header("content-type", "application/json")
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let m = assert_error(status, &r.json().unwrap(), 400, "invalid_request_error");
    assert!(m.contains("not a valid request"), "{m}");
    assert_serving(base);

    let (s, b) = post(
        base,
        "/v1/chat/completions",
        &json!({"model": "nope", "messages": [{"role": "user", "content": "w7"}]}),
    );
    let m = assert_error(s, &b, 404, "invalid_request_error");
    assert!(m.contains("nope") && m.contains("tiny"), "{m}");
    assert_eq!(b["error"]["code"], "model_not_found");
    assert_serving(base);

    // 300 prompt ids against a context of 256: refused, naming both, never truncated.
    let long = vec!["w9"; 300].join(" ");
    let (s, b) = post(
        base,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": long}),
    );
    let m = assert_error(s, &b, 400, "invalid_request_error");
    assert!(m.contains("300") && m.contains("256"), "{m}");
    assert_eq!(b["error"]["code"], "context_length_exceeded");
    assert_eq!(b["error"]["param"], "prompt");
    assert_serving(base);

    let (s, b) = post(
        base,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "w7 w8", "max_tokens": 1000}),
    );
    let m = assert_error(s, &b, 400, "invalid_request_error");
    assert!(m.contains("1000") && m.contains("256"), "{m}");
    assert_eq!(b["error"]["param"], "max_tokens");
    assert_serving(base);

    for (field, value) in [
        ("temperature", json!(7)),
        ("top_p", json!(0)),
        ("max_tokens", json!(0)),
        ("n", json!(2)),
        ("seed", json!(-1)),
    ] {
        let mut body = json!({"model": "tiny", "prompt": "w7"});
        body[field] = value;
        let (s, b) = post(base, "/v1/completions", &body);
        let m = assert_error(s, &b, 400, "invalid_request_error");
        assert_eq!(b["error"]["param"], field, "{b}");
        assert!(m.contains(field), "{m}");
        assert_serving(base);
    }

    let (s, b) = post(
        base,
        "/v1/chat/completions",
        &json!({"model": "tiny", "messages": [{"role": "wizard", "content": "w7"}]}),
    );
    let m = assert_error(s, &b, 400, "invalid_request_error");
    assert!(m.contains("wizard"), "{m}");
    assert_serving(base);

    let (s, b) = post(
        base,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "w7 ".repeat(3000)}),
    );
    let m = assert_error(s, &b, 413, "invalid_request_error");
    assert!(m.contains("size limit"), "{m}");
    assert_serving(base);

    let r = client.get(format!("{base}/v1/nothing")).send().unwrap();
    let status = r.status().as_u16();
    assert_error(status, &r.json().unwrap(), 404, "invalid_request_error");
    assert_serving(base);

    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["context_length"], 256);
    assert!(!chat(base, "w10 w11", 8).is_empty());

    let keyed = start(dir.path(), &["--api-key", "k1"]);
    for key in [None, Some("k2")] {
        let mut request = client.get(format!("{}/v1/models", keyed.base));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let r = request.send().unwrap();
        let status = r.status().as_u16();
        assert_error(status, &r.json().unwrap(), 401, "invalid_request_error");
    }
    let r = client
        .post(format!("{}/v1/completions", keyed.base))
        .json(&json!({"model": "tiny", "prompt": "w7", "max_tokens": 1}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client
        .get(format!("{}/v1/models", keyed.base))
        .bearer_auth("k1")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = client
        .post(format!("{}/v1/completions", keyed.base))
        .bearer_auth("k1")
        .json(&json!({"model": "tiny", "prompt": "w7", "max_tokens": 1}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // /health stays open for probes.
    let r = client.get(format!("{}/health", keyed.base)).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[test]
fn thirty_two_concurrent_clients_each_get_their_own_answer() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let server = start(dir.path(), &["--max-sessions", "4", "--queue", "64"]);
    let prompts: Vec<String> = (0..32)
        .map(|i| format!("w{} w{} w{}", 10 + i, 50 + 3 * i, 200 + i))
        .collect();
    let alone: Vec<String> = prompts.iter().map(|p| chat(&server.base, p, 12)).collect();
    let handles: Vec<_> = prompts
        .iter()
        .cloned()
        .map(|p| {
            let base = server.base.clone();
            std::thread::spawn(move || chat(&base, &p, 12))
        })
        .collect();
    let together: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(together, alone);
    let text = reqwest::blocking::get(format!("{}/metrics", server.base))
        .unwrap()
        .text()
        .unwrap();
    assert!(
        text.contains(
            "anemone_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 64"
        ),
        "{text}"
    );
}

#[test]
fn streaming_sends_openai_chunks_ending_with_done() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let server = start(dir.path(), &[]);
    let full = chat(&server.base, "w20 w21", 10);
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/v1/chat/completions", server.base))
        .json(
            &json!({"model": "tiny", "messages": [{"role": "user", "content": "w20 w21"}],
            "max_tokens": 10, "temperature": 0, "stream": true,
            "stream_options": {"include_usage": true}}),
        )
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let content_type = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let body = r.text().unwrap();
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(*data.last().unwrap(), "[DONE]", "{body}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"), "{id}");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["id"], id, "{c}");
        assert_eq!(c["model"], "tiny", "{c}");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    // The last chunk carries only usage; the one before it the finish reason.
    let (usage, rest) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]), "{usage}");
    let finish = &rest.last().unwrap()["choices"][0]["finish_reason"];
    assert!(finish == "length" || finish == "stop", "{finish}");
    let text: String = rest
        .iter()
        .map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(text, full);
    let generated = usage["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=10).contains(&generated), "{usage}");
    assert_eq!(
        usage["usage"]["total_tokens"].as_u64().unwrap(),
        usage["usage"]["prompt_tokens"].as_u64().unwrap() + generated
    );
}

/// The second turn of a chat continues from the first turn's kept KV state: the same answer as
/// a server without prefix reuse, with the first turn's ids reported as cached.
#[test]
fn the_next_turn_of_a_chat_reuses_the_kept_prefix() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let warm = start(dir.path(), &[]);
    let cold = start(dir.path(), &["--kv-memory", "0"]);
    let turn = |base: &str, messages: &Value| {
        let (s, b) = post(
            base,
            "/v1/chat/completions",
            &json!({"model": "tiny", "messages": messages, "max_tokens": 6, "temperature": 0}),
        );
        assert_eq!(s, 200, "{b}");
        b
    };
    let first = json!([{"role": "system", "content": "w30 w31 w32 w33"},
                       {"role": "user", "content": "w40 w41 w42"}]);
    let a1 = turn(&warm.base, &first);
    assert_eq!(a1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let answer = a1["choices"][0]["message"]["content"].as_str().unwrap();
    let second = json!([{"role": "system", "content": "w30 w31 w32 w33"},
                        {"role": "user", "content": "w40 w41 w42"},
                        {"role": "assistant", "content": answer},
                        {"role": "user", "content": "w50 w51"}]);
    let warm2 = turn(&warm.base, &second);
    let cold2 = turn(&cold.base, &second);
    let cached = warm2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The first turn's prompt at least (system + user + the assistant tag).
    assert!(cached >= 9, "{warm2}");
    assert!(
        cached < warm2["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{warm2}"
    );
    assert_eq!(cold2["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        warm2["choices"][0]["message"]["content"],
        cold2["choices"][0]["message"]["content"]
    );
}

fn metric(base: &str, name: &str) -> u64 {
    let text = reqwest::blocking::get(format!("{base}/metrics"))
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

/// SmolLM2 (real model: slow enough per token that a long request holds its session):
/// `--max-sessions 1 --queue 0` answers a second request 429 with Retry-After while the first
/// generates; the first client disconnecting cancels its generation and frees the session.
#[test]
fn queue_overflow_is_429_and_a_disconnect_cancels_the_generation() {
    let model = anemone_testkit::model("smollm2-135m-instruct.Q4_1.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_anemone"))
        .args([
            "serve",
            "--port",
            "0",
            "--max-sessions",
            "1",
            "--queue",
            "0",
        ])
        .args(["--kv-memory", "0", "--model"])
        .arg(format!("tiny={}", model.display()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let server = Server {
        child,
        base: line.trim().rsplit(' ').next().unwrap().to_string(),
    };
    let base = &server.base;
    let client = reqwest::blocking::Client::new();
    let mut long = client
        .post(format!("{base}/v1/chat/completions"))
        .json(
            &json!({"model": "tiny", "stream": true, "max_tokens": 2000, "temperature": 0,
                      "messages": [{"role": "user", "content": "Tell me a very long story."}]}),
        )
        .send()
        .unwrap();
    assert_eq!(long.status().as_u16(), 200);
    // Wait for generated text: the session is taken and generating.
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !seen.contains("\"content\":\"") || seen.matches("data: ").count() < 3 {
        let n = std::io::Read::read(&mut long, &mut buf).unwrap();
        assert!(n > 0, "stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert_eq!(metric(base, "anemone_active_sessions"), 1);
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "tiny", "prompt": "Hi", "max_tokens": 1}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let b: Value = r.json().unwrap();
    assert_eq!(b["error"]["type"], "rate_limit_error", "{b}");
    assert_eq!(metric(base, "anemone_requests_rejected_total"), 1);

    drop(long);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while metric(base, "anemone_requests_cancelled_total") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the disconnected client's generation was not cancelled"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    while metric(base, "anemone_active_sessions") != 0 {
        assert!(std::time::Instant::now() < deadline, "session not freed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (s, b) = post(
        base,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "The capital of France is", "max_tokens": 2,
                "temperature": 0}),
    );
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["usage"]["completion_tokens"], 2, "{b}");
}

/// The official `openai` Python client (installed into the test venv by `scripts/test.sh`),
/// chat and text completions, streaming and not, against the same greedy answers.
#[test]
fn the_openai_python_client_talks_to_the_server() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let server = start(dir.path(), &["--api-key", "k1"]);
    let script = r#"
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="k1")
msgs = [{"role": "user", "content": "w20 w21"}]
full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0)
parts = []
for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10,
                                             temperature=0, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
text = client.completions.create(model="tiny", prompt="w7 w8", max_tokens=4, temperature=0)
models = [m.id for m in client.models.list()]
try:
    client.chat.completions.create(model="nope", messages=msgs)
    missing = None
except openai.NotFoundError as e:
    missing = e.status_code
bad = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="wrong", max_retries=0)
try:
    bad.models.list()
    unauthorized = None
except openai.AuthenticationError as e:
    unauthorized = e.status_code
print(json.dumps({"full": full.choices[0].message.content, "streamed": "".join(parts),
                  "finish": full.choices[0].finish_reason, "usage": full.usage.total_tokens,
                  "text": text.choices[0].text, "models": models, "missing": missing,
                  "unauthorized": unauthorized}))
"#;
    let out = anemone_testkit::validator::run_python(&[
        std::ffi::OsStr::new("-c"),
        std::ffi::OsStr::new(script),
        std::ffi::OsStr::new(&server.base),
    ]);
    assert!(
        out.status.success(),
        "the openai client failed (is `openai` installed in the test python? scripts/test.sh \
         installs it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    let full = got["full"].as_str().unwrap();
    assert!(!full.is_empty(), "{got}");
    assert_eq!(got["streamed"], full, "{got}");
    assert!(got["usage"].as_u64().unwrap() > 0, "{got}");
    assert!(!got["text"].as_str().unwrap().is_empty(), "{got}");
    assert_eq!(got["models"], json!(["tiny"]));
    assert_eq!(got["missing"], 404);
    assert_eq!(got["unauthorized"], 401);
}
