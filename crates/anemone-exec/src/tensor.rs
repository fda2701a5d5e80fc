//! Runtime tensors (values held as f32 whatever their declared dtype) and fp16 rounding.

use std::fmt;
use std::str::FromStr;

use anemone_mil::{DType, TensorType};
use half::f16;

use crate::error::{ExecError, Result};

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
        Err(ExecError::InvalidTensor {
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
            return Err(ExecError::InvalidTensor {
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
                    return Err(ExecError::InvalidTensor {
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

/// How the executor rounds values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// Everything in f32; fp16 values are read as f32 and results are not rounded.
    Fp32,
    /// As the ANE stores values: every fp16 op output and state write is rounded to fp16
    /// (nearest even: magnitudes in [65504, 65520) become 65504, from 65520 on ±inf); inside
    /// an op sums accumulate in f32. Pure data movement (slices, concat, reshape, state reads)
    /// is not re-rounded: its fp16 operands already are.
    #[default]
    Fp16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "fp16" => Ok(Precision::Fp16),
            other => Err(format!("unknown precision `{other}` (fp16 or fp32)")),
        }
    }
}

/// Rounds one value to the nearest fp16 (ties to even) and back.
#[inline]
pub fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// Rounds every value to fp16 in place (F16C where the CPU has it).
pub fn round_f16_in_place(data: &mut [f32]) {
    crate::kernels::simd::round_f16_slice(data)
}
