//! `anemone convert` / `embed` / `classify` / `gate` on the tiny random-init encoders, and the
//! bad inputs of issue 13: empty text, invalid UTF-8 (line named), too long for the largest
//! bucket (both lengths named), wrong bundle kind, unknown model_type.

mod support;

use std::path::PathBuf;
use support::{anemone, text};

fn encoder_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/oracle-encoders")
        .join(name)
}

#[test]
fn embed_convert_gate_and_bad_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let model = encoder_fixture("bert_mean_norm");
    let bundle = tmp.path().join("enc.bundle");
    let out = anemone(&[
        "convert",
        model.to_str().unwrap(),
        "--out",
        bundle.to_str().unwrap(),
        "--lengths",
        "4,8",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = anemone(&[
        "embed",
        bundle.to_str().unwrap(),
        "--text",
        "w5 w6",
        "--text",
        "w7 w8 w9 w10",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["inputs"][0]["bucket"], 4);
    assert_eq!(v["inputs"][1]["bucket"], 8);
    assert_eq!(v["inputs"][1]["embedding"].as_array().unwrap().len(), 32);

    let long = ["w5"; 9].join(" ");
    let out = anemone(&["embed", bundle.to_str().unwrap(), "--text", &long]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("11 tokens") && err.contains("largest bucket 8"),
        "{err}"
    );

    let out = anemone(&["embed", bundle.to_str().unwrap(), "--text", "  "]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("empty"),
        "{}",
        text(&out.stderr)
    );

    let file = tmp.path().join("bad.txt");
    std::fs::write(&file, b"w5 w6\nw7 \xff\n").unwrap();
    let out = anemone(&[
        "embed",
        model.to_str().unwrap(),
        "--file",
        file.to_str().unwrap(),
    ]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("line 2") && err.contains("UTF-8"),
        "{err}"
    );

    let out = anemone(&["classify", bundle.to_str().unwrap(), "--text", "w5"]);
    assert!(!out.status.success() && text(&out.stderr).contains("no classification head"));

    let out = anemone(&[
        "gate",
        bundle.to_str().unwrap(),
        "--reference",
        model.to_str().unwrap(),
        "--prompts",
        file.to_str().unwrap(),
    ]);
    assert!(!out.status.success() && text(&out.stderr).contains("line 2"));
    let good = tmp.path().join("good.txt");
    std::fs::write(&good, "w5 w6\nw7 w8 w9 w10 w11\n").unwrap();
    let plot = tmp.path().join("g.svg");
    let out = anemone(&[
        "gate",
        bundle.to_str().unwrap(),
        "--reference",
        model.to_str().unwrap(),
        "--prompts",
        good.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(std::fs::read_to_string(&plot).unwrap().contains("<svg"));

    let unknown = tmp.path().join("t5");
    std::fs::create_dir(&unknown).unwrap();
    std::fs::write(unknown.join("config.json"), r#"{"model_type": "t5"}"#).unwrap();
    let out = anemone(&["embed", unknown.to_str().unwrap(), "--text", "x"]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("`t5`"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn classify_runs_the_head() {
    let model = encoder_fixture("bert_cls_classifier");
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("cls.bundle");
    let out = anemone(&[
        "convert",
        model.to_str().unwrap(),
        "--out",
        bundle.to_str().unwrap(),
        "--lengths",
        "16",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // no tokenizer in this fixture: a clear error
    let out = anemone(&["classify", bundle.to_str().unwrap(), "--text", "x"]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("no tokenizer"),
        "{}",
        text(&out.stderr)
    );
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn logits(v: &serde_json::Value, i: usize) -> Vec<f64> {
    v["inputs"][i]["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Cross-encoder pairs (reference and bundle, head in the package) against transformers'
/// logits, a pairs file without a tab, and ModernBERT's head in the package vs on the host.
#[test]
fn classify_pairs_and_heads_in_the_package() {
    let tmp = tempfile::tempdir().unwrap();
    let model = encoder_fixture("bert_pair_reranker");
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("oracle.json")).unwrap()).unwrap();
    let want = oracle["pairs"][0]["logits"][0].as_f64().unwrap();
    let (a, b) = (
        oracle["pairs"][0]["a"].as_str().unwrap(),
        oracle["pairs"][0]["b"].as_str().unwrap(),
    );
    let bundle = tmp.path().join("pair.bundle");
    let m = model.to_str().unwrap();
    let out = anemone(&[
        "convert",
        m,
        "--out",
        bundle.to_str().unwrap(),
        "--lengths",
        "16",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("anemone.json")).unwrap()).unwrap();
    assert_eq!(manifest["conversion"]["head"], "package");
    for (path, tol) in [(m, 1e-4), (bundle.to_str().unwrap(), 2e-2)] {
        let v = json(&anemone(&["classify", path, "--pair", a, b, "--json"]));
        let got = logits(&v, 0)[0];
        assert!((got - want).abs() < tol, "{path}: logit {got} vs {want}");
        let p = v["inputs"][0]["probabilities"][0].as_f64().unwrap();
        assert!(
            (p - 1.0 / (1.0 + (-got).exp())).abs() < 1e-6,
            "sigmoid score"
        );
    }
    let pairs = tmp.path().join("pairs.tsv");
    std::fs::write(&pairs, format!("{a}\t{b}\nno tab here\n")).unwrap();
    let out = anemone(&["classify", m, "--pairs-file", pairs.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("line 2") && err.contains("tab"),
        "{err}"
    );

    // A compressed ModernBERT bundle goes through the encoder gate (threshold for int8).
    let mb = encoder_fixture("modernbert_mean");
    let q8 = tmp.path().join("mb-q8");
    let q = q8.to_str().unwrap();
    let args = [
        "convert",
        mb.to_str().unwrap(),
        "--out",
        q,
        "--lengths",
        "8,32",
    ];
    let out = anemone(&[&args[..], &["--quantize", "int8"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let good = tmp.path().join("mb.txt");
    std::fs::write(
        &good,
        "w5 w6\nw7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18\n",
    )
    .unwrap();
    let gate = |min: &str| {
        let g = good.to_str().unwrap();
        let r = mb.to_str().unwrap();
        anemone(&[
            "gate",
            q,
            "--reference",
            r,
            "--prompts",
            g,
            "--json",
            "--min-embedding-cosine",
            min,
        ])
    };
    assert!(
        gate("0.99").status.success(),
        "int8 ModernBERT gate at 0.99"
    );
    assert!(
        !gate("1.0").status.success(),
        "a cosine of exactly 1 is not reached"
    );

    let model = encoder_fixture("modernbert_classifier");
    let m = model.to_str().unwrap();
    let texts = [
        "--text",
        "w5 w6 w7",
        "--text",
        "w9 w10 w11 w12 w13 w14 w15 w16 w17 w18",
    ];
    let reference = json(&anemone(&[&["classify", m, "--json"][..], &texts].concat()));
    for head in ["package", "host"] {
        let out_dir = tmp.path().join(format!("mb-{head}"));
        let o = out_dir.to_str().unwrap();
        let out = anemone(&[
            "convert",
            m,
            "--out",
            o,
            "--lengths",
            "8,16",
            "--encoder-head",
            head,
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v = json(&anemone(&[&["classify", o, "--json"][..], &texts].concat()));
        for i in 0..2 {
            assert_eq!(
                v["inputs"][i]["label"], reference["inputs"][i]["label"],
                "{head}"
            );
            for (g, w) in logits(&v, i).iter().zip(logits(&reference, i)) {
                assert!((g - w).abs() < 2e-2, "{head} input {i}: {g} vs {w}");
            }
        }
    }
}
