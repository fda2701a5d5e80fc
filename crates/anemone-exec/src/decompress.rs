//! Constant decoding: plain consts and the iOS18 constexpr decompressions, with the exact
//! arithmetic of coremltools' `decompress` (numpy fp16 rounding at each step).

use anemone_backend::{round_f16, Tensor};
use anemone_mil::{DType, TensorData};

/// A const's values as a runtime tensor (sub-byte and 8-bit integer payloads are widened;
/// only fp16/fp32/int32/bool consts are values a program computes with).
pub fn const_tensor(value: &TensorData) -> Result<Tensor, String> {
    let dtype = value.dtype();
    if !matches!(dtype, DType::F16 | DType::F32 | DType::I32 | DType::Bool) {
        return Err(format!(
            "a const of {} is only valid as a constexpr payload",
            value.tensor_type()
        ));
    }
    Ok(Tensor {
        dtype,
        shape: value.shape().to_vec(),
        data: value.to_f32_vec(),
    })
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// For every element of a tensor of `shape`, the flat index of its block in a tensor of
/// `block_counts` (block size per axis = `shape[i] / block_counts[i]`).
fn block_index_map(shape: &[usize], block_counts: &[usize]) -> Vec<usize> {
    let numel: usize = shape.iter().product();
    let bstrides = strides(block_counts);
    let sizes: Vec<usize> = shape.iter().zip(block_counts).map(|(d, b)| d / b).collect();
    let mut coord = vec![0usize; shape.len()];
    let mut out = Vec::with_capacity(numel);
    for _ in 0..numel {
        out.push(
            coord
                .iter()
                .zip(&sizes)
                .zip(&bstrides)
                .map(|((c, s), st)| c / s * st)
                .sum(),
        );
        for ax in (0..shape.len()).rev() {
            coord[ax] += 1;
            if coord[ax] < shape[ax] {
                break;
            }
            coord[ax] = 0;
        }
    }
    out
}

pub(crate) fn check_blocks(what: &str, shape: &[usize], counts: &[usize]) -> Result<(), String> {
    for (i, (&d, &c)) in shape.iter().zip(counts).enumerate() {
        if c == 0 || d % c != 0 {
            return Err(format!(
                "axis {i}: {what} dim {c} does not divide data dim {d}"
            ));
        }
    }
    Ok(())
}

/// `constexpr_blockwise_shift_scale`: `scale * (data - offset)`, scale and offset repeated
/// blockwise. As coremltools computes it: data is cast to scale's dtype; with an fp16 scale,
/// `data - offset` (unless the offset is fp32) and the product are rounded to fp16.
pub fn blockwise_shift_scale(
    data: &TensorData,
    scale: &TensorData,
    offset: Option<&TensorData>,
) -> Result<Tensor, String> {
    let (dshape, sshape) = (data.shape(), scale.shape());
    if !matches!(
        data.dtype(),
        DType::I4 | DType::U4 | DType::I8 | DType::U8 | DType::F16 | DType::F32
    ) {
        return Err(format!(
            "data must be int4/uint4/int8/uint8/fp16/fp32, got {}",
            data.tensor_type()
        ));
    }
    if !scale.dtype().is_float() {
        return Err(format!(
            "scale must be fp16/fp32, got {}",
            scale.tensor_type()
        ));
    }
    if dshape.is_empty() || dshape.len() != sshape.len() {
        return Err(format!(
            "data {} and scale {} need the same rank >= 1",
            data.tensor_type(),
            scale.tensor_type()
        ));
    }
    check_blocks("scale", dshape, sshape)?;
    if let Some(o) = offset {
        if o.shape() != sshape {
            return Err(format!(
                "offset {} must have the shape of scale {}",
                o.tensor_type(),
                scale.tensor_type()
            ));
        }
        if !o.dtype().is_float() && o.dtype() != data.dtype() {
            return Err(format!(
                "offset {} must be float or of data's dtype {}",
                o.tensor_type(),
                data.dtype()
            ));
        }
    }
    let half_math = scale.dtype() == DType::F16;
    // numpy: fp16 - fp32 promotes to fp32, after which the product is fp32 too.
    let offset_promotes = offset.is_some_and(|o| o.dtype() == DType::F32);
    let values = data.to_f32_vec();
    let scales = scale.to_f32_vec();
    let offsets = offset.map(|o| o.to_f32_vec());
    let blocks = block_index_map(dshape, sshape);
    let out = values
        .iter()
        .zip(&blocks)
        .map(|(&v, &b)| {
            let o = offsets.as_ref().map(|o| o[b]);
            shift_scale_element(v, scales[b], o, half_math, offset_promotes)
        })
        .collect();
    let mut t = Tensor {
        dtype: scale.dtype(),
        shape: dshape.to_vec(),
        data: out,
    };
    if half_math {
        t.data.iter_mut().for_each(|v| *v = round_f16(*v));
    }
    Ok(t)
}

/// One element of `constexpr_blockwise_shift_scale` before the final cast to scale's dtype
/// (with `half_math`, an fp16 scale, the caller rounds the result to fp16): the data value `v`,
/// its block's scale and offset. `offset_promotes`: the offset is fp32 (numpy promotes
/// `data - offset` and the product to fp32). The compressed matvec forms its weights here too.
#[inline]
pub(crate) fn shift_scale_element(
    v: f32,
    scale: f32,
    offset: Option<f32>,
    half_math: bool,
    offset_promotes: bool,
) -> f32 {
    let r16 = |v: f32| if half_math { round_f16(v) } else { v };
    let d = r16(v);
    let shifted = match offset {
        Some(o) if offset_promotes => d - o,
        Some(o) => r16(d - o),
        None => d,
    };
    if offset_promotes {
        scale * shifted
    } else {
        r16(scale * shifted)
    }
}

/// `constexpr_lut_to_dense` (scalar palettes): `out[i] = lut[group(i)..., indices[i], 0]`,
/// where `group(i)[a] = i[a] / (indices.shape[a] / lut.shape[a])`.
pub fn lut_to_dense(indices: &TensorData, lut: &TensorData) -> Result<Tensor, String> {
    let (ishape, lshape) = (indices.shape(), lut.shape());
    let bits = indices.dtype().bits();
    if !matches!(
        indices.dtype(),
        DType::U1 | DType::U2 | DType::U3 | DType::U4 | DType::U6 | DType::U8
    ) {
        return Err(format!(
            "indices must be uint1/2/3/4/6/8, got {}",
            indices.tensor_type()
        ));
    }
    if !lut.dtype().is_float() {
        return Err(format!("lut must be fp16/fp32, got {}", lut.tensor_type()));
    }
    let r = ishape.len();
    if r == 0 || lshape.len() != r + 2 {
        return Err(format!(
            "lut {} must have the rank of indices {} + 2",
            lut.tensor_type(),
            indices.tensor_type()
        ));
    }
    check_blocks("lut", ishape, &lshape[..r])?;
    let palette = lshape[r];
    if palette != 1 << bits || lshape[r + 1] != 1 {
        return Err(format!(
            "lut {}: needs 2^{bits} = {} scalar entries per palette",
            lut.tensor_type(),
            1usize << bits
        ));
    }
    let idx = indices.to_i32_vec().map_err(|e| e.to_string())?;
    let table = lut.to_f32_vec();
    let groups = block_index_map(ishape, &lshape[..r]);
    let data = idx
        .iter()
        .zip(&groups)
        .map(|(&i, &g)| table[g * palette + i as usize])
        .collect();
    Ok(Tensor {
        dtype: lut.dtype(),
        shape: ishape.to_vec(),
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i8s(shape: Vec<usize>, v: &[i32]) -> TensorData {
        TensorData::pack_ints(DType::I8, shape, v).unwrap()
    }

    #[test]
    fn malformed_payloads_are_errors_not_panics() {
        let data = i8s(vec![4, 6], &[1; 24]);
        let s = |shape: Vec<usize>| {
            let n = shape.iter().product();
            TensorData::f16_from_f32(shape, &vec![0.5; n]).unwrap()
        };
        let err = |r: Result<Tensor, String>| r.expect_err("malformed payload accepted");
        assert!(err(blockwise_shift_scale(&data, &s(vec![4]), None)).contains("same rank"));
        assert!(err(blockwise_shift_scale(&data, &s(vec![4, 4]), None)).contains("axis 1"));
        assert!(err(blockwise_shift_scale(
            &data,
            &s(vec![4, 1]),
            Some(&s(vec![2, 1]))
        ))
        .contains("offset"));
        let i32s = TensorData::from_i32(vec![4, 6], &[0; 24]).unwrap();
        assert!(err(blockwise_shift_scale(&i32s, &s(vec![4, 1]), None)).contains("data must be"));
        let idx = TensorData::pack_ints(DType::U2, vec![4, 6], &[3; 24]).unwrap();
        assert!(err(lut_to_dense(&idx, &s(vec![2, 1, 8, 1]))).contains("2^2"));
        assert!(err(lut_to_dense(&idx, &s(vec![3, 1, 4, 1]))).contains("axis 0"));
        assert!(err(lut_to_dense(&idx, &s(vec![1, 4, 1]))).contains("rank"));
        assert!(err(lut_to_dense(&data, &s(vec![1, 1, 256, 1]))).contains("indices must be"));
        assert!(
            const_tensor(&idx).is_err(),
            "a uint2 const is only a payload"
        );
    }

    #[test]
    fn blockwise_scales_follow_their_block() {
        // int4 data [2, 4], scales per (row, half-row) block, int4 offsets
        let data =
            TensorData::pack_ints(DType::I4, vec![2, 4], &[-8, 7, 1, -1, 3, 0, -4, 5]).unwrap();
        let scale = TensorData::f16_from_f32(vec![2, 2], &[0.5, 2.0, 0.25, 4.0]).unwrap();
        let offset = TensorData::pack_ints(DType::I4, vec![2, 2], &[1, -2, 0, 3]).unwrap();
        let t = blockwise_shift_scale(&data, &scale, Some(&offset)).unwrap();
        assert_eq!(t.dtype, DType::F16);
        let want = [
            (-8.0 - 1.0) * 0.5,
            (7.0 - 1.0) * 0.5,
            (1.0 + 2.0) * 2.0,
            (-1.0 + 2.0) * 2.0,
            3.0 * 0.25,
            0.0,
            (-4.0 - 3.0) * 4.0,
            (5.0 - 3.0) * 4.0,
        ];
        assert_eq!(t.data, want);
    }
}
