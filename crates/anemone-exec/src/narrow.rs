//! 8-bit shift-scale weights whose every block holds at most 16 codes in one arithmetic
//! progression — a 4-bit source's grid stored as 8-bit data (a GGUF Q4_0 / Q4_1 / Q4_K
//! checkpoint converted with `--quantize int8`, its grids kept) — re-held at load as 4-bit
//! data: the same fp16 values from half the bytes, formed by the 4-bit kernels (a table of 16
//! values a block).
//!
//! A block's element is `r16(r16(v − o) · s)` (`v` the 8-bit code, `o` the block's fp16
//! offset, `s` its fp16 scale, `r16` rounding to fp16, the difference taken in f32), or
//! `r16(v · s)` without offsets. With `v = b + j·k` (`b` the block's base code, `j` its step,
//! `k ∈ 0..=15`) it is held as the 4-bit code `k`, scale `s' = r16(j · s)` and the f32 offset
//! `o' = (o − b) / j` (the 4-bit kernels take f32 offsets rounded after the subtraction), so
//! the element is formed as `r16(r16(k − o') · s')`. That is the same number wherever the
//! arithmetic is exact (`j` a power of two, no subnormal or inexact step) — which is not
//! assumed: every value a block's codes can take is formed both ways at load, and the weight
//! is narrowed only if all are the same bits. A weight is narrowed whole or not at all (one
//! layout a weight).

use anemone_mil::{DType, TensorData};
use half::f16;

use crate::decompress::shift_scale_element;
use crate::packed::{Blocks, OffsetValues};

/// A narrowed weight: 4-bit codes (`U4`, the 8-bit weight's shape), one f32 offset and one
/// fp16 scale a block.
pub(crate) struct Narrowed {
    pub data: TensorData,
    pub scales: TensorData,
    pub offsets: Vec<f32>,
}

/// Codes of a 4-bit block: `0..=LEVELS - 1`.
const LEVELS: i32 = 16;

/// A block's codes: least, largest, and the gcd of their differences.
#[derive(Clone, Copy)]
struct Span {
    lo: i32,
    hi: i32,
    step: i32,
}

/// `data` (8-bit codes of a shift-scale weight with fp16 scales `scale` and fp16 or no
/// offsets, blocks `blocks`) as 4-bit codes, when every block's codes lie on one progression
/// of at most 16 terms whose values formed as 4-bit data are the same bits; else `None` (the
/// weight stays as it is). The 8-bit codes' mapped pages are released when it is narrowed.
pub(crate) fn narrow(
    data: &TensorData,
    scale: &TensorData,
    offset: Option<&OffsetValues>,
    blocks: &Blocks,
) -> Option<Narrowed> {
    let signed = match data.dtype() {
        DType::I8 => true,
        DType::U8 => false,
        _ => return None,
    };
    let offsets = match offset {
        None => None,
        Some(OffsetValues::F16(o)) => Some(o.as_slice()),
        Some(OffsetValues::F32(_)) => return None,
    };
    let cols = *data.shape().get(1)?;
    let per = blocks.cols_per;
    if per == 0 || cols % per != 0 || blocks.rows_per == 0 || scale.dtype() != DType::F16 {
        return None;
    }
    let code = |b: u8| if signed { b as i8 as i32 } else { b as i32 };
    let spans = spans(data.bytes(), cols, blocks, &code)?;
    let scales = scale.to_f32_vec();
    let forms = (spans.iter().enumerate())
        .map(|(g, &span)| {
            let s = f16::from_f32(*scales.get(g)?);
            let o = match offsets {
                Some(o) => Some(*o.get(g)?),
                None => None,
            };
            held_as(span, s, o)
        })
        .collect::<Option<Vec<Form>>>()?;
    let codes = pack(data.bytes(), cols, blocks, &forms, code);
    let narrowed = TensorData::from_bytes(DType::U4, data.shape(), codes).ok()?;
    let new_scales: Vec<f16> = forms.iter().map(|f| f.scale).collect();
    let scales = TensorData::from_f16(scale.shape(), &new_scales).ok()?;
    // the 8-bit codes were read once, here; the weight is held as `narrowed` from now on
    data.release_pages();
    Some(Narrowed {
        data: narrowed,
        scales,
        offsets: forms.iter().map(|f| f.offset).collect(),
    })
}

/// Each block's [`Span`], in one pass over the codes that stops at the first block whose
/// codes cannot be 16 terms of one progression (its span over 15 times the gcd of the codes'
/// differences so far, which only shrinks as codes come: a full-range 8-bit weight stops at
/// its first block).
fn spans(
    bytes: &[u8],
    cols: usize,
    blocks: &Blocks,
    code: &impl Fn(u8) -> i32,
) -> Option<Vec<Span>> {
    let per = blocks.cols_per;
    let rows = bytes.len() / cols;
    let count = rows.div_ceil(blocks.rows_per) * blocks.col_blocks;
    // the first code seen of each block (the gcd of differences from it is that from any code)
    let mut first: Vec<Option<i32>> = vec![None; count];
    let empty = Span {
        lo: i32::MAX,
        hi: i32::MIN,
        step: 0,
    };
    let mut spans = vec![empty; count];
    for (r, row) in bytes.chunks_exact(cols).enumerate() {
        for (cb, run) in row.chunks_exact(per).enumerate() {
            let g = blocks.row(r) + cb;
            let (span, first) = (spans.get_mut(g)?, first[g].get_or_insert(code(run[0])));
            for &b in run {
                let v = code(b);
                span.lo = span.lo.min(v);
                span.hi = span.hi.max(v);
                span.step = gcd(span.step, v - *first);
            }
            if span.hi - span.lo > (LEVELS - 1) * span.step.max(1) {
                return None;
            }
        }
    }
    Some(spans)
}

fn gcd(mut a: i32, mut b: i32) -> i32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.abs()
}

/// How a block is held as 4-bit data: code `v` is `base + step · k`.
#[derive(Clone, Copy)]
struct Form {
    base: i32,
    step: i32,
    scale: f16,
    offset: f32,
}

/// The first form (steps: the codes' gcd, then 1; bases from the least code down) under which
/// every code of `span` forms the same fp16 bits as the 8-bit block (scale `s`, offset `o`).
fn held_as(span: Span, s: f16, o: Option<f16>) -> Option<Form> {
    let steps = [span.step.max(1), 1];
    steps.into_iter().find_map(|step| {
        if span.hi - span.lo > (LEVELS - 1) * step || (span.hi - span.lo) % step != 0 {
            return None;
        }
        let bases = (0..LEVELS).map(|i| span.lo - i * step);
        bases
            .take_while(|&b| span.hi - b <= (LEVELS - 1) * step)
            .find_map(|base| form_if_same(span, base, step, s, o))
    })
}

/// The form of base `base` and step `step`, if it gives the same bits for every code of the
/// span's progression.
fn form_if_same(span: Span, base: i32, step: i32, s: f16, o: Option<f16>) -> Option<Form> {
    let scale = f16::from_f64(s.to_f64() * step as f64);
    let o64 = o.map_or(0.0, f16::to_f64);
    let offset = ((o64 - base as f64) / step as f64) as f32;
    let form = Form {
        base,
        step,
        scale,
        offset,
    };
    // each value as `decompress` forms it in fp16 arithmetic (`r16(r16(v − o) · s)`, the f32
    // offset rounded after the subtraction too, as the 4-bit kernels take it)
    let element =
        |v: i32, s: f16, o: Option<f32>| shift_scale_element(v as f32, s.to_f32(), o, true, false);
    let same = (span.lo..=span.hi).step_by(step as usize).all(|v| {
        let old = element(v, s, o.map(f16::to_f32));
        let new = element((v - base) / step, scale, Some(offset));
        !old.is_nan() && old.to_bits() == new.to_bits()
    });
    same.then_some(form)
}

/// The 4-bit codes (two a byte, low nibble first) of the 8-bit codes `bytes` (rows of `cols`)
/// under each block's form.
fn pack(
    bytes: &[u8],
    cols: usize,
    blocks: &Blocks,
    forms: &[Form],
    code: impl Fn(u8) -> i32,
) -> Vec<u8> {
    let per = blocks.cols_per;
    let mut packed = vec![0u8; bytes.len().div_ceil(2)];
    for (r, row) in bytes.chunks_exact(cols).enumerate() {
        let first = blocks.row(r);
        for (c, &b) in row.iter().enumerate() {
            let Form { base, step, .. } = forms[first + c / per];
            let k = ((code(b) - base) / step) as u8;
            let e = r * cols + c;
            packed[e / 2] |= k << (4 * (e % 2));
        }
    }
    packed
}
