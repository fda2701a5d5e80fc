//! Log-probabilities of generated tokens, as OpenAI's `logprobs` / `top_logprobs` report them:
//! the log-softmax of the model's raw next-token logits (before temperature, top-p or any
//! sampling change), in f32 with the normalising sum accumulated in f64, and the bytes of each
//! token (a token may hold part of a UTF-8 character, so its text alone cannot say).

use tokenizers::decoders::DecoderWrapper;
use tokenizers::Tokenizer;

/// Most alternatives a request may ask for (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generated token's log-probability and the `top` most likely tokens at its step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// Most likely first (ties: lower id first), `(id, logprob)`.
    pub top: Vec<(u32, f32)>,
}

/// `log_softmax(logits)[id]` and the `top` largest entries of the log-softmax. NaN logits are
/// never among the top ones; the log-normaliser skips them.
pub fn token_logprob(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| f64::from(v - max).exp())
        .sum();
    let log_norm = max + sum.ln() as f32;
    let logprob = |v: f32| v - log_norm;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &v) in logits.iter().enumerate() {
            if v.is_nan() || (best.len() == top && v <= best[top - 1].1) {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= v);
            best.insert(at, (i as u32, v));
            best.truncate(top);
        }
    }
    TokenLogprob {
        id,
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&v| logprob(v)),
        top: best.into_iter().map(|(i, v)| (i, logprob(v))).collect(),
    }
}

/// The bytes a token stands for: byte-level BPE tokens (GPT-2's byte-to-character table) and
/// byte-fallback tokens (`<0xE3>`) exactly; otherwise the token decoded alone. Unknown ids give
/// no bytes.
pub fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let Some(piece) = tokenizer.id_to_token(id) else {
        return Vec::new();
    };
    if let Some(byte) = byte_fallback(&piece) {
        return vec![byte];
    }
    if is_byte_level(tokenizer.get_decoder()) {
        if let Some(bytes) = piece
            .chars()
            .map(byte_level_char)
            .collect::<Option<Vec<u8>>>()
        {
            return bytes;
        }
    }
    tokenizer
        .decode(&[id], false)
        .map(String::into_bytes)
        .unwrap_or_else(|_| piece.into_bytes())
}

fn byte_fallback(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

fn is_byte_level(decoder: Option<&DecoderWrapper>) -> bool {
    match decoder {
        Some(DecoderWrapper::ByteLevel(_)) => true,
        Some(DecoderWrapper::Sequence(s)) => {
            s.get_decoders().iter().any(|d| is_byte_level(Some(d)))
        }
        Some(
            DecoderWrapper::BPE(_)
            | DecoderWrapper::WordPiece(_)
            | DecoderWrapper::Metaspace(_)
            | DecoderWrapper::CTC(_)
            | DecoderWrapper::Replace(_)
            | DecoderWrapper::Fuse(_)
            | DecoderWrapper::Strip(_)
            | DecoderWrapper::ByteFallback(_),
        )
        | None => false,
    }
}

/// GPT-2's byte-level alphabet backwards: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes for U+0100.. in byte order.
fn byte_level_char(c: char) -> Option<u8> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let code = c as u32;
    if code < 256 && printable(code) {
        return Some(code as u8);
    }
    let offset = code.checked_sub(256)?;
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth(offset as usize)
        .map(|b| b as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_matches_the_definition_and_orders_the_top() {
        let logits = [1.0f32, 3.0, 2.0, f32::NAN, 3.0];
        let z: f64 = [1.0f64, 3.0, 2.0, 3.0].iter().map(|v| v.exp()).sum();
        let t = token_logprob(&logits, 2, 3);
        assert!((f64::from(t.logprob) - (2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(t.top.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 4, 2]);
        assert!((f64::from(t.top[0].1) - (3.0 - z.ln())).abs() < 1e-6);
        let probs: f64 = [0u32, 1, 2, 4]
            .iter()
            .map(|&i| f64::from(token_logprob(&logits, i, 0).logprob).exp())
            .sum();
        assert!((probs - 1.0).abs() < 1e-6);
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
    }

    #[test]
    fn byte_level_and_byte_fallback_tokens_map_to_their_bytes() {
        assert_eq!(byte_level_char('a'), Some(b'a'));
        assert_eq!(byte_level_char('Ġ'), Some(b' '));
        assert_eq!(byte_level_char('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_char('ł'), Some(160));
        assert_eq!(byte_level_char('Ń'), Some(173));
        assert_eq!(byte_level_char('\u{0144}'), None);
        assert_eq!(byte_fallback("<0xE3>"), Some(0xE3));
        assert_eq!(byte_fallback("<0xE>"), None);
        assert_eq!(byte_fallback("hello"), None);
    }
}
