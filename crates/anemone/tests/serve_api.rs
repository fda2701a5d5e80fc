//! `anemone serve`: log-probabilities, `/v1/embeddings`, SIGTERM draining, and the keys of
//! `anemone bench --json`.

mod support;

use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::serve::{post, start, start_models, tiny_model};

fn run_python(script: &str, base: &str) -> Value {
    let out = anemone_testkit::validator::run_python(&[
        std::ffi::OsStr::new("-c"),
        std::ffi::OsStr::new(script),
        std::ffi::OsStr::new(base),
    ]);
    assert!(
        out.status.success(),
        "the openai client failed (scripts/test.sh installs `openai` into the test python):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The official `openai` client asks for logprobs (chat: streaming and not; completions): OpenAI's
/// shapes, and under greedy decoding every chosen token is the most likely one, its logprob the
/// maximum. Out-of-range values are 400s in OpenAI's error shape.
#[test]
fn logprobs_come_in_openai_shape_and_greedy_picks_the_max() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let server = start(dir.path(), &[]);
    let script = r#"
import json, sys
import openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
msgs = [{"role": "user", "content": "w20 w21 w22"}]
full = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0,
                                 logprobs=True, top_logprobs=5)
streamed = []
for chunk in c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=5, stream=True):
    if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
        streamed += [e.model_dump() for e in chunk.choices[0].logprobs.content]
text = c.completions.create(model="tiny", prompt="w7 w8 w9", max_tokens=5, temperature=0,
                            logprobs=3)
plain = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, temperature=0)
print(json.dumps({"full": full.choices[0].logprobs.model_dump(),
                  "tokens": full.usage.completion_tokens, "streamed": streamed,
                  "text": text.choices[0].logprobs.model_dump(),
                  "text_tokens": text.usage.completion_tokens,
                  "plain": plain.choices[0].logprobs}))
"#;
    let got = run_python(script, &server.base);
    let content = got["full"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        got["tokens"].as_u64().unwrap(),
        "{got}"
    );
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 5, "{entry}");
        let lp = entry["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{entry}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(entry["token"], top[0]["token"], "{entry}");
        assert_eq!(lp, top[0]["logprob"].as_f64().unwrap(), "{entry}");
        let values: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(values.windows(2).all(|w| w[0] >= w[1]), "{entry}");
        let bytes: Vec<u8> = entry["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, entry["token"].as_str().unwrap().as_bytes());
    }
    assert_eq!(&got["streamed"], &got["full"]["content"], "{got}");
    let text = &got["text"];
    let n = got["text_tokens"].as_u64().unwrap() as usize;
    assert_eq!(text["tokens"].as_array().unwrap().len(), n, "{text}");
    assert_eq!(text["text_offset"].as_array().unwrap().len(), n, "{text}");
    for (i, top) in text["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        // The three most likely, and the chosen one among them (greedy).
        assert_eq!(top.len(), 3, "{text}");
        let chosen = text["token_logprobs"][i].as_f64().unwrap();
        let max = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert_eq!(chosen, max, "{text}");
        assert_eq!(top[text["tokens"][i].as_str().unwrap()], chosen);
    }
    assert_eq!(got["plain"], Value::Null);

    let chat = |extra: Value| {
        let mut body = json!({"model": "tiny", "max_tokens": 2,
                              "messages": [{"role": "user", "content": "w20"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        post(&server.base, "/v1/chat/completions", &body)
    };
    for (extra, param) in [
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"logprobs": true, "top_logprobs": -1}),
            "top_logprobs",
        ),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (
            json!({"logprobs": false, "top_logprobs": 2}),
            "top_logprobs",
        ),
        (json!({"logprobs": 3}), "logprobs"),
    ] {
        let (status, body) = chat(extra.clone());
        assert_eq!(status, 400, "{extra}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert_eq!(body["error"]["param"], param, "{body}");
    }
    for extra in [
        json!({"logprobs": 6}),
        json!({"logprobs": true}),
        json!({"top_logprobs": 1}),
    ] {
        let mut body = json!({"model": "tiny", "prompt": "w7", "max_tokens": 1});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, b) = post(&server.base, "/v1/completions", &body);
        assert_eq!(status, 400, "{extra}: {b}");
        assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
    }
    let (status, b) = chat(json!({"logprobs": true, "top_logprobs": 20}));
    assert_eq!(status, 200, "{b}");
    assert_eq!(
        b["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        20
    );
}

fn encoder_fixture() -> std::path::PathBuf {
    anemone_testkit::oracle_encoders_root().join("bert_mean_norm")
}

/// `/v1/embeddings` on an encoder checkpoint and an encoder bundle: the same vectors as
/// `anemone embed`, lists and token ids, base64, usage, a too-long input named with both lengths,
/// and the official client; decoders and encoders each refuse the other's endpoints.
#[test]
fn embeddings_for_encoder_checkpoints_and_bundles() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = encoder_fixture();
    let bundle = dir.path().join("enc.bundle");
    let out = support::anemone(&[
        "convert",
        fixture.to_str().unwrap(),
        "--out",
        bundle.to_str().unwrap(),
        "--lengths",
        "8,16",
    ]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let decoder = dir.path().join("tiny");
    std::fs::create_dir(&decoder).unwrap();
    tiny_model(&decoder);
    let server = start_models(
        &[
            format!("enc={}", fixture.display()),
            format!("bun={}", bundle.display()),
            format!("tiny={}", decoder.display()),
        ],
        &["--backend", "executor"],
    );
    let base = &server.base;
    let text = "w10 w11 w12 w13";
    for (model, path) in [("enc", &fixture), ("bun", &bundle)] {
        let cli = support::anemone(&["embed", path.to_str().unwrap(), "--text", text, "--json"]);
        assert!(cli.status.success(), "{}", support::text(&cli.stderr));
        let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
        let want = &cli["inputs"][0]["embedding"];
        let (s, one) = post(
            base,
            "/v1/embeddings",
            &json!({"model": model, "input": text}),
        );
        assert_eq!(s, 200, "{one}");
        assert_eq!(one["object"], "list");
        assert_eq!(one["model"], model);
        assert_eq!(one["data"][0]["object"], "embedding");
        assert_eq!(&one["data"][0]["embedding"], want, "{model}");
        let tokens = cli["inputs"][0]["tokens"].as_u64().unwrap();
        assert_eq!(
            one["usage"],
            json!({"prompt_tokens": tokens, "total_tokens": tokens})
        );
        let (s, two) = post(
            base,
            "/v1/embeddings",
            &json!({"model": model, "input": ["w20 w21", text], "encoding_format": "base64"}),
        );
        assert_eq!(s, 200, "{two}");
        assert_eq!(two["data"][1]["index"], 1);
        let decoded: Vec<f32> = decode_base64_f32(two["data"][1]["embedding"].as_str().unwrap());
        let floats: Vec<f32> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(decoded, floats, "{model}: base64 holds the same f32 values");
        let (s, ids) = post(
            base,
            "/v1/embeddings",
            &json!({"model": model, "input": [[2, 10, 11, 3], [2, 12, 3]]}),
        );
        assert_eq!(s, 200, "{ids}");
        assert_eq!(ids["usage"]["prompt_tokens"], 7, "{ids}");
        assert_eq!(ids["data"].as_array().unwrap().len(), 2);
    }
    let long = vec!["w30"; 40].join(" ");
    let (s, b) = post(
        base,
        "/v1/embeddings",
        &json!({"model": "bun", "input": ["ok", long]}),
    );
    assert_eq!(s, 400, "{b}");
    let message = b["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("input 1") && message.contains("largest bucket 16"),
        "{b}"
    );
    assert!(message.contains("42 tokens"), "{b}");
    assert_eq!(b["error"]["code"], "context_length_exceeded");
    for (path, body, want) in [
        (
            "/v1/embeddings",
            json!({"model": "tiny", "input": "w7"}),
            400,
        ),
        (
            "/v1/embeddings",
            json!({"model": "nope", "input": "w7"}),
            404,
        ),
        ("/v1/embeddings", json!({"model": "enc", "input": []}), 400),
        (
            "/v1/embeddings",
            json!({"model": "enc", "input": "  "}),
            400,
        ),
        (
            "/v1/embeddings",
            json!({"model": "enc", "input": "a", "encoding_format": "hex"}),
            400,
        ),
        (
            "/v1/embeddings",
            json!({"model": "enc", "input": [[999999]]}),
            400,
        ),
        (
            "/v1/chat/completions",
            json!({"model": "enc", "messages": [{"role": "user", "content": "x"}]}),
            400,
        ),
    ] {
        let (s, b) = post(base, path, &body);
        assert_eq!(s, want, "{body}: {b}");
        assert!(b["error"]["message"].is_string(), "{b}");
    }
    let got = run_python(
        r#"
import json, sys
import openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
r = c.embeddings.create(model="bun", input=["w10 w11 w12 w13", "w20 w21"])
print(json.dumps({"n": len(r.data), "first": r.data[0].embedding, "usage": r.usage.prompt_tokens}))
"#,
        base,
    );
    assert_eq!(got["n"], 2);
    let (_, float) = post(
        base,
        "/v1/embeddings",
        &json!({"model": "bun", "input": text}),
    );
    let as_f32 = |v: &Value| -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    assert_eq!(
        as_f32(&got["first"]),
        as_f32(&float["data"][0]["embedding"])
    );
}

fn decode_base64_f32(text: &str) -> Vec<f32> {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut bytes = Vec::new();
    for c in text.bytes().filter(|&c| c != b'=') {
        bits = (bits << 6) | alphabet.iter().position(|&a| a == c).unwrap() as u32;
        n += 6;
        if n >= 8 {
            n -= 8;
            bytes.push((bits >> n) as u8);
        }
    }
    bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// SIGTERM while SmolLM2 streams two completions (counting, so no end-of-sequence comes): new connections are refused at once, the short
/// answer finishes, the long one is cancelled cleanly when the grace period ends (an error
/// event, then `[DONE]`), and the server exits 0.
#[test]
fn sigterm_refuses_new_connections_drains_and_exits_zero() {
    let model = support::model("smollm2-135m-instruct.Q4_1.gguf");
    let mut server = start_models(
        &[format!("s={}", model.display())],
        &["--max-sessions", "2", "--shutdown-grace", "10"],
    );
    let base = server.base.clone();
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let stream = |max_tokens: usize| {
        let base = base.clone();
        std::thread::spawn(move || {
            let mut r = reqwest::blocking::Client::new()
                .post(format!("{base}/v1/completions"))
                .json(
                    &json!({"model": "s", "stream": true, "max_tokens": max_tokens,
                              "temperature": 0, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,"}),
                )
                .send()
                .unwrap();
            let mut body = String::new();
            r.read_to_string(&mut body).unwrap();
            body
        })
    };
    let long = stream(2000);
    // Let both generate: wait until two sessions are active.
    let deadline = Instant::now() + Duration::from_secs(60);
    let short = stream(12);
    while metric(&base, "anemone_active_sessions") < 2 {
        assert!(Instant::now() < deadline, "the requests never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let refused_by = Instant::now() + Duration::from_secs(2);
    loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Err(_) => break,
            Ok(_) => assert!(Instant::now() < refused_by, "still accepting after SIGTERM"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let short = short.join().unwrap();
    assert!(short.contains("\"finish_reason\":\"length\""), "{short}");
    assert!(short.trim_end().ends_with("data: [DONE]"), "{short}");
    let long = long.join().unwrap();
    assert!(long.contains("\"error\""), "{long}");
    assert!(long.contains("cancelled"), "{long}");
    assert!(long.trim_end().ends_with("data: [DONE]"), "{long}");
    let waited = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < waited, "the server did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
}

fn metric(base: &str, name: &str) -> u64 {
    let text = reqwest::blocking::get(format!("{base}/metrics"))
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// `anemone bench --json` on a checkpoint and on a bundle carries what the issue lists: machine,
/// OS, commit, model and bundle hashes, load apart from compile, every raw timing.
#[test]
fn bench_json_has_machine_os_commit_hashes_load_and_raw_timings() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = support::fixture("qwen3_gqa4");
    let bundle = support::small_bundle(dir.path());
    for (path, is_bundle) in [(&fixture, false), (&bundle, true)] {
        let mut args = vec![path.to_str().unwrap()];
        args.extend([
            "--prompt-len",
            "4",
            "--gen",
            "3",
            "--runs",
            "2",
            "--warmup",
            "0",
        ]);
        args.extend(["--threads", "1", "--json"]);
        if is_bundle {
            args.extend(["--backend", "executor"]);
        }
        let mut full = vec!["bench"];
        full.extend(args);
        let out = support::anemone(&full);
        assert!(out.status.success(), "{}", support::text(&out.stderr));
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        for key in [
            "machine",
            "os",
            "os_version",
            "kernel",
            "arch",
            "commit",
            "anemone_version",
        ] {
            assert!(r.get(key).is_some(), "{key} missing: {r:#}");
        }
        assert!(r["machine"]["cores"].as_u64().unwrap() >= 1);
        assert!(r["machine"]["cpu"].is_string(), "{r:#}");
        assert_eq!(r["load_average"].as_array().unwrap().len(), 3);
        assert!(r["commit"].as_str().unwrap().len() >= 40, "{r:#}");
        assert_eq!(r["model_sha256"].as_str().unwrap().len(), 64);
        assert_eq!(r["bundle_sha256"].is_string(), is_bundle, "{r:#}");
        let result = &r["results"][0];
        assert!(result["load_s"].as_f64().unwrap() > 0.0);
        assert_eq!(result["compile_s"], 0.0, "the executor compiles nothing");
        assert!(
            result.get("compile_cache").is_some_and(Value::is_null),
            "no compiled-model cache on the executor: {result:#}"
        );
        if is_bundle {
            for key in ["verify_hashes_s", "host_weights_s", "packages_s"] {
                assert!(result["load"][key].is_f64(), "{key}: {result:#}");
            }
        }
        let raw = result["raw"].as_array().unwrap();
        assert_eq!(raw.len(), 2);
        assert!(raw[0]["prefill_s"].as_f64().unwrap() > 0.0);
        assert_eq!(raw[0]["token_s"].as_array().unwrap().len(), 2);
        assert_eq!(raw[0]["prompt_tokens"], 4);
    }
}
