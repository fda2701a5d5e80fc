//! While the serial ops between two projection regions of a decode step run, the team's idle
//! helpers ask the memory for the next projection's weights. The projection each one warms is
//! the next one reading another input, in the order a decoder layer runs them; a prefill's
//! products (which reuse what is in the caches) warm nothing.

use anemone_exec::LoadedPackage;
use anemone_models::ane::{
    names, ChunkOptions, ChunkSizing, LmHeadPlacement, Precision, Uncompressed,
};
use anemone_models::bundle::{convert, ConvertOptions};
use anemone_testkit::oracle_dir;

/// (projection, the projection whose weights are warmed after it) of a converted bundle's one
/// chunk, for `precision`.
fn warmed(precision: Precision) -> (Vec<(String, String)>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle");
    let ckpt = anemone_models::open_checkpoint(oracle_dir("qwen3_gqa4")).unwrap();
    let layers = ckpt.config.num_hidden_layers;
    let opts = ConvertOptions {
        chunk: ChunkOptions {
            context: 32,
            prefill_len: 8,
            precision,
            ..ChunkOptions::default()
        },
        sizing: ChunkSizing::LayersPerChunk(layers),
        lm_head: LmHeadPlacement::Host,
        force: false,
    };
    let manifest = convert(&ckpt, &out, &opts, &Uncompressed, &mut |_| {})
        .unwrap()
        .manifest;
    assert_eq!(manifest.chunks.len(), 1);
    let pkg = LoadedPackage::load(&out.join(&manifest.chunks[0].path), precision).unwrap();
    assert_eq!(pkg.warmed_projections(names::PREFILL).unwrap(), vec![]);
    let pairs = pkg
        .warmed_projections(names::DECODE)
        .unwrap()
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    (pairs, layers)
}

/// What a layer's projections warm: q/k/v the output projection, it gate/up's, they down's,
/// down the next layer's q/k/v (whose first is q).
fn expected(prefixes: &[String]) -> Vec<(String, String)> {
    let mut want = Vec::new();
    for (l, p) in prefixes.iter().enumerate() {
        let name = |suffix: &str| format!("{p}_{suffix}");
        for qkv in ["q_proj", "k_proj", "v_proj"] {
            want.push((name(qkv), name("o_proj")));
        }
        want.push((name("o_proj"), name("gate_proj")));
        want.push((name("gate_proj"), name("down_proj")));
        want.push((name("up_proj"), name("down_proj")));
        if let Some(next) = prefixes.get(l + 1) {
            want.push((name("down_proj"), format!("{next}_q_proj")));
        }
    }
    want
}

#[test]
fn each_projection_warms_the_next_one_of_another_input() {
    for precision in [Precision::Fp16, Precision::Fp32] {
        let (got, layers) = warmed(precision);
        let prefixes: Vec<String> = got
            .iter()
            .filter_map(|(a, _)| a.strip_suffix("_q_proj").map(str::to_string))
            .collect();
        assert_eq!(
            prefixes.len(),
            layers,
            "{precision:?}: one q_proj a layer in {got:?}"
        );
        assert_eq!(got, expected(&prefixes), "{precision:?}");
    }
}
