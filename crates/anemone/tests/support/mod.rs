//! Helpers shared by the CLI integration tests: run the built binary; fixtures and real models come
//! from `anemone-testkit`.
#![allow(dead_code)] // each test binary uses its own subset

pub mod serve;

use std::process::{Command, Output};

/// Runs the `anemone` binary built for these tests.
pub fn anemone(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anemone"))
        .args(args)
        .output()
        .expect("run anemone")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A transformers oracle fixture's checkpoint directory.
pub fn fixture(name: &str) -> std::path::PathBuf {
    anemone_testkit::oracle_dir(name)
}

/// A real model under `$ANEMONE_MODELS` (default `<workspace>/models`).
pub fn model(name: &str) -> std::path::PathBuf {
    anemone_testkit::model(name)
}

/// Converts the qwen3_gqa4 oracle fixture into a small bundle at `dir/b` (context 32, prefill
/// 4) and returns its path.
pub fn small_bundle(dir: &std::path::Path) -> std::path::PathBuf {
    let bundle = dir.join("b");
    let fixture = fixture("qwen3_gqa4");
    let out = anemone(&[
        "convert",
        fixture.to_str().unwrap(),
        "--out",
        bundle.to_str().unwrap(),
        "--context",
        "32",
        "--prefill-len",
        "4",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    bundle
}
