//! The bridge to `anemone convert`: [`ConfigCompressor`] applies a [`CompressConfig`] to every
//! projection and LM-head slice through the converter's [`WeightCompressor`] hook and leaves a
//! [`CompressionRecord`] (config, per-tensor scheme, error and bytes) in the manifest's
//! `compression` entry; [`CompressionRecord::summary`] condenses it per tensor group.
//!
//! Names matched against the config: projections by their Hugging Face name
//! (`model.layers.3.mlp.down_proj.weight`); LM-head slices always as `lm_head.weight`, also
//! when the head is tied to `model.embed_tokens.weight`, so one rule covers both.
//!
//! A group or block size that does not divide a tensor's channels (e.g. LM-head slices of
//! 15194 rows) is lowered to the largest divisor below it; the record holds the scheme applied.

use std::collections::BTreeMap;
use std::sync::Mutex;

use anemone_models::ane::{AneError, Precision, PreparedWeight, WeightCompressor};
use anemone_models::bundle::Manifest;
use serde::{Deserialize, Serialize};

use crate::{compress, CompressConfig, ErrorStats, Payload, Scheme};

/// Name LM-head slices are matched and recorded under.
pub const LM_HEAD_TENSOR: &str = "lm_head.weight";

/// What compression did to one weight (or one LM-head slice).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorRecord {
    /// The name matched against the config (see the module doc).
    pub tensor: String,
    /// The checkpoint tensor the values came from, when it differs from `tensor` (tied heads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `(first row, rows)` of an LM-head slice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<(usize, usize)>,
    pub shape: Vec<usize>,
    /// The scheme applied; `None` = stored dense.
    #[serde(default)]
    pub scheme: Option<Scheme>,
    /// Reconstruction error of the stored fp16 weight against the f32 original.
    #[serde(default)]
    pub error: Option<ErrorStats>,
    /// Bytes the weight takes dense at the bundle precision.
    pub dense_bytes: u64,
    /// Bytes it takes as stored.
    pub stored_bytes: u64,
}

/// The manifest's `compression` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompressionRecord {
    /// Where the config came from: `--quantize …`/`--palettize …` flags or a config file name.
    pub origin: String,
    pub config: CompressConfig,
    /// Every weight that went through the hook, in conversion order.
    pub tensors: Vec<TensorRecord>,
}

/// One tensor group (`mlp.down_proj`, `self_attn.q_proj`, `lm_head`) across layers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupSummary {
    pub group: String,
    /// Distinct schemes applied (`none` = dense).
    pub schemes: Vec<String>,
    pub tensors: usize,
    pub mean_relative_rms: f64,
    pub worst_relative_rms: f64,
    pub worst_tensor: String,
    pub max_abs: f64,
    pub dense_bytes: u64,
    pub stored_bytes: u64,
}

/// [`CompressionRecord`] condensed for `anemone inspect`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompressionSummary {
    pub origin: String,
    pub groups: Vec<GroupSummary>,
    pub compressed_tensors: usize,
    pub dense_tensors: usize,
    /// Mean and worst relative RMS over the compressed tensors.
    pub mean_relative_rms: f64,
    pub worst_relative_rms: f64,
    pub worst_tensor: String,
    pub dense_bytes: u64,
    pub stored_bytes: u64,
    pub bytes_saved: u64,
}

/// Why a manifest's `compression` entry could not be read as a [`CompressionRecord`].
#[derive(Debug, thiserror::Error)]
#[error("manifest `compression` entry is not an anemone compression record: {0}")]
pub struct RecordError(#[from] serde_json::Error);

impl CompressionRecord {
    /// The record of a bundle; `Ok(None)` when the bundle is uncompressed.
    pub fn from_manifest(manifest: &Manifest) -> Result<Option<CompressionRecord>, RecordError> {
        manifest
            .compression
            .as_ref()
            .map(|v| serde_json::from_value(v.clone()))
            .transpose()
            .map_err(RecordError)
    }

    pub fn summary(&self) -> CompressionSummary {
        let mut groups: BTreeMap<String, Vec<&TensorRecord>> = BTreeMap::new();
        for t in &self.tensors {
            groups.entry(group_of(&t.tensor)).or_default().push(t);
        }
        let groups: Vec<GroupSummary> = groups
            .into_iter()
            .map(|(group, members)| {
                let mut schemes: Vec<String> = members.iter().map(|t| scheme_name(t)).collect();
                schemes.sort();
                schemes.dedup();
                let errors = ErrorTally::of(members.iter().copied());
                GroupSummary {
                    group,
                    schemes,
                    tensors: members.len(),
                    mean_relative_rms: errors.mean(),
                    worst_relative_rms: errors.worst,
                    worst_tensor: errors.worst_tensor,
                    max_abs: errors.max_abs,
                    dense_bytes: members.iter().map(|t| t.dense_bytes).sum(),
                    stored_bytes: members.iter().map(|t| t.stored_bytes).sum(),
                }
            })
            .collect();
        let errors = ErrorTally::of(self.tensors.iter());
        let dense_bytes: u64 = self.tensors.iter().map(|t| t.dense_bytes).sum();
        let stored_bytes: u64 = self.tensors.iter().map(|t| t.stored_bytes).sum();
        CompressionSummary {
            origin: self.origin.clone(),
            groups,
            compressed_tensors: errors.count,
            dense_tensors: self.tensors.len() - errors.count,
            mean_relative_rms: errors.mean(),
            worst_relative_rms: errors.worst,
            worst_tensor: errors.worst_tensor,
            dense_bytes,
            stored_bytes,
            bytes_saved: dense_bytes.saturating_sub(stored_bytes),
        }
    }
}

fn scheme_name(t: &TensorRecord) -> String {
    t.scheme
        .map_or_else(|| "none".to_string(), |s| s.to_string())
}

/// `model.layers.3.mlp.down_proj.weight` → `mlp.down_proj`; `lm_head.weight` → `lm_head`.
fn group_of(tensor: &str) -> String {
    let rest = tensor
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once('.'))
        .map_or(tensor, |(_, r)| r);
    rest.strip_suffix(".weight").unwrap_or(rest).to_string()
}

/// Error statistics over the compressed members of a set of tensors.
#[derive(Default)]
struct ErrorTally {
    count: usize,
    sum: f64,
    worst: f64,
    worst_tensor: String,
    max_abs: f64,
}

impl ErrorTally {
    fn of<'a>(tensors: impl Iterator<Item = &'a TensorRecord>) -> ErrorTally {
        let mut tally = ErrorTally::default();
        for t in tensors {
            let Some(e) = t.error else { continue };
            tally.count += 1;
            tally.sum += e.relative_rms;
            tally.max_abs = tally.max_abs.max(e.max_abs);
            if e.relative_rms >= tally.worst {
                tally.worst = e.relative_rms;
                tally.worst_tensor = match t.rows {
                    Some((first, n)) => format!("{}[{first}..{}]", t.tensor, first + n),
                    None => t.tensor.clone(),
                };
            }
        }
        tally
    }

    fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }
}

/// The largest divisor of `n` not above `want` (at least 1).
fn largest_divisor_up_to(n: usize, want: usize) -> usize {
    (1..=want.min(n).max(1))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}

/// `scheme` with its group / block size lowered to fit `shape` (`[O, I, …]`).
fn fit_scheme(scheme: Scheme, shape: &[usize]) -> Scheme {
    match scheme {
        Scheme::Linear {
            bits,
            block_size: Some(b),
            mode,
        } if shape.len() >= 2 && !shape[1].is_multiple_of(b) => Scheme::Linear {
            bits,
            block_size: Some(largest_divisor_up_to(shape[1], b)),
            mode,
        },
        Scheme::Source {
            block_size: Some(b),
        } if shape.len() >= 2 && !shape[1].is_multiple_of(b) => Scheme::Source {
            block_size: Some(largest_divisor_up_to(shape[1], b)),
        },
        Scheme::Palettize {
            bits,
            mode,
            group_size,
        } if group_size != 0 && !shape.is_empty() && !shape[0].is_multiple_of(group_size) => {
            Scheme::Palettize {
                bits,
                mode,
                group_size: largest_divisor_up_to(shape[0], group_size),
            }
        }
        other => other,
    }
}

/// The [`WeightCompressor`] behind `anemone convert --quantize/--palettize/--compress-config`.
/// Weights are compressed one at a time (each in parallel over its groups); the per-tensor
/// record accumulates in conversion order.
#[derive(Debug)]
pub struct ConfigCompressor {
    origin: String,
    config: CompressConfig,
    records: Mutex<Vec<TensorRecord>>,
}

impl ConfigCompressor {
    /// `origin` says where `config` came from (recorded in the manifest).
    pub fn new(config: CompressConfig, origin: impl Into<String>) -> ConfigCompressor {
        ConfigCompressor {
            origin: origin.into(),
            config,
            records: Mutex::new(Vec::new()),
        }
    }

    pub fn config(&self) -> &CompressConfig {
        &self.config
    }

    /// Whether any tensor can be compressed at all (some rule or the default names a scheme).
    pub fn compresses_anything(&self) -> bool {
        self.config.default.is_some() || self.config.rules.iter().any(|r| r.scheme.is_some())
    }

    /// The record so far (complete once the conversion finished).
    pub fn record(&self) -> CompressionRecord {
        CompressionRecord {
            origin: self.origin.clone(),
            config: self.config.clone(),
            tensors: self.lock().clone(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<TensorRecord>> {
        // a panic while holding the lock only ever interrupts a push; the Vec stays valid
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl WeightCompressor for ConfigCompressor {
    fn compress(
        &self,
        tensor: &str,
        shape: &[usize],
        values: &[f32],
        precision: Precision,
    ) -> Result<Option<PreparedWeight>, AneError> {
        let is_projection = tensor.starts_with("model.layers.");
        let name = if is_projection {
            tensor
        } else {
            LM_HEAD_TENSOR
        };
        let dense_bytes = (values.len() * precision.bytes_per_weight()) as u64;
        let rows = if is_projection {
            None
        } else {
            let first = self
                .lock()
                .iter()
                .filter(|r| r.tensor == LM_HEAD_TENSOR)
                .map(|r| r.shape[0])
                .sum::<usize>();
            Some((first, shape[0]))
        };
        let mut record = TensorRecord {
            tensor: name.to_string(),
            source: (name != tensor).then(|| tensor.to_string()),
            rows,
            shape: shape.to_vec(),
            scheme: None,
            error: None,
            dense_bytes,
            stored_bytes: dense_bytes,
        };
        let Some(requested) = self.config.scheme_for(name) else {
            self.lock().push(record);
            return Ok(None);
        };
        if precision != Precision::Fp16 {
            return Err(AneError::Option {
                option: "precision",
                problem: format!(
                    "`{name}` is to be compressed ({requested}), but compressed weights decompress \
                     to fp16: convert with --precision fp16"
                ),
            });
        }
        let scheme = fit_scheme(requested, shape);
        if scheme != requested {
            tracing::debug!(tensor = name, shape = ?shape, %requested, applied = %scheme,
                "group/block size lowered to divide the tensor's channels");
        }
        let started = std::time::Instant::now();
        let compressed =
            compress(name, values, shape, &scheme).map_err(|e| AneError::Compression {
                tensor: name.to_string(),
                source: Box::new(e),
            })?;
        let stats = *compressed.stats();
        tracing::debug!(tensor = name, applied = %compressed.scheme(), relative_rms = stats.relative_rms,
            max_abs = stats.max_abs, ms = started.elapsed().as_millis() as u64, "compressed");
        // the scheme as applied: Auto resolves to Grid (with its block size) or Symmetric
        record.scheme = Some(*compressed.scheme());
        record.error = Some(stats);
        record.stored_bytes = compressed.payload_bytes() as u64;
        let weight = match compressed.payload() {
            Payload::BlockwiseShiftScale {
                data,
                scale,
                offset,
            } => PreparedWeight::BlockwiseShiftScale {
                data: data.clone(),
                scale: scale.clone(),
                offset: offset.clone(),
            },
            Payload::LutToDense { indices, lut } => PreparedWeight::Lut {
                indices: indices.clone(),
                lut: lut.clone(),
            },
        };
        self.lock().push(record);
        Ok(Some(weight))
    }

    fn describe(&self) -> Option<serde_json::Value> {
        // serializing plain data (strings, numbers, finite-or-null floats) cannot fail
        serde_json::to_value(self.record()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_strip_layer_and_suffix() {
        assert_eq!(
            group_of("model.layers.12.mlp.down_proj.weight"),
            "mlp.down_proj"
        );
        assert_eq!(
            group_of("model.layers.0.self_attn.q_proj.weight"),
            "self_attn.q_proj"
        );
        assert_eq!(group_of(LM_HEAD_TENSOR), "lm_head");
    }

    #[test]
    fn sizes_are_lowered_to_divisors() {
        assert_eq!(largest_divisor_up_to(15194, 32), 2);
        assert_eq!(largest_divisor_up_to(4864, 32), 32);
        assert_eq!(largest_divisor_up_to(24, 32), 24);
        let lut: Scheme = "lut4:group=32".parse().unwrap();
        assert_eq!(
            fit_scheme(lut, &[48, 64, 1, 1]),
            "lut4:group=24".parse().unwrap()
        );
        assert_eq!(fit_scheme(lut, &[64, 48, 1, 1]), lut);
        let int4: Scheme = "int4:block=32".parse().unwrap();
        assert_eq!(
            fit_scheme(int4, &[64, 48, 1, 1]),
            "int4:block=24".parse().unwrap()
        );
    }
}
