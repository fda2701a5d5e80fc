//! Translation of one proto op into an [`Op`], folding parameter consts into op fields.

use coreml_proto::proto::mil_spec as mil;

use super::{normalize, op_name, FnDecoder};
use crate::error::{MilError, Result};
use crate::op::{BinaryOp, ConvParams, GeluMode, Op, ReduceOp, UnaryOp};
use crate::program::Var;
use crate::types::DType;

/// Which argument names of an op type are tensor operands (the rest are parameters).
pub(super) fn operand_keys(op_type: &str) -> &'static [&'static str] {
    match op_type {
        "read_state" => &["input"],
        "write_state" => &["input", "data"],
        "slice_update" => &["x", "update", "begin", "end"],
        "conv" | "linear" => &["x", "weight", "bias"],
        "matmul" => &["x", "y"],
        "layer_norm" => &["x", "gamma", "beta"],
        "concat" => &["values"],
        _ if binary_kind(op_type).is_some() => &["x", "y"],
        _ => &["x"],
    }
}

fn binary_kind(t: &str) -> Option<BinaryOp> {
    BinaryOp::ALL.into_iter().find(|k| k.mil_type() == t)
}

fn unary_kind(t: &str) -> Option<UnaryOp> {
    UnaryOp::ALL.into_iter().find(|k| k.mil_type() == t)
}

fn reduce_kind(t: &str) -> Option<ReduceOp> {
    ReduceOp::ALL.into_iter().find(|k| k.mil_type() == t)
}

impl FnDecoder<'_> {
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
        self.operand(op, key)?.ok_or_else(|| {
            self.err(format!(
                "op `{}` ({}): missing input `{key}`",
                op_name(op),
                op.r#type
            ))
        })
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
                    op_type: "decoded op",
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
            op_type: "decoded op",
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

    /// Translates one proto op into an [`Op`].
    pub(super) fn op(&self, op: &mil::Operation) -> Result<Op> {
        let t = op.r#type.as_str();
        let x = || self.required(op, "x");
        Ok(match t {
            "read_state" => Op::ReadState {
                input: self.required(op, "input")?,
            },
            "write_state" => Op::WriteState {
                input: self.required(op, "input")?,
                data: self.required(op, "data")?,
            },
            "slice_update" => {
                let defaults = self
                    .ints(op, "stride")?
                    .is_none_or(|s| s.iter().all(|&v| v == 1))
                    && ["begin_mask", "end_mask", "squeeze_mask"]
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
                    update: self.required(op, "update")?,
                    begin: self.required(op, "begin")?,
                    end: self.required(op, "end")?,
                }
            }
            "conv" => {
                let x = x()?;
                let weight = self.required(op, "weight")?;
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
                let strides = pair("strides")?;
                let dilations = pair("dilations")?;
                let pad_type = self
                    .param_string(op, "pad_type")?
                    .unwrap_or_else(|| "valid".into());
                let pad = match pad_type.as_str() {
                    "valid" => [0; 4],
                    "custom" => match self.ints(op, "pad")? {
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
                let groups = self.int(op, "groups")?.unwrap_or(1);
                if groups < 1 {
                    return Err(self.err(format!("op `{}`: groups {groups}", op_name(op))));
                }
                Op::Conv {
                    x,
                    weight,
                    bias: self.operand(op, "bias")?,
                    params: ConvParams {
                        strides,
                        pad,
                        dilations,
                        groups: groups as usize,
                    },
                }
            }
            "matmul" => Op::Matmul {
                x: x()?,
                y: self.required(op, "y")?,
                transpose_x: self.flag(op, "transpose_x")?,
                transpose_y: self.flag(op, "transpose_y")?,
            },
            "linear" => Op::Linear {
                x: x()?,
                weight: self.required(op, "weight")?,
                bias: self.operand(op, "bias")?,
            },
            "softmax" => {
                let x = x()?;
                Op::Softmax {
                    x,
                    axis: self.axis(op, "axis", self.rank(x)?, Some(-1))?,
                }
            }
            "layer_norm" => {
                let x = x()?;
                let rank = self.rank(x)?;
                Op::LayerNorm {
                    x,
                    axes: self
                        .axes(op, "axes", rank)?
                        .unwrap_or_else(|| (0..rank).collect()),
                    gamma: self.operand(op, "gamma")?,
                    beta: self.operand(op, "beta")?,
                    epsilon: self.float(op, "epsilon", 1e-5)?,
                }
            }
            "rsqrt" => Op::Rsqrt {
                x: x()?,
                epsilon: self.float(op, "epsilon", 1e-12)?,
            },
            "gelu" => {
                let mode = self
                    .param_string(op, "mode")?
                    .unwrap_or_else(|| "EXACT".into());
                Op::Gelu {
                    x: x()?,
                    mode: GeluMode::from_mil_name(&mode)
                        .ok_or_else(|| self.unsupported(op, &format!("mode {mode}")))?,
                }
            }
            "slice_by_index" => {
                let x = x()?;
                let shape = self.b.tensor_type(x)?.shape.clone();
                let r = shape.len();
                let begin = self.ints(op, "begin")?.unwrap_or_else(|| vec![0; r]);
                let end = self
                    .ints(op, "end")?
                    .unwrap_or_else(|| shape.iter().map(|&d| d as i64).collect());
                let stride = self.ints(op, "stride")?.unwrap_or_else(|| vec![1; r]);
                let (bm, em) = (self.flags(op, "begin_mask")?, self.flags(op, "end_mask")?);
                if self.flags(op, "squeeze_mask")?.iter().any(|&b| b) {
                    return Err(self.unsupported(op, "squeeze_mask"));
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
            "concat" => {
                let values = self.operands(op, "values")?.unwrap_or_default();
                if self.flag(op, "interleave")? {
                    return Err(self.unsupported(op, "interleave"));
                }
                let first = *values
                    .first()
                    .ok_or_else(|| self.err(format!("op `{}`: no values", op_name(op))))?;
                Op::Concat {
                    axis: self.axis(op, "axis", self.rank(first)?, None)?,
                    values,
                }
            }
            "split" => {
                let x = x()?;
                let xt = self.b.tensor_type(x)?.clone();
                let axis = self.axis(op, "axis", xt.rank(), None)?;
                let split_sizes = match (self.ints(op, "split_sizes")?, self.int(op, "num_splits")?)
                {
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
            "reshape" => {
                let x = x()?;
                let xt = self.b.tensor_type(x)?.clone();
                let shape = self
                    .ints(op, "shape")?
                    .ok_or_else(|| self.unsupported(op, "dynamic shape"))?;
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
            "transpose" => {
                let x = x()?;
                let rank = self.rank(x)?;
                Op::Transpose {
                    x,
                    perm: self.axes(op, "perm", rank)?.unwrap_or_default(),
                }
            }
            "expand_dims" => {
                let x = x()?;
                let rank = self.rank(x)?;
                let n = self.ints(op, "axes")?.map_or(0, |v| v.len());
                let mut axes = self.axes(op, "axes", rank + n)?.unwrap_or_default();
                axes.sort_unstable();
                Op::ExpandDims { x, axes }
            }
            "squeeze" => {
                let x = x()?;
                let xt = self.b.tensor_type(x)?.clone();
                let mut axes = match self.axes(op, "axes", xt.rank())? {
                    Some(a) => a,
                    None => (0..xt.rank()).filter(|&i| xt.shape[i] == 1).collect(),
                };
                axes.sort_unstable();
                Op::Squeeze { x, axes }
            }
            "cast" => {
                let name = self.param_string(op, "dtype")?.unwrap_or_default();
                Op::Cast {
                    x: x()?,
                    dtype: DType::from_mil_name(&name)
                        .ok_or_else(|| self.unsupported(op, &format!("dtype {name}")))?,
                }
            }
            "constexpr_blockwise_shift_scale" => Op::ConstexprBlockwiseShiftScale {
                data: self
                    .param(op, "data")?
                    .ok_or_else(|| self.err(format!("op `{}`: missing data", op_name(op))))?,
                scale: self
                    .param(op, "scale")?
                    .ok_or_else(|| self.err(format!("op `{}`: missing scale", op_name(op))))?,
                offset: self.param(op, "offset")?,
            },
            "constexpr_lut_to_dense" => {
                if op.inputs.contains_key("vector_axis") {
                    return Err(self.unsupported(op, "vector palettes"));
                }
                Op::ConstexprLutToDense {
                    indices: self.param(op, "indices")?.ok_or_else(|| {
                        self.err(format!("op `{}`: missing indices", op_name(op)))
                    })?,
                    lut: self
                        .param(op, "lut")?
                        .ok_or_else(|| self.err(format!("op `{}`: missing lut", op_name(op))))?,
                }
            }
            _ => {
                if let Some(kind) = binary_kind(t) {
                    Op::Binary {
                        kind,
                        x: x()?,
                        y: self.required(op, "y")?,
                    }
                } else if let Some(kind) = unary_kind(t) {
                    Op::Unary { kind, x: x()? }
                } else if let Some(kind) = reduce_kind(t) {
                    let x = x()?;
                    let rank = self.rank(x)?;
                    Op::Reduce {
                        kind,
                        x,
                        axes: self
                            .axes(op, "axes", rank)?
                            .unwrap_or_else(|| (0..rank).collect()),
                        keep_dims: self.flag(op, "keep_dims")?,
                    }
                } else {
                    return Err(self.unsupported(op, "not in the supported op set"));
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
