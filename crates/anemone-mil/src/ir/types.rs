//! Element types, tensor and state types, and spec versions.

use std::fmt;

/// Element types a program may hold. Sub-byte types only appear as constexpr payloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F16,
    F32,
    I32,
    Bool,
    I8,
    U8,
    I4,
    U1,
    U2,
    U3,
    U4,
    U6,
}

impl DType {
    /// Storage width of one element in bits (bool is stored as one byte).
    pub fn bits(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 32,
            DType::F16 => 16,
            DType::Bool | DType::I8 | DType::U8 => 8,
            DType::U6 => 6,
            DType::I4 | DType::U4 => 4,
            DType::U3 => 3,
            DType::U2 => 2,
            DType::U1 => 1,
        }
    }

    /// The MIL text name (`fp16`, `int32`, `uint4`…), also the `cast` dtype string.
    pub fn mil_name(self) -> &'static str {
        match self {
            DType::F16 => "fp16",
            DType::F32 => "fp32",
            DType::I32 => "int32",
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I4 => "int4",
            DType::U1 => "uint1",
            DType::U2 => "uint2",
            DType::U3 => "uint3",
            DType::U4 => "uint4",
            DType::U6 => "uint6",
        }
    }

    /// Inverse of [`DType::mil_name`].
    pub fn from_mil_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.mil_name() == name)
    }

    pub const ALL: [DType; 12] = [
        DType::F16,
        DType::F32,
        DType::I32,
        DType::Bool,
        DType::I8,
        DType::U8,
        DType::I4,
        DType::U1,
        DType::U2,
        DType::U3,
        DType::U4,
        DType::U6,
    ];

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::F32)
    }

    /// Packed below one byte per element (LSB-first in blobs).
    pub fn is_sub_byte(self) -> bool {
        self.bits() < 8
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I32 | DType::I8 | DType::I4)
    }

    /// Types a function input, output or state may have in the model description.
    pub fn is_io_type(self) -> bool {
        matches!(self, DType::F16 | DType::F32 | DType::I32)
    }

    /// Bytes needed to hold `numel` elements packed (sub-byte types round up).
    pub fn packed_len(self, numel: usize) -> usize {
        (numel * self.bits()).div_ceil(8)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mil_name())
    }
}

/// A tensor type with a fully static shape; rank 0 is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: Vec::new(),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The element count if every dim is >= 1 and the tensor's bytes stay addressable
    /// (< 2^60); None otherwise. Types inside a function always satisfy this.
    pub fn checked_numel(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(
                1usize,
                |acc, &d| if d == 0 { None } else { acc.checked_mul(d) },
            )
            .filter(|&n| n < (1usize << 56))
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor<{}, [", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]>")
    }
}

/// The type of a value: a tensor, or a state wrapping a tensor (function inputs only).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    Tensor(TensorType),
    State(TensorType),
}

impl ValueType {
    /// The tensor type, or the wrapped tensor type of a state.
    pub fn tensor(&self) -> &TensorType {
        match self {
            ValueType::Tensor(t) | ValueType::State(t) => t,
        }
    }

    pub fn is_state(&self) -> bool {
        matches!(self, ValueType::State(_))
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueType::Tensor(t) => write!(f, "{t}"),
            ValueType::State(t) => write!(f, "state<{t}>"),
        }
    }
}

/// Core ML specification version; each maps to one function opset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum SpecVersion {
    /// iOS 16 / macOS 13, opset CoreML6.
    V7,
    /// iOS 17 / macOS 14, opset CoreML7.
    V8,
    /// iOS 18 / macOS 15, opset CoreML8: states, multi-function, grouped LUTs, int4 blocks.
    #[default]
    V9,
    /// iOS 26 / macOS 26, opset CoreML9.
    V10,
}

impl SpecVersion {
    pub fn number(self) -> i32 {
        match self {
            SpecVersion::V7 => 7,
            SpecVersion::V8 => 8,
            SpecVersion::V9 => 9,
            SpecVersion::V10 => 10,
        }
    }

    pub fn from_number(n: i32) -> Option<SpecVersion> {
        match n {
            7 => Some(SpecVersion::V7),
            8 => Some(SpecVersion::V8),
            9 => Some(SpecVersion::V9),
            10 => Some(SpecVersion::V10),
            _ => None,
        }
    }

    /// The function opset name written for this version (`CoreML8` for spec 9).
    pub fn opset(self) -> &'static str {
        match self {
            SpecVersion::V7 => "CoreML6",
            SpecVersion::V8 => "CoreML7",
            SpecVersion::V9 => "CoreML8",
            SpecVersion::V10 => "CoreML9",
        }
    }

    pub fn from_opset(opset: &str) -> Option<SpecVersion> {
        [
            SpecVersion::V7,
            SpecVersion::V8,
            SpecVersion::V9,
            SpecVersion::V10,
        ]
        .into_iter()
        .find(|v| v.opset() == opset)
    }

    /// States, multi-function programs and the iOS18 constexpr ops need spec 9 or later.
    pub fn supports_ios18_features(self) -> bool {
        self >= SpecVersion::V9
    }
}

/// Arithmetic precision, one for every stage: the compute and weight precision of a converted
/// graph (serialized in a bundle manifest as `"fp16"` / `"fp32"`) and how the executor rounds.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// What the Neural Engine runs: fp16 weights and compute. The executor rounds every fp16 op
    /// output and state write to fp16 (nearest even: magnitudes in [65504, 65520) become 65504,
    /// from 65520 on ±inf); inside an op sums accumulate in f32. Pure data movement (slices,
    /// concat, reshape, state reads) is not re-rounded: its fp16 operands already are.
    #[default]
    Fp16,
    /// fp32 weights and compute (a graph's KV state stays fp16, as Core ML requires): runs on
    /// CPU/GPU only, for exact checks against the reference. The executor reads fp16 values as
    /// f32 and does not round results.
    Fp32,
}

impl Precision {
    pub const ALL: [Precision; 2] = [Precision::Fp16, Precision::Fp32];

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp16 => "fp16",
            Precision::Fp32 => "fp32",
        }
    }

    /// The dtype of a graph's weights and activations in this precision.
    pub fn dtype(self) -> DType {
        match self {
            Precision::Fp16 => DType::F16,
            Precision::Fp32 => DType::F32,
        }
    }

    pub fn bytes_per_weight(self) -> usize {
        match self {
            Precision::Fp16 => 2,
            Precision::Fp32 => 4,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Precision::ALL.iter().map(|p| p.name()).collect();
                format!("unknown precision `{s}` (one of: {})", names.join(", "))
            })
    }
}
