//! The final norm and LM head as their own package (`--lm-head package`): one `lm_head` function
//! from the last hidden state to logits, the vocabulary split into slices of at most
//! [`MAX_ANE_DIM`] outputs, each its own 1×1 conv and output `logits_{i}`.

use anemone_checkpoint::Checkpoint;
use anemone_mil::{DType, FunctionBuilder, Program, SpecVersion, TensorType};

use super::norm::rms_norm;
use super::options::{ChunkOptions, MAX_ANE_DIM};
use super::weights::{dense, load_checked, PreparedWeight, WeightCompressor};
use super::AneError;
use crate::families::decoder::tensor_names::{EMBED_TOKENS, FINAL_NORM, LM_HEAD};

pub const FUNCTION: &str = "lm_head";
pub const INPUT: &str = "hidden_states";

/// `(first token id, count)` of every vocabulary slice.
pub fn vocab_slices(vocab: usize) -> Vec<(usize, usize)> {
    let n = vocab.div_ceil(MAX_ANE_DIM).max(1);
    // equal slices (the last may be shorter), each <= MAX_ANE_DIM
    let per = vocab.div_ceil(n);
    (0..n)
        .map(|i| (i * per, per.min(vocab - i * per)))
        .filter(|(_, len)| *len > 0)
        .collect()
}

/// Builds the LM-head program. Loads the head (or the tied embedding) once as f32 and converts
/// it slice by slice; each slice `[len, hidden, 1, 1]` goes through `compressor` under the
/// head's tensor name.
pub fn build_lm_head_program(
    checkpoint: &Checkpoint,
    options: &ChunkOptions,
    compressor: &dyn WeightCompressor,
) -> Result<Program, AneError> {
    let c = &checkpoint.config;
    let (h, vocab) = (c.hidden_size, c.vocab_size);
    let dtype = options.precision.dtype();
    let head_name = if c.tie_word_embeddings {
        EMBED_TOKENS
    } else {
        LM_HEAD
    };
    let norm = dense(
        vec![h],
        &load_checked(checkpoint, FINAL_NORM, &[h])?,
        options.precision,
    )?;
    let head = load_checked(checkpoint, head_name, &[vocab, h])?;

    let mut f = FunctionBuilder::new(FUNCTION);
    let x = f.input(INPUT, TensorType::new(dtype, [1, h, 1, 1]))?;
    let normed = rms_norm(
        &mut f,
        "final_norm",
        x,
        1,
        &norm,
        c.residual_norm_eps() as f32,
        options.norm,
    )?;
    for (i, (first, len)) in vocab_slices(vocab).into_iter().enumerate() {
        let rows = &head[first * h..(first + len) * h];
        let shape = [len, h, 1, 1];
        let weight = match compressor.compress(head_name, &shape, rows, options.precision)? {
            Some(w) => w,
            None => PreparedWeight::Dense(dense(shape.to_vec(), rows, options.precision)?),
        };
        let w = weight.emit(&mut f, &format!("lm_head_{i}_weight"))?;
        let logits = f.conv1x1(&format!("logits_{i}"), normed, w, None)?;
        f.output(logits)?;
    }
    let mut program = Program::new(SpecVersion::V9);
    program.add_function(f.finish()?)?;
    program
        .metadata
        .insert("anemone.kind".into(), "lm_head".into());
    program
        .metadata
        .insert("anemone.precision".into(), options.precision.name().into());
    program
        .metadata
        .insert("anemone.norm".into(), options.norm.name().into());
    debug_assert!(dtype == DType::F16 || dtype == DType::F32);
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_vocabulary_within_the_limit() {
        for vocab in [1, 360, 16384, 16385, 49152, 151936] {
            let s = vocab_slices(vocab);
            assert_eq!(s[0].0, 0);
            assert!(
                s.iter().all(|(_, n)| *n <= MAX_ANE_DIM && *n > 0),
                "{vocab}: {s:?}"
            );
            assert_eq!(s.iter().map(|(_, n)| n).sum::<usize>(), vocab);
            for w in s.windows(2) {
                assert_eq!(w[0].0 + w[0].1, w[1].0);
            }
        }
        assert_eq!(vocab_slices(151936).len(), 10);
    }
}
