//! `host.safetensors`: the embedding, the final norm and (unless packaged or tied) the LM head,
//! in the bundle precision, under their Hugging Face names.

use std::path::Path;

use anemone_checkpoint::Checkpoint;
use half::f16;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::manifest::{HostEntry, HOST_FILE};
use super::BundleError;
use crate::ane::weights::load_checked;
use crate::ane::Precision;
use crate::families::decoder::tensor_names::{EMBED_TOKENS, FINAL_NORM, LM_HEAD};

fn encode(values: Vec<f32>, precision: Precision) -> Vec<u8> {
    match precision {
        Precision::Fp16 => values
            .into_iter()
            .flat_map(|v| f16::from_f32(v).to_le_bytes())
            .collect(),
        Precision::Fp32 => values.into_iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Writes the host tensors; `with_head` includes an untied `lm_head.weight`.
pub fn write_host_file(
    checkpoint: &Checkpoint,
    path: &Path,
    precision: Precision,
    with_head: bool,
) -> Result<HostEntry, BundleError> {
    let c = &checkpoint.config;
    let (h, vocab) = (c.hidden_size, c.vocab_size);
    let mut names = vec![(EMBED_TOKENS, vec![vocab, h]), (FINAL_NORM, vec![h])];
    if with_head && !c.tie_word_embeddings {
        names.push((LM_HEAD, vec![vocab, h]));
    }
    // one tensor's f32 copy at a time; only the encoded bytes are kept
    let mut encoded = Vec::with_capacity(names.len());
    for (name, shape) in &names {
        let values = load_checked(checkpoint, name, shape)?;
        encoded.push((name.to_string(), shape.clone(), encode(values, precision)));
    }
    let dtype = match precision {
        Precision::Fp16 => Dtype::F16,
        Precision::Fp32 => Dtype::F32,
    };
    let safetensors_error = |e: safetensors::SafeTensorError| BundleError::Safetensors {
        path: path.to_path_buf(),
        problem: e.to_string(),
    };
    let views = encoded
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(safetensors_error)
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(safetensors_error)?;
    Ok(HostEntry {
        path: HOST_FILE.into(),
        tensors: names.iter().map(|(n, _)| n.to_string()).collect(),
        dtype: format!("{dtype:?}"),
        tied_embeddings: c.tie_word_embeddings,
    })
}
