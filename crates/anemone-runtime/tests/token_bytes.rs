//! `TokenBytes` (a byte-level BPE's decoding as a flat table) decodes exactly as the tokenizer
//! it replaces, and `TextStream::owning` keeps only the table where there is one.

use anemone_runtime::{TextStream, TokenBytes};
use tokenizers::Tokenizer;

fn qwen3() -> Tokenizer {
    Tokenizer::from_file(anemone_testkit::model("qwen3-tokenizer/tokenizer.json")).unwrap()
}

const TEXT: &str = "Crème brûlée 🦀🦀 naïve 你好，世界 — ∑ done\n\ttabs  and\r\n<think>x</think>";

#[test]
fn every_token_decodes_as_the_tokenizer_decodes_it() {
    let tokenizer = qwen3();
    let table = TokenBytes::of(&tokenizer).expect("Qwen3's decoder is ByteLevel");
    let ids = tokenizer.get_vocab_size(true) as u32;
    assert!(ids > 151_000, "{ids}");
    // every id alone (a lone byte of a multi-byte character decodes to U+FFFD in both), the
    // special ones (skipped: empty), the added non-special ones (kept), and ids past the end
    let mut differ = Vec::new();
    for id in 0..ids + 3 {
        let want = tokenizer.decode(&[id], true).unwrap();
        if table.decode(&[id]) != want {
            differ.push(id);
        }
    }
    assert!(
        differ.is_empty(),
        "{} ids differ, first {:?}",
        differ.len(),
        &differ[..differ.len().min(8)]
    );
    assert_eq!(
        table.decode(&[151_644]),
        "",
        "<|im_start|> is special: skipped"
    );
    assert_eq!(
        table.decode(&[151_667]),
        "<think>",
        "<think> is added, not special"
    );
    assert!(table.heap_bytes() < 2 << 20, "{} bytes", table.heap_bytes());
}

#[test]
fn id_runs_decode_as_the_tokenizer_decodes_them() {
    let tokenizer = qwen3();
    let table = TokenBytes::of(&tokenizer).unwrap();
    let mut ids = tokenizer.encode(TEXT, false).unwrap().get_ids().to_vec();
    ids.splice(3..3, [151_644, 151_645, 151_643]);
    // every run of ids: runs that start or end inside a character's bytes included
    for a in 0..ids.len() {
        for b in a..=ids.len() {
            assert_eq!(
                table.decode(&ids[a..b]),
                tokenizer.decode(&ids[a..b], true).unwrap(),
                "ids[{a}..{b}]"
            );
        }
    }
}

#[test]
fn an_owning_stream_keeps_only_the_table_and_streams_the_same_text() {
    let tokenizer = qwen3();
    let ids = tokenizer.encode(TEXT, false).unwrap().get_ids().to_vec();
    let mut borrowed = TextStream::new(&tokenizer);
    let mut owning = TextStream::owning(tokenizer.clone());
    assert!(
        !owning.holds_tokenizer(),
        "a byte-level tokenizer is dropped"
    );
    assert!(borrowed.holds_tokenizer());
    for &id in &ids {
        assert_eq!(owning.push(id).unwrap(), borrowed.push(id).unwrap());
    }
    assert_eq!(owning.finish().unwrap(), borrowed.finish().unwrap());
    assert_eq!(owning.text().unwrap(), TEXT);
}

#[test]
fn other_decoders_keep_the_tokenizer() {
    let path = anemone_testkit::oracle_encoders_root().join("bert_mean_norm/tokenizer.json");
    let tokenizer = Tokenizer::from_file(path).unwrap();
    assert!(
        TokenBytes::of(&tokenizer).is_none(),
        "WordPiece without a decoder"
    );
    let text = "hello world, again";
    let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    let mut owning = TextStream::owning(tokenizer.clone());
    assert!(owning.holds_tokenizer());
    for &id in &ids {
        owning.push(id).unwrap();
    }
    assert_eq!(
        owning.text().unwrap(),
        tokenizer.decode(&ids, true).unwrap()
    );
}
