//! Constant tensor data in its storage layout (little-endian, sub-byte types packed LSB-first).

use half::f16;

use crate::error::{MilError, Result};
use crate::ir::bytes::SharedBytes;
use crate::ir::types::{DType, TensorType};

/// Immutable constant data. Cloning shares the bytes; identical bytes are written once per package.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TensorData {
    ty: TensorType,
    bytes: SharedBytes,
}

impl std::fmt::Debug for TensorData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorData({}, {} bytes)", self.ty, self.bytes.len())
    }
}

fn check_len(shape: &[usize], n: usize, what: &str) -> Result<()> {
    let numel: usize = shape.iter().product();
    if numel != n {
        return Err(MilError::InvalidTensorData {
            detail: format!("{what}: shape {shape:?} holds {numel} elements, got {n}"),
        });
    }
    Ok(())
}

impl TensorData {
    /// Data already in storage layout; the length must be exactly the packed size.
    pub fn from_bytes(
        dtype: DType,
        shape: impl Into<Vec<usize>>,
        bytes: impl Into<SharedBytes>,
    ) -> Result<Self> {
        let ty = TensorType::new(dtype, shape);
        if ty.checked_numel().is_none() {
            return Err(MilError::InvalidTensorData {
                detail: format!("{ty}: dims must be >= 1 and the size addressable"),
            });
        }
        let bytes = bytes.into();
        let want = dtype.packed_len(ty.numel());
        if bytes.len() != want {
            return Err(MilError::InvalidTensorData {
                detail: format!("{ty}: needs {want} bytes, got {}", bytes.len()),
            });
        }
        if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(MilError::InvalidTensorData {
                detail: format!("{ty}: bool bytes must be 0 or 1"),
            });
        }
        Ok(TensorData { ty, bytes })
    }

    pub fn from_f16(shape: impl Into<Vec<usize>>, values: &[f16]) -> Result<Self> {
        let shape = shape.into();
        check_len(&shape, values.len(), "fp16 data")?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(DType::F16, shape, bytes)
    }

    /// fp16 data rounded (nearest even) from f32 values.
    pub fn f16_from_f32(shape: impl Into<Vec<usize>>, values: &[f32]) -> Result<Self> {
        let shape = shape.into();
        check_len(&shape, values.len(), "fp16 data")?;
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        Self::from_bytes(DType::F16, shape, bytes)
    }

    pub fn from_f32(shape: impl Into<Vec<usize>>, values: &[f32]) -> Result<Self> {
        let shape = shape.into();
        check_len(&shape, values.len(), "fp32 data")?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(DType::F32, shape, bytes)
    }

    pub fn from_i32(shape: impl Into<Vec<usize>>, values: &[i32]) -> Result<Self> {
        let shape = shape.into();
        check_len(&shape, values.len(), "int32 data")?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(DType::I32, shape, bytes)
    }

    pub fn from_bool(shape: impl Into<Vec<usize>>, values: &[bool]) -> Result<Self> {
        let shape = shape.into();
        check_len(&shape, values.len(), "bool data")?;
        let bytes: Vec<u8> = values.iter().map(|&v| v as u8).collect();
        Self::from_bytes(DType::Bool, shape, bytes)
    }

    pub fn from_i8(shape: impl Into<Vec<usize>>, values: &[i8]) -> Result<Self> {
        let shape = shape.into();
        check_len(&shape, values.len(), "int8 data")?;
        let bytes: Vec<u8> = values.iter().map(|&v| v as u8).collect();
        Self::from_bytes(DType::I8, shape, bytes)
    }

    /// Packs integer values into an integer dtype (int8, uint8, int4, uint1/2/3/4/6),
    /// checking each value fits its range.
    pub fn pack_ints(dtype: DType, shape: impl Into<Vec<usize>>, values: &[i32]) -> Result<Self> {
        let shape = shape.into();
        check_len(&shape, values.len(), "packed integer data")?;
        let (lo, hi) = match dtype {
            DType::I8 => (-128, 127),
            DType::U8 => (0, 255),
            DType::I4 => (-8, 7),
            DType::U1 | DType::U2 | DType::U3 | DType::U4 | DType::U6 => {
                (0, (1 << dtype.bits()) - 1)
            }
            _ => {
                return Err(MilError::InvalidTensorData {
                    detail: format!("pack_ints: {dtype} is not a packed integer type"),
                })
            }
        };
        if let Some((i, v)) = values
            .iter()
            .enumerate()
            .find(|(_, v)| **v < lo || **v > hi)
        {
            return Err(MilError::InvalidTensorData {
                detail: format!("pack_ints: element {i} = {v} does not fit {dtype} [{lo}, {hi}]"),
            });
        }
        let bits = dtype.bits();
        let mask = (1u32 << bits) - 1;
        let mut bytes = vec![0u8; dtype.packed_len(values.len())];
        for (i, &v) in values.iter().enumerate() {
            let code = (v as u32) & mask;
            let bit = i * bits;
            // an element may straddle two bytes (uint3, uint6)
            let word = code << (bit % 8);
            bytes[bit / 8] |= word as u8;
            if bit % 8 + bits > 8 {
                bytes[bit / 8 + 1] |= (word >> 8) as u8;
            }
        }
        Self::from_bytes(dtype, shape, bytes)
    }

    pub fn tensor_type(&self) -> &TensorType {
        &self.ty
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    pub fn numel(&self) -> usize {
        self.ty.numel()
    }

    /// Storage-layout bytes (what weight.bin holds).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Releases the resident pages of mapped data ([`SharedBytes::release_pages`]).
    pub fn release_pages(&self) {
        self.bytes.release_pages()
    }

    /// The shared bytes ([`SharedBytes::same_storage`] means the same weight).
    pub fn shared_bytes(&self) -> &SharedBytes {
        &self.bytes
    }

    /// Integer elements of integer and bool types, sign-extended where signed.
    pub fn to_i32_vec(&self) -> Result<Vec<i32>> {
        let n = self.numel();
        let b = &self.bytes;
        Ok(match self.dtype() {
            DType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::I8 => b.iter().map(|&v| v as i8 as i32).collect(),
            DType::U8 | DType::Bool => b.iter().map(|&v| v as i32).collect(),
            DType::I4 | DType::U1 | DType::U2 | DType::U3 | DType::U4 | DType::U6 => {
                let bits = self.dtype().bits();
                let mask = (1u32 << bits) - 1;
                (0..n)
                    .map(|i| {
                        let bit = i * bits;
                        let lo = b[bit / 8] as u32;
                        let hi = if bit % 8 + bits > 8 {
                            b[bit / 8 + 1] as u32
                        } else {
                            0
                        };
                        let code = ((lo | (hi << 8)) >> (bit % 8)) & mask;
                        if self.dtype() == DType::I4 {
                            ((code << 28) as i32) >> 28
                        } else {
                            code as i32
                        }
                    })
                    .collect()
            }
            DType::F16 | DType::F32 => {
                return Err(MilError::InvalidTensorData {
                    detail: format!("to_i32_vec on float data {}", self.ty),
                })
            }
        })
    }

    /// Every element converted to f32 (floats exactly, integers by value).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let b = &self.bytes;
        match self.dtype() {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            _ => self
                .to_i32_vec()
                .expect("non-float dtypes are integer types")
                .into_iter()
                .map(|v| v as f32)
                .collect(),
        }
    }

    /// The single element of a one-element tensor, as f64.
    pub fn scalar_f64(&self) -> Option<f64> {
        (self.numel() == 1).then(|| self.to_f32_vec()[0] as f64)
    }
}
