//! Translation of one proto op into an [`Op`], folding parameter consts into op fields.
//! Argument names come from the op signature table.

use coreml_proto::proto::mil_spec as mil;

use super::{debug_assert_in_signature, normalize, op_name, static_type, FunctionReader};
use crate::error::{MilError, Result};
use crate::ir::op::{ConvParams, GeluMode, Op};
use crate::ir::program::Var;
use crate::ir::signature::{arg::*, OpKind};
use crate::ir::tensor::TensorData;
use crate::ir::types::DType;

impl FunctionReader<'_> {
    /// The `val` attribute of a const op.
    pub(super) fn const_val<'op>(&self, op: &'op mil::Operation) -> Result<&'op mil::Value> {
        op.attributes
            .get(VAL)
            .ok_or_else(|| self.err(format!("const `{}` has no {VAL}", op_name(op))))
    }

    fn missing(&self, op: &mil::Operation, key: &str) -> MilError {
        self.err(format!(
            "op `{}` ({}): missing input `{key}`",
            op_name(op),
            op.r#type
        ))
    }

    /// A required constant payload of a constexpr op.
    fn payload(&self, op: &mil::Operation, key: &str) -> Result<TensorData> {
        self.param(op, key)?.ok_or_else(|| self.missing(op, key))
    }

    fn ints(&self, op: &mil::Operation, key: &str) -> Result<Option<Vec<i64>>> {
        Ok(match self.param(op, key)? {
            Some(t) => Some(t.to_i32_vec()?.into_iter().map(i64::from).collect()),
            None => None,
        })
    }

    fn int(&self, op: &mil::Operation, key: &str) -> Result<Option<i64>> {
        match self.ints(op, key)? {
            None => Ok(None),
            Some(v) if v.len() == 1 => Ok(Some(v[0])),
            Some(v) => Err(self.err(format!(
                "op `{}`: `{key}` must be a scalar, got {v:?}",
                op_name(op)
            ))),
        }
    }

    fn flag(&self, op: &mil::Operation, key: &str) -> Result<bool> {
        Ok(self.int(op, key)?.unwrap_or(0) != 0)
    }

    fn flags(&self, op: &mil::Operation, key: &str) -> Result<Vec<bool>> {
        Ok(self
            .ints(op, key)?
            .unwrap_or_default()
            .into_iter()
            .map(|v| v != 0)
            .collect())
    }

    fn float(&self, op: &mil::Operation, key: &str, default: f32) -> Result<f32> {
        Ok(match self.param(op, key)? {
            Some(t) if t.numel() == 1 => t.to_f32_vec()[0],
            Some(t) => {
                return Err(self.err(format!(
                    "op `{}`: `{key}` must be a scalar, got {}",
                    op_name(op),
                    t.tensor_type()
                )))
            }
            None => default,
        })
    }

    fn operands(&self, op: &mil::Operation, key: &str) -> Result<Option<Vec<Var>>> {
        debug_assert_in_signature(op, key);
        let Some(arg) = op.inputs.get(key) else {
            return Ok(None);
        };
        arg.arguments
            .iter()
            .map(|b| match &b.binding {
                Some(mil::argument::binding::Binding::Name(n)) => {
                    self.vars.get(n).copied().ok_or_else(|| {
                        self.err(format!(
                            "op `{}`: `{key}` refers to undefined value `{n}`",
                            op_name(op)
                        ))
                    })
                }
                _ => Err(self.err(format!("op `{}`: `{key}` must name a value", op_name(op)))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn operand(&self, op: &mil::Operation, key: &str) -> Result<Option<Var>> {
        match self.operands(op, key)? {
            None => Ok(None),
            Some(v) if v.len() == 1 => Ok(Some(v[0])),
            Some(_) => Err(self.err(format!(
                "op `{}`: `{key}` must bind exactly one value",
                op_name(op)
            ))),
        }
    }

    fn required(&self, op: &mil::Operation, key: &str) -> Result<Var> {
        self.operand(op, key)?.ok_or_else(|| self.missing(op, key))
    }

    fn rank(&self, v: Var) -> Result<usize> {
        Ok(self.b.tensor_type(v)?.rank())
    }

    fn axes(&self, op: &mil::Operation, key: &str, rank: usize) -> Result<Option<Vec<usize>>> {
        let Some(v) = self.ints(op, key)? else {
            return Ok(None);
        };
        v.iter()
            .map(|&a| {
                normalize(a, rank).ok_or_else(|| MilError::AxisOutOfRange {
                    op: op_name(op),
                    op_type: static_type(op),
                    axis: a,
                    rank,
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn axis(
        &self,
        op: &mil::Operation,
        key: &str,
        rank: usize,
        default: Option<i64>,
    ) -> Result<usize> {
        let a = self
            .int(op, key)?
            .or(default)
            .ok_or_else(|| self.err(format!("op `{}`: missing `{key}`", op_name(op))))?;
        normalize(a, rank).ok_or_else(|| MilError::AxisOutOfRange {
            op: op_name(op),
            op_type: static_type(op),
            axis: a,
            rank,
        })
    }

    fn unsupported(&self, op: &mil::Operation, why: &str) -> MilError {
        MilError::UnsupportedOp {
            file: self.file.to_string(),
            function: self.function.clone(),
            op: op_name(op),
            op_type: format!("{} ({why})", op.r#type),
        }
    }

    /// Translates one proto op of kind `kind` into an [`Op`].
    pub(super) fn op(&self, op: &mil::Operation, kind: OpKind) -> Result<Op> {
        let x = || self.required(op, X);
        Ok(match kind {
            OpKind::Const => Op::Const {
                value: self.tensor_of(self.const_val(op)?, &format!("const `{}`", op_name(op)))?,
            },
            OpKind::ReadState => Op::ReadState {
                input: self.required(op, INPUT)?,
            },
            OpKind::WriteState => Op::WriteState {
                input: self.required(op, INPUT)?,
                data: self.required(op, DATA)?,
            },
            OpKind::SliceUpdate => {
                let defaults = self
                    .ints(op, STRIDE)?
                    .is_none_or(|s| s.iter().all(|&v| v == 1))
                    && [BEGIN_MASK, END_MASK, SQUEEZE_MASK]
                        .iter()
                        .map(|k| self.flags(op, k))
                        .collect::<Result<Vec<_>>>()?
                        .iter()
                        .all(|m| m.iter().all(|&b| !b));
                if !defaults {
                    return Err(self.unsupported(op, "strides or masks"));
                }
                Op::SliceUpdate {
                    x: x()?,
                    update: self.required(op, UPDATE)?,
                    begin: self.required(op, BEGIN)?,
                    end: self.required(op, END)?,
                }
            }
            OpKind::Conv => {
                let x = x()?;
                let weight = self.required(op, WEIGHT)?;
                let xs = self.b.tensor_type(x)?.shape.clone();
                let ws = self.b.tensor_type(weight)?.shape.clone();
                if xs.len() != 4 || ws.len() != 4 {
                    return Err(self.unsupported(op, "only 2-D convolution"));
                }
                let pair = |k: &str| -> Result<[usize; 2]> {
                    match self.ints(op, k)? {
                        None => Ok([1, 1]),
                        Some(v) if v.len() == 2 && v.iter().all(|&s| s >= 1) => {
                            Ok([v[0] as usize, v[1] as usize])
                        }
                        Some(v) => Err(self.err(format!("op `{}`: bad `{k}` {v:?}", op_name(op)))),
                    }
                };
                let strides = pair(STRIDES)?;
                let dilations = pair(DILATIONS)?;
                let pad_type = self
                    .param_string(op, PAD_TYPE)?
                    .unwrap_or_else(|| "valid".into());
                let pad = match pad_type.as_str() {
                    "valid" => [0; 4],
                    "custom" => match self.ints(op, PAD)? {
                        Some(p) if p.len() == 4 && p.iter().all(|&v| v >= 0) => p.map_into(),
                        None => [0; 4],
                        Some(p) => {
                            return Err(self.err(format!("op `{}`: bad pad {p:?}", op_name(op))))
                        }
                    },
                    "same" | "same_lower" => {
                        let mut pad = [0; 4];
                        for i in 0..2 {
                            let out = xs[2 + i].div_ceil(strides[i]);
                            let window = dilations[i] * (ws[2 + i].max(1) - 1) + 1;
                            let total = ((out - 1) * strides[i] + window).saturating_sub(xs[2 + i]);
                            let (small, big) = (total / 2, total - total / 2);
                            pad[2 * i] = if pad_type == "same" { small } else { big };
                            pad[2 * i + 1] = total - pad[2 * i];
                        }
                        pad
                    }
                    other => return Err(self.unsupported(op, &format!("pad_type {other}"))),
                };
                let groups = self.int(op, GROUPS)?.unwrap_or(1);
                if groups < 1 {
                    return Err(self.err(format!("op `{}`: groups {groups}", op_name(op))));
                }
                Op::Conv {
                    x,
                    weight,
                    bias: self.operand(op, BIAS)?,
                    params: ConvParams {
                        strides,
                        pad,
                        dilations,
                        groups: groups as usize,
                    },
                }
            }
            OpKind::Matmul => Op::Matmul {
                x: x()?,
                y: self.required(op, Y)?,
                transpose_x: self.flag(op, TRANSPOSE_X)?,
                transpose_y: self.flag(op, TRANSPOSE_Y)?,
            },
            OpKind::Linear => Op::Linear {
                x: x()?,
                weight: self.required(op, WEIGHT)?,
                bias: self.operand(op, BIAS)?,
            },
            OpKind::Softmax => {
                let x = x()?;
                Op::Softmax {
                    x,
                    axis: self.axis(op, AXIS, self.rank(x)?, Some(-1))?,
                }
            }
            OpKind::LayerNorm => {
                let x = x()?;
                let rank = self.rank(x)?;
                Op::LayerNorm {
                    x,
                    axes: self
                        .axes(op, AXES, rank)?
                        .unwrap_or_else(|| (0..rank).collect()),
                    gamma: self.operand(op, GAMMA)?,
                    beta: self.operand(op, BETA)?,
                    epsilon: self.float(op, EPSILON, 1e-5)?,
                }
            }
            OpKind::Rsqrt => Op::Rsqrt {
                x: x()?,
                epsilon: self.float(op, EPSILON, 1e-12)?,
            },
            OpKind::Gelu => {
                let mode = self
                    .param_string(op, MODE)?
                    .unwrap_or_else(|| "EXACT".into());
                Op::Gelu {
                    x: x()?,
                    mode: GeluMode::from_mil_name(&mode)
                        .ok_or_else(|| self.unsupported(op, &format!("mode {mode}")))?,
                }
            }
            OpKind::SliceByIndex => {
                let x = x()?;
                let shape = self.b.tensor_type(x)?.shape.clone();
                let r = shape.len();
                let begin = self
                    .ints(op, BEGIN)?
                    .ok_or_else(|| self.missing(op, BEGIN))?;
                let end = self.ints(op, END)?.ok_or_else(|| self.missing(op, END))?;
                let stride = self.ints(op, STRIDE)?.unwrap_or_else(|| vec![1; r]);
                let (bm, em) = (self.flags(op, BEGIN_MASK)?, self.flags(op, END_MASK)?);
                if self.flags(op, SQUEEZE_MASK)?.iter().any(|&b| b) {
                    return Err(self.unsupported(op, SQUEEZE_MASK));
                }
                if begin.len() != r
                    || end.len() != r
                    || stride.len() != r
                    || stride.iter().any(|&s| s < 1)
                {
                    return Err(self.unsupported(
                        op,
                        "begin/end/stride of the wrong length or negative stride",
                    ));
                }
                let resolve = |i: i64, d: usize| {
                    (if i < 0 { i + d as i64 } else { i }).clamp(0, d as i64) as usize
                };
                Op::SliceByIndex {
                    x,
                    begin: (0..r)
                        .map(|i| {
                            if bm.get(i) == Some(&true) {
                                0
                            } else {
                                resolve(begin[i], shape[i])
                            }
                        })
                        .collect(),
                    end: (0..r)
                        .map(|i| {
                            if em.get(i) == Some(&true) {
                                shape[i]
                            } else {
                                resolve(end[i], shape[i])
                            }
                        })
                        .collect(),
                    stride: stride.iter().map(|&s| s as usize).collect(),
                }
            }
            OpKind::Concat => {
                let values = self
                    .operands(op, VALUES)?
                    .ok_or_else(|| self.missing(op, VALUES))?;
                if self.flag(op, INTERLEAVE)? {
                    return Err(self.unsupported(op, INTERLEAVE));
                }
                let first = *values
                    .first()
                    .ok_or_else(|| self.err(format!("op `{}`: no values", op_name(op))))?;
                Op::Concat {
                    axis: self.axis(op, AXIS, self.rank(first)?, None)?,
                    values,
                }
            }
            OpKind::Split => {
                let x = x()?;
                let xt = self.b.tensor_type(x)?.clone();
                let axis = self.axis(op, AXIS, xt.rank(), None)?;
                let split_sizes = match (self.ints(op, SPLIT_SIZES)?, self.int(op, NUM_SPLITS)?) {
                    (Some(s), _) => s.iter().map(|&v| v.max(0) as usize).collect(),
                    (None, Some(n)) if n >= 1 && n as usize <= xt.shape[axis] => {
                        vec![xt.shape[axis] / n as usize; n as usize]
                    }
                    _ => {
                        return Err(self.err(format!(
                            "op `{}`: needs split_sizes or num_splits",
                            op_name(op)
                        )))
                    }
                };
                Op::Split {
                    x,
                    split_sizes,
                    axis,
                }
            }
            OpKind::Reshape => {
                let x = x()?;
                let xt = self.b.tensor_type(x)?.clone();
                let shape = self
                    .ints(op, SHAPE)?
                    .ok_or_else(|| self.missing(op, SHAPE))?;
                let mut resolved: Vec<i64> = shape
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| {
                        if d == 0 {
                            xt.shape.get(i).map_or(0, |&s| s as i64)
                        } else {
                            d
                        }
                    })
                    .collect();
                let known: i64 = resolved
                    .iter()
                    .filter(|&&d| d > 0)
                    .try_fold(1i64, |a, &d| a.checked_mul(d))
                    .unwrap_or(0);
                if let Some(slot) = resolved.iter_mut().find(|d| **d == -1) {
                    *slot = if known > 0 {
                        xt.numel() as i64 / known
                    } else {
                        0
                    };
                }
                if resolved.iter().any(|&d| d < 1) {
                    return Err(self.err(format!(
                        "op `{}`: cannot resolve reshape {shape:?} of {xt}",
                        op_name(op)
                    )));
                }
                Op::Reshape {
                    x,
                    shape: resolved.iter().map(|&d| d as usize).collect(),
                }
            }
            OpKind::Transpose => {
                let x = x()?;
                let rank = self.rank(x)?;
                Op::Transpose {
                    x,
                    perm: self
                        .axes(op, PERM, rank)?
                        .ok_or_else(|| self.missing(op, PERM))?,
                }
            }
            OpKind::ExpandDims => {
                let x = x()?;
                let rank = self.rank(x)?;
                let n = self.ints(op, AXES)?.map_or(0, |v| v.len());
                let mut axes = self
                    .axes(op, AXES, rank + n)?
                    .ok_or_else(|| self.missing(op, AXES))?;
                axes.sort_unstable();
                Op::ExpandDims { x, axes }
            }
            OpKind::Squeeze => {
                let x = x()?;
                let xt = self.b.tensor_type(x)?.clone();
                let mut axes = match self.axes(op, AXES, xt.rank())? {
                    Some(a) => a,
                    None => (0..xt.rank()).filter(|&i| xt.shape[i] == 1).collect(),
                };
                axes.sort_unstable();
                Op::Squeeze { x, axes }
            }
            OpKind::Cast => {
                let name = self
                    .param_string(op, DTYPE)?
                    .ok_or_else(|| self.missing(op, DTYPE))?;
                Op::Cast {
                    x: x()?,
                    dtype: DType::from_mil_name(&name)
                        .ok_or_else(|| self.unsupported(op, &format!("dtype {name}")))?,
                }
            }
            OpKind::ConstexprBlockwiseShiftScale => Op::ConstexprBlockwiseShiftScale {
                data: self.payload(op, DATA)?,
                scale: self.payload(op, SCALE)?,
                offset: self.param(op, OFFSET)?,
            },
            OpKind::ConstexprLutToDense => {
                if op.inputs.contains_key(VECTOR_AXIS) {
                    return Err(self.unsupported(op, "vector palettes"));
                }
                Op::ConstexprLutToDense {
                    indices: self.payload(op, INDICES)?,
                    lut: self.payload(op, LUT)?,
                }
            }
            OpKind::Binary(kind) => Op::Binary {
                kind,
                x: x()?,
                y: self.required(op, Y)?,
            },
            OpKind::Unary(kind) => Op::Unary { kind, x: x()? },
            OpKind::Reduce(kind) => {
                let x = x()?;
                let rank = self.rank(x)?;
                Op::Reduce {
                    kind,
                    x,
                    axes: self
                        .axes(op, AXES, rank)?
                        .unwrap_or_else(|| (0..rank).collect()),
                    keep_dims: self.flag(op, KEEP_DIMS)?,
                }
            }
        })
    }
}

trait MapInto {
    fn map_into(self) -> [usize; 4];
}

impl MapInto for Vec<i64> {
    fn map_into(self) -> [usize; 4] {
        [
            self[0] as usize,
            self[1] as usize,
            self[2] as usize,
            self[3] as usize,
        ]
    }
}
