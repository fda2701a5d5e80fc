//! The encoder reference forward against transformers (random-init BERT / RoBERTa / BERT with a
//! classifier head / a BERT cross-encoder on text pairs / ModernBERT base and with a
//! classifier head, padded batches) and against sentence-transformers on all-MiniLM-L6-v2.

use anemone_models::encoder::{open_encoder, EncoderReference, PoolingMode};
use anemone_testkit::{assert_close, cosine, oracle_encoders_root, real_fixture, Tier};
use serde_json::Value;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .flat_map(|x| match x {
            Value::Array(_) => floats(x),
            other => vec![other.as_f64().expect("number") as f32],
        })
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn read(path: &std::path::Path) -> Value {
    serde_json::from_slice(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn random_init_encoders_match_transformers_layer_by_layer() {
    let mut seen = 0;
    for (name, mode, normalize, labels) in [
        ("bert_mean_norm", PoolingMode::Mean, true, 0),
        ("bert_cls_classifier", PoolingMode::Cls, false, 3),
        ("roberta_lasttoken", PoolingMode::LastToken, false, 0),
        ("bert_pair_reranker", PoolingMode::Cls, false, 1),
        ("modernbert_mean", PoolingMode::Mean, true, 0),
        ("modernbert_classifier", PoolingMode::Cls, false, 3),
    ] {
        let dir = oracle_encoders_root().join(name);
        let ck = open_encoder(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ck.pooling.mode, mode, "{name}");
        assert_eq!(ck.pooling.normalize, normalize, "{name}");
        assert_eq!(ck.config.labels.len(), labels, "{name}");
        let reference = EncoderReference::load(&ck).unwrap();
        let oracle = read(&dir.join("oracle.json"));
        for (i, input) in oracle["inputs"].as_array().unwrap().iter().enumerate() {
            let ids = ids(&input["ids"]);
            let trace = reference.forward(i, &ids).unwrap();
            let want = input["hidden_states"].as_array().unwrap();
            assert_eq!(trace.hidden_states.len(), want.len(), "{name}: layer count");
            for (l, (got, want)) in trace.hidden_states.iter().zip(want).enumerate() {
                assert_close(
                    &format!("{name} input {i} hidden {l}"),
                    got,
                    &floats(want),
                    Tier::F32_SUM,
                );
            }
            let emb = reference.embed(i, &ids).unwrap();
            assert_close(
                &format!("{name} input {i} embedding"),
                &emb,
                &floats(&input["embedding"]),
                Tier::F32_SUM,
            );
            if labels > 0 {
                let logits = reference.logits(&trace).expect("head");
                assert_close(
                    &format!("{name} input {i} logits"),
                    &logits,
                    &floats(&input["logits"]),
                    Tier::F32_SUM,
                );
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 17);
}

/// A cross-encoder on text pairs: the tokenizer's pair template (`[CLS] A [SEP] B [SEP]`, token
/// type 1 from B on) gives transformers' ids and types, and the logits match.
#[test]
fn text_pairs_match_transformers_tokenizer_and_logits() {
    let dir = oracle_encoders_root().join("bert_pair_reranker");
    let ck = open_encoder(&dir).unwrap();
    let tok = ck.encoder_tokenizer().unwrap();
    let reference = EncoderReference::load(&ck).unwrap();
    let oracle = read(&dir.join("oracle.json"));
    let pairs = oracle["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 3);
    for (i, pair) in pairs.iter().enumerate() {
        let (a, b) = (pair["a"].as_str().unwrap(), pair["b"].as_str().unwrap());
        let enc = tok.encode_pair(i, a, b).unwrap();
        assert_eq!(enc.ids, ids(&pair["ids"]), "pair {i} ids");
        assert_eq!(enc.type_ids, ids(&pair["type_ids"]), "pair {i} token types");
        assert!(
            enc.type_ids.contains(&1),
            "pair {i}: second segment typed 1"
        );
        let trace = reference
            .forward_typed(i, &enc.ids, Some(&enc.type_ids))
            .unwrap();
        let logits = reference.logits(&trace).unwrap();
        assert_close(
            &format!("pair {i} logits"),
            &logits,
            &floats(&pair["logits"]),
            Tier::F32_SUM,
        );
        // Typing the second segment 0 changes the score: the types are really used.
        let untyped = reference
            .logits(&reference.forward(i, &enc.ids).unwrap())
            .unwrap();
        assert!(
            (untyped[0] - logits[0]).abs() > 1e-4,
            "pair {i}: types ignored"
        );
    }
    assert!(tok.encode_pair(0, "w5", " ").is_err());
}

#[test]
fn decoder_and_unknown_model_types_are_named() {
    let err = open_encoder(anemone_testkit::oracle_root().join("qwen3_gqa4")).unwrap_err();
    assert!(err.to_string().contains("is a decoder"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "t5"}"#).unwrap();
    let err = open_encoder(dir.path()).unwrap_err().to_string();
    assert!(err.contains("`t5`") && err.contains("bert"), "{err}");
    let err = anemone_models::open_checkpoint(oracle_encoders_root().join("bert_mean_norm"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is an encoder"), "{err}");
}

/// all-MiniLM-L6-v2 against sentence-transformers: token ids equal, embeddings within fp32
/// summation noise (cosine ≥ 0.99999).
#[test]
fn minilm_matches_sentence_transformers() {
    let fixture = read(&real_fixture("all-minilm-l6-v2.embeddings.json"));
    let ck = open_encoder(anemone_testkit::model("all-minilm-l6-v2")).unwrap();
    assert_eq!(ck.pooling.mode, PoolingMode::Mean);
    assert!(ck.pooling.normalize);
    let tok = ck.encoder_tokenizer().unwrap();
    let reference = EncoderReference::load(&ck).unwrap();
    for (i, item) in fixture["inputs"].as_array().unwrap().iter().enumerate() {
        let text = item["text"].as_str().unwrap();
        let got_ids = tok.encode(i, text).unwrap();
        assert_eq!(got_ids, ids(&item["ids"]), "input {i}: {text}");
        let emb = reference.embed(i, &got_ids).unwrap();
        let want = floats(&item["embedding"]);
        let cos = cosine(&emb, &want);
        assert!(cos >= 0.99999, "input {i}: cosine {cos}");
        assert_close(
            &format!("input {i} embedding"),
            &emb,
            &want,
            Tier::custom("fp32 vs torch, 6 layers", 1e-4),
        );
    }
}
