//! The Core ML backend: runs a bundle's `.mlpackage` chunks through `MLModel`, on the Neural
//! Engine by default, behind the same [`anemone_backend::Backend`] contract as the executor.
//!
//! Only Apple targets (`target_vendor = "apple"`) have Core ML: there `CoreMlBackend` compiles
//! each package once into a `.mlmodelc` cached by the package's content hash ([`cache`]), loads
//! it with the chosen compute units, keeps one `MLState` per session and serializes predictions
//! per model. Everywhere else the crate holds the platform-independent parts (options, errors,
//! the cache layout, the compute-plan summary) and [`availability`] says why Core ML is not
//! there. Nothing here has run on a Mac from this repository's CI: the Apple layer is
//! type-checked for `aarch64-apple-darwin` by `scripts/check-apple.sh`.

pub mod cache;
mod error;
pub mod plan;

#[cfg(target_vendor = "apple")]
mod apple;
#[cfg(target_vendor = "apple")]
mod apple_arrays;

#[cfg(target_vendor = "apple")]
pub use apple::{compute_plan, CoreMlBackend, CoreMlPackage, CoreMlState};
#[cfg(target_vendor = "apple")]
pub use apple_arrays::CoreMlBuffer;
pub use error::CoreMlError;

use std::path::PathBuf;

/// The devices Core ML may use (`MLComputeUnits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeUnits {
    /// CPU and Neural Engine (`cpuAndNeuralEngine`): the placement anemone's graphs are shaped
    /// for.
    #[default]
    Ane,
    /// CPU and GPU (`cpuAndGPU`).
    Gpu,
    /// CPU only (`cpuOnly`).
    Cpu,
    /// Whatever Core ML picks (`all`).
    All,
}

impl ComputeUnits {
    pub const ALL: [ComputeUnits; 4] = [
        ComputeUnits::Ane,
        ComputeUnits::Gpu,
        ComputeUnits::Cpu,
        ComputeUnits::All,
    ];

    /// The name `--compute-units` takes.
    pub fn name(self) -> &'static str {
        match self {
            ComputeUnits::Ane => "ane",
            ComputeUnits::Gpu => "gpu",
            ComputeUnits::Cpu => "cpu",
            ComputeUnits::All => "all",
        }
    }
}

impl std::str::FromStr for ComputeUnits {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ComputeUnits::ALL
            .into_iter()
            .find(|u| u.name() == s)
            .ok_or_else(|| format!("unknown compute units `{s}` (one of: ane, gpu, cpu, all)"))
    }
}

/// How the backend compiles and loads packages.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CoreMlOptions {
    pub compute_units: ComputeUnits,
    /// Compile every package afresh into a temporary directory instead of reusing (and
    /// filling) the cache.
    pub no_cache: bool,
    /// The cache root; `None` = [`cache::default_root`].
    pub cache_dir: Option<PathBuf>,
}

/// Whether Core ML can run anemone's bundles here.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Availability {
    pub available: bool,
    /// The OS version (`15.1`), where known.
    pub os_version: Option<String>,
    /// Why not, when not available.
    pub reason: Option<String>,
}

/// The oldest macOS whose Core ML runs stateful multi-function models (`MLState`,
/// `functionName`).
pub const MIN_MACOS_STATEFUL: (u32, u32) = (15, 0);
/// The oldest macOS with `MLComputePlan`.
pub const MIN_MACOS_PLAN: (u32, u32) = (14, 4);

/// Core ML's availability on this machine.
pub fn availability() -> Availability {
    #[cfg(target_vendor = "apple")]
    {
        apple::availability()
    }
    #[cfg(not(target_vendor = "apple"))]
    {
        Availability {
            available: false,
            os_version: None,
            reason: Some(unavailable_reason()),
        }
    }
}

/// Why Core ML is missing on a non-Apple target.
pub fn unavailable_reason() -> String {
    format!(
        "Core ML exists only on Apple platforms (macOS {}.{}+ for stateful bundles); this is {}-{}",
        MIN_MACOS_STATEFUL.0,
        MIN_MACOS_STATEFUL.1,
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// `(major, minor)` of a version string like `15.1.1`.
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// The element offset of row-major index `flat` of `shape` in an array laid out with `strides`
/// (elements): how the host reads and writes Core ML arrays whose rows are padded.
pub fn strided_offset(flat: usize, shape: &[usize], strides: &[usize]) -> usize {
    let mut rest = flat;
    let mut offset = 0;
    for (dim, stride) in shape.iter().zip(strides).rev() {
        let dim = (*dim).max(1);
        offset += (rest % dim) * stride;
        rest /= dim;
    }
    offset
}

/// For copying position `position` of an array `[.., T]` into one of `shape` `[.., 1]`: the
/// `(from, to)` element offsets of every value, through each array's strides.
pub fn position_offsets<'a>(
    shape: &'a [usize],
    from_strides: &'a [usize],
    to_strides: &'a [usize],
    position: usize,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    let step = from_strides.last().copied().unwrap_or(0);
    (0..shape.iter().product::<usize>()).map(move |flat| {
        (
            strided_offset(flat, shape, from_strides) + position * step,
            strided_offset(flat, shape, to_strides),
        )
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn position_offsets_take_one_column_through_padded_rows() {
        // from [1, 3, 1, 5] with 32-element rows, position 4, into [1, 3, 1, 1] with 32-element
        // rows too (an IOSurface pads a width-1 row the same way)
        let offsets: Vec<_> =
            super::position_offsets(&[1, 3, 1, 1], &[96, 32, 32, 1], &[96, 32, 32, 1], 4).collect();
        assert_eq!(offsets, [(4, 0), (36, 32), (68, 64)]);
        // dense arrays
        let dense: Vec<_> =
            super::position_offsets(&[1, 2, 1, 1], &[6, 3, 3, 1], &[2, 1, 1, 1], 2).collect();
        assert_eq!(dense, [(2, 0), (5, 1)]);
    }

    #[test]
    fn strided_offsets_skip_row_padding() {
        // [1, 3, 1, 5] fp16 in an IOSurface whose rows hold 32 elements (64 bytes)
        let (shape, strides) = ([1, 3, 1, 5], [96, 32, 32, 1]);
        let offsets: Vec<usize> = (0..15)
            .map(|i| strided_offset(i, &shape, &strides))
            .collect();
        assert_eq!(&offsets[..6], [0, 1, 2, 3, 4, 32]);
        assert_eq!(offsets[14], 68);
        // contiguous strides are the identity
        let dense = [15, 5, 5, 1];
        assert!((0..15).all(|i| strided_offset(i, &shape, &dense) == i));
    }

    use super::*;

    #[test]
    fn compute_units_parse_by_name_and_default_to_the_neural_engine() {
        for u in ComputeUnits::ALL {
            assert_eq!(u.name().parse::<ComputeUnits>(), Ok(u));
        }
        assert_eq!(ComputeUnits::default(), ComputeUnits::Ane);
        assert!("npu"
            .parse::<ComputeUnits>()
            .unwrap_err()
            .contains("ane, gpu"));
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("15.1.1"), Some((15, 1)));
        assert_eq!(parse_version("14"), Some((14, 0)));
        assert_eq!(parse_version("x"), None);
        assert!(parse_version("14.4").unwrap() >= MIN_MACOS_PLAN);
        assert!(parse_version("14.3").unwrap() < MIN_MACOS_PLAN);
    }

    #[cfg(not(target_vendor = "apple"))]
    #[test]
    fn elsewhere_core_ml_is_unavailable_with_the_reason() {
        let a = availability();
        assert!(!a.available);
        assert!(a.reason.unwrap().contains("only on Apple platforms"));
    }
}
