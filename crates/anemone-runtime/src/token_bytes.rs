//! A byte-level BPE tokenizer's decoding as a flat table: each token's bytes, nothing else.
//!
//! A `tokenizers::Tokenizer` for a 49k-token vocabulary holds ~9 MiB resident (the vocabulary
//! both ways as hash maps of small strings, the merges); decoding ids needs only each token's
//! bytes, ~0.5 MiB. `generate` encodes its prompt once and then only decodes, so it keeps this
//! table and drops the tokenizer ([`crate::TextStream::owning`]).

use tokenizers::{DecoderWrapper, Tokenizer};

/// The bytes of every token id under a `ByteLevel` decoder (GPT-2's byte-to-character map
/// undone), empty for special tokens and for ids without a token.
///
/// Invariant: `decode(ids)` equals `tokenizer.decode(ids, true)` for every id sequence of the
/// tokenizer it was made from: that decoder concatenates the tokens' bytes (a token with a
/// character outside the map contributes its UTF-8 bytes unchanged) and reads them as UTF-8
/// lossily, and skipped (special or unknown) ids contribute nothing, as an empty entry does.
pub struct TokenBytes {
    /// All tokens' bytes, token after token.
    bytes: Vec<u8>,
    /// `ends[id]`: where token `id`'s bytes end in `bytes` (they start at `ends[id - 1]`, or 0).
    ends: Vec<u32>,
}

/// GPT-2's `bytes_to_unicode`, inverted: the byte a character of a byte-level token stands for.
/// Printable bytes (`!`..=`~`, 0xA1..=0xAC, 0xAE..=0xFF) are their own character; the other 68
/// bytes, in increasing order, are the characters U+0100, U+0101, ….
fn char_byte(c: char) -> Option<u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    match u32::from(c) {
        code @ 0..=0xFF => {
            let b = code as u8;
            printable(b).then_some(b)
        }
        code @ 0x100..=0x143 => {
            let nth = (code - 0x100) as usize;
            (0..=255u8).filter(|b| !printable(*b)).nth(nth)
        }
        _ => None,
    }
}

impl TokenBytes {
    /// The table of `tokenizer`'s tokens when its decoder is `ByteLevel` alone (the decoders of
    /// GPT-2-style BPE vocabularies: SmolLM2, Qwen, Llama 3); `None` for any other decoder.
    pub fn of(tokenizer: &Tokenizer) -> Option<Self> {
        if !matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let mut map = [0u8; 0x144];
        let mut mapped = [false; 0x144];
        for code in 0..0x144u32 {
            if let Some(b) = char::from_u32(code).and_then(char_byte) {
                map[code as usize] = b;
                mapped[code as usize] = true;
            }
        }
        let ids = tokenizer
            .get_vocab(true)
            .into_values()
            .max()
            .map_or(0, |m| m + 1);
        let added = tokenizer.get_added_vocabulary();
        let mut bytes = Vec::new();
        let mut ends = Vec::with_capacity(ids as usize);
        let mut token_bytes = Vec::new();
        for id in 0..ids {
            if let Some(token) = tokenizer.id_to_token(id) {
                if !added.is_special_token(&token) {
                    token_bytes.clear();
                    let all_mapped = token.chars().all(|c| {
                        let code = u32::from(c) as usize;
                        let hit = code < mapped.len() && mapped[code];
                        if hit {
                            token_bytes.push(map[code]);
                        }
                        hit
                    });
                    if all_mapped {
                        bytes.extend_from_slice(&token_bytes);
                    } else {
                        bytes.extend_from_slice(token.as_bytes());
                    }
                }
            }
            ends.push(u32::try_from(bytes.len()).ok()?);
        }
        bytes.shrink_to_fit();
        Some(TokenBytes { bytes, ends })
    }

    /// The bytes of token `id` (empty for a special token or an id without a token).
    fn token(&self, id: u32) -> &[u8] {
        let Some(&end) = self.ends.get(id as usize) else {
            return &[];
        };
        let start = match id {
            0 => 0,
            _ => self.ends[id as usize - 1],
        };
        &self.bytes[start as usize..end as usize]
    }

    /// `ids` as text, special tokens skipped (what `Tokenizer::decode(ids, true)` returns).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token(id));
        }
        match String::from_utf8(out) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// Bytes the table holds (its two vectors' lengths).
    pub fn heap_bytes(&self) -> usize {
        self.bytes.len() + 4 * self.ends.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_map_is_a_bijection_onto_all_bytes() {
        let mut seen = [false; 256];
        for code in 0..0x200u32 {
            if let Some(b) = char::from_u32(code).and_then(char_byte) {
                assert!(!seen[b as usize], "byte {b} mapped twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|s| *s));
        // GPT-2's table: space is U+0120 ('Ġ'), newline U+010A ('Ċ'), 0xAD U+0143
        assert_eq!(char_byte('\u{120}'), Some(b' '));
        assert_eq!(char_byte('\u{10A}'), Some(b'\n'));
        assert_eq!(char_byte('\u{143}'), Some(0xAD));
        assert_eq!(char_byte(' '), None);
    }
}
