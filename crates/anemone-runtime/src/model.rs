//! The one thing generation needs from a model: next-token logits after feeding ids.

use crate::error::RuntimeError;
use anemone_models::reference::{LogitsFor, ReferenceModel};

/// Anything that turns a growing token sequence into next-token logits: the fp32 reference
/// forward, the pipeline of a converted bundle, …
///
/// Invariant: after `reset`, a sequence of `feed` calls behaves as one `feed` of their
/// concatenation (up to floating-point rounding); each returns the logits after its last id.
pub trait LogitsModel {
    /// Forgets every fed token (the next `feed` starts at position 0).
    fn reset(&mut self);
    /// Appends `ids` (non-empty) and returns the `[vocab_size]` logits after the last of them.
    fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>, RuntimeError>;
    fn vocab_size(&self) -> usize;
    /// Most tokens a sequence may hold.
    fn context_len(&self) -> usize;
    /// Tokens fed since the last reset.
    fn position(&self) -> usize;
}

impl LogitsModel for ReferenceModel {
    fn reset(&mut self) {
        ReferenceModel::reset(self)
    }

    fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        Ok(self.forward(ids, LogitsFor::LastPosition)?)
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn context_len(&self) -> usize {
        ReferenceModel::context_len(self)
    }

    fn position(&self) -> usize {
        ReferenceModel::position(self)
    }
}
