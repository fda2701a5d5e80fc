//! Where things are: the repository, its fixtures, and the real models of `scripts/fetch-models.sh`.

use std::path::{Path, PathBuf};

/// The workspace root (this crate lives at `crates/anemone-testkit`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|e| panic!("workspace root beside {}: {e}", env!("CARGO_MANIFEST_DIR")))
}

/// The random-init transformers fixtures: `tests/fixtures/oracle`, or `$ANEMONE_ORACLE_DIR`
/// (e.g. the output of `tools/oracle/make_fixtures.py --holdout DIR`).
pub fn oracle_root() -> PathBuf {
    std::env::var_os("ANEMONE_ORACLE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("tests/fixtures/oracle"))
}

/// One oracle fixture's checkpoint directory under [`oracle_root`].
pub fn oracle_dir(name: &str) -> PathBuf {
    oracle_root().join(name)
}

/// A real-model fixture file under `tests/fixtures/real/` (transformers' continuations).
pub fn real_fixture(file: &str) -> PathBuf {
    repo_root().join("tests/fixtures/real").join(file)
}

/// `$ANEMONE_MODELS`, else `<workspace>/models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("ANEMONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models"))
}

/// A real model (file or directory) under [`models_dir`]; panics with the fetch command when
/// it is missing.
pub fn model(name: &str) -> PathBuf {
    let path = models_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `scripts/fetch-models.sh` (or set ANEMONE_MODELS)",
        path.display()
    );
    path
}

/// Every regular file under `dir` with its bytes, by relative path, sorted: for asserting that
/// two outputs are byte-identical.
pub fn tree_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| {
                e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                    .path()
            })
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                let bytes =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.push((rel, bytes));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}

/// The encoder oracle fixtures (`tools/oracle/make_encoder_fixtures.py`).
pub fn oracle_encoders_root() -> PathBuf {
    repo_root().join("tests/fixtures/oracle-encoders")
}
