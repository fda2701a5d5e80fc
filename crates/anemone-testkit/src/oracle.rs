//! The transformers oracle fixtures: tiny random-init checkpoints with their greedy ids, logits
//! and per-layer hidden states (made by `tools/oracle/make_fixtures.py`).

use std::path::PathBuf;

use crate::paths::oracle_root;

/// One fixture directory: a Hugging Face checkpoint plus `oracle.json`, `logits.npy`,
/// `hidden_states.npy`.
#[derive(Debug, Clone)]
pub struct OracleFixture {
    pub name: String,
    pub dir: PathBuf,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
}

impl OracleFixture {
    /// transformers' logits, `[prompt + greedy, vocab]`.
    pub fn logits_path(&self) -> PathBuf {
        self.dir.join("logits.npy")
    }

    /// transformers' residual stream after the embedding and after every layer.
    pub fn hidden_states_path(&self) -> PathBuf {
        self.dir.join("hidden_states.npy")
    }

    fn read(dir: PathBuf) -> Self {
        let path = dir.join("oracle.json");
        let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let oracle: serde_json::Value =
            serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ids = |key: &str| -> Vec<u32> {
            oracle[key]
                .as_array()
                .unwrap_or_else(|| panic!("{}: no array `{key}`", path.display()))
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|id| u32::try_from(id).ok())
                        .unwrap_or_else(|| panic!("{}: `{key}` holds {v}", path.display()))
                })
                .collect()
        };
        OracleFixture {
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            prompt_ids: ids("prompt_ids"),
            greedy_ids: ids("greedy_ids"),
            dir,
        }
    }
}

/// Every fixture under [`oracle_root`], sorted by name; panics when fewer than 3 are found.
pub fn oracle_fixtures() -> Vec<OracleFixture> {
    let root = oracle_root();
    let mut fixtures: Vec<OracleFixture> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|entry| {
            entry
                .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
                .path()
        })
        .filter(|dir| dir.join("oracle.json").is_file())
        .map(OracleFixture::read)
        .collect();
    fixtures.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(
        fixtures.len() >= 3,
        "expected oracle fixtures under {}",
        root.display()
    );
    fixtures
}

/// The fixture called `name` under [`oracle_root`].
pub fn oracle_fixture(name: &str) -> OracleFixture {
    let dir = oracle_root().join(name);
    assert!(
        dir.join("oracle.json").is_file(),
        "{}: no oracle.json",
        dir.display()
    );
    OracleFixture::read(dir)
}
