//! The fuzz targets: each takes arbitrary bytes and must return (an error is fine) without a
//! panic, a hang or a giant allocation. `fuzz_targets/*.rs` hand them to libFuzzer
//! (`cargo fuzz`, nightly); `src/bin/drive.rs` runs them on stable with a seeded mutator.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

/// The GGUF reader on the bytes; a file it accepts is also opened as a checkpoint (config,
/// tokenizer, tensors).
pub fn gguf(data: &[u8]) {
    let path = Path::new("fuzz.gguf");
    if anemone_checkpoint::gguf::reader::parse(path, data).is_err() {
        return;
    }
    let mut file = tempfile::Builder::new().suffix(".gguf").tempfile().unwrap();
    file.write_all(data).unwrap();
    if let Ok(checkpoint) = anemone_models::open_checkpoint(file.path()) {
        let _ = anemone_models::families::validate_checkpoint(&checkpoint);
    }
}

/// A Hugging Face directory: the bytes as `model.safetensors` beside the oracle fixture's
/// `config.json`, opened and validated.
pub fn safetensors(data: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), CONFIG_JSON).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), data).unwrap();
    if let Ok(checkpoint) = anemone_models::open_checkpoint(dir.path()) {
        let _ = anemone_models::families::validate_checkpoint(&checkpoint);
    }
}

const CONFIG_JSON: &str = include_str!("../../tests/fixtures/oracle/qwen3_gqa4/config.json");

/// The weight.bin of the seed package, for the mlmodel target's blob references.
fn seed_blobs() -> &'static HashMap<String, anemone_mil::BlobFile> {
    static BLOBS: OnceLock<HashMap<String, anemone_mil::BlobFile>> = OnceLock::new();
    BLOBS.get_or_init(|| {
        let bytes = include_bytes!("../corpus/weight_bin/qwen3_gqa4-chunk-00.bin").to_vec();
        let blob = anemone_mil::BlobFile::parse("weight.bin", bytes).expect("seed weight.bin");
        HashMap::from([("weight.bin".to_string(), blob)])
    })
}

/// `model.mlmodel` (protobuf) read into a program against the seed weight.bin, then verified.
pub fn mlmodel(data: &[u8]) {
    if let Ok(program) = anemone_mil::read_model_proto("model.mlmodel", data, seed_blobs()) {
        let _ = anemone_mil::verify_program(&program);
    }
}

/// `weight.bin`: header, records, bounds.
pub fn weight_bin(data: &[u8]) {
    if let Ok(blob) = anemone_mil::BlobFile::parse("weight.bin", data.to_vec()) {
        for r in blob.records() {
            let _ = r.size_bytes;
        }
    }
}

/// A bundle's `anemone.json`, read (schema-checked) and verified against an empty bundle.
pub fn manifest(data: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("anemone.json"), data).unwrap();
    if let Ok(m) = anemone_models::bundle::read_manifest(dir.path()) {
        let _ = anemone_models::bundle::verify_bundle(dir.path(), &m);
        let _ = m.package_paths();
    }
}

/// Every target by name.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("mlmodel", mlmodel),
    ("weight_bin", weight_bin),
    ("manifest", manifest),
];
