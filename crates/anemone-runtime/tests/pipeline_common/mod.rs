//! Helpers shared by the pipeline and gate tests: fixtures, conversion into a temp dir,
//! comparisons with the worst element named.
#![allow(dead_code)]

use std::path::Path;

use anemone_models::ane::{ChunkOptions, ChunkSizing, LmHeadPlacement, Uncompressed};
use anemone_models::bundle::{convert, ConvertOptions};
use anemone_models::reference::{ReferenceModel, ReferenceOptions};

#[allow(unused_imports)] // each test binary uses its own subset
pub use anemone_testkit::{cosine, models_dir, oracle_fixtures, repo_root, worst, OracleFixture};

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

/// Asserts `|got - want| ≤ tolerance` everywhere, naming the worst element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tolerance: f32) {
    anemone_testkit::assert_close(
        what,
        got,
        want,
        anemone_testkit::Tier::custom("test", tolerance),
    );
}

/// The fp32 reference of a checkpoint directory, on one thread, holding `context` positions.
pub fn reference_of(dir: &Path, context: usize) -> ReferenceModel {
    let checkpoint = anemone_models::open_checkpoint(dir).unwrap();
    ReferenceModel::load(
        &checkpoint,
        &ReferenceOptions {
            threads: Some(1),
            context_len: Some(context),
            huge_pages: false,
        },
    )
    .unwrap()
}
