//! Weight compression: int8/int4 linear quantization and LUT palettization with measured error.
//!
//! ```
//! use anemone_compress::{compress, emit_weight, Scheme};
//! use anemone_mil::{DType, FunctionBuilder, TensorType};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (o, i) = (64, 32);
//! let w: Vec<f32> = (0..o * i).map(|k| ((k * 37 % 101) as f32 - 50.0) * 1e-3).collect();
//! let c = compress("layers.0.mlp.up_proj", &w, &[o, i, 1, 1], &"lut4:group=16".parse()?)?;
//! assert!(c.stats().relative_rms < 0.1);
//!
//! let mut f = FunctionBuilder::new("main");
//! let x = f.input("x", TensorType::new(DType::F16, [1, i, 1, 8]))?;
//! let weight = emit_weight(&mut f, "up_proj_weight", &c)?; // constexpr_lut_to_dense
//! let y = f.conv1x1("up_proj", x, weight, None)?;
//! f.output(y)?;
//! # Ok(()) }
//! ```
//!
//! Shapes: weights are `[O, I]` (linear) or `[O, I, kH, kW]` (conv); axis 0 holds output
//! channels, axis 1 input channels. Linear schemes put one fp16 scale per output channel or per
//! block of input channels (scale shape `[O, I/B, 1…]`); palettes put one fp16 LUT per group of
//! output channels (LUT shape `[O/G, 1, 1…, 2^bits, 1]`) — the payload rules of coremltools'
//! iOS18 `constexpr_blockwise_shift_scale` / `constexpr_lut_to_dense`.
//!
//! Linear quantization is symmetric (`[-127, 127]` / `[-7, 7]`, no offset), with the scale the
//! smallest fp16 not below `max|w| / qmax` (nothing clips; every weight lands within half a
//! step) and rounding to nearest, ties to even. An all-zero block gets scale 1 and zero data.
//! Except: a weight from a block-quantized source (a GGUF Q4_1 dequantizes every 32 values to
//! `min + d·q`, q in 0..15) is stored on the source's own grids ([`LinearMode::Grid`], chosen
//! by the default [`LinearMode::Auto`] when ≥ 90% of sampled blocks lie on one): scale = the
//! grid step, an fp16 offset per block, reconstruction within fp16 rounding of the source.
//!
//! k-means clusters each group's values binned by fp16 value with exact moments of the
//! original f32 values, so it minimizes the true squared error at the LUT's own precision.
//! The default solver ([`KmeansAlgorithm::LLOYD`]) seeds Lloyd's iteration with the exact
//! optimum of a coarsened problem; [`KmeansAlgorithm::Optimal`] is the exact dynamic program.
//! On a Qwen3-0.6B-shaped block both match or beat coremltools' k-means (scikit-learn or
//! kmeans1d) in error at a small fraction of its time (`benches/compress_vs_coremltools.sh`).
//! Groups run in parallel (rayon). [`ErrorStats`] are measured on the weight Core ML will
//! reconstruct (fp16), against the original f32 values.

// Library code reports failures as errors; tests may unwrap (docs/ARCHITECTURE.md, "Lint gates").
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::panic,
        clippy::todo,
        clippy::unimplemented,
        clippy::dbg_macro
    )
)]

mod cluster;
mod config;
mod convert_hook;
mod error;
mod grid;
mod layout;
mod linear;
mod pack;
mod palette;
mod scheme;
mod stats;

pub use cluster::{cluster, Clustering, KmeansAlgorithm, SortedPoints};
pub use config::{CompressConfig, CompressRule};
pub use convert_hook::{
    CompressionRecord, CompressionSummary, ConfigCompressor, GroupSummary, RecordError,
    TensorRecord, LM_HEAD_TENSOR,
};
pub use error::{CompressError, Result};
pub use scheme::{LinearBits, LinearMode, PaletteMode, Scheme, DEFAULT_GROUP_SIZE, PALETTE_BITS};
pub use stats::ErrorStats;

use anemone_mil::{DType, FunctionBuilder, TensorData, Var};
use half::f16;

use layout::{check_finite, Layout};

/// The constexpr payload of one compressed weight.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    /// `constexpr_blockwise_shift_scale`: `data` int8/int4 of the weight's shape, `scale` fp16
    /// `[O, I/B, 1…]`, with a source grid an fp16 `offset` of the scale's shape.
    BlockwiseShiftScale {
        data: TensorData,
        scale: TensorData,
        offset: Option<TensorData>,
    },
    /// `constexpr_lut_to_dense`: `indices` uintN of the weight's shape, `lut` fp16
    /// `[O/G, 1, 1…, 2^N, 1]`.
    LutToDense {
        indices: TensorData,
        lut: TensorData,
    },
}

/// A compressed weight: what the constexpr op needs and how close it reconstructs. Only
/// [`compress`] makes one, so its payload always agrees with its shape and scheme.
#[derive(Clone, Debug, PartialEq)]
pub struct Compressed {
    scheme: Scheme,
    shape: Vec<usize>,
    payload: Payload,
    stats: ErrorStats,
}

impl Compressed {
    /// The scheme as applied: a linear [`LinearMode::Auto`] resolved to `Grid` (with the
    /// grid's block size) or `Symmetric`, group / block sizes as used.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// The dense weight's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn payload(&self) -> &Payload {
        &self.payload
    }

    /// Reconstruction error against the original weight.
    pub fn stats(&self) -> &ErrorStats {
        &self.stats
    }

    /// Bytes the payload occupies in weight.bin (data + scales / indices + LUTs).
    pub fn payload_bytes(&self) -> usize {
        match &self.payload {
            Payload::BlockwiseShiftScale {
                data,
                scale,
                offset,
            } => {
                data.bytes().len()
                    + scale.bytes().len()
                    + offset.as_ref().map_or(0, |o| o.bytes().len())
            }
            Payload::LutToDense { indices, lut } => indices.bytes().len() + lut.bytes().len(),
        }
    }

    /// The dense weight Core ML reconstructs (fp16 values as f32), decoded from the payload.
    pub fn decompress(&self) -> Vec<f32> {
        match &self.payload {
            Payload::BlockwiseShiftScale {
                data,
                scale,
                offset,
            } => {
                let q = data.to_f32_vec();
                let s = scale.to_f32_vec();
                let o = offset.as_ref().map(|o| o.to_f32_vec());
                let block = q.len() / s.len();
                let fp16 = |x: f32| f16::from_f32(x).to_f32();
                q.iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        // fp16(scale · fp16(data − offset)), as coremltools' decompress
                        let shifted = o.as_ref().map_or(v, |o| fp16(v - o[i / block]));
                        fp16(shifted * s[i / block])
                    })
                    .collect()
            }
            Payload::LutToDense { indices, lut } => {
                let idx = indices.to_f32_vec();
                let table = lut.to_f32_vec();
                let size = 1usize << indices.dtype().bits();
                let group_len = idx.len() / (table.len() / size);
                idx.iter()
                    .enumerate()
                    .map(|(i, &k)| table[(i / group_len) * size + k as usize])
                    .collect()
            }
        }
    }
}

/// Tuning beyond the scheme.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompressOptions<'a> {
    /// Per-weight importance (e.g. squared activations or a Fisher diagonal), same length as
    /// the weight, finite and `>= 0`: k-means minimizes the importance-weighted squared error.
    /// Ignored by linear and uniform schemes.
    pub importance: Option<&'a [f32]>,
    pub kmeans: KmeansAlgorithm,
}

/// Compresses one weight `[O, I, …]` with default options (no importance, Lloyd k-means).
/// `tensor` names it in errors.
pub fn compress(
    tensor: &str,
    weights: &[f32],
    shape: &[usize],
    scheme: &Scheme,
) -> Result<Compressed> {
    compress_with(tensor, weights, shape, scheme, &CompressOptions::default())
}

fn shape_error(tensor: &str, shape: &[usize], scheme: &Scheme, detail: String) -> CompressError {
    CompressError::ShapeMismatch {
        tensor: tensor.into(),
        shape: shape.to_vec(),
        scheme: scheme.to_string(),
        detail,
    }
}

/// A linear block size must divide the input channels.
fn check_block_size(
    tensor: &str,
    shape: &[usize],
    scheme: &Scheme,
    layout: &Layout,
    block_size: Option<usize>,
) -> Result<()> {
    match block_size.filter(|b| !layout.in_channels.is_multiple_of(*b)) {
        Some(block) => Err(shape_error(
            tensor,
            shape,
            scheme,
            format!(
                "block size {block} does not divide {} input channels",
                layout.in_channels
            ),
        )),
        None => Ok(()),
    }
}

/// Compresses one weight with explicit [`CompressOptions`].
pub fn compress_with(
    tensor: &str,
    weights: &[f32],
    shape: &[usize],
    scheme: &Scheme,
    options: &CompressOptions,
) -> Result<Compressed> {
    scheme.validate()?;
    let layout = Layout::new(tensor, shape, weights.len(), &scheme.to_string())?;
    if let Scheme::Source { block_size } = *scheme {
        let linear = |bits| Scheme::Linear {
            bits,
            block_size,
            mode: LinearMode::Auto,
        };
        check_block_size(tensor, shape, scheme, &layout, block_size)?;
        let (_, int4_grid) = linear::resolve(
            weights,
            &layout,
            LinearBits::Int4,
            block_size,
            LinearMode::Auto,
        );
        let bits = if int4_grid {
            LinearBits::Int4
        } else {
            LinearBits::Int8
        };
        return compress_with(tensor, weights, shape, &linear(bits), options);
    }
    let mil = |source| CompressError::Mil {
        tensor: tensor.into(),
        source,
    };
    // what was applied: a linear Auto mode resolves to Grid or Symmetric
    let mut applied = *scheme;
    let (payload, stats) = match *scheme {
        Scheme::Linear {
            bits,
            block_size,
            mode,
        } => {
            check_block_size(tensor, shape, scheme, &layout, block_size)?;
            let (block_size, grid) = linear::resolve(weights, &layout, bits, block_size, mode);
            applied = Scheme::Linear {
                bits,
                block_size,
                mode: if grid {
                    LinearMode::Grid
                } else {
                    LinearMode::Symmetric
                },
            };
            // NaN or infinity is looked for only when it shows (a scale overflow, a non-finite
            // error sum), so finite weights are read once
            let lq = match linear::quantize(tensor, weights, &layout, bits, block_size, grid) {
                Err(e) => {
                    check_finite(tensor, "weights", weights)?;
                    return Err(e);
                }
                Ok(lq) => {
                    if !lq.stats.relative_rms.is_finite() || !lq.stats.max_abs.is_finite() {
                        check_finite(tensor, "weights", weights)?;
                    }
                    lq
                }
            };
            let mut scale_shape = vec![1; shape.len()];
            scale_shape[0] = layout.out_channels;
            scale_shape[1] = lq.blocks_per_row;
            let data = match bits {
                LinearBits::Int8 => TensorData::from_bytes(DType::I8, shape.to_vec(), lq.q),
                LinearBits::Int4 => {
                    TensorData::from_bytes(DType::I4, shape.to_vec(), pack::pack_int4(&lq.q))
                }
            }
            .map_err(mil)?;
            let scale = TensorData::from_f16(scale_shape.clone(), &lq.scales).map_err(mil)?;
            let offset = lq
                .offsets
                .map(|o| TensorData::from_f16(scale_shape, &o))
                .transpose()
                .map_err(mil)?;
            tracing::trace!(tensor, scheme = %applied, grid_blocks = lq.grid_blocks,
                blocks = lq.scales.len(), "linear quantization");
            (
                Payload::BlockwiseShiftScale {
                    data,
                    scale,
                    offset,
                },
                lq.stats,
            )
        }
        Scheme::Source { .. } => unreachable!("resolved to a linear scheme above"),
        Scheme::Palettize {
            bits,
            mode,
            group_size,
        } => {
            check_finite(tensor, "weights", weights)?;
            let group = if group_size == 0 {
                layout.out_channels
            } else {
                group_size
            };
            if layout.out_channels % group != 0 {
                return Err(shape_error(
                    tensor,
                    shape,
                    scheme,
                    format!(
                        "group size {group} does not divide {} output channels",
                        layout.out_channels
                    ),
                ));
            }
            if let Some(imp) = options.importance {
                if imp.len() != weights.len() {
                    return Err(CompressError::LengthMismatch {
                        tensor: tensor.into(),
                        what: "importance",
                        shape: shape.to_vec(),
                        got: imp.len(),
                        want: weights.len(),
                    });
                }
                if let Some(index) = imp.iter().position(|v| !v.is_finite() || *v < 0.0) {
                    return Err(CompressError::NonFinite {
                        tensor: tensor.into(),
                        what: "importance",
                        index,
                        value: imp[index],
                        extra: " and >= 0",
                    });
                }
            }
            let p = palette::palettize(
                weights,
                options.importance,
                &layout,
                bits,
                mode,
                group,
                options.kmeans,
            );
            let index_dtype = match bits {
                1 => DType::U1,
                2 => DType::U2,
                3 => DType::U3,
                4 => DType::U4,
                6 => DType::U6,
                _ => DType::U8,
            };
            let indices = TensorData::from_bytes(
                index_dtype,
                shape.to_vec(),
                pack::pack_bits(&p.indices, bits as usize),
            )
            .map_err(mil)?;
            let mut lut_shape = vec![1; shape.len() + 2];
            lut_shape[0] = p.groups;
            lut_shape[shape.len()] = 1 << bits;
            let lut = TensorData::from_f16(lut_shape, &p.luts).map_err(mil)?;
            (Payload::LutToDense { indices, lut }, p.stats)
        }
    };
    Ok(Compressed {
        scheme: applied,
        shape: shape.to_vec(),
        payload,
        stats,
    })
}

/// Adds the constexpr op producing the dense fp16 weight to `f`; `name` names the op and its
/// output value.
pub fn emit_weight(f: &mut FunctionBuilder, name: &str, c: &Compressed) -> Result<Var> {
    let var = match &c.payload {
        Payload::BlockwiseShiftScale {
            data,
            scale,
            offset,
        } => f.constexpr_blockwise_shift_scale(name, data.clone(), scale.clone(), offset.clone()),
        Payload::LutToDense { indices, lut } => {
            f.constexpr_lut_to_dense(name, indices.clone(), lut.clone())
        }
    };
    var.map_err(|source| CompressError::Mil {
        tensor: name.into(),
        source,
    })
}
