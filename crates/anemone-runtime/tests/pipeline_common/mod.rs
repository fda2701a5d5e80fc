//! Helpers shared by the pipeline and gate tests: fixtures, conversion into a temp dir,
//! comparisons with the worst element named.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use anemone_models::ane::{ChunkOptions, ChunkSizing, LmHeadPlacement, Uncompressed};
use anemone_models::bundle::{convert, ConvertOptions};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The random-init oracle fixtures (`ANEMONE_ORACLE_DIR` points elsewhere, e.g. at the output
/// of `make_fixtures.py --holdout DIR`).
pub fn oracle_root() -> PathBuf {
    std::env::var_os("ANEMONE_ORACLE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("tests/fixtures/oracle"))
}

pub fn models_dir() -> PathBuf {
    std::env::var_os("ANEMONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models"))
}

pub struct OracleFixture {
    pub name: String,
    pub dir: PathBuf,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
}

pub fn oracle_fixtures() -> Vec<OracleFixture> {
    let root = oracle_root();
    let mut out: Vec<OracleFixture> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.join("oracle.json").is_file())
        .map(|dir| {
            let oracle: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("oracle.json")).unwrap()).unwrap();
            let ids = |key: &str| -> Vec<u32> {
                oracle[key]
                    .as_array()
                    .unwrap_or_else(|| panic!("{}: no {key}", dir.display()))
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect()
            };
            OracleFixture {
                name: dir.file_name().unwrap().to_string_lossy().into_owned(),
                prompt_ids: ids("prompt_ids"),
                greedy_ids: ids("greedy_ids"),
                dir,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(
        out.len() >= 3,
        "expected oracle fixtures under {}",
        root.display()
    );
    out
}

pub fn small_options(chunk: ChunkOptions) -> ConvertOptions {
    ConvertOptions {
        chunk,
        sizing: ChunkSizing::LayersPerChunk(1),
        lm_head: LmHeadPlacement::Host,
        force: false,
    }
}

/// Converts `model` into `out` (a fresh path).
pub fn convert_to(model: &Path, out: &Path, options: &ConvertOptions) {
    let checkpoint = anemone_models::open_checkpoint(model)
        .unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    convert(&checkpoint, out, options, &Uncompressed, &mut |_| {})
        .unwrap_or_else(|e| panic!("converting {}: {e}", model.display()));
}

/// `(index, got, want)` of the largest absolute difference.
pub fn worst(got: &[f32], want: &[f32]) -> (usize, f32, f32) {
    assert_eq!(got.len(), want.len(), "length mismatch");
    got.iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| (i, *g, *w))
        .max_by(|a, b| (a.1 - a.2).abs().total_cmp(&(b.1 - b.2).abs()))
        .unwrap_or((0, 0.0, 0.0))
}

/// Asserts `|got - want| ≤ tolerance` everywhere, naming the worst element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tolerance: f32) {
    let (i, g, w) = worst(got, want);
    assert!(
        (g - w).abs() <= tolerance && g.is_finite(),
        "{what}: worst element {i}: got {g}, want {w} (|diff| {} > {tolerance})",
        (g - w).abs()
    );
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        ab += *x as f64 * *y as f64;
        aa += *x as f64 * *x as f64;
        bb += *y as f64 * *y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt())
}
