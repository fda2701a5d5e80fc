//! Helpers of the `anemone serve` tests: a tiny chat model and a server process on a free port.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

/// The qwen3_gqa4 oracle fixture plus a word-level tokenizer (`w6`…`w359`) and a chat template.
pub fn tiny_model(dir: &Path) {
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

pub struct Server {
    pub child: Child,
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(model: &Path, extra: &[&str]) -> Server {
    start_models(&[format!("tiny={}", model.display())], extra)
}

/// A server of every `NAME=PATH` in `models`, on a free port.
pub fn start_models(models: &[String], extra: &[&str]) -> Server {
    let mut command = Command::new(env!("CARGO_BIN_EXE_anemone"));
    command.args(["serve", "--port", "0"]);
    for spec in models {
        command.arg("--model").arg(spec);
    }
    let mut child = command.args(extra).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line.trim().rsplit(' ').next().unwrap().to_string();
    assert!(base.starts_with("http://127.0.0.1:"), "{line}");
    Server { child, base }
}

pub fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}
