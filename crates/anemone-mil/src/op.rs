//! The closed set of ops this crate emits and reads. Every consumer matches exhaustively.

use crate::program::Var;
use crate::tensor::TensorData;
use crate::types::DType;

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
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::RealDiv => "real_div",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Pow => "pow",
        }
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
        match self {
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Exp => "exp",
            UnaryOp::Silu => "silu",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Square => "square",
            UnaryOp::Abs => "abs",
        }
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
        match self {
            ReduceOp::Mean => "reduce_mean",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Sum => "reduce_sum",
        }
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
/// are plain values, written as separate `const` ops named `{op}_{param}` by the encoder.
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
    /// The MIL op type string.
    pub fn mil_type(&self) -> &'static str {
        match self {
            Op::Const { .. } => "const",
            Op::ReadState { .. } => "read_state",
            Op::WriteState { .. } => "write_state",
            Op::SliceUpdate { .. } => "slice_update",
            Op::Conv { .. } => "conv",
            Op::Matmul { .. } => "matmul",
            Op::Linear { .. } => "linear",
            Op::Softmax { .. } => "softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Reduce { kind, .. } => kind.mil_type(),
            Op::Unary { kind, .. } => kind.mil_type(),
            Op::Rsqrt { .. } => "rsqrt",
            Op::Gelu { .. } => "gelu",
            Op::Binary { kind, .. } => kind.mil_type(),
            Op::SliceByIndex { .. } => "slice_by_index",
            Op::Concat { .. } => "concat",
            Op::Split { .. } => "split",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::ExpandDims { .. } => "expand_dims",
            Op::Squeeze { .. } => "squeeze",
            Op::Cast { .. } => "cast",
            Op::ConstexprBlockwiseShiftScale { .. } => "constexpr_blockwise_shift_scale",
            Op::ConstexprLutToDense { .. } => "constexpr_lut_to_dense",
        }
    }

    /// Every value operand, in argument order.
    pub fn operands(&self) -> Vec<Var> {
        match self {
            Op::Const { .. }
            | Op::ConstexprBlockwiseShiftScale { .. }
            | Op::ConstexprLutToDense { .. } => vec![],
            Op::ReadState { input } => vec![*input],
            Op::WriteState { input, data } => vec![*input, *data],
            Op::SliceUpdate {
                x,
                update,
                begin,
                end,
            } => vec![*x, *update, *begin, *end],
            Op::Conv {
                x, weight, bias, ..
            }
            | Op::Linear { x, weight, bias } => {
                let mut v = vec![*x, *weight];
                v.extend(bias);
                v
            }
            Op::Matmul { x, y, .. } | Op::Binary { x, y, .. } => vec![*x, *y],
            Op::LayerNorm { x, gamma, beta, .. } => {
                let mut v = vec![*x];
                v.extend(gamma);
                v.extend(beta);
                v
            }
            Op::Concat { values, .. } => values.clone(),
            Op::Softmax { x, .. }
            | Op::Reduce { x, .. }
            | Op::Unary { x, .. }
            | Op::Rsqrt { x, .. }
            | Op::Gelu { x, .. }
            | Op::SliceByIndex { x, .. }
            | Op::Split { x, .. }
            | Op::Reshape { x, .. }
            | Op::Transpose { x, .. }
            | Op::ExpandDims { x, .. }
            | Op::Squeeze { x, .. }
            | Op::Cast { x, .. } => vec![*x],
        }
    }

    /// Constant data carried by the op itself (const value, constexpr payloads).
    pub fn const_payloads(&self) -> Vec<&TensorData> {
        match self {
            Op::Const { value } => vec![value],
            Op::ConstexprBlockwiseShiftScale {
                data,
                scale,
                offset,
            } => {
                let mut v = vec![data, scale];
                v.extend(offset);
                v
            }
            Op::ConstexprLutToDense { indices, lut } => vec![indices, lut],
            _ => vec![],
        }
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
