//! Helpers shared by the CLI integration tests: run the built binary, find fixtures, real models
//! and the coremltools validator.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
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

/// A transformers oracle fixture under `tests/fixtures/oracle/`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/oracle")
        .join(name)
}

/// A real model file under `$ANEMONE_MODELS` (default `<workspace>/models`).
pub fn model(file: &str) -> PathBuf {
    let dir = std::env::var_os("ANEMONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/fetch-models.sh` (or set ANEMONE_MODELS)",
        path.display()
    );
    path
}

/// `validate_mlpackage.py`: `$ANEMONE_VALIDATOR`, else `../shared/tools/` beside the repo.
pub fn validator() -> PathBuf {
    if let Ok(path) = std::env::var("ANEMONE_VALIDATOR") {
        return PathBuf::from(path);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/validate_mlpackage.py")
}
