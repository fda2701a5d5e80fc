//! Encoder bundles end to end on the random-init fixtures: convert (one package, one function
//! per bucket), the coremltools validator and the ANE lint, then the executor (fp32 and fp16)
//! against the fp32 reference, embedding by embedding and layer by layer.

use anemone_exec::Precision as ExecPrecision;
use anemone_models::ane::{lint_program, Precision, Severity, Uncompressed};
use anemone_models::encoder::bundle::{convert_encoder, EncoderConvertOptions, HeadPlacement};
use anemone_models::encoder::open_encoder;
use anemone_runtime::encoder::Encoder;
use anemone_testkit::{assert_close, cosine, oracle_encoders_root, Tier};

fn oracle_ids(name: &str) -> Vec<Vec<u32>> {
    let path = oracle_encoders_root().join(name).join("oracle.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            i["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

fn convert(name: &str, precision: Precision, lengths: &[usize], out: &std::path::Path) {
    let ck = open_encoder(oracle_encoders_root().join(name)).unwrap();
    convert_encoder(
        &ck,
        out,
        &EncoderConvertOptions {
            lengths: lengths.to_vec(),
            precision,
            force: false,
            compressor: &Uncompressed,
            head: HeadPlacement::Package,
        },
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[test]
fn encoder_bundles_validate_and_match_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let mut packages = Vec::new();
    for name in [
        "bert_mean_norm",
        "bert_cls_classifier",
        "roberta_lasttoken",
        "modernbert_mean",
        "modernbert_classifier",
    ] {
        let dir = oracle_encoders_root().join(name);
        let reference = Encoder::open(&dir, ExecPrecision::Fp32).unwrap();
        let inputs = oracle_ids(name);
        let want = reference.embed_ids(&inputs).unwrap();
        for (precision, exec, tier, min_cos) in [
            (
                Precision::Fp32,
                ExecPrecision::Fp32,
                Tier::custom("fp32 graph vs reference", 2e-5),
                0.999_999_9,
            ),
            (
                Precision::Fp16,
                ExecPrecision::Fp16,
                Tier::custom("fp16 graph vs reference", 2e-2),
                0.9999,
            ),
        ] {
            let out = tmp.path().join(format!("{name}-{}", precision.name()));
            convert(name, precision, &[8, 32], &out);
            let manifest: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join("anemone.json")).unwrap()).unwrap();
            assert_eq!(manifest["kind"], "encoder");
            assert_eq!(
                manifest["conversion"]["buckets"],
                serde_json::json!([8, 32])
            );
            let pkg = out.join("encoder.mlpackage");
            let program = anemone_mil::read_package(&pkg).unwrap();
            assert_eq!(program.functions().len(), 2);
            let errors: Vec<_> = lint_program(&program, 0)
                .into_iter()
                .filter(|f| f.severity == Severity::Error)
                .collect();
            assert!(errors.is_empty(), "{name}: lint {errors:?}");
            packages.push(pkg);

            let encoder = Encoder::open(&out, exec).unwrap();
            let got = encoder.embed_ids(&inputs).unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.index, w.index);
                assert_eq!(g.bucket, Some(if g.tokens <= 8 { 8 } else { 32 }));
                let what = format!("{name} {} input {}", precision.name(), g.index);
                assert_close(&what, &g.embedding, &w.embedding, tier);
                let c = cosine(&g.embedding, &w.embedding);
                assert!(c >= min_cos, "{what}: cosine {c}");
                if let (Some(gl), Some(wl)) = (&g.logits, &w.logits) {
                    assert_close(&format!("{what} logits"), gl, wl, tier);
                }
                let (_, layers) = encoder.hidden_states(g.index, &inputs[g.index]).unwrap();
                let (_, ref_layers) = reference.hidden_states(g.index, &inputs[g.index]).unwrap();
                assert_eq!(layers.len(), ref_layers.len(), "{what}: layer count");
                for (l, (a, b)) in layers.iter().zip(&ref_layers).enumerate() {
                    let c = cosine(a, b);
                    assert!(c >= min_cos, "{what}: layer {l} cosine {c}");
                }
            }
        }
    }
    let refs: Vec<&std::path::Path> = packages.iter().map(|p| p.as_path()).collect();
    anemone_testkit::validate_package(&refs);
}

#[test]
fn too_long_inputs_name_both_lengths_and_never_truncate() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("b");
    convert("bert_mean_norm", Precision::Fp16, &[4, 8], &out);
    let encoder = Encoder::open(&out, ExecPrecision::Fp16).unwrap();
    let err = encoder
        .embed_ids(&[vec![2, 5, 3], vec![2; 9]])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("input 1") && err.contains("9 tokens") && err.contains("largest bucket 8"),
        "{err}"
    );
}
