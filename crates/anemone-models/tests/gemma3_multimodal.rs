//! A multimodal Gemma 3 checkpoint (`Gemma3ForConditionalGeneration`, `model_type` gemma3,
//! `tools/oracle/make_gemma_multimodal_fixture.py`) opens as its text decoder: the same config
//! and tensors as the `gemma3_sliding_gqa2` text checkpoint it was built from, the vision tower
//! and projector not read, unknown top-level keys refused by name. (Its numerics against
//! transformers run with the other oracle fixtures: `oracle.rs`, the pipeline tests.)

use anemone_testkit::oracle_dir;
use serde_json::{json, Value};

#[test]
fn opens_as_its_text_decoder() {
    let mm = anemone_models::open_checkpoint(oracle_dir("gemma3_multimodal")).unwrap();
    let text = anemone_models::open_checkpoint(oracle_dir("gemma3_sliding_gqa2")).unwrap();
    assert_eq!(mm.config, text.config);
    let names = mm.tensors.names();
    assert_eq!(names, text.tensors.names());
    assert!(!names
        .iter()
        .any(|n| n.contains("vision") || n.contains("projector")));
    for name in &names {
        assert_eq!(
            mm.load_f32(name).unwrap(),
            text.load_f32(name).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn unknown_keys_and_a_missing_text_config_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let src = oracle_dir("gemma3_multimodal");
    let edit = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let dst = tmp.path().join("m");
        let _ = std::fs::remove_dir_all(&dst);
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
        let path = dst.join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        f(c.as_object_mut().unwrap());
        std::fs::write(&path, serde_json::to_vec(&c).unwrap()).unwrap();
        anemone_models::open_checkpoint(&dst)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let err = edit(&|c| {
        c.insert("audio_config".into(), json!({"x": 1}));
    });
    assert!(err.contains("audio_config"), "{err}");
    let err = edit(&|c| {
        c.remove("text_config");
    });
    assert!(err.contains("text_config"), "{err}");
    let err = edit(&|c| {
        c["text_config"]["final_logit_softcapping"] = json!(30.0);
    });
    assert!(err.contains("final_logit_softcapping"), "{err}");
}
