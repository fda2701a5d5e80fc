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
