//! `anemone serve` end to end: a real server process on 127.0.0.1 over a tiny oracle checkpoint
//! given a word-level tokenizer and a chat template, driven over HTTP.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

/// The qwen3_gqa4 oracle fixture plus a word-level tokenizer (`w6`…`w359`) and a chat template.
fn tiny_model(dir: &Path) {
    let src = anemone_testkit::oracle_root().join("qwen3_gqa4");
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let mut vocab = serde_json::Map::new();
    for (i, t) in [
        "<unk>",
        "<s>",
        "</s>",
        "<|user|>",
        "<|assistant|>",
        "<|system|>",
    ]
    .iter()
    .enumerate()
    {
        vocab.insert(t.to_string(), json!(i));
    }
    for i in 6..360 {
        vocab.insert(format!("w{i}"), json!(i));
    }
    let tokenizer = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}});
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = json!({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false,
        "chat_template": "{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(model: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_anemone"))
        .args(["serve", "--port", "0", "--model"])
        .arg(format!("tiny={}", model.display()))
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line.trim().rsplit(' ').next().unwrap().to_string();
    assert!(base.starts_with("http://127.0.0.1:"), "{line}");
    Server { child, base }
}

fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
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
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .body("{not json")
        .header("content-type", "application/json")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.json::<Value>().unwrap()["error"]["message"].is_string());
    let (s, b) = post(
        base,
        "/v1/chat/completions",
        &json!({"model": "nope", "messages": [{"role": "user", "content": "w7"}]}),
    );
    assert_eq!(s, 404, "{b}");
    let long = vec!["w9"; 300].join(" ");
    let (s, b) = post(
        base,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": long}),
    );
    let m = b["error"]["message"].as_str().unwrap().to_string();
    assert_eq!(s, 400, "{b}");
    assert!(m.contains("300") && m.contains("256"), "{m}");
    let (s, b) = post(
        base,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "w7 w8", "max_tokens": 1000}),
    );
    assert_eq!(s, 400, "{b}");
    let (s, _) = post(
        base,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "w7", "temperature": 7}),
    );
    assert_eq!(s, 400);
    let (s, _) = post(
        base,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "w7 ".repeat(3000)}),
    );
    assert_eq!(s, 413);
    assert_eq!(
        client
            .get(format!("{base}/health"))
            .send()
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    assert!(!chat(base, "w10 w11", 8).is_empty());
    let keyed = start(dir.path(), &["--api-key", "k1"]);
    let r = client
        .get(format!("{}/v1/models", keyed.base))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client
        .get(format!("{}/v1/models", keyed.base))
        .bearer_auth("k1")
        .send()
        .unwrap();
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
            "max_tokens": 10, "temperature": 0, "stream": true}),
        )
        .send()
        .unwrap();
    let body = r.text().unwrap();
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(*data.last().unwrap(), "[DONE]");
    let text: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(text, full);
}
