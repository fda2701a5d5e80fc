//! Incremental detokenization: text is released only once it is complete, so a multi-byte
//! character split across tokens is never printed half-way, and the concatenation of the pieces
//! equals decoding all ids at once.

use crate::error::RuntimeError;
use crate::token_bytes::TokenBytes;
use tokenizers::Tokenizer;

/// What a [`TextStream`] decodes with.
enum Source<'t> {
    Borrowed(&'t Tokenizer),
    Owned(Box<Tokenizer>),
    /// The tokenizer's byte table; the tokenizer itself was dropped.
    Bytes(TokenBytes),
}

pub struct TextStream<'t> {
    source: Source<'t>,
    ids: Vec<u32>,
    /// Ids before this index are fully accounted for in `emitted`.
    prefix_offset: usize,
    /// Ids before this index have been decoded and emitted.
    read_offset: usize,
    emitted: String,
}

impl<'t> TextStream<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        Self::from_source(Source::Borrowed(tokenizer))
    }

    fn from_source(source: Source<'t>) -> Self {
        Self {
            source,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            emitted: String::new(),
        }
    }

    /// A stream that owns its decoding: a byte-level BPE tokenizer becomes its token-byte table
    /// (the same text, ~1/16 of the memory) and is dropped here; any other tokenizer is kept.
    pub fn owning(tokenizer: Tokenizer) -> TextStream<'static> {
        TextStream::from_source(match TokenBytes::of(&tokenizer) {
            Some(table) => Source::Bytes(table),
            None => Source::Owned(Box::new(tokenizer)),
        })
    }

    /// Whether the stream still holds a whole tokenizer (else only its token-byte table).
    pub fn holds_tokenizer(&self) -> bool {
        !matches!(self.source, Source::Bytes(_))
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, RuntimeError> {
        self.ids.push(id);
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            if let Some(new) = full.get(prefix.len()..) {
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                self.emitted.push_str(new);
                return Ok(Some(new.to_string()));
            }
        }
        Ok(None)
    }

    /// Whatever is still held back (e.g. an incomplete character at the end), so that the pieces
    /// add up to [`TextStream::text`].
    pub fn finish(&mut self) -> Result<Option<String>, RuntimeError> {
        let all = self.text()?;
        let rest = match all.strip_prefix(self.emitted.as_str()) {
            Some(rest) => rest.to_string(),
            None => {
                tracing::warn!("incremental detokenization diverged from the full decode");
                return Ok(None);
            }
        };
        self.emitted.push_str(&rest);
        self.read_offset = self.ids.len();
        self.prefix_offset = self.ids.len();
        Ok((!rest.is_empty()).then_some(rest))
    }

    /// All ids decoded at once (special tokens skipped).
    pub fn text(&self) -> Result<String, RuntimeError> {
        self.decode(&self.ids)
    }

    /// `ids` as text, special tokens skipped.
    fn decode(&self, ids: &[u32]) -> Result<String, RuntimeError> {
        let tokenizer = match &self.source {
            Source::Borrowed(t) => *t,
            Source::Owned(t) => t,
            Source::Bytes(table) => return Ok(table.decode(ids)),
        };
        tokenizer
            .decode(ids, true)
            .map_err(|e| RuntimeError::Tokenizer {
                operation: "decode",
                problem: e.to_string(),
            })
    }
}
