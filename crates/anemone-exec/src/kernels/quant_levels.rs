//! The rule that admits a block of compressed data to the split kernels (`quant_split.rs`):
//! splitting in f32 rounds to fp16's 11 significant bits, which is fp16's rounding only where
//! every value a block can form is zero or an fp16 normal below the overflow threshold (or an
//! fp16 value already: a subnormal product of integer data). Checked
//! at load ([`split_levels_of`]), in O(1) a block.

use half::f16;

/// Whether the split kernels (`quant_split.rs`) form an 8-bit block (or a 4-bit block's
/// table), and how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Split {
    /// No: the f32 kernels form it.
    #[default]
    No,
    /// Yes, `r16(v − o)` rounded by splitting too.
    Rounds,
    /// Yes, with `v − o` exact in fp16 (no offset, or an integer one with every `|v − o|`
    /// at most 2048), so not rounded.
    Exact,
}

/// Veltkamp's splitting constant for rounding an f32 value to fp16's 11 significant bits:
/// `2^(24 − 11) + 1`.
pub(super) const SPLITTER: f32 = 8193.0;

/// `r16(t · s)` by splitting, as the split kernels form it (`t`, `s` fp16 values, so `t · s`
/// is exact in f32): `γ = t · (s · C)` (`s · C` exact: 11 + 14 bits fit in 24) is
/// `fl(C · (t · s))`, `δ = fl(γ − t · s)` (one fused multiply-add), `γ − δ` the product
/// rounded to 11 significant bits, to nearest even — fp16's rounding while the result is an
/// fp16 normal below the overflow threshold, which [`splits`] guarantees. (Zeros keep the
/// product's sign: `δ` is `+0` there.) Checked against `f16::from_f32` by the tests, and over
/// every pair by `examples/split_exhaustive.rs`.
#[inline]
pub fn split_product(t: f32, s: f32) -> f32 {
    let g = t * (s * SPLITTER);
    let d = (-t).mul_add(s, g);
    g - d
}

/// `r16(d)` by splitting, as the split kernels form `r16(v − o)` from the f32 difference `d`:
/// `γ = fl(C · d)`, `γ − fl(γ − d)`, `d` rounded to 11 significant bits, to nearest even.
#[inline]
pub fn split_round(d: f32) -> f32 {
    let g = d * SPLITTER;
    g - (g - d)
}

const MIN_NORMAL: f64 = 1.0 / 16384.0;
const OVERFLOW: f64 = 65520.0;

/// The bit width of a block's integer data: its codes' range is that of the width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bits {
    /// int4 (−8..=7) / uint4 (0..=15): a 4-bit row's 16-entry table.
    Four,
    /// int8 (−128..=127) / uint8 (0..=255).
    Eight,
}

impl Bits {
    /// The least and the largest data value (`signed`: int, else uint).
    fn range(self, signed: bool) -> (f64, f64) {
        match (self, signed) {
            (Bits::Four, true) => (-8.0, 7.0),
            (Bits::Four, false) => (0.0, 15.0),
            (Bits::Eight, true) => (-128.0, 127.0),
            (Bits::Eight, false) => (0.0, 255.0),
        }
    }
}

/// The least nonzero and the largest `|y|` over a block's possible `bits`-wide data `v`
/// ([`Bits::range`]), `y = r16(fl(v − o))` (or `v` without an offset), and whether
/// every `v − o` is exact in fp16; `None` when some nonzero `|v − o|` lies outside
/// `[2^-14, 65520)` (splitting would not round it as fp16 does). Both ends in O(1): the
/// extremes of `|v − o|` over the integers of the data range, rounded (monotone) as the
/// kernels round.
fn data_range(bits: Bits, signed: bool, offset: Option<f16>) -> Option<(f64, f64, bool)> {
    let (lo, hi) = bits.range(signed);
    let Some(o) = offset else {
        return Some((1.0, f64::max(-lo, hi), true));
    };
    let o = o.to_f64();
    if !o.is_finite() {
        return None;
    }
    let dmax = f64::max((lo - o).abs(), (hi - o).abs());
    // the nearest data value to `o` that differs from it (all exact in f64)
    let integer = o.fract() == 0.0;
    let dmin = if o < lo {
        lo - o
    } else if o > hi {
        o - hi
    } else if integer {
        1.0
    } else {
        f64::min(o - o.floor(), o.ceil() - o)
    };
    if dmin < MIN_NORMAL || dmax >= OVERFLOW {
        return None;
    }
    // the kernels round the f32 difference (monotone, as is r16)
    let r = |d: f64| f16::from_f32(d as f32).to_f64();
    // integers up to 2048 are fp16 values
    Some((r(dmin), r(dmax), integer && dmax <= 2048.0))
}

/// The level of `s` over data with range `range` ([`data_range`]).
///
/// Where the differences are exact (`Split::Exact`: integers `t`), a product `t · s` is an
/// integer multiple of 2^-24 (every fp16 value is), so one below 2^-14 is an fp16 subnormal
/// as it stands: fp16 leaves it as is, and so does splitting (it has at most 10 significant
/// bits). Only overflow refuses such a block, whatever its scale.
fn level_of(range: Option<(f64, f64, bool)>, scale: f16) -> Split {
    let Some((ymin, ymax, exact)) = range else {
        return Split::No;
    };
    let s = scale.to_f64().abs();
    let finite = s.is_finite() && ymax * s < OVERFLOW;
    let normal = s == 0.0 || ymin * s >= MIN_NORMAL;
    match (finite, exact, normal) {
        (false, ..) | (true, false, false) => Split::No,
        (true, false, true) => Split::Rounds,
        (true, true, _) => Split::Exact,
    }
}

/// Whether (and how) the split kernels form every value of a block of 8-bit data (`signed`:
/// int8, else uint8) with fp16 scale `scale` and fp16 offset `offset` (`None`: no offset)
/// exactly as `decompress` does: splitting rounds to 11 significant bits, which is fp16's
/// rounding only for results that are zero or fp16 normals (≥ 2^-14) below 65520 (from
/// there on fp16 rounds to infinity), or already fp16 values. So every nonzero `|v − o|` and
/// `|r16(v − o) · s|` over the block's possible data `v` must lie in `[2^-14, 65520)`, except
/// that products of integer differences (no offset, or an integer one: [`Split::Exact`]) may
/// be subnormal (`level_of`).
pub fn split_level(signed: bool, scale: f16, offset: Option<f16>) -> Split {
    split_level_of(Bits::Eight, signed, scale, offset)
}

/// [`split_level`] of a block of `bits`-wide data: the same rule over that width's range
/// (for [`Bits::Four`], a 4-bit row's 16 table entries `r16(r16(v − o) · s)`).
pub fn split_level_of(bits: Bits, signed: bool, scale: f16, offset: Option<f16>) -> Split {
    level_of(data_range(bits, signed, offset), scale)
}

/// Whether the split kernels form the block ([`split_level`] is not [`Split::No`]).
pub fn splits(signed: bool, scale: f16, offset: Option<f16>) -> bool {
    split_level(signed, scale, offset) != Split::No
}

/// The least [`split_level`] over each run of `per_row` blocks (a row group's) of 8-bit data
/// with these fp16 scales and offsets (one a block): the same levels, from a table of
/// `data_range` for every fp16 offset (built once), so a weight's check at load is a
/// lookup and two products per block.
pub fn split_levels(
    signed: bool,
    scales: &[f16],
    offsets: Option<&[f16]>,
    per_row: usize,
) -> Vec<Split> {
    split_levels_of(Bits::Eight, signed, scales, offsets, per_row)
}

/// [`split_levels`] of `bits`-wide data: each row group's least [`split_level_of`].
pub fn split_levels_of(
    bits: Bits,
    signed: bool,
    scales: &[f16],
    offsets: Option<&[f16]>,
    per_row: usize,
) -> Vec<Split> {
    use std::sync::OnceLock;
    // each offset's `data_range`, its ends as fp16 values (they are: rounded by `r16`, finite
    // below 65520), 6 bytes an entry: 384 KiB a table
    type Table = Vec<Option<(f16, f16, bool)>>;
    // by width, then signedness; each built on first use by a row with offsets
    static TABLES: [[OnceLock<Table>; 2]; 2] = [
        [OnceLock::new(), OnceLock::new()],
        [OnceLock::new(), OnceLock::new()],
    ];
    let table = |offsets: Option<&[f16]>| {
        offsets.map(|_| {
            TABLES[usize::from(bits == Bits::Eight)][usize::from(signed)].get_or_init(|| {
                (0..=u16::MAX)
                    .map(|o| {
                        let range = data_range(bits, signed, Some(f16::from_bits(o)));
                        range.map(|(lo, hi, exact)| (f16::from_f64(lo), f16::from_f64(hi), exact))
                    })
                    .collect()
            })
        })
    };
    let (plain, table) = (data_range(bits, signed, None), table(offsets));
    let level = |b: usize, s: f16| match (offsets, table) {
        (Some(o), Some(t)) => {
            let range = t[o[b].to_bits() as usize];
            level_of(
                range.map(|(lo, hi, exact)| (lo.to_f64(), hi.to_f64(), exact)),
                s,
            )
        }
        _ => level_of(plain, s),
    };
    if per_row == 0 || offsets.is_some_and(|o| o.len() < scales.len()) {
        return Vec::new();
    }
    scales
        .chunks(per_row)
        .enumerate()
        .map(|(r, row)| {
            let first = r * per_row;
            (row.iter().enumerate())
                .map(|(i, &s)| level(first + i, s))
                .min()
                .unwrap_or(Split::No)
        })
        .collect()
}
