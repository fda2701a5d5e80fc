//! What runs on the host: the token embedding, the final RMSNorm and the LM head (read from
//! `host.safetensors`), and the bundle's tokenizer.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use anemone_checkpoint::TokenizerBundle;
use anemone_exec::team::{self, SharedOut, Team};
use anemone_models::bundle::Manifest;
use anemone_models::families::decoder::tensor_names::{EMBED_TOKENS as EMBED, FINAL_NORM, LM_HEAD};
#[cfg(doc)]
use anemone_models::reference::kernels::{dot, dot_f16};
use anemone_models::reference::{rows_serial, rows_serial_f16};
use half::f16;
use memmap2::Mmap;

use super::PipelineError;

/// Values of one host tensor: read in place from the mapped `host.safetensors` (only the pages
/// a step touches become resident: an untied embedding costs the rows looked up, not the table;
/// the LM head, read whole every step, is read into the page cache at load, in huge pages where
/// the kernel gives them: [`anemone_mil::huge_pages`]), or copied out of the file when its
/// bytes cannot be read in place (misaligned, big-endian).
enum Values<T> {
    Mapped {
        map: Arc<Mmap>,
        range: std::ops::Range<usize>,
    },
    Owned(Vec<T>),
}

/// Types every bit pattern of which is a value (so bytes of the map may be read as them).
trait Plain: Copy {
    fn from_le(bytes: &[u8]) -> Self;
}

impl Plain for f32 {
    fn from_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Plain for f16 {
    fn from_le(b: &[u8]) -> Self {
        f16::from_le_bytes([b[0], b[1]])
    }
}

/// `bytes` as `T`s when they are aligned for `T` and the machine is little-endian (the file's
/// order), else `None`.
fn in_place<T: Plain>(bytes: &[u8]) -> Option<&[T]> {
    if cfg!(target_endian = "big") {
        return None;
    }
    // SAFETY: `T: Plain` is f32 or f16, for which every bit pattern is a valid value; align_to
    // only reinterprets the aligned middle part.
    let (head, values, tail) = unsafe { bytes.align_to::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(values)
}

impl<T: Plain> Values<T> {
    fn new(map: &Arc<Mmap>, range: std::ops::Range<usize>) -> Self {
        let bytes = &map[range.clone()];
        match in_place::<T>(bytes) {
            Some(_) => Values::Mapped {
                map: Arc::clone(map),
                range,
            },
            None => Values::Owned(
                bytes
                    .chunks_exact(std::mem::size_of::<T>())
                    .map(T::from_le)
                    .collect(),
            ),
        }
    }

    /// Asks the kernel to read mapped bytes into the page cache in the background, without
    /// mapping them (no resident memory is added); owned values are in memory already.
    fn read_ahead(&self) {
        if let Values::Mapped { map, range } = self {
            // a hint: a refusal leaves the bytes to be read when they are touched
            let _ = map.advise_range(memmap2::Advice::WillNeed, range.start, range.len());
        }
    }

    fn as_slice(&self) -> &[T] {
        match self {
            // the range was checked to read in place when the value was made
            Values::Mapped { map, range } => in_place(&map[range.clone()]).unwrap_or(&[]),
            Values::Owned(v) => v,
        }
    }
}

/// A host tensor kept in its stored dtype: fp16 tensors stay fp16 (half the memory of f32) and
/// are widened exactly when read, so every result equals the f32 computation on the widened
/// values bit for bit.
enum HostTensor {
    F32(Values<f32>),
    F16(Values<f16>),
}

impl HostTensor {
    fn row(&self, row: usize, width: usize) -> Cow<'_, [f32]> {
        let range = row * width..(row + 1) * width;
        match self {
            HostTensor::F32(v) => Cow::Borrowed(&v.as_slice()[range]),
            HostTensor::F16(v) => {
                Cow::Owned(v.as_slice()[range].iter().map(|h| h.to_f32()).collect())
            }
        }
    }

    /// `out[i] = Σ_j self[first + i, j]·x[j]`: each one [`dot`] / [`dot_f16`] (the same sums
    /// in the same order for either dtype), several rows a pass where the CPU has it.
    fn dot_rows(&self, first: usize, x: &[f32], out: &mut [f32]) {
        let range = first * x.len()..(first + out.len()) * x.len();
        match self {
            HostTensor::F32(v) => rows_serial(&v.as_slice()[range], x, out),
            HostTensor::F16(v) => rows_serial_f16(&v.as_slice()[range], x, out),
        }
    }

    fn read_ahead(&self) {
        match self {
            HostTensor::F32(v) => v.read_ahead(),
            HostTensor::F16(v) => v.read_ahead(),
        }
    }

    fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            HostTensor::F32(v) => v.as_slice().to_vec(),
            HostTensor::F16(v) => v.as_slice().iter().map(|x| x.to_f32()).collect(),
        }
    }
}

/// Bytes of tensor `name` in a `.safetensors` file's bytes; `None` if the header does not
/// parse or has no such tensor.
fn tensor_range(bytes: &[u8], name: &str) -> Option<std::ops::Range<usize>> {
    let (header_len, metadata) = safetensors::SafeTensors::read_metadata(bytes).ok()?;
    let (start, end) = metadata.info(name)?.data_offsets;
    let data = 8 + header_len;
    Some(data + start..data + end)
}

/// Host tensors in their stored dtype (F16 or F32), in Hugging Face layout (`[vocab, hidden]`
/// rows); sums run in f32.
pub struct HostWeights {
    hidden: usize,
    vocab: usize,
    eps: f32,
    embed: HostTensor,
    final_norm: Vec<f32>,
    /// `None` when the head is tied to the embedding or runs as its own package.
    lm_head: Option<HostTensor>,
    /// The head runs on the host (else in the LM-head package, which holds its own norm).
    head_on_host: bool,
}

impl HostWeights {
    pub fn load(dir: &Path, manifest: &Manifest) -> Result<Self, PipelineError> {
        let path = dir.join(&manifest.host.path);
        let io = |e: std::io::Error| PipelineError::Host {
            path: path.clone(),
            tensor: "(file)".into(),
            problem: e.to_string(),
        };
        let handle = std::fs::File::open(&path).map_err(io)?;
        let len = usize::try_from(handle.metadata().map_err(io)?.len())
            .map_err(|_| io(std::io::Error::other("larger than the address space")))?;
        let head_on_host = manifest.lm_head.is_none();
        let head_name = if manifest.config.tie_word_embeddings {
            EMBED
        } else {
            LM_HEAD
        };
        // SAFETY (of both maps): a bundle's files are never written in place (bundles are
        // replaced by an atomic directory exchange, which leaves a mapped file's inode as it was).
        let map = unsafe { anemone_mil::huge_pages::map(&handle, len) }.map_err(io)?;
        // the head, read whole every step, is read into the page cache now (in huge pages where
        // the kernel gives them) and mapped at the first logits, after the prefill's scratch is
        // gone; an unknown name is reported by `read_tensor` below
        let map = match head_on_host
            .then(|| tensor_range(&map, head_name))
            .flatten()
        {
            Some(range) => {
                unsafe { anemone_mil::huge_pages::make_cached(&handle, map, range) }.map_err(io)?
            }
            None => map,
        };
        let bytes = Arc::new(map);
        let file =
            safetensors::SafeTensors::deserialize(&bytes).map_err(|e| PipelineError::Host {
                path: path.clone(),
                tensor: "(header)".into(),
                problem: e.to_string(),
            })?;
        let c = &manifest.config;
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let load = |name: &str, shape: &[usize]| read_tensor(&path, &file, &bytes, name, shape);
        let embed = load(EMBED, &[vocab, h])?;
        let final_norm = load(FINAL_NORM, &[h])?.to_f32_vec();
        let lm_head = if head_on_host && !c.tie_word_embeddings {
            Some(load(LM_HEAD, &[vocab, h])?)
        } else {
            None
        };
        Ok(HostWeights {
            hidden: h,
            vocab,
            eps: c.residual_norm_eps() as f32,
            embed,
            final_norm,
            lm_head,
            head_on_host,
        })
    }

    /// The embedding row of `id` as f32 (checked against the vocabulary by the caller).
    pub fn embedding(&self, id: u32) -> Cow<'_, [f32]> {
        self.embed.row(id as usize, self.hidden)
    }

    /// Whether [`HostWeights::logits`] is the head (else the LM-head package is).
    pub fn head_on_host(&self) -> bool {
        self.head_on_host
    }

    /// To be called when a prompt starts: the host LM head, read whole at every logits, is read
    /// into the page cache in the background while the prompt runs through the chunks. Its
    /// cached pages are mapped only from the first logits on, and a kernel that reclaims idle
    /// page cache (memory pressure, or proactive reclaim such as DAMON's) may have dropped them
    /// since the load or the last step; faulted back in from disk inside the logits they cost
    /// more than the prefill itself (the project's benchmark host, Qwen2.5 fp32 bundle).
    pub fn start_prompt(&self) {
        if self.head_on_host {
            self.lm_head.as_ref().unwrap_or(&self.embed).read_ahead();
        }
    }

    /// `lm_head(rms_norm(x) · w)` for one hidden vector, in f32, its rows spread over `team`
    /// (each row one [`dot`] / [`dot_f16`], whichever thread or kernel runs it).
    pub fn logits(&self, x: &[f32], team: Option<&Team>) -> Vec<f32> {
        let h = self.hidden;
        let mean_sq = x.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / h as f64;
        let inv = 1.0 / (mean_sq + self.eps as f64).sqrt();
        let normed: Vec<f32> = x
            .iter()
            .zip(&self.final_norm)
            .map(|(v, w)| (*v as f64 * inv) as f32 * w)
            .collect();
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0f32; self.vocab];
        let row_bytes = h * if matches!(head, HostTensor::F16(_)) {
            2
        } else {
            4
        };
        let rows_per_unit = team::matvec_unit_rows(row_bytes);
        let units = self.vocab.div_ceil(rows_per_unit);
        let out = SharedOut::new(&mut logits);
        let vocab = self.vocab;
        team::for_each_run_from_ends(team, units, 1, &|run| {
            let first = run.start * rows_per_unit;
            let last = (run.end * rows_per_unit).min(vocab);
            // SAFETY: runs are disjoint row ranges of `logits`, which outlives the region.
            let rows = unsafe { out.slice(first..last) };
            head.dot_rows(first, &normed, rows);
        });
        logits
    }
}

/// A tensor of `file` in its stored dtype (F16 or F32 on disk), checked against `shape`, its
/// values read in place from `map` where they can be.
fn read_tensor(
    path: &Path,
    file: &safetensors::SafeTensors,
    map: &Arc<Mmap>,
    name: &str,
    shape: &[usize],
) -> Result<HostTensor, PipelineError> {
    let bad = |problem: String| PipelineError::Host {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        problem,
    };
    let view = file
        .tensor(name)
        .map_err(|e| bad(format!("not readable: {e}")))?;
    if view.shape() != shape {
        return Err(bad(format!(
            "shape {:?}, the manifest's config implies {shape:?}",
            view.shape()
        )));
    }
    let data = view.data();
    let start = data.as_ptr() as usize - map.as_ptr() as usize;
    let range = start..start + data.len();
    match view.dtype() {
        safetensors::Dtype::F32 => Ok(HostTensor::F32(Values::new(map, range))),
        safetensors::Dtype::F16 => Ok(HostTensor::F16(Values::new(map, range))),
        other => Err(bad(format!("dtype {other:?}; bundles hold F16 or F32"))),
    }
}

/// The bundle's `tokenizer.json` and chat template, if it has them.
pub(crate) fn load_tokenizer(
    dir: &Path,
    manifest: &Manifest,
) -> Result<Option<TokenizerBundle>, PipelineError> {
    let Some(entry) = &manifest.tokenizer else {
        return Ok(None);
    };
    let path = dir.join(&entry.path);
    let tokenizer =
        tokenizers::Tokenizer::from_file(&path).map_err(|e| PipelineError::Tokenizer {
            path: path.clone(),
            problem: e.to_string(),
        })?;
    let chat_template = match &entry.chat_template_path {
        Some(rel) => {
            let p = dir.join(rel);
            Some(
                std::fs::read_to_string(&p).map_err(|e| PipelineError::Tokenizer {
                    path: p.clone(),
                    problem: e.to_string(),
                })?,
            )
        }
        None => None,
    };
    Ok(Some(TokenizerBundle {
        tokenizer,
        chat_template,
        bos_token: entry.bos_token.clone(),
        eos_token: entry.eos_token.clone(),
        add_bos: entry.add_bos,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A map of `bytes` (a temporary file's).
    fn map_of(bytes: &[u8]) -> Arc<Mmap> {
        let file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut &file, bytes).unwrap();
        // SAFETY: the temporary file is private to this test and not written again.
        Arc::new(unsafe { Mmap::map(&file) }.unwrap())
    }

    #[test]
    fn the_head_range_is_the_bytes_of_the_named_tensor() {
        let embed: Vec<u8> = (0..24u8).collect();
        let head: Vec<u8> = (100..116u8).collect();
        let views = [("embed", [3usize, 2], &embed), ("head", [2usize, 2], &head)].map(
            |(name, shape, data)| {
                let view = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    shape.to_vec(),
                    data,
                )
                .unwrap();
                (name, view)
            },
        );
        let bytes = safetensors::serialize(views, None).unwrap();
        assert_eq!(&bytes[tensor_range(&bytes, "head").unwrap()], &head[..]);
        assert_eq!(&bytes[tensor_range(&bytes, "embed").unwrap()], &embed[..]);
        assert_eq!(tensor_range(&bytes, "lm_head"), None);
        assert_eq!(tensor_range(&bytes[..5], "head"), None);
    }

    #[test]
    fn values_read_in_place_or_copied_are_the_same() {
        let halves: Vec<f16> = (0..38).map(|i| f16::from_f32(i as f32 * -0.37)).collect();
        let singles: Vec<f32> = (0..37).map(|i| i as f32 * 1.0e-3 - 7.5).collect();
        // 38 halves, so the f32 run starts 4-aligned; the shifted copy misaligns both runs
        let mut bytes = vec![0u8; 8];
        bytes.extend(halves.iter().flat_map(|h| h.to_le_bytes()));
        bytes.extend(singles.iter().flat_map(|v| v.to_le_bytes()));
        bytes.push(0);
        let map = map_of(&bytes);
        let f32_at = 8 + 2 * halves.len();

        let aligned = Values::<f16>::new(&map, 8..f32_at);
        assert!(matches!(aligned, Values::Mapped { .. }));
        assert_eq!(aligned.as_slice(), halves.as_slice());
        let aligned = Values::<f32>::new(&map, f32_at..f32_at + 4 * singles.len());
        assert!(matches!(aligned, Values::Mapped { .. }));
        assert_eq!(aligned.as_slice(), singles.as_slice());

        let mut shifted = vec![0u8; 9];
        shifted.extend_from_slice(&bytes[8..]);
        let map = map_of(&shifted);
        let misaligned = Values::<f16>::new(&map, 9..f32_at + 1);
        assert!(matches!(misaligned, Values::Owned(_)));
        assert_eq!(misaligned.as_slice(), halves.as_slice());
        let misaligned = Values::<f32>::new(&map, f32_at + 1..f32_at + 1 + 4 * singles.len());
        assert!(matches!(misaligned, Values::Owned(_)));
        assert_eq!(misaligned.as_slice(), singles.as_slice());
    }
}
