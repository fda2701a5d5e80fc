//! SentencePiece vocabularies of GGUF files (`tokenizer.ggml.model = llama`: Llama 2, Gemma, …)
//! as a `tokenizers` BPE model, the way llama.cpp's SPM tokenizer works:
//!
//! - spaces become `▁` (and a leading `▁` is prepended when `tokenizer.ggml.add_space_prefix`);
//! - the text is split into characters and the adjacent pair whose concatenation is the token
//!   with the highest score is merged, again and again: a BPE whose merges are every
//!   `(left, right)` split of every token, ranked by that token's score;
//! - what no token covers falls back to the byte tokens `<0xXX>`.
//!
//! Tokens typed CONTROL are special added tokens, USER_DEFINED ones plain added tokens matched
//! in the raw text before anything else (Gemma's newline and space runs), as llama.cpp's
//! partitioning does.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::{DecoderWrapper, NormalizerWrapper, Tokenizer};

use super::metadata::Metadata;
use crate::error::{CheckpointError, Result};

/// llama.cpp token types.
const TOKEN_TYPE_NORMAL: i64 = 1;
const TOKEN_TYPE_BYTE: i64 = 6;

const SPACE: &str = "▁";

fn tokenizer_error(problem: String) -> CheckpointError {
    CheckpointError::Tokenizer { problem }
}

/// The SPM model of `meta` (`tokens` already read), with its normalizer and decoder; added
/// tokens and the BOS/EOS template are the caller's.
pub fn tokenizer(meta: &Metadata, tokens: &[&str], types: Option<&[i64]>) -> Result<Tokenizer> {
    let file = meta.path.display();
    let scores = meta.opt_array("tokenizer.ggml.scores")?.ok_or_else(|| {
        meta.bad(
            "tokenizer.ggml.scores",
            "required for a llama (SPM) tokenizer",
        )
    })?;
    if scores.len() != tokens.len() {
        return Err(meta.bad(
            "tokenizer.ggml.scores",
            format!("{} entries for {} tokens", scores.len(), tokens.len()),
        ));
    }
    let scores = scores
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.as_f64().ok_or_else(|| {
                meta.bad("tokenizer.ggml.scores", format!("entry {i}: not a number"))
            })
        })
        .collect::<Result<Vec<f64>>>()?;
    let types = types.ok_or_else(|| {
        meta.bad(
            "tokenizer.ggml.token_type",
            "required for a llama (SPM) tokenizer (byte tokens are found by it)",
        )
    })?;
    let add_space_prefix = meta
        .opt_bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);

    let mut vocab = Vocab::default();
    for (id, &t) in tokens.iter().enumerate() {
        // the first of duplicate texts wins, as in llama.cpp's token_to_id
        vocab.entry(t.to_string()).or_insert(id as u32);
    }
    for b in 0..=255u8 {
        let name = format!("<0x{b:02X}>");
        match vocab.get(&name) {
            Some(&id) if types[id as usize] == TOKEN_TYPE_BYTE => {}
            _ => {
                return Err(tokenizer_error(format!(
                    "{file}: byte token `{name}` missing from the SPM vocabulary (needed for \
                     byte fallback)"
                )))
            }
        }
    }
    // Every split of every normal token into two tokens is a merge; a higher score merges first.
    let mut merges: Vec<(f64, u32, String, String)> = Vec::new();
    for (id, &t) in tokens.iter().enumerate() {
        if types[id] != TOKEN_TYPE_NORMAL || vocab.get(t) != Some(&(id as u32)) {
            continue;
        }
        for (i, _) in t.char_indices().skip(1) {
            let (left, right) = t.split_at(i);
            if vocab.contains_key(left) && vocab.contains_key(right) {
                merges.push((scores[id], id as u32, left.to_string(), right.to_string()));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let merges: Vec<(String, String)> = merges.into_iter().map(|(_, _, l, r)| (l, r)).collect();
    let unk = meta
        .opt_u32("tokenizer.ggml.unknown_token_id")?
        .and_then(|id| tokens.get(id as usize))
        .map(|t| t.to_string());
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder
        .build()
        .map_err(|e| tokenizer_error(format!("{file}: SPM as BPE: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);

    let replace = Replace::new(" ", SPACE)
        .map_err(|e| tokenizer_error(format!("{file}: SPM normalizer: {e}")))?;
    let normalizer: NormalizerWrapper = if add_space_prefix {
        tokenizers::normalizers::Sequence::new(vec![
            Prepend::new(SPACE.to_string()).into(),
            replace.into(),
        ])
        .into()
    } else {
        replace.into()
    };
    tokenizer.with_normalizer(Some(normalizer));
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ")
            .map_err(|e| tokenizer_error(format!("{file}: SPM decoder: {e}")))?
            .into(),
        ByteFallback::default().into(),
        Fuse::default().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}
