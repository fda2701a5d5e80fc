//! Corrupt GGUF files: each lie or truncation gives `CheckpointError::Corrupt` naming the file
//! and the problem — never a panic, an out-of-bounds read or a giant allocation.

mod gguf_support;

use anemone_checkpoint::{Checkpoint, CheckpointError};
use gguf_support::*;

/// A tiny llama GGUF with a small byte-level tokenizer, so string arrays are present to corrupt.
fn valid() -> (Vec<u8>, Layout) {
    let (mut w, _, _) = tiny_llama();
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    tokens.extend((0..VOCAB - 3).map(|i| {
        char::from(b'a' + (i % 26) as u8)
            .to_string()
            .repeat(1 + i / 26)
    }));
    w.kv("tokenizer.ggml.model", Val::Str("gpt2".into()))
        .kv("tokenizer.ggml.tokens", Val::StrArr(tokens))
        .kv("tokenizer.ggml.merges", Val::StrArr(vec!["a a".into()]))
        .kv("tokenizer.ggml.token_type", Val::I32Arr(vec![1; VOCAB]));
    w.write()
}

fn open_bytes(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let path = write_temp(bytes);
    anemone_models::open_checkpoint(&path)
}

/// Asserts a `Corrupt` error whose message contains `needle`, and that it names the file.
fn expect_corrupt(bytes: &[u8], needle: &str) {
    let path = write_temp(bytes);
    match anemone_models::open_checkpoint(&path) {
        Err(e @ CheckpointError::Corrupt { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
            assert!(
                msg.contains(&path.display().to_string()),
                "message {msg:?} does not name the file"
            );
        }
        other => panic!("expected Corrupt containing {needle:?}, got {other:?}"),
    }
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn the_uncorrupted_file_opens() {
    let (bytes, _) = valid();
    let ckpt = open_bytes(&bytes).unwrap();
    assert_eq!(ckpt.config.vocab_size, VOCAB);
}

#[test]
fn bad_magic() {
    let (mut bytes, _) = valid();
    bytes[..4].copy_from_slice(b"GGML");
    expect_corrupt(&bytes, "bad magic");
}

#[test]
fn unsupported_versions() {
    for version in [1u32, 4, 0x0300_0000] {
        let (mut bytes, _) = valid();
        bytes[4..8].copy_from_slice(&version.to_le_bytes());
        expect_corrupt(&bytes, "unsupported GGUF version");
    }
    let (mut bytes, _) = valid();
    bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
    expect_corrupt(&bytes, "big-endian");
}

#[test]
fn empty_file() {
    expect_corrupt(&[], "truncated");
}

#[test]
fn every_truncation_is_corrupt() {
    let (bytes, layout) = valid();
    // Every cut inside the header, then cuts through the data section.
    let cuts = (0..layout.infos_end).chain((layout.data_start..bytes.len()).step_by(97));
    for cut in cuts {
        match open_bytes(&bytes[..cut]) {
            Err(CheckpointError::Corrupt { problem, .. }) => assert!(
                problem.contains("truncated")
                    || problem.contains("remain")
                    || problem.contains("past the end")
                    || problem.contains("before its data section"),
                "cut at {cut}: {problem}"
            ),
            other => panic!(
                "cut at {cut} of {}: expected Corrupt, got {other:?}",
                bytes.len()
            ),
        }
    }
}

#[test]
fn lying_tensor_offset() {
    let (bytes, layout) = valid();
    let at = layout.tensor_offset_at["blk.1.ffn_down.weight"];
    for lie in [
        1u64 << 40,
        u64::MAX - 31,
        (bytes.len() - layout.data_start) as u64,
    ] {
        let mut b = bytes.clone();
        put_u64(&mut b, at, lie);
        expect_corrupt(&b, "extends past the end of the file");
    }
    let mut b = bytes.clone();
    put_u64(&mut b, at, 8);
    expect_corrupt(&b, "not a multiple of the alignment");
}

#[test]
fn lying_tensor_dimensions() {
    let (bytes, layout) = valid();
    // ne[1] of token_embd sits just before its type field (rank 2: ne[0], ne[1]).
    let at = layout.tensor_type_at["token_embd.weight"] - 8;
    let mut b = bytes.clone();
    put_u64(&mut b, at, u64::MAX / 2);
    expect_corrupt(&b, "token_embd.weight");
    let mut b = bytes.clone();
    put_u64(&mut b, at, 1 << 30);
    expect_corrupt(&b, "extends past the end of the file");
}

#[test]
fn lying_string_length() {
    let (bytes, layout) = valid();
    for lie in [u64::MAX, 1 << 40, bytes.len() as u64] {
        let mut b = bytes.clone();
        put_u64(&mut b, layout.key_len_at["general.architecture"], lie);
        expect_corrupt(&b, "claims");
        // A string inside an array: the first token's length, after element type and count.
        let mut b = bytes.clone();
        put_u64(&mut b, layout.value_at["tokenizer.ggml.tokens"] + 12, lie);
        expect_corrupt(&b, "claims");
    }
}

#[test]
fn huge_array_count() {
    let (bytes, layout) = valid();
    for key in ["tokenizer.ggml.tokens", "tokenizer.ggml.token_type"] {
        for lie in [u64::MAX, 1 << 60, 1 << 32] {
            let mut b = bytes.clone();
            put_u64(&mut b, layout.value_at[key] + 4, lie);
            expect_corrupt(&b, &format!("array count of `{key}`"));
        }
    }
}

#[test]
fn huge_header_counts() {
    let (bytes, _) = valid();
    for (at, what) in [(8, "tensor count"), (16, "metadata count")] {
        let mut b = bytes.clone();
        put_u64(&mut b, at, u64::MAX);
        expect_corrupt(&b, what);
    }
}

#[test]
fn unknown_value_type() {
    let (mut bytes, layout) = valid();
    let at = layout.value_at["llama.block_count"] - 4;
    bytes[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    expect_corrupt(&bytes, "unknown value type 99");
}

#[test]
fn invalid_utf8_key() {
    let (mut bytes, layout) = valid();
    let at = layout.key_len_at["general.architecture"] + 8;
    bytes[at] = 0xFF;
    expect_corrupt(&bytes, "not valid UTF-8");
}

#[test]
fn scattered_byte_flips_never_panic() {
    let (bytes, layout) = valid();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        let mut b = bytes.clone();
        for _ in 0..3 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = (state % layout.infos_end as u64) as usize;
            b[at] ^= (state >> 32) as u8 | 1;
        }
        // Any outcome but a panic is acceptable: a flipped value may still be a valid file.
        let _ = open_bytes(&b);
    }
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

#[test]
fn overlapping_tensor_data_is_corrupt_and_names_both_tensors() {
    let (bytes, layout) = valid();
    // blk.0.attn_q.weight made to start where token_embd.weight's data is
    let embd = get_u64(&bytes, layout.tensor_offset_at["token_embd.weight"]);
    let mut b = bytes.clone();
    put_u64(
        &mut b,
        layout.tensor_offset_at["blk.0.attn_q.weight"],
        embd + 64,
    );
    expect_corrupt(&b, "overlaps tensor `token_embd.weight`");
    expect_corrupt(&b, "`blk.0.attn_q.weight`");
}

#[test]
fn a_changed_ggml_type_that_still_fits_is_corrupt_and_named() {
    let (bytes, layout) = valid();
    // F32 -> F16: half the bytes, so the file still holds it, but the layout gives it away
    let mut b = bytes.clone();
    let at = layout.tensor_type_at["blk.0.attn_q.weight"];
    b[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    expect_corrupt(&b, "tensor `blk.0.attn_q.weight` (F16");
    expect_corrupt(&b, "type or shape disagrees with its data");
}
