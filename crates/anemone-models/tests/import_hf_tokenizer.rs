//! Tokenizer-side files of a Hugging Face directory: the real Qwen3 tokenizer against the ids
//! transformers gives (committed fixture), chat template sources, special tokens and BOS handling.

mod hf_support;

use anemone_checkpoint::{Checkpoint, CheckpointError};
use hf_support::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;

fn qwen3_tokenizer_dir() -> std::path::PathBuf {
    let dir = models_dir().join("qwen3-tokenizer");
    assert!(
        dir.join("tokenizer.json").is_file(),
        "{} is missing: run scripts/fetch-models.sh",
        dir.display()
    );
    dir
}

/// A tiny qwen3 model directory carrying the real Qwen3 tokenizer files.
fn tiny_with_qwen3_tokenizer() -> TinyDir {
    let dir = TinyDir::new("qwen3");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(qwen3_tokenizer_dir().join(file), dir.file(file)).unwrap();
    }
    dir
}

#[test]
fn qwen3_tokenizer_encodes_like_transformers() {
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("tests/fixtures/real/qwen3-tokenizer.json"))
            .unwrap(),
    )
    .unwrap();
    let dir = tiny_with_qwen3_tokenizer();
    // config.json's eos would win; drop it so the tokenizer's EOS token supplies the id.
    let mut config = tiny_config("qwen3");
    config.as_object_mut().unwrap().remove("eos_token_id");
    config.as_object_mut().unwrap().remove("bos_token_id");
    dir.write_config(&config);
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    let bundle = checkpoint.tokenizer.as_ref().expect("tokenizer found");

    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let got = bundle.tokenizer.encode(text, true).unwrap();
        assert_eq!(got.get_ids(), want.as_slice(), "encoding {text:?}");
        let decoded = bundle.tokenizer.decode(&want, false).unwrap();
        assert_eq!(decoded, text, "decoding {text:?}");
    }

    assert_eq!(bundle.eos_token.as_deref(), fixture["eos_token"].as_str());
    assert_eq!(bundle.bos_token, None);
    assert!(!bundle.add_bos);
    let eos_id = fixture["eos_token_id"].as_u64().unwrap() as u32;
    assert_eq!(checkpoint.config.eos_token_ids, vec![eos_id]);
    assert_eq!(checkpoint.config.bos_token_id, None);

    let template = bundle
        .chat_template
        .as_deref()
        .expect("chat template found");
    let config: Value = serde_json::from_slice(
        &std::fs::read(qwen3_tokenizer_dir().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(Some(template), config["chat_template"].as_str());
    assert!(template.contains("<|im_start|>") && template.contains("add_generation_prompt"));

    for file in ["tokenizer.json", "tokenizer_config.json"] {
        assert!(checkpoint.source_paths.contains(&dir.file(file)), "{file}");
    }
}

/// A word-level tokenizer.json: `<s>`=0, `</s>`=1, then words, whitespace-split.
fn write_word_tokenizer(path: &Path, with_bos_post_processor: bool) {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::{AddedToken, Tokenizer};
    let vocab: HashMap<String, u32> = ["<s>", "</s>", "<unk>", "hello", "world"]
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i as u32))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("<unk>".into())
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    tokenizer.add_special_tokens(&[
        AddedToken::from("<s>", true),
        AddedToken::from("</s>", true),
    ]);
    if with_bos_post_processor {
        let template = TemplateProcessing::builder()
            .try_single("<s> $A")
            .unwrap()
            .special_tokens(vec![("<s>".to_string(), 0)])
            .build()
            .unwrap();
        tokenizer.with_post_processor(Some(template));
    }
    tokenizer.save(path, false).unwrap();
}

fn word_dir(with_bos_post_processor: bool, tokenizer_config: Value) -> TinyDir {
    let dir = TinyDir::new("llama");
    write_word_tokenizer(&dir.file("tokenizer.json"), with_bos_post_processor);
    write_json(&dir.file("tokenizer_config.json"), &tokenizer_config);
    dir
}

fn ids(checkpoint: &Checkpoint, text: &str) -> Vec<u32> {
    let bundle = checkpoint.tokenizer.as_ref().unwrap();
    bundle
        .tokenizer
        .encode(text, true)
        .unwrap()
        .get_ids()
        .to_vec()
}

#[test]
fn special_tokens_as_strings_or_added_token_objects() {
    let dir = word_dir(
        false,
        json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
            "eos_token": "</s>",
        }),
    );
    let mut config = tiny_config("llama");
    config.as_object_mut().unwrap().remove("eos_token_id");
    config.as_object_mut().unwrap().remove("bos_token_id");
    dir.write_config(&config);
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    let bundle = checkpoint.tokenizer.as_ref().unwrap();
    assert_eq!(bundle.bos_token.as_deref(), Some("<s>"));
    assert_eq!(bundle.eos_token.as_deref(), Some("</s>"));
    assert_eq!(checkpoint.config.bos_token_id, Some(0));
    assert_eq!(checkpoint.config.eos_token_ids, vec![1]);
    assert!(!bundle.add_bos);
    assert_eq!(ids(&checkpoint, "hello world"), vec![3, 4]);
    assert!(bundle.chat_template.is_none());

    let dir = word_dir(false, json!({"bos_token": {"lstrip": false}}));
    let err = anemone_models::open_checkpoint(dir.path()).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::BadField { field, .. } if field == "bos_token"),
        "{err}"
    );
}

#[test]
fn add_bos_token_is_honoured_both_ways() {
    // The post-processor already adds BOS and nothing says otherwise.
    let dir = word_dir(true, json!({"bos_token": "<s>"}));
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    assert!(checkpoint.tokenizer.as_ref().unwrap().add_bos);
    assert_eq!(ids(&checkpoint, "hello world"), vec![0, 3, 4]);

    // add_bos_token: true with a tokenizer.json that does not add it.
    let dir = word_dir(false, json!({"bos_token": "<s>", "add_bos_token": true}));
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    assert!(checkpoint.tokenizer.as_ref().unwrap().add_bos);
    assert_eq!(ids(&checkpoint, "hello world"), vec![0, 3, 4]);
    let plain = checkpoint
        .tokenizer
        .as_ref()
        .unwrap()
        .tokenizer
        .encode("hello", false)
        .unwrap();
    assert_eq!(plain.get_ids(), &[3]);

    // add_bos_token: false overrides a post-processor that adds it.
    let dir = word_dir(true, json!({"bos_token": "<s>", "add_bos_token": false}));
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    assert!(!checkpoint.tokenizer.as_ref().unwrap().add_bos);
    assert_eq!(ids(&checkpoint, "hello world"), vec![3, 4]);
}

#[test]
fn chat_template_sources_in_priority_order() {
    // A list of named templates: "default" is used.
    let dir = word_dir(
        false,
        json!({"chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "DEFAULT {{ messages }}"},
        ]}),
    );
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    let template = checkpoint.tokenizer.as_ref().unwrap().chat_template.clone();
    assert_eq!(template.as_deref(), Some("DEFAULT {{ messages }}"));

    // chat_template.jinja (transformers 5) wins over tokenizer_config.json.
    std::fs::write(dir.file("chat_template.jinja"), "JINJA {{ messages }}\n").unwrap();
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    let template = checkpoint.tokenizer.as_ref().unwrap().chat_template.clone();
    assert_eq!(template.as_deref(), Some("JINJA {{ messages }}\n"));
    assert!(checkpoint
        .source_paths
        .contains(&dir.file("chat_template.jinja")));

    // chat_template.json (processor style) when nothing else has one.
    let dir = word_dir(false, json!({}));
    write_json(
        &dir.file("chat_template.json"),
        &json!({"chat_template": "FROM JSON"}),
    );
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    let template = checkpoint.tokenizer.as_ref().unwrap().chat_template.clone();
    assert_eq!(template.as_deref(), Some("FROM JSON"));

    // A list without "default" gives no template; a malformed one a named error.
    let dir = word_dir(
        false,
        json!({"chat_template": [{"name": "rag", "template": "R"}]}),
    );
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    assert!(checkpoint
        .tokenizer
        .as_ref()
        .unwrap()
        .chat_template
        .is_none());
    for bad in [json!(7), json!([{"name": "default"}])] {
        let dir = word_dir(false, json!({"chat_template": bad}));
        let err = anemone_models::open_checkpoint(dir.path()).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::BadField { field, path, .. }
                if field == "chat_template" && path.ends_with("tokenizer_config.json")),
            "{err}"
        );
    }
}

#[test]
fn broken_tokenizer_json_is_named() {
    let dir = TinyDir::new("llama");
    std::fs::write(dir.file("tokenizer.json"), "{\"model\": 3}").unwrap();
    let err = anemone_models::open_checkpoint(dir.path()).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Tokenizer { problem } if problem.contains("tokenizer.json")),
        "{err}"
    );
}

#[test]
fn directory_without_tokenizer_opens_with_none() {
    let dir = TinyDir::new("llama");
    write_json(
        &dir.file("tokenizer_config.json"),
        &json!({"eos_token": "</s>"}),
    );
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    assert!(checkpoint.tokenizer.is_none());
}
