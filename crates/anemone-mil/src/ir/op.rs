//! The closed set of ops this crate emits and reads. Every consumer matches exhaustively.

use crate::ir::program::Var;
use crate::ir::signature::OpKind;
use crate::ir::tensor::TensorData;
use crate::ir::types::DType;

/// Elementwise binary ops (numpy broadcasting, both operands of one dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    RealDiv,
    Maximum,
    Minimum,
    Pow,
}

impl BinaryOp {
    pub fn mil_type(self) -> &'static str {
        OpKind::Binary(self).mil_type()
    }
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::RealDiv,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Pow,
    ];
}

/// Elementwise unary float ops without parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Sqrt,
    Exp,
    Silu,
    Tanh,
    Square,
    Abs,
}

impl UnaryOp {
    pub fn mil_type(self) -> &'static str {
        OpKind::Unary(self).mil_type()
    }
    pub const ALL: [UnaryOp; 6] = [
        UnaryOp::Sqrt,
        UnaryOp::Exp,
        UnaryOp::Silu,
        UnaryOp::Tanh,
        UnaryOp::Square,
        UnaryOp::Abs,
    ];
}

/// Reductions over a set of axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Mean,
    Max,
    Sum,
}

impl ReduceOp {
    pub fn mil_type(self) -> &'static str {
        OpKind::Reduce(self).mil_type()
    }
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Mean, ReduceOp::Max, ReduceOp::Sum];
}

/// `gelu` approximation modes (MIL `mode` strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum GeluMode {
    #[default]
    Exact,
    TanhApproximation,
    SigmoidApproximation,
}

impl GeluMode {
    pub fn mil_name(self) -> &'static str {
        match self {
            GeluMode::Exact => "EXACT",
            GeluMode::TanhApproximation => "TANH_APPROXIMATION",
            GeluMode::SigmoidApproximation => "SIGMOID_APPROXIMATION",
        }
    }
    pub fn from_mil_name(s: &str) -> Option<Self> {
        [
            GeluMode::Exact,
            GeluMode::TanhApproximation,
            GeluMode::SigmoidApproximation,
        ]
        .into_iter()
        .find(|m| m.mil_name() == s)
    }
}

/// 2-D convolution parameters (input `[N, C, H, W]`, weight `[O, C/groups, kH, kW]`).
/// Padding is explicit (`pad_type = "custom"`); pads are `[top, bottom, left, right]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvParams {
    pub strides: [usize; 2],
    pub pad: [usize; 4],
    pub dilations: [usize; 2],
    pub groups: usize,
}

impl Default for ConvParams {
    fn default() -> Self {
        ConvParams {
            strides: [1, 1],
            pad: [0, 0, 0, 0],
            dilations: [1, 1],
            groups: 1,
        }
    }
}

/// One MIL operation. Tensor operands are [`Var`]s; static parameters (axes, epsilon, shapes…)
/// are plain values, written as separate `const` ops named `{op}_{param}` by the proto writer.
/// Axes are normalized to non-negative by the builder.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A constant tensor (inline in the proto if < 10 elements, else in weight.bin).
    Const {
        value: TensorData,
    },
    /// Reads the current contents of a state input.
    ReadState {
        input: Var,
    },
    /// Replaces a state's contents; no outputs.
    WriteState {
        input: Var,
        data: Var,
    },
    /// `x` with `x[begin..end] = update`; `begin`/`end` are int32 vectors of x's rank (dynamic).
    SliceUpdate {
        x: Var,
        update: Var,
        begin: Var,
        end: Var,
    },
    /// 2-D convolution.
    Conv {
        x: Var,
        weight: Var,
        bias: Option<Var>,
        params: ConvParams,
    },
    /// Batched matrix product with optional transposes of the last two dims.
    Matmul {
        x: Var,
        y: Var,
        transpose_x: bool,
        transpose_y: bool,
    },
    /// `x @ weight^T + bias`, weight `[out, in]` (const or constexpr output).
    Linear {
        x: Var,
        weight: Var,
        bias: Option<Var>,
    },
    Softmax {
        x: Var,
        axis: usize,
    },
    /// Normalizes over `axes`; gamma/beta have the shape of those axes.
    LayerNorm {
        x: Var,
        axes: Vec<usize>,
        gamma: Option<Var>,
        beta: Option<Var>,
        epsilon: f32,
    },
    Reduce {
        kind: ReduceOp,
        x: Var,
        axes: Vec<usize>,
        keep_dims: bool,
    },
    Unary {
        kind: UnaryOp,
        x: Var,
    },
    /// `1 / sqrt(x + epsilon)`.
    Rsqrt {
        x: Var,
        epsilon: f32,
    },
    Gelu {
        x: Var,
        mode: GeluMode,
    },
    Binary {
        kind: BinaryOp,
        x: Var,
        y: Var,
    },
    /// Static slice: `begin <= end <= dim`, `stride >= 1`, per axis.
    SliceByIndex {
        x: Var,
        begin: Vec<usize>,
        end: Vec<usize>,
        stride: Vec<usize>,
    },
    Concat {
        values: Vec<Var>,
        axis: usize,
    },
    /// Splits along `axis` into pieces of `split_sizes` (one output each).
    Split {
        x: Var,
        split_sizes: Vec<usize>,
        axis: usize,
    },
    /// Reshape to a fully resolved static shape.
    Reshape {
        x: Var,
        shape: Vec<usize>,
    },
    Transpose {
        x: Var,
        perm: Vec<usize>,
    },
    /// Inserts size-1 axes; `axes` index the output (sorted ascending).
    ExpandDims {
        x: Var,
        axes: Vec<usize>,
    },
    /// Removes size-1 axes of the input (sorted ascending).
    Squeeze {
        x: Var,
        axes: Vec<usize>,
    },
    Cast {
        x: Var,
        dtype: DType,
    },
    /// iOS18: `(data - offset) * scale` with scale broadcast blockwise (`data.shape[i] / scale.shape[i]`).
    ConstexprBlockwiseShiftScale {
        data: TensorData,
        scale: TensorData,
        offset: Option<TensorData>,
    },
    /// iOS18: `lut[group..., indices]`; lut shape = per-axis group counts ++ `[2^bits, 1]`.
    ConstexprLutToDense {
        indices: TensorData,
        lut: TensorData,
    },
}

impl Op {
    /// The op's kind, whose [`crate::Signature`] names its arguments.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Const { .. } => OpKind::Const,
            Op::ReadState { .. } => OpKind::ReadState,
            Op::WriteState { .. } => OpKind::WriteState,
            Op::SliceUpdate { .. } => OpKind::SliceUpdate,
            Op::Conv { .. } => OpKind::Conv,
            Op::Matmul { .. } => OpKind::Matmul,
            Op::Linear { .. } => OpKind::Linear,
            Op::Softmax { .. } => OpKind::Softmax,
            Op::LayerNorm { .. } => OpKind::LayerNorm,
            Op::Reduce { kind, .. } => OpKind::Reduce(*kind),
            Op::Unary { kind, .. } => OpKind::Unary(*kind),
            Op::Rsqrt { .. } => OpKind::Rsqrt,
            Op::Gelu { .. } => OpKind::Gelu,
            Op::Binary { kind, .. } => OpKind::Binary(*kind),
            Op::SliceByIndex { .. } => OpKind::SliceByIndex,
            Op::Concat { .. } => OpKind::Concat,
            Op::Split { .. } => OpKind::Split,
            Op::Reshape { .. } => OpKind::Reshape,
            Op::Transpose { .. } => OpKind::Transpose,
            Op::ExpandDims { .. } => OpKind::ExpandDims,
            Op::Squeeze { .. } => OpKind::Squeeze,
            Op::Cast { .. } => OpKind::Cast,
            Op::ConstexprBlockwiseShiftScale { .. } => OpKind::ConstexprBlockwiseShiftScale,
            Op::ConstexprLutToDense { .. } => OpKind::ConstexprLutToDense,
        }
    }

    /// The MIL op type string.
    pub fn mil_type(&self) -> &'static str {
        self.kind().mil_type()
    }

    /// Every value operand, in argument order.
    pub fn operands(&self) -> Vec<Var> {
        self.operand_args()
            .into_iter()
            .flat_map(|(_, vars)| vars)
            .collect()
    }

    /// Constant data carried by the op itself (const value, constexpr payloads).
    pub fn const_payloads(&self) -> Vec<&TensorData> {
        self.payload_args()
            .into_iter()
            .map(|(_, data)| data)
            .collect()
    }

    /// Whether the op's output is a compile-time constant (const or constexpr).
    pub fn is_constant(&self) -> bool {
        matches!(
            self,
            Op::Const { .. }
                | Op::ConstexprBlockwiseShiftScale { .. }
                | Op::ConstexprLutToDense { .. }
        )
    }
}
