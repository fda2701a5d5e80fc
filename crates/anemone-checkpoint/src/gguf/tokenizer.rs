//! The tokenizer a GGUF file stores in its metadata, rebuilt as a `tokenizers::Tokenizer`.
//!
//! Supported: `tokenizer.ggml.model = gpt2` (byte-level BPE) and `llama` (SentencePiece, see
//! `spm`). The pre-tokenizer is chosen from
//! `tokenizer.ggml.pre` with llama.cpp's regexes (llama-vocab.cpp); tokens typed CONTROL become
//! special added tokens and USER_DEFINED ones plain added tokens, as transformers' GGUF
//! conversion does, so `<|im_start|>` in text is one token.

use super::metadata::Metadata;
use crate::error::{CheckpointError, Result};
use crate::tokenizer::TokenizerBundle;
use std::collections::HashSet;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Llama 3's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`): like Llama 3's, one digit at a time.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token texts llama.cpp treats as end of generation wherever they appear in a vocabulary.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
];

/// How a vocabulary's text is split before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2's regex (llama.cpp `default`, `gpt-2`).
    Gpt2,
    /// Every digit alone, then GPT-2's regex (llama.cpp `smollm`, `starcoder`, `refact`, …).
    Gpt2SingleDigits,
    Llama3,
    Qwen2,
}

impl PreTokenizerKind {
    /// The kind for a `tokenizer.ggml.pre` value (absent = llama.cpp's default).
    pub fn from_ggml_pre(pre: Option<&str>) -> Option<Self> {
        Some(match pre.unwrap_or("default") {
            "default" | "gpt-2" | "gpt2" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => Self::Gpt2SingleDigits,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" | "dbrx" | "pixtral" => {
                Self::Llama3
            }
            "qwen2" | "deepseek-r1-qwen" | "megrez" => Self::Qwen2,
            _ => return None,
        })
    }

    fn build(self) -> Result<PreTokenizerWrapper> {
        let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
            Split::new(
                SplitPattern::Regex(pattern.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map(Into::into)
            .map_err(|e| tokenizer_error(format!("pre-tokenizer regex: {e}")))
        };
        let byte_level =
            |use_regex| PreTokenizerWrapper::from(ByteLevel::new(false, true, use_regex));
        Ok(match self {
            Self::Gpt2 => byte_level(true),
            Self::Gpt2SingleDigits => {
                Sequence::new(vec![split(r"\p{N}")?, byte_level(true)]).into()
            }
            Self::Llama3 => Sequence::new(vec![split(LLAMA3_SPLIT)?, byte_level(false)]).into(),
            Self::Qwen2 => Sequence::new(vec![split(QWEN2_SPLIT)?, byte_level(false)]).into(),
        })
    }
}

/// What the metadata's tokenizer yields: the bundle plus the ids the decoder config needs.
#[derive(Debug)]
pub struct GgufTokenizer {
    pub bundle: TokenizerBundle,
    pub vocab_size: usize,
    pub bos_token_id: Option<u32>,
    /// The EOS id first, then every other end-of-generation token (see [`eos_token_ids`]).
    pub eos_token_ids: Vec<u32>,
}

fn tokenizer_error(problem: String) -> CheckpointError {
    CheckpointError::Tokenizer { problem }
}

/// GPT-2's printable spelling of each byte (`bytes_to_unicode`).
pub fn byte_spelling() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in out.iter_mut().enumerate() {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).expect("codes below 512 are valid chars");
    }
    out
}

/// Builds the tokenizer described by `meta`, or `None` when the file carries no tokenizer.
pub fn build(meta: &Metadata) -> Result<Option<GgufTokenizer>> {
    let Some(model) = meta.opt_str("tokenizer.ggml.model")? else {
        return Ok(None);
    };
    let file = meta.path.display();
    let spm = match model {
        "gpt2" => false,
        "llama" => true,
        other => {
            return Err(tokenizer_error(format!(
                "{file}: tokenizer model `{other}` is not supported (only `gpt2` byte-level BPE \
                 and `llama` SentencePiece)"
            )))
        }
    };
    let tokens = meta
        .opt_str_array("tokenizer.ggml.tokens")?
        .ok_or_else(|| meta.bad("tokenizer.ggml.tokens", "required key is missing"))?;
    let token_types = meta.opt_int_array("tokenizer.ggml.token_type")?;
    if let Some(types) = &token_types {
        if types.len() != tokens.len() {
            return Err(meta.bad(
                "tokenizer.ggml.token_type",
                format!("{} entries for {} tokens", types.len(), tokens.len()),
            ));
        }
    }
    let token_id = |key: &str| -> Result<Option<u32>> {
        match meta.opt_u32(key)? {
            Some(id) if id as usize >= tokens.len() => Err(meta.bad(
                key,
                format!(
                    "token id {id} is outside the vocabulary of {}",
                    tokens.len()
                ),
            )),
            other => Ok(other),
        }
    };
    let bos = token_id("tokenizer.ggml.bos_token_id")?;
    let eos = token_id("tokenizer.ggml.eos_token_id")?;
    let eot = token_id("tokenizer.ggml.eot_token_id")?;
    let eom = token_id("tokenizer.ggml.eom_token_id")?;
    let add_bos = meta
        .opt_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(false);
    let add_eos = meta
        .opt_bool("tokenizer.ggml.add_eos_token")?
        .unwrap_or(false);

    let (mut tokenizer, in_vocab): (Tokenizer, SpelledAsWritten) = if spm {
        let tokenizer = super::spm::tokenizer(meta, &tokens, token_types.as_deref())?;
        (tokenizer, Box::new(|_: &str| true))
    } else {
        gpt2_tokenizer(meta, &tokens)?
    };
    let in_alphabet = |t: &str| in_vocab(t);
    if let Some(types) = &token_types {
        let control: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|&(t, &ty)| ty == TOKEN_TYPE_CONTROL && in_alphabet(t))
            .map(|(t, _)| AddedToken::from(*t, true).normalized(false))
            .collect();
        tokenizer.add_special_tokens(&control);
        let user: Vec<AddedToken> = tokens
            .iter()
            .zip(types)
            .filter(|&(t, &ty)| ty == TOKEN_TYPE_USER_DEFINED && in_alphabet(t))
            .map(|(t, _)| AddedToken::from(*t, false).normalized(false))
            .collect();
        tokenizer.add_tokens(&user);
    }

    let token_text = |id: Option<u32>| id.map(|i| tokens[i as usize].to_string());
    let (bos_token, eos_token) = (token_text(bos), token_text(eos));
    if add_bos || add_eos {
        let special = |id: Option<u32>, text: &Option<String>, key: &str| match (id, text) {
            (Some(id), Some(text)) => Ok((text.clone(), id)),
            _ => Err(meta.bad(key, "required when the file asks to add this token")),
        };
        let mut template = Vec::new();
        let mut specials = Vec::new();
        if add_bos {
            let (text, id) = special(bos, &bos_token, "tokenizer.ggml.bos_token_id")?;
            template.push(text.clone());
            specials.push((text, id));
        }
        template.push("$A".to_string());
        if add_eos {
            let (text, id) = special(eos, &eos_token, "tokenizer.ggml.eos_token_id")?;
            template.push(text.clone());
            specials.push((text, id));
        }
        let processor = TemplateProcessing::builder()
            .try_single(template)
            .map_err(|e| tokenizer_error(format!("{file}: BOS/EOS template: {e}")))?
            .special_tokens(specials)
            .build()
            .map_err(|e| tokenizer_error(format!("{file}: BOS/EOS template: {e}")))?;
        tokenizer.with_post_processor(Some(processor));
    }

    let chat_template = meta.opt_str("tokenizer.chat_template")?.map(str::to_string);
    let eos_token_ids = eos_token_ids(&tokens, token_types.as_deref(), [eos, eot, eom]);
    Ok(Some(GgufTokenizer {
        bundle: TokenizerBundle {
            tokenizer,
            chat_template,
            bos_token,
            eos_token,
            add_bos,
        },
        vocab_size: tokens.len(),
        bos_token_id: bos,
        eos_token_ids,
    }))
}

/// Whether a token text is in the model's vocabulary as written (so it can be an added token).
type SpelledAsWritten = Box<dyn Fn(&str) -> bool>;

/// The byte-level BPE of a `gpt2` vocabulary, and which token texts it spells as written.
fn gpt2_tokenizer(meta: &Metadata, tokens: &[&str]) -> Result<(Tokenizer, SpelledAsWritten)> {
    let file = meta.path.display();
    let pre_name = meta.opt_str("tokenizer.ggml.pre")?;
    let pre = PreTokenizerKind::from_ggml_pre(pre_name).ok_or_else(|| {
        tokenizer_error(format!(
            "{file}: pre-tokenizer `{}` (tokenizer.ggml.pre) is not supported \
             (supported: default, gpt-2, smollm, starcoder, llama-bpe, llama3, qwen2, …)",
            pre_name.unwrap_or_default()
        ))
    })?;
    let merges = meta
        .opt_str_array("tokenizer.ggml.merges")?
        .ok_or_else(|| meta.bad("tokenizer.ggml.merges", "required for a gpt2 tokenizer"))?;
    let spelling = byte_spelling();
    let alphabet: HashSet<char> = spelling.iter().copied().collect();
    let in_alphabet = move |t: &str| t.chars().all(|c| alphabet.contains(&c));
    // A token written with characters outside the byte alphabet is respelled byte by byte, as
    // transformers does, so BPE can reach it.
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, &t)| {
            let text = if in_alphabet(t) {
                t.to_string()
            } else {
                t.bytes().map(|b| spelling[b as usize]).collect()
            };
            (text, id as u32)
        })
        .collect();
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    meta.bad(
                        "tokenizer.ggml.merges",
                        format!("merge {i} `{m}` is not two tokens"),
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab.clone(), merges)
        .build()
        .map_err(|e| tokenizer_error(format!("{file}: BPE model: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre.build()?));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

    // user-defined tokens BPE cannot reach are left out, as before
    let in_vocab = move |t: &str| in_alphabet(t) && vocab.contains_key(t);
    Ok((tokenizer, Box::new(in_vocab)))
}

/// The ids that end generation, llama.cpp's way: the EOS, EOT and EOM ids the file names, then
/// every token whose text is a known end-of-turn marker (`<|im_end|>`, `<|endoftext|>`, …) —
/// chat models stop at the template's end token even when the file's EOS is another token.
pub fn eos_token_ids(
    tokens: &[&str],
    token_types: Option<&[i64]>,
    named: [Option<u32>; 3],
) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for id in named.into_iter().flatten() {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    for (id, t) in tokens.iter().enumerate() {
        let id = id as u32;
        let typed_normal = token_types.is_some_and(|types| types[id as usize] == 1);
        if END_OF_GENERATION_TEXTS.contains(t) && !typed_normal && !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_spelling_is_a_bijection_onto_printable_chars() {
        let s = byte_spelling();
        let set: HashSet<char> = s.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(s[b'A' as usize], 'A');
        assert_eq!(s[b' ' as usize], 'Ġ');
        assert_eq!(s[b'\n' as usize], 'Ċ');
        assert!(s.iter().all(|c| !c.is_whitespace() && !c.is_control()));
    }

    #[test]
    fn known_pre_tokenizers_and_unknown_one() {
        assert_eq!(
            PreTokenizerKind::from_ggml_pre(None),
            Some(PreTokenizerKind::Gpt2)
        );
        assert_eq!(
            PreTokenizerKind::from_ggml_pre(Some("smollm")),
            Some(PreTokenizerKind::Gpt2SingleDigits)
        );
        assert_eq!(
            PreTokenizerKind::from_ggml_pre(Some("qwen2")),
            Some(PreTokenizerKind::Qwen2)
        );
        assert_eq!(
            PreTokenizerKind::from_ggml_pre(Some("llama-bpe")),
            Some(PreTokenizerKind::Llama3)
        );
        assert_eq!(PreTokenizerKind::from_ggml_pre(Some("chatglm-bpe")), None);
        for kind in [
            PreTokenizerKind::Gpt2,
            PreTokenizerKind::Gpt2SingleDigits,
            PreTokenizerKind::Llama3,
            PreTokenizerKind::Qwen2,
        ] {
            kind.build().expect("regex compiles");
        }
    }

    #[test]
    fn eos_ids_put_the_named_eos_first_and_add_end_markers() {
        let tokens = [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "hello",
            "<|end|>",
        ];
        let types = [3, 3, 3, 1, 1];
        assert_eq!(
            eos_token_ids(&tokens, Some(&types), [Some(2), None, Some(2)]),
            vec![2, 0]
        );
        assert_eq!(
            eos_token_ids(&tokens, None, [None, None, None]),
            vec![0, 2, 4]
        );
    }
}
