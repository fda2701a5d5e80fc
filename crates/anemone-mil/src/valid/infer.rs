//! Output type inference and operand checks for every op (numpy broadcasting, conv windows,
//! matmul transposes, slice bounds, concat axes, constexpr payload layouts).

use crate::error::{MilError, Result};
use crate::ir::op::{BinaryOp, Op};
use crate::ir::program::Var;
use crate::ir::signature::arg;
use crate::ir::tensor::TensorData;
use crate::ir::types::{DType, TensorType, ValueType};

/// What inference needs to know about operands.
pub(crate) trait OperandTypes {
    /// The type of an operand, or None if it is not (yet) defined.
    fn operand_type(&self, v: Var) -> Option<&ValueType>;
    /// Whether the operand is produced by const / constexpr ops.
    fn is_constant(&self, v: Var) -> bool;
    /// A human-readable name for messages.
    fn operand_name(&self, v: Var) -> String;
}

struct Ctx<'a> {
    op_name: &'a str,
    op_type: &'static str,
    env: &'a dyn OperandTypes,
}

impl Ctx<'_> {
    fn fail<T>(&self, detail: impl Into<String>) -> Result<T> {
        Err(MilError::TypeMismatch {
            op: self.op_name.to_string(),
            op_type: self.op_type,
            detail: detail.into(),
        })
    }

    fn any(&self, v: Var, role: &str) -> Result<&ValueType> {
        match self.env.operand_type(v) {
            Some(t) => Ok(t),
            None => self.fail(format!("operand `{role}` (value #{}) is not defined", v.0)),
        }
    }

    /// A tensor (not state) operand.
    fn tensor(&self, v: Var, role: &str) -> Result<&TensorType> {
        match self.any(v, role)? {
            ValueType::Tensor(t) => Ok(t),
            ValueType::State(_) => self.fail(format!(
                "operand `{role}` = `{}` is a state; read it with read_state first",
                self.env.operand_name(v)
            )),
        }
    }

    fn float(&self, v: Var, role: &str) -> Result<&TensorType> {
        let t = self.tensor(v, role)?;
        if !t.dtype.is_float() {
            return self.fail(format!("operand `{role}` must be fp16/fp32, got {t}"));
        }
        Ok(t)
    }

    fn same_dtype(&self, a: &TensorType, b: &TensorType, what: &str) -> Result<()> {
        if a.dtype != b.dtype {
            return self.fail(format!("{what}: dtypes differ ({a} vs {b})"));
        }
        Ok(())
    }

    fn axis(&self, axis: usize, rank: usize) -> Result<usize> {
        if axis >= rank {
            return Err(MilError::AxisOutOfRange {
                op: self.op_name.to_string(),
                op_type: self.op_type,
                axis: axis as i64,
                rank,
            });
        }
        Ok(axis)
    }

    fn unique_axes(&self, axes: &[usize], rank: usize) -> Result<()> {
        for (i, &a) in axes.iter().enumerate() {
            self.axis(a, rank)?;
            if axes[..i].contains(&a) {
                return self.fail(format!("axis {a} listed twice in {axes:?}"));
            }
        }
        Ok(())
    }
}

fn tensor(dtype: DType, shape: Vec<usize>) -> ValueType {
    ValueType::Tensor(TensorType { dtype, shape })
}

/// Numpy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Infers the output types of `op` (none for write_state), checking every operand.
pub(crate) fn infer(op_name: &str, op: &Op, env: &dyn OperandTypes) -> Result<Vec<ValueType>> {
    let c = Ctx {
        op_name,
        op_type: op.mil_type(),
        env,
    };
    let out = match op {
        Op::Const { value } => {
            if value.dtype().is_sub_byte() {
                return c.fail(format!(
                    "a const of {} is only allowed as a constexpr payload",
                    value.dtype()
                ));
            }
            ValueType::Tensor(value.tensor_type().clone())
        }
        Op::ReadState { input } => match c.any(*input, arg::INPUT)? {
            ValueType::State(t) => ValueType::Tensor(t.clone()),
            ValueType::Tensor(t) => {
                return c.fail(format!("operand `input` must be a state, got {t}"))
            }
        },
        Op::WriteState { input, data } => {
            let st = match c.any(*input, arg::INPUT)? {
                ValueType::State(t) => t,
                ValueType::Tensor(t) => {
                    return c.fail(format!("operand `input` must be a state, got {t}"))
                }
            };
            let d = c.tensor(*data, arg::DATA)?;
            if d != st {
                return c.fail(format!("data {d} does not match state {st}"));
            }
            return Ok(vec![]);
        }
        Op::SliceUpdate {
            x,
            update,
            begin,
            end,
        } => {
            let xt = c.tensor(*x, arg::X)?;
            let ut = c.tensor(*update, arg::UPDATE)?;
            c.same_dtype(xt, ut, "x and update")?;
            if ut.rank() != xt.rank() || ut.shape.iter().zip(&xt.shape).any(|(u, x)| u > x) {
                return c.fail(format!("update {ut} does not fit inside x {xt}"));
            }
            for (v, role) in [(*begin, arg::BEGIN), (*end, arg::END)] {
                let t = c.tensor(v, role)?;
                if t.dtype != DType::I32 || t.shape != [xt.rank()] {
                    return c.fail(format!(
                        "`{role}` must be tensor<int32, [{}]>, got {t}",
                        xt.rank()
                    ));
                }
            }
            ValueType::Tensor(xt.clone())
        }
        Op::Conv {
            x,
            weight,
            bias,
            params,
        } => {
            let xt = c.float(*x, arg::X)?;
            let wt = c.tensor(*weight, arg::WEIGHT)?;
            c.same_dtype(xt, wt, "x and weight")?;
            if xt.rank() != 4 || wt.rank() != 4 {
                return c.fail(format!(
                    "conv needs x [N,C,H,W] and weight [O,C/g,kH,kW]; got {xt} and {wt}"
                ));
            }
            let g = params.groups;
            let (cin, cout) = (xt.shape[1], wt.shape[0]);
            if g == 0 || cin % g != 0 || cout % g != 0 || wt.shape[1] * g != cin {
                return c.fail(format!(
                    "groups {g}: input channels {cin} and weight {wt} disagree (need weight[1] * groups == C, O % groups == 0)"
                ));
            }
            if params.strides.contains(&0) || params.dilations.contains(&0) {
                return c.fail("strides and dilations must be >= 1");
            }
            if let Some(b) = bias {
                let bt = c.tensor(*b, arg::BIAS)?;
                c.same_dtype(xt, bt, "x and bias")?;
                if bt.shape != [cout] {
                    return c.fail(format!("bias must be [{cout}], got {bt}"));
                }
            }
            let mut shape = vec![xt.shape[0], cout, 0, 0];
            for i in 0..2 {
                let padded = xt.shape[2 + i]
                    .checked_add(params.pad[2 * i])
                    .and_then(|p| p.checked_add(params.pad[2 * i + 1]));
                let window = wt.shape[2 + i]
                    .checked_sub(1)
                    .and_then(|k| params.dilations[i].checked_mul(k))
                    .map(|w| w + 1);
                let (Some(padded), Some(window)) = (padded, window) else {
                    return c.fail(format!("kernel {wt} or pads {:?} out of range", params.pad));
                };
                if padded < window {
                    return c.fail(format!(
                        "kernel {wt} with dilation {:?} does not fit padded input {xt}",
                        params.dilations
                    ));
                }
                shape[2 + i] = (padded - window) / params.strides[i] + 1;
            }
            tensor(xt.dtype, shape)
        }
        Op::Matmul {
            x,
            y,
            transpose_x,
            transpose_y,
        } => {
            let xt = c.tensor(*x, arg::X)?;
            let yt = c.tensor(*y, arg::Y)?;
            c.same_dtype(xt, yt, "x and y")?;
            if xt.rank() < 2 || yt.rank() < 2 {
                return c.fail(format!("matmul operands need rank >= 2, got {xt} and {yt}"));
            }
            let (xr, yr) = (xt.rank(), yt.rank());
            let (m, kx) = if *transpose_x {
                (xt.shape[xr - 1], xt.shape[xr - 2])
            } else {
                (xt.shape[xr - 2], xt.shape[xr - 1])
            };
            let (ky, n) = if *transpose_y {
                (yt.shape[yr - 1], yt.shape[yr - 2])
            } else {
                (yt.shape[yr - 2], yt.shape[yr - 1])
            };
            if kx != ky {
                return c.fail(format!(
                    "inner dims differ: x {xt} (transpose_x={transpose_x}) gives K={kx}, y {yt} (transpose_y={transpose_y}) gives K={ky}"
                ));
            }
            let Some(mut shape) = broadcast_shapes(&xt.shape[..xr - 2], &yt.shape[..yr - 2]) else {
                return c.fail(format!("batch dims of {xt} and {yt} do not broadcast"));
            };
            shape.extend([m, n]);
            tensor(xt.dtype, shape)
        }
        Op::Linear { x, weight, bias } => {
            let xt = c.float(*x, arg::X)?;
            let wt = c.tensor(*weight, arg::WEIGHT)?;
            c.same_dtype(xt, wt, "x and weight")?;
            if !env.is_constant(*weight) {
                return c.fail("linear weight must be a const or constexpr output");
            }
            if xt.rank() < 1 || wt.rank() != 2 || wt.shape[1] != xt.shape[xt.rank() - 1] {
                return c.fail(format!(
                    "weight must be [out, {}], got {wt} for x {xt}",
                    xt.shape.last().copied().unwrap_or(0)
                ));
            }
            if let Some(b) = bias {
                let bt = c.tensor(*b, arg::BIAS)?;
                c.same_dtype(xt, bt, "x and bias")?;
                if bt.shape != [wt.shape[0]] || !env.is_constant(*b) {
                    return c.fail(format!("bias must be a const [{}], got {bt}", wt.shape[0]));
                }
            }
            let mut shape = xt.shape.clone();
            *shape.last_mut().expect("rank >= 1") = wt.shape[0];
            tensor(xt.dtype, shape)
        }
        Op::Softmax { x, axis } => {
            let xt = c.float(*x, arg::X)?;
            c.axis(*axis, xt.rank())?;
            ValueType::Tensor(xt.clone())
        }
        Op::LayerNorm {
            x,
            axes,
            gamma,
            beta,
            epsilon,
        } => {
            let xt = c.float(*x, arg::X)?;
            if axes.is_empty() {
                return c.fail("axes must not be empty");
            }
            c.unique_axes(axes, xt.rank())?;
            if !(epsilon.is_finite() && *epsilon >= 0.0) {
                return c.fail(format!("epsilon must be finite and >= 0, got {epsilon}"));
            }
            let norm_shape: Vec<usize> = axes.iter().map(|&a| xt.shape[a]).collect();
            for (v, role) in [(gamma, arg::GAMMA), (beta, arg::BETA)] {
                if let Some(v) = v {
                    let t = c.tensor(*v, role)?;
                    c.same_dtype(xt, t, role)?;
                    if t.shape != norm_shape || !env.is_constant(*v) {
                        return c.fail(format!(
                            "`{role}` must be a const of shape {norm_shape:?}, got {t}"
                        ));
                    }
                }
            }
            ValueType::Tensor(xt.clone())
        }
        Op::Reduce {
            x, axes, keep_dims, ..
        } => {
            let xt = c.tensor(*x, arg::X)?;
            if !(xt.dtype.is_float() || xt.dtype == DType::I32) {
                return c.fail(format!("x must be fp16/fp32/int32, got {xt}"));
            }
            if axes.is_empty() {
                return c.fail("axes must not be empty");
            }
            c.unique_axes(axes, xt.rank())?;
            let shape = xt
                .shape
                .iter()
                .enumerate()
                .filter_map(|(i, &d)| match (axes.contains(&i), keep_dims) {
                    (false, _) => Some(d),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect();
            tensor(xt.dtype, shape)
        }
        Op::Unary { x, .. } | Op::Gelu { x, .. } => ValueType::Tensor(c.float(*x, arg::X)?.clone()),
        Op::Rsqrt { x, epsilon } => {
            if !(epsilon.is_finite() && *epsilon >= 0.0) {
                return c.fail(format!("epsilon must be finite and >= 0, got {epsilon}"));
            }
            ValueType::Tensor(c.float(*x, arg::X)?.clone())
        }
        Op::Binary { kind, x, y } => {
            let xt = c.tensor(*x, arg::X)?;
            let yt = c.tensor(*y, arg::Y)?;
            c.same_dtype(xt, yt, "x and y")?;
            let int_ok = matches!(
                kind,
                BinaryOp::Add
                    | BinaryOp::Sub
                    | BinaryOp::Mul
                    | BinaryOp::Maximum
                    | BinaryOp::Minimum
            );
            if !(xt.dtype.is_float() || (int_ok && xt.dtype == DType::I32)) {
                return c.fail(format!(
                    "operands must be fp16/fp32{}, got {xt}",
                    if int_ok { "/int32" } else { "" }
                ));
            }
            let Some(shape) = broadcast_shapes(&xt.shape, &yt.shape) else {
                return c.fail(format!(
                    "shapes {:?} and {:?} do not broadcast",
                    xt.shape, yt.shape
                ));
            };
            tensor(xt.dtype, shape)
        }
        Op::SliceByIndex {
            x,
            begin,
            end,
            stride,
        } => {
            let xt = c.tensor(*x, arg::X)?;
            let r = xt.rank();
            if begin.len() != r || end.len() != r || stride.len() != r {
                return c.fail(format!(
                    "begin/end/stride need {r} entries each, got {}/{}/{}",
                    begin.len(),
                    end.len(),
                    stride.len()
                ));
            }
            let mut shape = Vec::with_capacity(r);
            for i in 0..r {
                if stride[i] == 0 || begin[i] >= end[i] || end[i] > xt.shape[i] {
                    return c.fail(format!(
                        "axis {i}: slice [{}:{}:{}] is empty or out of bounds for dim {} of {xt}",
                        begin[i], end[i], stride[i], xt.shape[i]
                    ));
                }
                shape.push((end[i] - begin[i]).div_ceil(stride[i]));
            }
            tensor(xt.dtype, shape)
        }
        Op::Concat { values, axis } => {
            let Some(first) = values.first() else {
                return c.fail("concat of no values");
            };
            let ft = c.tensor(*first, "values[0]")?;
            c.axis(*axis, ft.rank())?;
            let mut shape = ft.shape.clone();
            shape[*axis] = 0;
            for (i, v) in values.iter().enumerate() {
                let t = c.tensor(*v, &format!("values[{i}]"))?;
                c.same_dtype(ft, t, &format!("values[0] and values[{i}]"))?;
                let agrees = t.rank() == ft.rank()
                    && (0..t.rank()).all(|d| d == *axis || t.shape[d] == ft.shape[d]);
                if !agrees {
                    return c.fail(format!(
                        "values[{i}] {t} does not match values[0] {ft} outside axis {axis}"
                    ));
                }
                shape[*axis] += t.shape[*axis];
            }
            tensor(ft.dtype, shape)
        }
        Op::Split {
            x,
            split_sizes,
            axis,
        } => {
            let xt = c.tensor(*x, arg::X)?;
            c.axis(*axis, xt.rank())?;
            if split_sizes.is_empty()
                || split_sizes.contains(&0)
                || split_sizes.iter().sum::<usize>() != xt.shape[*axis]
            {
                return c.fail(format!(
                    "split_sizes {split_sizes:?} must be positive and sum to dim {} of {xt}",
                    xt.shape[*axis]
                ));
            }
            return Ok(split_sizes
                .iter()
                .map(|&s| {
                    let mut shape = xt.shape.clone();
                    shape[*axis] = s;
                    tensor(xt.dtype, shape)
                })
                .collect());
        }
        Op::Reshape { x, shape } => {
            let xt = c.tensor(*x, arg::X)?;
            let target = TensorType::new(xt.dtype, shape.clone());
            if target.checked_numel() != Some(xt.numel()) {
                return c.fail(format!(
                    "cannot reshape {xt} ({} elements) to {shape:?}",
                    xt.numel()
                ));
            }
            tensor(xt.dtype, shape.clone())
        }
        Op::Transpose { x, perm } => {
            let xt = c.tensor(*x, arg::X)?;
            let mut seen = vec![false; xt.rank()];
            if perm.len() != xt.rank()
                || perm
                    .iter()
                    .any(|&p| p >= xt.rank() || std::mem::replace(&mut seen[p], true))
            {
                return c.fail(format!(
                    "perm {perm:?} is not a permutation of rank {}",
                    xt.rank()
                ));
            }
            tensor(xt.dtype, perm.iter().map(|&p| xt.shape[p]).collect())
        }
        Op::ExpandDims { x, axes } => {
            let xt = c.tensor(*x, arg::X)?;
            let out_rank = xt.rank() + axes.len();
            if axes.is_empty() || axes.windows(2).any(|w| w[0] >= w[1]) {
                return c.fail(format!(
                    "axes {axes:?} must be non-empty, sorted and unique"
                ));
            }
            c.unique_axes(axes, out_rank)?;
            let mut rest = xt.shape.iter();
            let shape = (0..out_rank)
                .map(|i| {
                    if axes.contains(&i) {
                        1
                    } else {
                        *rest.next().expect("counted")
                    }
                })
                .collect();
            tensor(xt.dtype, shape)
        }
        Op::Squeeze { x, axes } => {
            let xt = c.tensor(*x, arg::X)?;
            if axes.is_empty() || axes.windows(2).any(|w| w[0] >= w[1]) {
                return c.fail(format!(
                    "axes {axes:?} must be non-empty, sorted and unique"
                ));
            }
            c.unique_axes(axes, xt.rank())?;
            if let Some(a) = axes.iter().find(|&&a| xt.shape[a] != 1) {
                return c.fail(format!("axis {a} of {xt} is not of size 1"));
            }
            let shape = xt
                .shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, &d)| d)
                .collect();
            tensor(xt.dtype, shape)
        }
        Op::Cast { x, dtype } => {
            let xt = c.tensor(*x, arg::X)?;
            let castable =
                |d: DType| matches!(d, DType::F16 | DType::F32 | DType::I32 | DType::Bool);
            if !castable(xt.dtype) || !castable(*dtype) {
                return c.fail(format!(
                    "cast supports fp16/fp32/int32/bool, got {xt} -> {dtype}"
                ));
            }
            tensor(*dtype, xt.shape.clone())
        }
        Op::ConstexprBlockwiseShiftScale {
            data,
            scale,
            offset,
        } => infer_shift_scale(&c, data, scale, offset.as_ref())?,
        Op::ConstexprLutToDense { indices, lut } => infer_lut(&c, indices, lut)?,
    };
    Ok(vec![out])
}

fn infer_shift_scale(
    c: &Ctx,
    data: &TensorData,
    scale: &TensorData,
    offset: Option<&TensorData>,
) -> Result<ValueType> {
    let (dt, st) = (data.tensor_type(), scale.tensor_type());
    if !matches!(
        dt.dtype,
        DType::I4 | DType::U4 | DType::I8 | DType::U8 | DType::F16 | DType::F32
    ) {
        return c.fail(format!(
            "data must be int4/uint4/int8/uint8/fp16/fp32, got {dt}"
        ));
    }
    if !st.dtype.is_float() {
        return c.fail(format!("scale must be fp16/fp32, got {st}"));
    }
    if dt.rank() == 0 || dt.rank() != st.rank() {
        return c.fail(format!("data {dt} and scale {st} need the same rank >= 1"));
    }
    for i in 0..dt.rank() {
        if st.shape[i] == 0 || dt.shape[i] % st.shape[i] != 0 {
            return c.fail(format!(
                "axis {i}: data dim {} is not a multiple of scale dim {}",
                dt.shape[i], st.shape[i]
            ));
        }
    }
    if let Some(o) = offset {
        let ot = o.tensor_type();
        if ot.shape != st.shape {
            return c.fail(format!("offset {ot} must have the shape of scale {st}"));
        }
        if !ot.dtype.is_float() && ot.dtype != dt.dtype {
            return c.fail(format!(
                "offset {ot} must be float or of data's dtype {}",
                dt.dtype
            ));
        }
    }
    Ok(tensor(st.dtype, dt.shape.clone()))
}

fn infer_lut(c: &Ctx, indices: &TensorData, lut: &TensorData) -> Result<ValueType> {
    let (it, lt) = (indices.tensor_type(), lut.tensor_type());
    if !matches!(
        it.dtype,
        DType::U1 | DType::U2 | DType::U3 | DType::U4 | DType::U6 | DType::U8
    ) {
        return c.fail(format!("indices must be uint1/2/3/4/6/8, got {it}"));
    }
    if !lt.dtype.is_float() {
        return c.fail(format!("lut must be fp16/fp32, got {lt}"));
    }
    let r = it.rank();
    if r == 0 || lt.rank() != r + 2 {
        return c.fail(format!("lut {lt} must have rank of indices {it} + 2"));
    }
    for i in 0..r {
        if lt.shape[i] == 0 || it.shape[i] % lt.shape[i] != 0 {
            return c.fail(format!(
                "axis {i}: indices dim {} is not a multiple of lut dim {}",
                it.shape[i], lt.shape[i]
            ));
        }
    }
    if lt.shape[r] != 1 << it.dtype.bits() {
        return c.fail(format!(
            "lut {lt}: palette axis must hold 2^{} = {} entries",
            it.dtype.bits(),
            1 << it.dtype.bits()
        ));
    }
    if lt.shape[r + 1] != 1 {
        return c.fail(format!(
            "lut {lt}: vector palettes (last dim > 1) are not supported"
        ));
    }
    Ok(tensor(lt.dtype, it.shape.clone()))
}
