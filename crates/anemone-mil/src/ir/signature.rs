//! The op signature table: for every op kind, its MIL type name and the names of its operands,
//! parameters and constant payloads. The builder's checks, the proto writer, the proto reader,
//! the verifier and the MIL printer all take op and argument names from here.

use crate::ir::op::{BinaryOp, ReduceOp, UnaryOp};

/// Argument names, shared by every op that takes an argument of that name.
pub mod arg {
    pub const X: &str = "x";
    pub const Y: &str = "y";
    pub const INPUT: &str = "input";
    pub const DATA: &str = "data";
    pub const UPDATE: &str = "update";
    pub const BEGIN: &str = "begin";
    pub const END: &str = "end";
    pub const WEIGHT: &str = "weight";
    pub const BIAS: &str = "bias";
    pub const GAMMA: &str = "gamma";
    pub const BETA: &str = "beta";
    pub const VALUES: &str = "values";
    pub const STRIDES: &str = "strides";
    pub const PAD_TYPE: &str = "pad_type";
    pub const PAD: &str = "pad";
    pub const DILATIONS: &str = "dilations";
    pub const GROUPS: &str = "groups";
    pub const TRANSPOSE_X: &str = "transpose_x";
    pub const TRANSPOSE_Y: &str = "transpose_y";
    pub const AXIS: &str = "axis";
    pub const AXES: &str = "axes";
    pub const EPSILON: &str = "epsilon";
    pub const KEEP_DIMS: &str = "keep_dims";
    pub const MODE: &str = "mode";
    pub const STRIDE: &str = "stride";
    pub const BEGIN_MASK: &str = "begin_mask";
    pub const END_MASK: &str = "end_mask";
    pub const SQUEEZE_MASK: &str = "squeeze_mask";
    pub const INTERLEAVE: &str = "interleave";
    pub const SPLIT_SIZES: &str = "split_sizes";
    pub const NUM_SPLITS: &str = "num_splits";
    pub const SHAPE: &str = "shape";
    pub const PERM: &str = "perm";
    pub const DTYPE: &str = "dtype";
    pub const VAL: &str = "val";
    pub const SCALE: &str = "scale";
    pub const OFFSET: &str = "offset";
    pub const INDICES: &str = "indices";
    pub const LUT: &str = "lut";
    pub const VECTOR_AXIS: &str = "vector_axis";
}

/// Whether an argument must be bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Presence {
    Required,
    /// May be absent; the reader then applies MIL's documented default.
    Optional,
    /// A list of one or more values (operands only).
    Variadic,
}

/// One named argument of an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    pub name: &'static str,
    pub presence: Presence,
}

impl Slot {
    /// Whether a reader must find this argument bound (required and variadic slots).
    pub fn is_required(self) -> bool {
        self.presence != Presence::Optional
    }
}

const fn req(name: &'static str) -> Slot {
    Slot {
        name,
        presence: Presence::Required,
    }
}

const fn opt(name: &'static str) -> Slot {
    Slot {
        name,
        presence: Presence::Optional,
    }
}

const fn many(name: &'static str) -> Slot {
    Slot {
        name,
        presence: Presence::Variadic,
    }
}

/// The argument names of one op kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    pub mil_type: &'static str,
    /// Tensor operands, bound by name to values of the function, in argument order.
    pub operands: &'static [Slot],
    /// Static parameters carried by [`crate::Op`]. The writer emits every one, in this order, as
    /// a const op named by [`param_const_name`].
    pub params: &'static [Slot],
    /// Parameters other writers (coremltools) may bind that [`crate::Op`] cannot express: the
    /// reader accepts them only at their neutral values.
    pub foreign_params: &'static [Slot],
    /// Constant data carried by the op itself: the `val` attribute of `const`, the inputs of
    /// constexpr ops (bound to immediate or blob values).
    pub payloads: &'static [Slot],
}

impl Signature {
    /// Every argument name this op kind accepts as a proto input.
    pub fn input_slots(&self) -> impl Iterator<Item = Slot> + '_ {
        self.operands
            .iter()
            .chain(self.params)
            .chain(self.foreign_params)
            .chain(self.payloads)
            .copied()
    }

    pub fn operand(&self, name: &str) -> Option<Slot> {
        self.operands.iter().copied().find(|s| s.name == name)
    }

    pub fn has_param(&self, name: &str) -> bool {
        self.params
            .iter()
            .chain(self.foreign_params)
            .any(|s| s.name == name)
    }

    pub fn has_payload(&self, name: &str) -> bool {
        self.payloads.iter().any(|s| s.name == name)
    }
}

/// The name of the const op the writer emits for parameter `param` of op `op`.
pub fn param_const_name(op: &str, param: &str) -> String {
    format!("{op}_{param}")
}

/// Every op type this crate builds, writes and reads; one per MIL type name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Const,
    ReadState,
    WriteState,
    SliceUpdate,
    Conv,
    Matmul,
    Linear,
    Softmax,
    LayerNorm,
    Reduce(ReduceOp),
    Unary(UnaryOp),
    Rsqrt,
    Gelu,
    Binary(BinaryOp),
    SliceByIndex,
    Concat,
    Split,
    Reshape,
    Transpose,
    ExpandDims,
    Squeeze,
    Cast,
    ConstexprBlockwiseShiftScale,
    ConstexprLutToDense,
}

use arg::*;

const NONE: &[Slot] = &[];
const JUST_X: &[Slot] = &[req(X)];
const X_Y: &[Slot] = &[req(X), req(Y)];
const X_WEIGHT_BIAS: &[Slot] = &[req(X), req(WEIGHT), opt(BIAS)];
const SLICE_MASKS: &[Slot] = &[opt(BEGIN_MASK), opt(END_MASK), opt(SQUEEZE_MASK)];

impl OpKind {
    /// Every op kind, each family member (binary, unary, reduce) listed separately.
    pub fn all() -> impl Iterator<Item = OpKind> {
        [
            OpKind::Const,
            OpKind::ReadState,
            OpKind::WriteState,
            OpKind::SliceUpdate,
            OpKind::Conv,
            OpKind::Matmul,
            OpKind::Linear,
            OpKind::Softmax,
            OpKind::LayerNorm,
            OpKind::Rsqrt,
            OpKind::Gelu,
            OpKind::SliceByIndex,
            OpKind::Concat,
            OpKind::Split,
            OpKind::Reshape,
            OpKind::Transpose,
            OpKind::ExpandDims,
            OpKind::Squeeze,
            OpKind::Cast,
            OpKind::ConstexprBlockwiseShiftScale,
            OpKind::ConstexprLutToDense,
        ]
        .into_iter()
        .chain(ReduceOp::ALL.into_iter().map(OpKind::Reduce))
        .chain(UnaryOp::ALL.into_iter().map(OpKind::Unary))
        .chain(BinaryOp::ALL.into_iter().map(OpKind::Binary))
    }

    /// The op kind of a MIL type name, if this crate supports it.
    pub fn from_mil_type(mil_type: &str) -> Option<OpKind> {
        OpKind::all().find(|k| k.mil_type() == mil_type)
    }

    pub fn mil_type(self) -> &'static str {
        self.signature().mil_type
    }

    /// The argument table of this op kind.
    pub fn signature(self) -> Signature {
        let sig = |mil_type, operands, params, foreign_params, payloads| Signature {
            mil_type,
            operands,
            params,
            foreign_params,
            payloads,
        };
        // Slot lists are `const` blocks so that they live for `'static`.
        match self {
            OpKind::Const => sig("const", NONE, NONE, NONE, const { &[req(VAL)] }),
            OpKind::ReadState => sig("read_state", const { &[req(INPUT)] }, NONE, NONE, NONE),
            OpKind::WriteState => sig(
                "write_state",
                const { &[req(INPUT), req(DATA)] },
                NONE,
                NONE,
                NONE,
            ),
            OpKind::SliceUpdate => sig(
                "slice_update",
                const { &[req(X), req(UPDATE), req(BEGIN), req(END)] },
                NONE,
                const {
                    &[
                        opt(STRIDE),
                        opt(BEGIN_MASK),
                        opt(END_MASK),
                        opt(SQUEEZE_MASK),
                    ]
                },
                NONE,
            ),
            OpKind::Conv => sig(
                "conv",
                X_WEIGHT_BIAS,
                const {
                    &[
                        opt(STRIDES),
                        opt(PAD_TYPE),
                        opt(PAD),
                        opt(DILATIONS),
                        opt(GROUPS),
                    ]
                },
                NONE,
                NONE,
            ),
            OpKind::Matmul => sig(
                "matmul",
                X_Y,
                const { &[opt(TRANSPOSE_X), opt(TRANSPOSE_Y)] },
                NONE,
                NONE,
            ),
            OpKind::Linear => sig("linear", X_WEIGHT_BIAS, NONE, NONE, NONE),
            OpKind::Softmax => sig("softmax", JUST_X, const { &[opt(AXIS)] }, NONE, NONE),
            OpKind::LayerNorm => sig(
                "layer_norm",
                const { &[req(X), opt(GAMMA), opt(BETA)] },
                const { &[opt(AXES), opt(EPSILON)] },
                NONE,
                NONE,
            ),
            OpKind::Reduce(kind) => {
                let name = match kind {
                    ReduceOp::Mean => "reduce_mean",
                    ReduceOp::Max => "reduce_max",
                    ReduceOp::Sum => "reduce_sum",
                };
                sig(
                    name,
                    JUST_X,
                    const { &[opt(AXES), opt(KEEP_DIMS)] },
                    NONE,
                    NONE,
                )
            }
            OpKind::Unary(kind) => {
                let name = match kind {
                    UnaryOp::Sqrt => "sqrt",
                    UnaryOp::Exp => "exp",
                    UnaryOp::Silu => "silu",
                    UnaryOp::Tanh => "tanh",
                    UnaryOp::Square => "square",
                    UnaryOp::Abs => "abs",
                };
                sig(name, JUST_X, NONE, NONE, NONE)
            }
            OpKind::Rsqrt => sig("rsqrt", JUST_X, const { &[opt(EPSILON)] }, NONE, NONE),
            OpKind::Gelu => sig("gelu", JUST_X, const { &[opt(MODE)] }, NONE, NONE),
            OpKind::Binary(kind) => {
                let name = match kind {
                    BinaryOp::Add => "add",
                    BinaryOp::Sub => "sub",
                    BinaryOp::Mul => "mul",
                    BinaryOp::RealDiv => "real_div",
                    BinaryOp::Maximum => "maximum",
                    BinaryOp::Minimum => "minimum",
                    BinaryOp::Pow => "pow",
                };
                sig(name, X_Y, NONE, NONE, NONE)
            }
            OpKind::SliceByIndex => sig(
                "slice_by_index",
                JUST_X,
                const { &[req(BEGIN), req(END), opt(STRIDE)] },
                SLICE_MASKS,
                NONE,
            ),
            OpKind::Concat => sig(
                "concat",
                const { &[many(VALUES)] },
                const { &[req(AXIS), opt(INTERLEAVE)] },
                NONE,
                NONE,
            ),
            OpKind::Split => sig(
                "split",
                JUST_X,
                const { &[opt(SPLIT_SIZES), req(AXIS)] },
                const { &[opt(NUM_SPLITS)] },
                NONE,
            ),
            OpKind::Reshape => sig("reshape", JUST_X, const { &[req(SHAPE)] }, NONE, NONE),
            OpKind::Transpose => sig("transpose", JUST_X, const { &[req(PERM)] }, NONE, NONE),
            OpKind::ExpandDims => sig("expand_dims", JUST_X, const { &[req(AXES)] }, NONE, NONE),
            OpKind::Squeeze => sig("squeeze", JUST_X, const { &[opt(AXES)] }, NONE, NONE),
            OpKind::Cast => sig("cast", JUST_X, const { &[req(DTYPE)] }, NONE, NONE),
            OpKind::ConstexprBlockwiseShiftScale => sig(
                "constexpr_blockwise_shift_scale",
                NONE,
                NONE,
                NONE,
                const { &[req(DATA), req(SCALE), opt(OFFSET)] },
            ),
            OpKind::ConstexprLutToDense => sig(
                "constexpr_lut_to_dense",
                NONE,
                NONE,
                const { &[opt(VECTOR_AXIS)] },
                const { &[req(INDICES), req(LUT)] },
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn mil_type_names_are_unique_and_parse_back() {
        let mut seen = HashSet::new();
        for kind in OpKind::all() {
            assert!(seen.insert(kind.mil_type()), "{} twice", kind.mil_type());
            assert_eq!(OpKind::from_mil_type(kind.mil_type()), Some(kind));
        }
        assert_eq!(OpKind::from_mil_type("frobnicate"), None);
    }

    #[test]
    fn each_argument_name_has_one_slot_per_op() {
        for kind in OpKind::all() {
            let sig = kind.signature();
            let mut seen = HashSet::new();
            for slot in sig.input_slots() {
                assert!(
                    seen.insert(slot.name),
                    "{}: `{}` twice",
                    sig.mil_type,
                    slot.name
                );
            }
            assert!(
                sig.params
                    .iter()
                    .chain(sig.foreign_params)
                    .chain(sig.payloads)
                    .all(|s| s.presence != Presence::Variadic),
                "{}: only operands are variadic",
                sig.mil_type
            );
        }
    }
}
