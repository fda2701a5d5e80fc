//! Compression schemes and their text form (`int8`, `int4:block=32`, `lut4:kmeans:group=32`).

use std::fmt;
use std::str::FromStr;

use crate::error::{CompressError, Result};

/// Width of a symmetric linear quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearBits {
    /// int8 in [-127, 127].
    Int8,
    /// int4 in [-7, 7].
    Int4,
}

impl LinearBits {
    /// Largest quantized magnitude (the symmetric range is `[-qmax, qmax]`, as coremltools'
    /// `linear_symmetric` mode).
    pub fn qmax(self) -> i32 {
        match self {
            LinearBits::Int8 => 127,
            LinearBits::Int4 => 7,
        }
    }

    /// Data range on a source grid: the whole two's-complement range.
    pub fn grid_range(self) -> (i32, i32) {
        match self {
            LinearBits::Int8 => (-128, 127),
            LinearBits::Int4 => (-8, 7),
        }
    }

    /// Levels a source grid may have to be stored exactly.
    pub fn grid_levels(self) -> u32 {
        let (lo, hi) = self.grid_range();
        (hi - lo + 1) as u32
    }

    pub fn dtype(self) -> anemone_mil::DType {
        match self {
            LinearBits::Int8 => anemone_mil::DType::I8,
            LinearBits::Int4 => anemone_mil::DType::I4,
        }
    }
}

/// Where a linear quantization's grid comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearMode {
    /// Per tensor: [`LinearMode::Grid`] if nearly every sampled block of the weight lies on an
    /// affine grid of at most `2^bits` levels (a block-quantized source: GGUF Q4_0/Q4_1/Q8_0,
    /// the K-quants' sub-blocks), else [`LinearMode::Symmetric`]. The default.
    Auto,
    /// Symmetric max-abs scales (`[-qmax, qmax]`), no offset: coremltools' `linear_symmetric`.
    Symmetric,
    /// Blocks on an affine grid are stored on that grid (fp16 scale = its step, fp16 offset),
    /// reproducing them to fp16 precision; the other blocks are symmetric with offset 0.
    Grid,
}

/// How a palette (LUT) is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PaletteMode {
    /// 1-D k-means (see [`crate::KmeansAlgorithm`]).
    Kmeans,
    /// `2^bits` evenly spaced values from the group's minimum to its maximum.
    Uniform,
}

/// Palette sizes `constexpr_lut_to_dense` accepts (uint1/2/3/4/6/8 indices).
pub const PALETTE_BITS: [u8; 6] = [1, 2, 3, 4, 6, 8];

/// Default output channels sharing one LUT (coremltools' `per_grouped_channel` default).
pub const DEFAULT_GROUP_SIZE: usize = 32;

/// A compression scheme for one weight of shape `[O, I, ...]` (axis 0 = output channels,
/// axis 1 = input channels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Linear quantization → `constexpr_blockwise_shift_scale`. One fp16 scale (and with
    /// [`LinearMode::Grid`] one fp16 offset) per output channel (`block_size: None`) or per
    /// block of `block_size` input channels. [`LinearMode::Auto`] with no block size picks the
    /// block size of the source's grid (32, else 16).
    Linear {
        bits: LinearBits,
        block_size: Option<usize>,
        mode: LinearMode,
    },
    /// Palettization → `constexpr_lut_to_dense`: one fp16 LUT of `2^bits` entries per group of
    /// `group_size` output channels (`0` = one LUT for the whole tensor).
    Palettize {
        bits: u8,
        mode: PaletteMode,
        group_size: usize,
    },
    /// The narrowest linear width that keeps a block-quantized source exact: int4 on the
    /// source's grids where nearly every block has at most 16 levels (Q4_0/Q4_1/Q4_K), else
    /// int8 [`LinearMode::Auto`] (grids of up to 256 levels: Q5_x/Q6_K/Q8_0; symmetric per
    /// channel for weights without grids). Resolves per tensor to a `Linear` scheme.
    Source { block_size: Option<usize> },
}

impl Scheme {
    /// int8, [`LinearMode::Auto`], no block size.
    pub fn int8() -> Scheme {
        Scheme::Linear {
            bits: LinearBits::Int8,
            block_size: None,
            mode: LinearMode::Auto,
        }
    }

    /// int4, [`LinearMode::Auto`], no block size.
    pub fn int4() -> Scheme {
        Scheme::Linear {
            bits: LinearBits::Int4,
            block_size: None,
            mode: LinearMode::Auto,
        }
    }

    /// k-means palettization with the default group size.
    pub fn kmeans(bits: u8) -> Scheme {
        Scheme::Palettize {
            bits,
            mode: PaletteMode::Kmeans,
            group_size: DEFAULT_GROUP_SIZE,
        }
    }

    /// Checks the scheme's own parameters (not yet against a shape).
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: String| {
            Err(CompressError::InvalidScheme {
                text: self.to_string(),
                detail,
            })
        };
        match *self {
            Scheme::Linear {
                block_size: Some(0),
                ..
            }
            | Scheme::Source {
                block_size: Some(0),
            } => bad("block size must be >= 1".into()),
            Scheme::Palettize { bits, .. } if !PALETTE_BITS.contains(&bits) => {
                bad(format!("palette bits must be one of {PALETTE_BITS:?}"))
            }
            _ => Ok(()),
        }
    }

    /// Bits stored per weight, ignoring scales and LUTs.
    pub fn bits_per_weight(&self) -> u32 {
        match *self {
            Scheme::Linear { bits, .. } => bits.dtype().bits() as u32,
            Scheme::Palettize { bits, .. } => bits as u32,
            // at most int8 (a tensor that resolves to int4 stores 4)
            Scheme::Source { .. } => 8,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Scheme::Linear {
                bits,
                block_size,
                mode,
            } => {
                f.write_str(match bits {
                    LinearBits::Int8 => "int8",
                    LinearBits::Int4 => "int4",
                })?;
                f.write_str(match mode {
                    LinearMode::Auto => "",
                    LinearMode::Symmetric => ":symmetric",
                    LinearMode::Grid => ":grid",
                })?;
                if let Some(b) = block_size {
                    write!(f, ":block={b}")?;
                }
                Ok(())
            }
            Scheme::Source { block_size } => {
                f.write_str("source")?;
                if let Some(b) = block_size {
                    write!(f, ":block={b}")?;
                }
                Ok(())
            }
            Scheme::Palettize {
                bits,
                mode,
                group_size,
            } => {
                let mode = match mode {
                    PaletteMode::Kmeans => "kmeans",
                    PaletteMode::Uniform => "uniform",
                };
                write!(f, "lut{bits}:{mode}:group={group_size}")
            }
        }
    }
}

impl FromStr for Scheme {
    type Err = CompressError;

    /// `int8`, `int4`, with optional `:symmetric` / `:grid` / `:auto` and `:block=B`, `lutN` (N ∈ 1,2,3,4,6,8) with optional `:kmeans` /
    /// `:uniform` and `:group=G` in any order. Case-insensitive.
    fn from_str(text: &str) -> Result<Scheme> {
        let bad = |detail: String| CompressError::InvalidScheme {
            text: text.to_string(),
            detail,
        };
        let lower = text.trim().to_ascii_lowercase();
        let mut parts = lower.split(':');
        let kind = parts.next().unwrap_or_default();
        let parse_num = |key: &str, v: &str| {
            v.parse::<usize>()
                .map_err(|_| bad(format!("`{key}={v}` is not a non-negative integer")))
        };
        let mut scheme = match kind {
            "int8" => Scheme::int8(),
            "int4" => Scheme::int4(),
            "source" => Scheme::Source { block_size: None },
            k if k.starts_with("lut") => {
                let bits: u8 = k[3..]
                    .parse()
                    .map_err(|_| bad(format!("`{k}`: expected lutN with N a bit count")))?;
                Scheme::kmeans(bits)
            }
            other => {
                return Err(bad(format!(
                    "unknown kind `{other}` (expected int8, int4, source or lutN)"
                )))
            }
        };
        for part in parts {
            match (&mut scheme, part.split_once('=')) {
                (Scheme::Linear { block_size, .. }, Some(("block", v)))
                | (Scheme::Source { block_size }, Some(("block", v))) => {
                    *block_size = Some(parse_num("block", v)?)
                }
                (Scheme::Linear { mode, .. }, None) if part == "symmetric" => {
                    *mode = LinearMode::Symmetric
                }
                (Scheme::Linear { mode, .. }, None) if part == "grid" => *mode = LinearMode::Grid,
                (Scheme::Linear { mode, .. }, None) if part == "auto" => *mode = LinearMode::Auto,
                (Scheme::Palettize { group_size, .. }, Some(("group", v))) => {
                    *group_size = parse_num("group", v)?
                }
                (Scheme::Palettize { mode, .. }, None) if part == "kmeans" => {
                    *mode = PaletteMode::Kmeans
                }
                (Scheme::Palettize { mode, .. }, None) if part == "uniform" => {
                    *mode = PaletteMode::Uniform
                }
                _ => return Err(bad(format!("option `{part}` does not apply to `{kind}`"))),
            }
        }
        scheme.validate().map_err(|e| match e {
            CompressError::InvalidScheme { detail, .. } => bad(detail),
            other => other,
        })?;
        Ok(scheme)
    }
}

impl serde::Serialize for Scheme {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Scheme {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Scheme, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
