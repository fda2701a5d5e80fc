//! Helpers shared by the convert tests: fixture paths and the coremltools validator.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

const INSTALL_HINT: &str = "install it with: pip install coremltools \"numpy<2.4\"";

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn oracle_fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/oracle").join(name)
}

pub fn models_dir() -> PathBuf {
    std::env::var_os("ANEMONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models"))
}

fn validator() -> PathBuf {
    if let Ok(p) = std::env::var("ANEMONE_VALIDATOR") {
        return PathBuf::from(p);
    }
    repo_root().join("../shared/tools/validate_mlpackage.py")
}

/// Runs coremltools' loader and type inference on `pkg` (`--strict`); fails (never skips)
/// without coremltools, because CI installs it.
pub fn validate(pkg: &Path) {
    let v = validator();
    assert!(
        v.is_file(),
        "validator not found at {} (set ANEMONE_VALIDATOR); {INSTALL_HINT}",
        v.display()
    );
    let out = Command::new("python3")
        .arg(&v)
        .arg("--strict")
        .arg("-q")
        .arg(pkg)
        .output()
        .unwrap_or_else(|e| panic!("python3 not runnable ({e}); {INSTALL_HINT}"));
    assert!(
        out.status.success(),
        "validator rejected {}:\n{}\n{}",
        pkg.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every regular file under `dir` with its bytes, by relative path (sorted).
pub fn tree_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}
