//! The weight-compression options of `anemone convert` and the compression summary that
//! `convert` and `inspect` print.

use std::path::PathBuf;

use anemone_compress::{
    CompressConfig, CompressionSummary, ConfigCompressor, Scheme, DEFAULT_GROUP_SIZE,
    LM_HEAD_TENSOR,
};
use anemone_models::ane::Precision;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QuantizeBits {
    Int8,
    Int4,
    /// int4 where the source's blocks have at most 16 levels, int8 elsewhere.
    Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LinearModeArg {
    Auto,
    Symmetric,
    Grid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PaletteModeArg {
    Kmeans,
    Uniform,
}

/// Weight compression of the chunk projections (and of the LM-head slices with
/// `--lm-head package`). At most one of --quantize, --palettize, --compress-config.
#[derive(Debug, Args)]
pub struct CompressArgs {
    /// Linear quantization (constexpr_blockwise_shift_scale): one fp16 scale per output
    /// channel, or per --block-size input channels. Weights from a block-quantized source
    /// (GGUF Q4_0/Q4_1/Q5_x/Q8_0/K-quants) are stored on the source's own grids instead — one
    /// fp16 scale and offset per 32 (or 16) weights — and keep the source's values to fp16
    /// precision (see --linear-mode). `source`: per tensor the narrowest of the two that
    /// holds a GGUF source exactly (int4 for Q4_0/Q4_1/Q4_K tensors, int8 for Q5/Q6/Q8).
    #[arg(long, value_enum, conflicts_with_all = ["palettize", "compress_config"])]
    pub quantize: Option<QuantizeBits>,

    /// With --quantize: one scale per block of B input channels instead of per output channel.
    #[arg(long, value_name = "B", requires = "quantize")]
    pub block_size: Option<usize>,

    /// With --quantize: auto = a tensor whose blocks lie on affine grids that fit the width
    /// (a block-quantized source) is stored on them, any other symmetrically; symmetric =
    /// always max-abs symmetric, no offset (coremltools' linear_symmetric); grid = source grids
    /// wherever a block has one, symmetric blocks elsewhere [default: auto].
    #[arg(long, value_enum, requires = "quantize")]
    pub linear_mode: Option<LinearModeArg>,

    /// Palettization to 2^N-entry lookup tables (constexpr_lut_to_dense), N in 2, 3, 4, 6, 8.
    #[arg(long, value_name = "N", conflicts_with = "compress_config")]
    pub palettize: Option<u8>,

    /// With --palettize: how each table is chosen [default: kmeans].
    #[arg(long, value_enum, requires = "palettize")]
    pub palette_mode: Option<PaletteModeArg>,

    /// With --palettize: output channels sharing one table [default: 32]; 0 = one table per
    /// tensor. Lowered to the largest divisor of a tensor's rows where it does not divide them.
    #[arg(long, value_name = "G", requires = "palettize")]
    pub group_size: Option<usize>,

    /// A JSON file mapping tensor-name patterns to schemes, first match wins, e.g.
    /// {"rules": [{"pattern": "*.mlp.*", "scheme": "lut4"},
    /// {"pattern": "lm_head.weight", "scheme": "lut8"}], "default": "int8"}.
    /// Projections match by Hugging Face name, LM-head slices as lm_head.weight.
    #[arg(long, value_name = "FILE")]
    pub compress_config: Option<PathBuf>,
}

impl CompressArgs {
    /// The config these options describe and where it came from; `None` without any option.
    pub fn config(&self) -> Result<Option<(CompressConfig, String)>> {
        if let Some(bits) = self.quantize {
            let mut text = match bits {
                QuantizeBits::Int8 => "int8".to_string(),
                QuantizeBits::Int4 => "int4".to_string(),
                QuantizeBits::Source => "source".to_string(),
            };
            match (bits, self.linear_mode.unwrap_or(LinearModeArg::Auto)) {
                (_, LinearModeArg::Auto) => {}
                (QuantizeBits::Source, _) => bail!(
                    "--linear-mode: --quantize source picks the source's grids itself (only \
                     auto applies)"
                ),
                (_, LinearModeArg::Symmetric) => text.push_str(":symmetric"),
                (_, LinearModeArg::Grid) => text.push_str(":grid"),
            }
            if let Some(b) = self.block_size {
                text.push_str(&format!(":block={b}"));
            }
            let scheme: Scheme = text.parse().context("--quantize/--block-size")?;
            return Ok(Some((CompressConfig::uniform(scheme), scheme.to_string())));
        }
        if let Some(bits) = self.palettize {
            if !matches!(bits, 2 | 3 | 4 | 6 | 8) {
                bail!("--palettize {bits}: expected 2, 3, 4, 6 or 8 bits per weight");
            }
            let mode = match self.palette_mode.unwrap_or(PaletteModeArg::Kmeans) {
                PaletteModeArg::Kmeans => "kmeans",
                PaletteModeArg::Uniform => "uniform",
            };
            let group = self.group_size.unwrap_or(DEFAULT_GROUP_SIZE);
            let scheme: Scheme = format!("lut{bits}:{mode}:group={group}")
                .parse()
                .context("--palettize")?;
            return Ok(Some((CompressConfig::uniform(scheme), scheme.to_string())));
        }
        if let Some(path) = &self.compress_config {
            let config = CompressConfig::from_path(path)?;
            let origin = path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into(),
            );
            return Ok(Some((config, origin)));
        }
        Ok(None)
    }

    /// The compressor for `convert`, checked against the other options.
    pub fn compressor(
        &self,
        precision: Precision,
        lm_head_packaged: bool,
    ) -> Result<Option<ConfigCompressor>> {
        let Some((config, origin)) = self.config()? else {
            return Ok(None);
        };
        let compressor = ConfigCompressor::new(config, origin);
        if !compressor.compresses_anything() {
            return Ok(Some(compressor));
        }
        if precision != Precision::Fp16 {
            bail!(
                "weight compression ({}) needs --precision fp16: compressed weights decompress \
                 to fp16",
                compressor.record().origin
            );
        }
        let names_head = compressor
            .config()
            .rules
            .iter()
            .any(|r| r.scheme.is_some() && r.pattern.starts_with("lm_head"));
        if names_head && !lm_head_packaged {
            bail!(
                "the compression config has a rule for {LM_HEAD_TENSOR}, but the LM head stays \
                 on the host (uncompressed): add --lm-head package or drop the rule"
            );
        }
        Ok(Some(compressor))
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// The text form of a compression summary, each line starting with `indent`.
pub fn print_summary(s: &CompressionSummary, indent: &str) {
    println!(
        "{indent}compression ({}): {} tensor(s) compressed, {} dense; relative RMS mean {:.2e}, \
         worst {:.2e} ({})",
        s.origin,
        s.compressed_tensors,
        s.dense_tensors,
        s.mean_relative_rms,
        s.worst_relative_rms,
        if s.worst_tensor.is_empty() {
            "-"
        } else {
            &s.worst_tensor
        }
    );
    println!(
        "{indent}  weights {} -> {} (saved {}, {:.2}x)",
        mib(s.dense_bytes),
        mib(s.stored_bytes),
        mib(s.bytes_saved),
        s.dense_bytes as f64 / s.stored_bytes.max(1) as f64
    );
    println!(
        "{indent}  {:<18} {:<24} {:>7} {:>10} {:>10} {:>9} {:>10}",
        "group", "scheme", "tensors", "mean rRMS", "worst rRMS", "max abs", "stored"
    );
    for g in &s.groups {
        println!(
            "{indent}  {:<18} {:<24} {:>7} {:>10.2e} {:>10.2e} {:>9.2e} {:>10}",
            g.group,
            g.schemes.join(","),
            g.tensors,
            g.mean_relative_rms,
            g.worst_relative_rms,
            g.max_abs,
            mib(g.stored_bytes)
        );
    }
}
