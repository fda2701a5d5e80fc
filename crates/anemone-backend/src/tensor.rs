//! The tensor that crosses the [`crate::Backend`] boundary: values held as f32 whatever the
//! declared dtype.

use std::fmt;

use anemone_mil::{DType, TensorType};

use crate::fp16::round_f16_in_place;

/// A tensor built with data that does not match its shape or dtype.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tensor: {detail}")]
pub struct TensorError {
    pub detail: String,
}

type Result<T, E = TensorError> = std::result::Result<T, E>;

/// Largest magnitude an int32 tensor may hold: its values are stored as f32, exact up to 2^24.
pub const MAX_EXACT_INT: f32 = 16_777_216.0;

/// A dense row-major tensor. Values are stored as f32 for every dtype: fp16 tensors hold
/// fp16-representable values (in fp16 precision mode), int32 tensors hold integers of
/// magnitude ≤ 2^24, bool tensors hold 0 or 1.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

fn check_runtime_dtype(dtype: DType) -> Result<()> {
    if matches!(dtype, DType::F16 | DType::F32 | DType::I32 | DType::Bool) {
        Ok(())
    } else {
        Err(TensorError {
            detail: format!(
                "{dtype} is a storage-only type; runtime tensors are fp16/fp32/int32/bool"
            ),
        })
    }
}

impl Tensor {
    /// A tensor of `dtype`; the data length must match the shape and the values must fit
    /// the dtype (fp16 values are rounded to fp16, integers must be whole and ≤ 2^24).
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>, mut data: Vec<f32>) -> Result<Self> {
        let shape = shape.into();
        check_runtime_dtype(dtype)?;
        let numel: usize = shape.iter().product();
        if numel != data.len() {
            return Err(TensorError {
                detail: format!(
                    "{dtype} shape {shape:?} holds {numel} elements, got {}",
                    data.len()
                ),
            });
        }
        match dtype {
            DType::F16 => round_f16_in_place(&mut data),
            DType::I32 | DType::Bool => {
                if let Some((i, v)) = data.iter().enumerate().find(|(_, v)| !fits_int(dtype, **v)) {
                    return Err(TensorError {
                        detail: format!("{dtype} element {i} = {v} is not a representable value"),
                    });
                }
            }
            _ => {}
        }
        Ok(Tensor { dtype, shape, data })
    }

    pub fn f32(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Result<Self> {
        Self::new(DType::F32, shape, data)
    }

    /// An fp16 tensor; `data` is rounded to fp16 (nearest even, ±inf beyond the fp16 range).
    pub fn f16(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Result<Self> {
        Self::new(DType::F16, shape, data)
    }

    pub fn i32(shape: impl Into<Vec<usize>>, values: &[i32]) -> Result<Self> {
        Self::new(
            DType::I32,
            shape,
            values.iter().map(|&v| v as f32).collect(),
        )
    }

    pub fn zeros(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        let shape = shape.into();
        let n = shape.iter().product();
        Tensor {
            dtype,
            shape,
            data: vec![0.0; n],
        }
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.clone())
    }

    /// Integer values (int32/bool tensors exactly; float tensors truncated toward zero).
    pub fn to_i32_vec(&self) -> Vec<i32> {
        self.data.iter().map(|&v| v as i32).collect()
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.tensor_type())
    }
}

fn fits_int(dtype: DType, v: f32) -> bool {
    match dtype {
        DType::Bool => v == 0.0 || v == 1.0,
        _ => v.fract() == 0.0 && v.abs() <= MAX_EXACT_INT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_tensors_hold_fp16_values() {
        let t = Tensor::f16([3], vec![1.0 / 3.0, 65519.0, 65520.0]).unwrap();
        assert_eq!(t.data, [0.33325195, 65504.0, f32::INFINITY]);
        assert_eq!(t.to_string(), "tensor<fp16, [3]>");
    }

    #[test]
    fn mismatched_data_is_refused_with_what_is_wrong() {
        let err = Tensor::f32([2, 2], vec![0.0; 3]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tensor: fp32 shape [2, 2] holds 4 elements, got 3"
        );
        assert!(Tensor::new(DType::I32, [1], vec![0.5]).is_err());
        assert!(Tensor::new(DType::Bool, [1], vec![2.0]).is_err());
        assert!(Tensor::new(DType::I32, [1], vec![MAX_EXACT_INT * 2.0]).is_err());
        assert!(Tensor::new(DType::U4, [1], vec![1.0]).is_err());
        assert_eq!(Tensor::i32([2], &[-3, 7]).unwrap().to_i32_vec(), [-3, 7]);
    }
}
