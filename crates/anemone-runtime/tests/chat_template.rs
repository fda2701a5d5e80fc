//! SmolLM2's and Qwen3's chat templates render exactly as transformers' `apply_chat_template`
//! (expected strings in fixtures/chat/cases.json, made by fixtures/chat/make_expected.py).

use anemone_runtime::{ChatMessage, ChatTemplate};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct TemplateCases {
    template: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    expected: String,
}

fn cases() -> BTreeMap<String, TemplateCases> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat/cases.json"
    );
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn check(name: &str) {
    let all = cases();
    let t = &all[name];
    let template =
        ChatTemplate::new(&t.template, t.bos_token.as_deref(), t.eos_token.as_deref()).unwrap();
    assert!(t.cases.len() >= 8, "{name}: too few cases");
    for (i, case) in t.cases.iter().enumerate() {
        let got = template
            .render(&case.messages, case.add_generation_prompt)
            .unwrap_or_else(|e| panic!("{name} case {i}: {e}"));
        assert_eq!(
            got, case.expected,
            "{name} case {i} (add_generation_prompt={})",
            case.add_generation_prompt
        );
    }
}

#[test]
fn smollm2_template_matches_transformers() {
    check("smollm2");
}

#[test]
fn qwen3_template_matches_transformers() {
    check("qwen3");
}
