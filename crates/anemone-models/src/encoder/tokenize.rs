//! Encoder tokenization (special tokens added, never truncated or padded) and length buckets
//! (each input goes to the smallest bucket that holds it; longer than the largest is an error).

use super::{EncoderError, Result};

/// A tokenizer with the checkpoint's padding and truncation switched off (all-MiniLM-L6-v2's
/// `tokenizer.json` pads and truncates to 128, which would silently cut long inputs).
#[derive(Clone)]
pub struct EncoderTokenizer {
    tokenizer: tokenizers::Tokenizer,
}

impl EncoderTokenizer {
    pub fn new(mut tokenizer: tokenizers::Tokenizer) -> Result<Self> {
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| EncoderError::Tokenizer {
                problem: format!("cannot switch truncation off: {e}"),
            })?;
        Ok(EncoderTokenizer { tokenizer })
    }

    /// Reads a `tokenizer.json`.
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let tokenizer =
            tokenizers::Tokenizer::from_file(path).map_err(|e| EncoderError::Tokenizer {
                problem: format!("{}: {e}", path.display()),
            })?;
        Self::new(tokenizer)
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }

    /// Token ids of input `index` with the model's special tokens (`[CLS] … [SEP]`).
    ///
    /// Empty or whitespace-only text is refused ([`EncoderError::EmptyInput`]); text that is
    /// not blank but has no word tokens (control characters, lone marks) is embedded as its
    /// special tokens alone, as sentence-transformers does.
    pub fn encode(&self, index: usize, text: &str) -> Result<Vec<u32>> {
        if text.trim().is_empty() {
            return Err(EncoderError::EmptyInput { index });
        }
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| EncoderError::Tokenizer {
                problem: format!("input {index}: {e}"),
            })?;
        Ok(enc.get_ids().to_vec())
    }
}

/// One tokenized input: ids and token types (1 for the second segment of a pair).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
}

impl EncoderTokenizer {
    /// A text pair (query, passage) as the tokenizer's pair template joins it — BERT:
    /// `[CLS] A [SEP] B [SEP]` with token type 1 from B on (cross-encoders, rerankers). Either
    /// side blank is refused.
    pub fn encode_pair(&self, index: usize, a: &str, b: &str) -> Result<Encoded> {
        if a.trim().is_empty() || b.trim().is_empty() {
            return Err(EncoderError::EmptyInput { index });
        }
        let enc = self
            .tokenizer
            .encode((a, b), true)
            .map_err(|e| EncoderError::Tokenizer {
                problem: format!("input {index}: {e}"),
            })?;
        Ok(Encoded {
            ids: enc.get_ids().to_vec(),
            type_ids: enc.get_type_ids().to_vec(),
        })
    }
}

/// Length buckets, ascending and distinct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buckets(Vec<usize>);

impl Buckets {
    /// `lengths` sorted; each must be ≥ 2 (room for the special tokens) and ≤ `max_tokens`
    /// (the position table).
    pub fn new(lengths: &[usize], max_tokens: usize) -> Result<Self> {
        let mut v = lengths.to_vec();
        v.sort_unstable();
        v.dedup();
        let bad = |problem: String| Err(EncoderError::Lengths { problem });
        match (v.first(), v.last()) {
            (Some(&lo), Some(&hi)) => {
                if lo < 2 {
                    return bad(format!("bucket {lo} is too short (at least 2 tokens)"));
                }
                if hi > max_tokens {
                    return bad(format!(
                        "bucket {hi} exceeds the model's {max_tokens} positions"
                    ));
                }
            }
            _ => return bad("no lengths given".into()),
        }
        Ok(Buckets(v))
    }

    pub fn lengths(&self) -> &[usize] {
        &self.0
    }

    pub fn largest(&self) -> usize {
        self.0.last().copied().unwrap_or(0)
    }

    /// The smallest bucket holding `tokens`, or [`EncoderError::TooLong`] naming both lengths.
    pub fn pick(&self, index: usize, tokens: usize) -> Result<usize> {
        self.0
            .iter()
            .copied()
            .find(|&b| b >= tokens)
            .ok_or(EncoderError::TooLong {
                index,
                tokens,
                largest: self.largest(),
            })
    }

    /// Input indices grouped by bucket (ascending buckets, input order within each).
    pub fn group(&self, token_counts: &[usize]) -> Result<Vec<(usize, Vec<usize>)>> {
        let mut groups: Vec<(usize, Vec<usize>)> =
            self.0.iter().map(|&b| (b, Vec::new())).collect();
        for (i, &n) in token_counts.iter().enumerate() {
            let b = self.pick(i, n)?;
            if let Some(g) = groups.iter_mut().find(|g| g.0 == b) {
                g.1.push(i);
            }
        }
        groups.retain(|g| !g.1.is_empty());
        Ok(groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smallest_bucket_and_too_long_names_both_lengths() {
        let b = Buckets::new(&[128, 32, 512], 512).unwrap();
        assert_eq!(b.lengths(), &[32, 128, 512]);
        assert_eq!(b.pick(0, 2).unwrap(), 32);
        assert_eq!(b.pick(0, 32).unwrap(), 32);
        assert_eq!(b.pick(0, 33).unwrap(), 128);
        let err = b.pick(4, 513).unwrap_err().to_string();
        assert!(
            err.contains("input 4") && err.contains("513") && err.contains("512"),
            "{err}"
        );
        let groups = b.group(&[40, 3, 200, 10]).unwrap();
        assert_eq!(
            groups,
            vec![(32, vec![1, 3]), (128, vec![0]), (512, vec![2])]
        );
        assert!(Buckets::new(&[1024], 512).is_err());
        assert!(Buckets::new(&[], 512).is_err());
    }
}
