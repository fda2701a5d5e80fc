//! Projection weights (1×1 conv, linear) held as the package stores them: fp16 values, or the
//! payload of an fp16 `constexpr_blockwise_shift_scale` (integer data + scales) or
//! `constexpr_lut_to_dense` (indices + fp16 palettes). Each element is formed exactly as
//! [`crate::decompress`] forms it, as an fp16 value, so a single-token matvec over a row formed
//! on the fly sums the same fp16 values in the same order as over the expanded weight (the fused
//! kernels of [`crate::kernels::quant`] where they apply, else a row at a time in portable code).

use anemone_mil::{DType, TensorData};
use half::f16;

use anemone_backend::round_f16_in_place;

use crate::decompress::check_blocks;
use crate::kernels::{gemm_f16, linalg, lut, quant, simd, Accumulation};
use crate::narrow;

/// A projection weight `[O, I, 1…]` (or `[O, I]`), read as `O` rows of `I` values.
pub(crate) struct HalfWeight {
    pub shape: Vec<usize>,
    pub data: WeightData,
}

pub(crate) enum WeightData {
    /// Plain fp16 values.
    Half(Halves),
    /// `scale * (data - offset)` per block, fp16 scale, integer data.
    ShiftScale {
        data: TensorData,
        /// The fp16 scales as stored (the package's own bytes).
        scale: TensorData,
        offset: Option<OffsetValues>,
        offset_promotes: bool,
        blocks: Blocks,
        /// Each row group's least [`quant::split_level_of`] over its blocks, for 8-bit or
        /// 4-bit data where the split kernels run (else empty: none split).
        split: Vec<quant::Split>,
    },
    /// `lut[block, index]`, fp16 palettes of `palette` entries.
    Lut {
        indices: TensorData,
        table: Vec<f16>,
        palette: usize,
        blocks: Blocks,
    },
}

/// A shift-scale weight's offsets, one a block: as fp16 bit patterns when `data - offset`
/// rounds to fp16 (the offset is not fp32) and every offset is exactly an fp16 value (an
/// fp16 or 8-bit or narrower integer offset always is) — half the bytes, and the form the
/// fused kernels broadcast from memory — else as f32. Stored fp16 offsets are read in place
/// from the package's bytes ([`Halves::of`]), not copied.
pub(crate) enum OffsetValues {
    F16(Halves),
    F32(Vec<f32>),
}

impl OffsetValues {
    /// The offsets `o` of a weight whose scale is fp16.
    fn of(o: &TensorData) -> Self {
        if o.dtype() == DType::F16 {
            // fp16 offsets do not promote and are their own fp16 values
            return OffsetValues::F16(Halves::of(o));
        }
        let values = o.to_f32_vec();
        let promotes = o.dtype() == DType::F32;
        let exact = |v: &f32| f16::from_f32(*v).to_f32().to_bits() == v.to_bits();
        if !promotes && values.iter().all(exact) {
            OffsetValues::F16(Halves::Owned(
                values.iter().map(|&v| f16::from_f32(v)).collect(),
            ))
        } else {
            OffsetValues::F32(values)
        }
    }

    /// Offset `g` as f32 (exactly the stored value).
    #[inline]
    fn at(&self, g: usize) -> f32 {
        match self {
            OffsetValues::F16(v) => v.as_slice()[g].to_f32(),
            OffsetValues::F32(v) => v[g],
        }
    }

    fn view(&self) -> quant::Offsets<'_> {
        match self {
            OffsetValues::F16(v) => quant::Offsets::F16(v.as_bits()),
            OffsetValues::F32(v) => quant::Offsets::F32(v),
        }
    }
}

/// fp16 values: the package's own bytes (read in place, no copy) or a copy.
pub(crate) enum Halves {
    Shared(TensorData),
    Owned(Vec<f16>),
}

impl Halves {
    /// The bytes of an fp16 tensor, in place when they are aligned for fp16 on a
    /// little-endian machine (the package's bytes are), else copied.
    pub fn of(value: &TensorData) -> Self {
        let bytes = value.bytes();
        // SAFETY: f16 is a plain 2-byte value type; every bit pattern is valid.
        let (head, _, _) = unsafe { bytes.align_to::<f16>() };
        if cfg!(target_endian = "little") && head.is_empty() && bytes.len().is_multiple_of(2) {
            return Halves::Shared(value.clone());
        }
        Halves::Owned(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        )
    }

    /// The values' bit patterns.
    pub fn as_bits(&self) -> &[u16] {
        use half::slice::HalfFloatSliceExt;
        self.as_slice().reinterpret_cast()
    }

    pub fn as_slice(&self) -> &[f16] {
        match self {
            Halves::Owned(v) => v,
            Halves::Shared(t) => {
                // SAFETY: as in `of`, which checked alignment, length and byte order.
                let (_, mid, _) = unsafe { t.bytes().align_to::<f16>() };
                mid
            }
        }
    }
}

/// Block of element `(row, col)`: `(row / rows_per) * col_blocks + col / cols_per` (the block
/// counts of the trailing unit axes are 1).
pub(crate) struct Blocks {
    pub rows_per: usize,
    pub cols_per: usize,
    pub col_blocks: usize,
}

impl Blocks {
    fn new(shape: &[usize], counts: &[usize]) -> Option<Self> {
        check_blocks("blocks", shape, counts).ok()?;
        if counts[2..].iter().any(|&c| c != 1) {
            return None;
        }
        Some(Blocks {
            rows_per: shape[0] / counts[0],
            cols_per: shape[1] / counts[1],
            col_blocks: counts[1],
        })
    }

    /// Block of element `(row, 0)`; column `c` is `c / cols_per` blocks further.
    #[inline]
    pub fn row(&self, row: usize) -> usize {
        self.group(row) * self.col_blocks
    }

    /// The row group (rows sharing their blocks' parameters) of `row`.
    #[inline]
    fn group(&self, row: usize) -> usize {
        // one block of rows per row (the usual layout) needs no division, run per row
        if self.rows_per == 1 {
            row
        } else {
            row / self.rows_per
        }
    }
}

/// Integer elements `start..start + out.len()` of packed `data` (as
/// [`TensorData::to_i32_vec`] reads them: little-endian bit order, int4 sign-extended).
fn codes(bytes: &[u8], dtype: DType, start: usize, out: &mut [i32]) {
    match dtype {
        DType::I8 => {
            let b = &bytes[start..start + out.len()];
            out.iter_mut()
                .zip(b)
                .for_each(|(o, &v)| *o = v as i8 as i32);
        }
        DType::U8 => {
            let b = &bytes[start..start + out.len()];
            out.iter_mut().zip(b).for_each(|(o, &v)| *o = v as i32);
        }
        DType::U4 | DType::I4 => {
            let signed = dtype == DType::I4;
            for (n, o) in out.iter_mut().enumerate() {
                let e = start + n;
                let c = (bytes[e / 2] >> (4 * (e % 2))) & 15;
                *o = if signed {
                    ((c << 4) as i8 >> 4) as i32
                } else {
                    c as i32
                };
            }
        }
        _ => {
            let bits = dtype.bits();
            for (n, o) in out.iter_mut().enumerate() {
                *o = lut::index_at(bytes, bits, start + n) as i32;
            }
        }
    }
}

/// The fp16 scale `g` of stored scales, as f32.
#[inline]
fn scale_at(scale: &TensorData, g: usize) -> f32 {
    let b = scale.bytes();
    f16::from_le_bytes([b[2 * g], b[2 * g + 1]]).to_f32()
}

/// Per-task buffers of one row.
pub(crate) struct Scratch {
    codes: Vec<i32>,
    values: Vec<f32>,
}

impl Scratch {
    pub fn new(k: usize) -> Self {
        Scratch {
            codes: vec![0; k],
            values: vec![0.0; k],
        }
    }
}

/// Each row group's least [`quant::split_level_of`] over its blocks, for 8-bit or 4-bit
/// `dtype` data with these fp16 scales and fp16 offsets where the split kernels run (a cost
/// at load otherwise paid for nothing); else empty (no row is formed by splitting).
fn split_levels(
    dtype: DType,
    scale: &TensorData,
    offset: Option<&OffsetValues>,
    blocks: &Blocks,
) -> Vec<quant::Split> {
    let (bits, signed) = match dtype {
        DType::I8 => (quant::Bits::Eight, true),
        DType::U8 => (quant::Bits::Eight, false),
        DType::I4 => (quant::Bits::Four, true),
        DType::U4 => (quant::Bits::Four, false),
        _ => return Vec::new(),
    };
    if !quant::split_used() {
        return Vec::new();
    }
    let scales = Halves::of(scale);
    let offsets = match offset {
        // symmetric rows split too: 8-bit ones since their block parameters are read as
        // memory-broadcast operands (session 15: 4–8% less CPU time decoding a symmetric int8
        // SmolLM2 on one thread; `tests/matvec_speed.rs` 0.083 against 0.091 ns a weight);
        // 4-bit ones a table per block (3% less, session 14)
        None => None,
        Some(OffsetValues::F16(o)) => Some(o.as_slice()),
        Some(OffsetValues::F32(_)) => return Vec::new(),
    };
    quant::split_levels_of(bits, signed, scales.as_slice(), offsets, blocks.col_blocks)
}

/// A pointwise projection weight shape: `[O, I]` or `[O, I, 1, …]`.
fn pointwise(shape: &[usize]) -> bool {
    shape.len() >= 2 && shape[2..].iter().all(|&d| d == 1)
}

impl HalfWeight {
    /// An fp16 const, kept fp16.
    pub fn half(value: &TensorData) -> Option<Self> {
        if value.dtype() != DType::F16 || !pointwise(value.shape()) {
            return None;
        }
        Some(HalfWeight {
            shape: value.shape().to_vec(),
            data: WeightData::Half(Halves::of(value)),
        })
    }

    /// An fp16 `constexpr_blockwise_shift_scale` of integer data, kept compressed (`None`
    /// when it is not one, or malformed: the expanding decoder reports that).
    pub fn shift_scale(
        data: &TensorData,
        scale: &TensorData,
        offset: Option<&TensorData>,
    ) -> Option<Self> {
        let integer = matches!(data.dtype(), DType::I4 | DType::U4 | DType::I8 | DType::U8);
        if !integer || scale.dtype() != DType::F16 || !pointwise(data.shape()) {
            return None;
        }
        if scale.shape().len() != data.shape().len() {
            return None;
        }
        if let Some(o) = offset {
            let valid = o.dtype().is_float() || o.dtype() == data.dtype();
            if o.shape() != scale.shape() || !valid {
                return None;
            }
        }
        let blocks = Blocks::new(data.shape(), scale.shape())?;
        let offset_promotes = offset.is_some_and(|o| o.dtype() == DType::F32);
        let mut offset = offset.map(OffsetValues::of);
        let (mut data, mut scale) = (data.clone(), scale.clone());
        if let Some(n) = narrow::narrow(&data, &scale, offset.as_ref(), &blocks) {
            (data, scale) = (n.data, n.scales);
            offset = Some(OffsetValues::F32(n.offsets));
        }
        let split = match offset_promotes {
            true => Vec::new(),
            false => split_levels(data.dtype(), &scale, offset.as_ref(), &blocks),
        };
        Some(HalfWeight {
            shape: data.shape().to_vec(),
            data: WeightData::ShiftScale {
                data,
                scale,
                offset,
                offset_promotes,
                blocks,
                split,
            },
        })
    }

    /// An fp16 `constexpr_lut_to_dense` (scalar palettes), kept compressed.
    pub fn lut(indices: &TensorData, lut: &TensorData) -> Option<Self> {
        let (ishape, lshape) = (indices.shape(), lut.shape());
        let valid_idx = matches!(
            indices.dtype(),
            DType::U1 | DType::U2 | DType::U3 | DType::U4 | DType::U6 | DType::U8
        );
        if !valid_idx || lut.dtype() != DType::F16 || !pointwise(ishape) {
            return None;
        }
        let r = ishape.len();
        if lshape.len() != r + 2 || lshape[r] != 1 << indices.dtype().bits() || lshape[r + 1] != 1 {
            return None;
        }
        let blocks = Blocks::new(ishape, &lshape[..r])?;
        let table = lut
            .bytes()
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]))
            .collect();
        Some(HalfWeight {
            shape: ishape.to_vec(),
            data: WeightData::Lut {
                indices: indices.clone(),
                table,
                palette: lshape[r],
                blocks,
            },
        })
    }

    /// The weight's fp16 values when it is held as plain fp16 (not compressed).
    pub fn as_f16(&self) -> Option<&[f16]> {
        match &self.data {
            WeightData::Half(w) => Some(w.as_slice()),
            WeightData::ShiftScale { .. } | WeightData::Lut { .. } => None,
        }
    }

    /// Rows × columns of the weight as a matrix.
    pub fn rows_cols(&self) -> (usize, usize) {
        (self.shape[0], self.shape[1])
    }

    /// Row `i` as fp16 values (exactly the expanded constant's).
    pub fn row(&self, i: usize, scratch: &mut Scratch, out: &mut [f16]) {
        use half::slice::HalfFloatSliceExt;
        let k = out.len();
        let base = i * k;
        match &self.data {
            WeightData::Half(v) => out.copy_from_slice(&v.as_slice()[base..base + k]),
            WeightData::ShiftScale {
                data,
                scale,
                offset,
                offset_promotes,
                blocks,
                ..
            } => {
                // shift_scale_element, a row at a time: integer data is exact in fp16, so
                // `r16(v) = v`; with an fp16 scale the final fp16 cast absorbs the product's
                // rounding (rounding to fp16 twice is rounding once)
                let (c, vals) = (&mut scratch.codes[..k], &mut scratch.values[..k]);
                let row_blocks = blocks.row(i);
                let per = blocks.cols_per;
                if matches!(data.dtype(), DType::I8 | DType::U8) {
                    // 8-bit data straight from its bytes: `v - offset` (rounded unless fp32),
                    // `· scale`, the fp16 cast; without an offset, `v · scale` in one pass
                    let bytes = &data.bytes()[base..base + k];
                    let signed = data.dtype() == DType::I8;
                    let value = |b: u8| if signed { (b as i8) as f32 } else { b as f32 };
                    for (cb, (v, b)) in vals.chunks_mut(per).zip(bytes.chunks(per)).enumerate() {
                        let g = row_blocks + cb;
                        match offset {
                            Some(o) => {
                                let og = o.at(g);
                                v.iter_mut().zip(b).for_each(|(v, &b)| *v = value(b) - og)
                            }
                            None => v
                                .iter_mut()
                                .zip(b)
                                .for_each(|(v, &b)| *v = value(b) * scale_at(scale, g)),
                        }
                    }
                    if offset.is_some() {
                        if !offset_promotes {
                            round_f16_in_place(vals);
                        }
                        for (cb, v) in vals.chunks_mut(per).enumerate() {
                            let sb = scale_at(scale, row_blocks + cb);
                            v.iter_mut().for_each(|v| *v *= sb);
                        }
                    }
                    out.convert_from_f32_slice(vals);
                    return;
                }
                codes(data.bytes(), data.dtype(), base, c);
                vals.iter_mut()
                    .zip(c.iter())
                    .for_each(|(v, &c)| *v = c as f32);
                if let Some(o) = offset {
                    for (cb, chunk) in vals.chunks_mut(blocks.cols_per).enumerate() {
                        let ob = o.at(row_blocks + cb);
                        chunk.iter_mut().for_each(|v| *v -= ob);
                    }
                    if !offset_promotes {
                        round_f16_in_place(vals);
                    }
                }
                for (cb, chunk) in vals.chunks_mut(blocks.cols_per).enumerate() {
                    let sb = scale_at(scale, row_blocks + cb);
                    chunk.iter_mut().for_each(|v| *v *= sb);
                }
                out.convert_from_f32_slice(vals);
            }
            WeightData::Lut {
                indices,
                table,
                palette,
                blocks,
            } => {
                let (row_blocks, per) = (blocks.row(i), blocks.cols_per);
                let bits = indices.dtype().bits();
                for (cb, o) in out.chunks_mut(per).enumerate() {
                    let g = row_blocks + cb;
                    let entries = &table[g * palette..(g + 1) * palette];
                    lut::form(indices.bytes(), bits, base + cb * per, entries, o);
                }
            }
        }
    }

    /// The rows of a palettized weight from `first` that fill `out`, as fp16 values: one run
    /// of indices when they share one palette (blocks of whole rows, one row group), else row
    /// by row ([`Self::row`]).
    fn lut_rows(&self, first: usize, out: &mut [f16]) {
        let k = self.shape[1];
        let rows = out.len() / k.max(1);
        if let WeightData::Lut {
            indices,
            table,
            palette,
            blocks,
        } = &self.data
        {
            let g = blocks.group(first);
            if blocks.col_blocks == 1 && rows > 0 && blocks.group(first + rows - 1) == g {
                let entries = &table[g * palette..(g + 1) * palette];
                lut::form(
                    indices.bytes(),
                    indices.dtype().bits(),
                    first * k,
                    entries,
                    out,
                );
                return;
            }
        }
        for (r, row) in out.chunks_exact_mut(k.max(1)).enumerate() {
            // a palette row is formed without scratch (`Scratch::new(0)` holds nothing)
            self.row(first + r, &mut Scratch::new(0), row);
        }
    }

    /// `dst = W · x` (one token): fp16 weights read directly, compressed ones through the fused
    /// kernels ([`quant`]) or row by row; all sum the same fp16 values in the same order.
    pub fn matvec(&self, dst: &mut [f32], x: &[f32], acc: Accumulation) -> Result<(), String> {
        let (rows, k) = self.rows_cols();
        if dst.len() != rows || x.len() != k {
            return Err(format!(
                "matvec: weight {:?} for {} outputs of a {}-vector",
                self.shape,
                dst.len(),
                x.len()
            ));
        }
        match (&self.data, acc) {
            (WeightData::Half(w), Accumulation::F32) => linalg::matvec_f16(dst, w.as_slice(), x),
            (WeightData::Half(w), Accumulation::Fp16Blocks) => {
                crate::kernels::fp16acc::matvec_f16(dst, w.as_slice(), x)
            }
            (WeightData::ShiftScale { .. } | WeightData::Lut { .. }, Accumulation::F32)
                if self
                    .fused_weight()
                    .is_some_and(|w| quant::matvec_weights(&mut [(&mut *dst, w)], x)) =>
            {
                Ok(())
            }
            (WeightData::Lut { .. }, Accumulation::F32)
                if self
                    .lut8()
                    .is_some_and(|w| lut::matvec8_group(&mut [(&mut *dst, w)], x)) =>
            {
                Ok(())
            }
            (WeightData::Lut { indices, .. }, Accumulation::F32) => {
                let row_bytes = (k * indices.dtype().bits()).div_ceil(8);
                quant::matvec_by_formed_rows(dst, x, row_bytes, |i, rows| self.lut_rows(i, rows));
                Ok(())
            }
            (WeightData::ShiftScale { .. } | WeightData::Lut { .. }, _) => {
                let dot: fn(&[f16], &[f32]) -> f32 = match acc {
                    Accumulation::F32 => simd::dot_f16_kernel(),
                    Accumulation::Fp16Blocks => crate::kernels::fp16acc::dot_f16,
                };
                quant::matvec_by_rows(dst, k, |i| self.with_row(i, |row| dot(row, x)));
                Ok(())
            }
        }
    }

    /// `dst = W · x` (one token, f32 accumulation) for several compressed weights of one input
    /// in one parallel region ([`quant::matvec_group`]), each output exactly its own
    /// [`Self::matvec`]'s. `false` (outputs unspecified) unless the fused kernels, or
    /// [`lut::matvec8_group`], take every weight; then each runs its own `matvec`.
    pub fn matvec_fused_group(group: &mut [(&HalfWeight, &mut [f32])], x: &[f32]) -> bool {
        let shaped = |w: &HalfWeight, dst: &[f32]| w.rows_cols() == (dst.len(), x.len());
        let lut8: Option<Vec<_>> = group
            .iter_mut()
            .map(|(w, dst)| {
                let lut8 = w.lut8().filter(|_| shaped(w, dst))?;
                Some((&mut **dst, lut8))
            })
            .collect();
        if let Some(mut lut8) = lut8 {
            return lut::matvec8_group(&mut lut8, x);
        }
        let mut weights = Vec::with_capacity(group.len());
        for (w, dst) in group.iter_mut() {
            let (rows, k) = w.rows_cols();
            match w.fused_weight() {
                Some(fw) if w.fused() && rows == dst.len() && k == x.len() => {
                    weights.push((&mut **dst, fw))
                }
                _ => return false,
            }
        }
        quant::matvec_weights(&mut weights, x)
    }

    /// Runs `f` on row `i` formed as fp16 values in this thread's row buffer ([`Self::row`]).
    fn with_row<R>(&self, i: usize, f: impl FnOnce(&[f16]) -> R) -> R {
        let k = self.rows_cols().1;
        ROW.with(|cell| {
            let mut cell = cell.borrow_mut();
            let (scratch, buf) = &mut *cell;
            if buf.len() != k {
                *scratch = Scratch::new(k);
                buf.resize(k, f16::ZERO);
            }
            self.row(i, scratch, buf);
            f(buf)
        })
    }

    /// Runs `f` on the weight's values as f32 in a per-thread buffer (wide steps).
    pub fn with_widened<R>(&self, f: impl FnOnce(&[f32]) -> R) -> R {
        match &self.data {
            WeightData::Half(w) => linalg::with_widened(w.as_slice(), f),
            WeightData::ShiftScale { .. } | WeightData::Lut { .. } => {
                let (rows, k) = self.rows_cols();
                let fused = self.fused();
                let fill = |buf: &mut [f32]| {
                    quant::fill_by_rows(buf, k, |i, out| self.expand_row(fused, i, out))
                };
                quant::with_filled(rows * k, fill, f)
            }
        }
    }

    /// Row `i` of a compressed weight as f32 (exactly the expanded constant's): the fused
    /// expansion when `fused` ([`Self::fused`]) and it takes the row, else formed as fp16.
    fn expand_row(&self, fused: bool, i: usize, out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        if fused {
            if let Some(r) = self.fused_row(i) {
                if quant::expand(&r, out) {
                    return;
                }
            }
        }
        self.with_row(i, |row| row.convert_to_f32_slice(out))
    }

    /// A pointwise convolution ([`gemm_f16::is_pointwise`]) of `x` by this weight, f32
    /// accumulation, plus `bias`: the values of [`linalg::conv2d`] on the weight expanded to
    /// f32. fp16 weights are widened a few rows at a time ([`gemm_f16::pointwise_conv_f16`]);
    /// compressed ones are expanded a panel of rows at a time, never whole when the product
    /// splits ([`gemm_f16::matmul_rows_by`]).
    pub fn pointwise_conv(
        &self,
        out: &mut [f32],
        x: &[f32],
        x_shape: &[usize],
        bias: Option<&[f32]>,
    ) -> Result<(), String> {
        match &self.data {
            WeightData::Half(w) => {
                gemm_f16::pointwise_conv_f16(out, x, x_shape, w.as_slice(), &self.shape, bias)
            }
            WeightData::ShiftScale { .. } | WeightData::Lut { .. } => {
                let fused = self.fused();
                let expand_row = |i: usize, row: &mut [f32]| self.expand_row(fused, i, row);
                gemm_f16::pointwise_conv_rows_by(out, x, x_shape, &self.shape, bias, &expand_row)
            }
        }
    }
}

std::thread_local! {
    /// Per-thread buffers of the row-forming path (codes, values, one fp16 row).
    static ROW: std::cell::RefCell<(Scratch, Vec<f16>)> =
        std::cell::RefCell::new((Scratch::new(0), Vec::new()));
}

#[path = "packed_views.rs"]
mod views;

#[cfg(test)]
#[path = "packed_tests.rs"]
mod tests;
