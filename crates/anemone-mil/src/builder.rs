//! Building functions op by op, with types inferred and checked at every step.

use std::collections::HashSet;

use crate::error::{MilError, Result};
use crate::ir::identifier::is_valid_identifier;
use crate::ir::op::{BinaryOp, ConvParams, GeluMode, Op, ReduceOp, UnaryOp};
use crate::ir::program::{Function, Operation, ValueInfo, Var};
use crate::ir::signature::OpKind;
use crate::ir::tensor::TensorData;
use crate::ir::types::{DType, TensorType, ValueType};
use crate::valid::infer::{infer, OperandTypes};
use crate::valid::verify_function;

/// Builds one [`Function`]. Every method checks its operands and returns typed errors naming
/// the op; values are referred to by [`Var`] handles of this builder.
///
/// Names: every op name and value name must be a unique identifier within the function.
/// Single-output ops name their output after the op; `split` outputs are `{name}_{i}`.
pub struct FunctionBuilder {
    func: Function,
    names: HashSet<String>,
    constant: Vec<bool>,
}

impl OperandTypes for FunctionBuilder {
    fn operand_type(&self, v: Var) -> Option<&ValueType> {
        self.func.values.get(v.index()).map(|i| &i.ty)
    }
    fn is_constant(&self, v: Var) -> bool {
        self.constant.get(v.index()).copied().unwrap_or(false)
    }
    fn operand_name(&self, v: Var) -> String {
        self.func
            .values
            .get(v.index())
            .map_or_else(|| format!("#{}", v.0), |i| i.name.clone())
    }
}

fn normalize_axis(op: &str, op_type: &'static str, axis: i64, rank: usize) -> Result<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a >= rank as i64 {
        return Err(MilError::AxisOutOfRange {
            op: op.to_string(),
            op_type,
            axis,
            rank,
        });
    }
    Ok(a as usize)
}

impl FunctionBuilder {
    pub fn new(name: &str) -> Self {
        FunctionBuilder {
            func: Function {
                name: name.to_string(),
                values: Vec::new(),
                inputs: Vec::new(),
                operations: Vec::new(),
                outputs: Vec::new(),
            },
            names: HashSet::new(),
            constant: Vec::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.func.name
    }

    fn claim_name(&mut self, name: &str) -> Result<()> {
        if !is_valid_identifier(name) {
            return Err(MilError::InvalidName {
                name: name.to_string(),
            });
        }
        if !self.names.insert(name.to_string()) {
            return Err(MilError::DuplicateName {
                function: self.func.name.clone(),
                name: name.to_string(),
            });
        }
        Ok(())
    }

    /// Whether a name is already taken in this function.
    pub fn is_name_taken(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    fn new_value(&mut self, name: &str, ty: ValueType, constant: bool) -> Var {
        let v = Var(self.func.values.len() as u32);
        self.func.values.push(ValueInfo {
            name: name.to_string(),
            ty,
        });
        self.constant.push(constant);
        v
    }

    /// Declares a tensor input (fp16, fp32 or int32, static shape).
    pub fn input(&mut self, name: &str, ty: TensorType) -> Result<Var> {
        self.check_io_shape(name, &ty)?;
        if !ty.dtype.is_io_type() {
            return Err(MilError::InvalidFunction {
                function: self.func.name.clone(),
                detail: format!("input `{name}` has type {ty}; inputs must be fp16, fp32 or int32"),
            });
        }
        self.claim_name(name)?;
        let v = self.new_value(name, ValueType::Tensor(ty), false);
        self.func.inputs.push(v);
        Ok(v)
    }

    /// Declares a state input wrapping an fp16 tensor.
    pub fn state(&mut self, name: &str, ty: TensorType) -> Result<Var> {
        self.check_io_shape(name, &ty)?;
        if ty.dtype != DType::F16 {
            return Err(MilError::InvalidFunction {
                function: self.func.name.clone(),
                detail: format!("state `{name}` has type {ty}; states must be fp16"),
            });
        }
        self.claim_name(name)?;
        let v = self.new_value(name, ValueType::State(ty), false);
        self.func.inputs.push(v);
        Ok(v)
    }

    fn check_io_shape(&self, name: &str, ty: &TensorType) -> Result<()> {
        if ty.checked_numel().is_none() {
            return Err(MilError::InvalidFunction {
                function: self.func.name.clone(),
                detail: format!(
                    "input `{name}` has type {ty}; dims must be >= 1 and the size addressable"
                ),
            });
        }
        Ok(())
    }

    /// The type of a value of this function.
    pub fn ty(&self, v: Var) -> Option<&ValueType> {
        self.operand_type(v)
    }

    /// The tensor type of `v`, or an error if it is unknown or a state.
    pub fn tensor_type(&self, v: Var) -> Result<&TensorType> {
        match self.operand_type(v) {
            Some(ValueType::Tensor(t)) => Ok(t),
            Some(ValueType::State(t)) => Err(MilError::InvalidFunction {
                function: self.func.name.clone(),
                detail: format!(
                    "value `{}` is a state<{t}>, not a tensor",
                    self.operand_name(v)
                ),
            }),
            None => Err(MilError::InvalidFunction {
                function: self.func.name.clone(),
                detail: format!("value #{} is not defined in this function", v.0),
            }),
        }
    }

    /// The function built so far (e.g. for printing a partial graph).
    pub fn function(&self) -> &Function {
        &self.func
    }

    /// Adds any op, inferring its outputs; output names are derived from `name`.
    pub fn push(&mut self, name: &str, op: Op) -> Result<Vec<Var>> {
        let n_out = match &op {
            Op::WriteState { .. } => 0,
            Op::Split { split_sizes, .. } => split_sizes.len(),
            _ => 1,
        };
        let names: Vec<String> = match n_out {
            0 => vec![],
            1 => vec![name.to_string()],
            n => (0..n).map(|i| format!("{name}_{i}")).collect(),
        };
        self.push_named(name, op, &names)
    }

    /// Adds any op with explicit output value names (used by the proto reader).
    pub fn push_named(
        &mut self,
        name: &str,
        mut op: Op,
        output_names: &[String],
    ) -> Result<Vec<Var>> {
        self.canonicalize(&mut op);
        let types = infer(name, &op, self)?;
        if let Some(t) = types.iter().find(|t| t.tensor().checked_numel().is_none()) {
            return Err(MilError::TypeMismatch {
                op: name.to_string(),
                op_type: op.mil_type(),
                detail: format!("output type {t} has a zero-size or oversized shape"),
            });
        }
        if types.len() != output_names.len() {
            return Err(MilError::TypeMismatch {
                op: name.to_string(),
                op_type: op.mil_type(),
                detail: format!(
                    "op has {} outputs, {} names given",
                    types.len(),
                    output_names.len()
                ),
            });
        }
        // The op name and its first output share a name by convention; both must be fresh
        // otherwise, and no name may repeat.
        let mut claimed = HashSet::new();
        for n in std::iter::once(name).chain(output_names.iter().map(String::as_str)) {
            if claimed.insert(n) {
                self.claim_name(n)?;
            }
        }
        let constant = op.is_constant();
        let outputs: Vec<Var> = types
            .into_iter()
            .zip(output_names)
            .map(|(ty, n)| self.new_value(n, ty, constant))
            .collect();
        self.func.operations.push(Operation {
            name: name.to_string(),
            op,
            outputs: outputs.clone(),
        });
        Ok(outputs)
    }

    /// Float parameters are stored as written: rounded to fp16 when the op computes in fp16.
    fn canonicalize(&self, op: &mut Op) {
        if let Op::LayerNorm { x, epsilon, .. } | Op::Rsqrt { x, epsilon } = op {
            if matches!(self.operand_type(*x), Some(ValueType::Tensor(t)) if t.dtype == DType::F16)
            {
                *epsilon = half::f16::from_f32(*epsilon).to_f32();
            }
        }
    }

    fn push1(&mut self, name: &str, op: Op) -> Result<Var> {
        Ok(self.push(name, op)?[0])
    }

    fn axis(&self, name: &str, op_type: &'static str, x: Var, axis: i64) -> Result<usize> {
        let rank = self.tensor_type(x)?.rank();
        normalize_axis(name, op_type, axis, rank)
    }

    fn axes(
        &self,
        name: &str,
        op_type: &'static str,
        rank: usize,
        axes: &[i64],
    ) -> Result<Vec<usize>> {
        axes.iter()
            .map(|&a| normalize_axis(name, op_type, a, rank))
            .collect()
    }

    /// Marks `v` as a function output (order of calls = output order).
    pub fn output(&mut self, v: Var) -> Result<()> {
        if self.func.values.get(v.index()).is_none() {
            return Err(MilError::InvalidFunction {
                function: self.func.name.clone(),
                detail: format!("output value #{} is not defined", v.0),
            });
        }
        self.func.outputs.push(v);
        Ok(())
    }

    /// Finishes the function, running the verifier.
    pub fn finish(self) -> Result<Function> {
        verify_function(&self.func)?;
        Ok(self.func)
    }

    // ---- constants -------------------------------------------------------------------------

    pub fn constant(&mut self, name: &str, value: TensorData) -> Result<Var> {
        self.push1(name, Op::Const { value })
    }

    /// An fp16 constant rounded from f32 values.
    pub fn const_f16(&mut self, name: &str, shape: &[usize], values: &[f32]) -> Result<Var> {
        self.constant(name, TensorData::f16_from_f32(shape.to_vec(), values)?)
    }

    pub fn const_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> Result<Var> {
        self.constant(name, TensorData::from_f32(shape.to_vec(), values)?)
    }

    pub fn const_i32(&mut self, name: &str, shape: &[usize], values: &[i32]) -> Result<Var> {
        self.constant(name, TensorData::from_i32(shape.to_vec(), values)?)
    }

    /// A scalar constant of a float dtype (fp16 or fp32).
    pub fn scalar(&mut self, name: &str, dtype: DType, value: f32) -> Result<Var> {
        let data = match dtype {
            DType::F16 => TensorData::f16_from_f32(vec![], &[value])?,
            DType::F32 => TensorData::from_f32(vec![], &[value])?,
            DType::I32 => TensorData::from_i32(vec![], &[value as i32])?,
            other => {
                return Err(MilError::InvalidTensorData {
                    detail: format!("scalar `{name}`: unsupported dtype {other}"),
                })
            }
        };
        self.constant(name, data)
    }

    // ---- state -----------------------------------------------------------------------------

    pub fn read_state(&mut self, name: &str, state: Var) -> Result<Var> {
        self.push1(name, Op::ReadState { input: state })
    }

    pub fn write_state(&mut self, name: &str, state: Var, data: Var) -> Result<()> {
        self.push(name, Op::WriteState { input: state, data })
            .map(|_| ())
    }

    /// `x` with the window `[begin, end)` replaced by `update` (begin/end: int32 `[rank]`).
    pub fn slice_update(
        &mut self,
        name: &str,
        x: Var,
        update: Var,
        begin: Var,
        end: Var,
    ) -> Result<Var> {
        self.push1(
            name,
            Op::SliceUpdate {
                x,
                update,
                begin,
                end,
            },
        )
    }

    // ---- linear algebra --------------------------------------------------------------------

    pub fn conv(
        &mut self,
        name: &str,
        x: Var,
        weight: Var,
        bias: Option<Var>,
        params: ConvParams,
    ) -> Result<Var> {
        self.push1(
            name,
            Op::Conv {
                x,
                weight,
                bias,
                params,
            },
        )
    }

    /// A 1×1 convolution with default parameters (the ANE's projection).
    pub fn conv1x1(&mut self, name: &str, x: Var, weight: Var, bias: Option<Var>) -> Result<Var> {
        self.conv(name, x, weight, bias, ConvParams::default())
    }

    pub fn matmul(
        &mut self,
        name: &str,
        x: Var,
        y: Var,
        transpose_x: bool,
        transpose_y: bool,
    ) -> Result<Var> {
        self.push1(
            name,
            Op::Matmul {
                x,
                y,
                transpose_x,
                transpose_y,
            },
        )
    }

    pub fn linear(&mut self, name: &str, x: Var, weight: Var, bias: Option<Var>) -> Result<Var> {
        self.push1(name, Op::Linear { x, weight, bias })
    }

    // ---- normalization and activations -----------------------------------------------------

    pub fn softmax(&mut self, name: &str, x: Var, axis: i64) -> Result<Var> {
        let axis = self.axis(name, OpKind::Softmax.mil_type(), x, axis)?;
        self.push1(name, Op::Softmax { x, axis })
    }

    pub fn layer_norm(
        &mut self,
        name: &str,
        x: Var,
        axes: &[i64],
        gamma: Option<Var>,
        beta: Option<Var>,
        epsilon: f32,
    ) -> Result<Var> {
        let rank = self.tensor_type(x)?.rank();
        let axes = self.axes(name, OpKind::LayerNorm.mil_type(), rank, axes)?;
        self.push1(
            name,
            Op::LayerNorm {
                x,
                axes,
                gamma,
                beta,
                epsilon,
            },
        )
    }

    pub fn reduce(
        &mut self,
        name: &str,
        kind: ReduceOp,
        x: Var,
        axes: &[i64],
        keep_dims: bool,
    ) -> Result<Var> {
        let rank = self.tensor_type(x)?.rank();
        let axes = self.axes(name, kind.mil_type(), rank, axes)?;
        self.push1(
            name,
            Op::Reduce {
                kind,
                x,
                axes,
                keep_dims,
            },
        )
    }

    pub fn reduce_mean(
        &mut self,
        name: &str,
        x: Var,
        axes: &[i64],
        keep_dims: bool,
    ) -> Result<Var> {
        self.reduce(name, ReduceOp::Mean, x, axes, keep_dims)
    }

    pub fn reduce_max(&mut self, name: &str, x: Var, axes: &[i64], keep_dims: bool) -> Result<Var> {
        self.reduce(name, ReduceOp::Max, x, axes, keep_dims)
    }

    pub fn reduce_sum(&mut self, name: &str, x: Var, axes: &[i64], keep_dims: bool) -> Result<Var> {
        self.reduce(name, ReduceOp::Sum, x, axes, keep_dims)
    }

    pub fn unary(&mut self, name: &str, kind: UnaryOp, x: Var) -> Result<Var> {
        self.push1(name, Op::Unary { kind, x })
    }

    pub fn sqrt(&mut self, name: &str, x: Var) -> Result<Var> {
        self.unary(name, UnaryOp::Sqrt, x)
    }

    pub fn exp(&mut self, name: &str, x: Var) -> Result<Var> {
        self.unary(name, UnaryOp::Exp, x)
    }

    pub fn silu(&mut self, name: &str, x: Var) -> Result<Var> {
        self.unary(name, UnaryOp::Silu, x)
    }

    pub fn tanh(&mut self, name: &str, x: Var) -> Result<Var> {
        self.unary(name, UnaryOp::Tanh, x)
    }

    pub fn square(&mut self, name: &str, x: Var) -> Result<Var> {
        self.unary(name, UnaryOp::Square, x)
    }

    pub fn abs(&mut self, name: &str, x: Var) -> Result<Var> {
        self.unary(name, UnaryOp::Abs, x)
    }

    pub fn rsqrt(&mut self, name: &str, x: Var, epsilon: f32) -> Result<Var> {
        self.push1(name, Op::Rsqrt { x, epsilon })
    }

    pub fn gelu(&mut self, name: &str, x: Var, mode: GeluMode) -> Result<Var> {
        self.push1(name, Op::Gelu { x, mode })
    }

    // ---- elementwise binary ----------------------------------------------------------------

    pub fn binary(&mut self, name: &str, kind: BinaryOp, x: Var, y: Var) -> Result<Var> {
        self.push1(name, Op::Binary { kind, x, y })
    }

    pub fn add(&mut self, name: &str, x: Var, y: Var) -> Result<Var> {
        self.binary(name, BinaryOp::Add, x, y)
    }

    pub fn sub(&mut self, name: &str, x: Var, y: Var) -> Result<Var> {
        self.binary(name, BinaryOp::Sub, x, y)
    }

    pub fn mul(&mut self, name: &str, x: Var, y: Var) -> Result<Var> {
        self.binary(name, BinaryOp::Mul, x, y)
    }

    pub fn real_div(&mut self, name: &str, x: Var, y: Var) -> Result<Var> {
        self.binary(name, BinaryOp::RealDiv, x, y)
    }

    pub fn maximum(&mut self, name: &str, x: Var, y: Var) -> Result<Var> {
        self.binary(name, BinaryOp::Maximum, x, y)
    }

    pub fn minimum(&mut self, name: &str, x: Var, y: Var) -> Result<Var> {
        self.binary(name, BinaryOp::Minimum, x, y)
    }

    pub fn pow(&mut self, name: &str, x: Var, y: Var) -> Result<Var> {
        self.binary(name, BinaryOp::Pow, x, y)
    }

    // ---- shape ops -------------------------------------------------------------------------

    /// Static slice `x[begin:end:stride]` per axis; negative indices count from the end, and
    /// `end = i64::MAX` means "to the end". `stride` defaults to 1.
    pub fn slice_by_index(
        &mut self,
        name: &str,
        x: Var,
        begin: &[i64],
        end: &[i64],
        stride: Option<&[i64]>,
    ) -> Result<Var> {
        let shape = self.tensor_type(x)?.shape.clone();
        let bad = |detail: String| MilError::TypeMismatch {
            op: name.to_string(),
            op_type: OpKind::SliceByIndex.mil_type(),
            detail,
        };
        if begin.len() != shape.len()
            || end.len() != shape.len()
            || stride.is_some_and(|s| s.len() != shape.len())
        {
            return Err(bad(format!(
                "begin/end/stride need {} entries each",
                shape.len()
            )));
        }
        let resolve = |i: i64, d: usize| -> usize {
            let r = if i < 0 { i + d as i64 } else { i };
            r.clamp(0, d as i64) as usize
        };
        let mut b = Vec::new();
        let mut e = Vec::new();
        let mut s = Vec::new();
        for (i, &d) in shape.iter().enumerate() {
            b.push(resolve(begin[i], d));
            e.push(resolve(end[i], d));
            let st = stride.map_or(1, |s| s[i]);
            if st < 1 {
                return Err(bad(format!("axis {i}: stride {st} must be >= 1")));
            }
            s.push(st as usize);
        }
        self.push1(
            name,
            Op::SliceByIndex {
                x,
                begin: b,
                end: e,
                stride: s,
            },
        )
    }

    pub fn concat(&mut self, name: &str, values: &[Var], axis: i64) -> Result<Var> {
        let first = *values.first().ok_or_else(|| MilError::TypeMismatch {
            op: name.to_string(),
            op_type: OpKind::Concat.mil_type(),
            detail: "concat of no values".into(),
        })?;
        let axis = self.axis(name, OpKind::Concat.mil_type(), first, axis)?;
        self.push1(
            name,
            Op::Concat {
                values: values.to_vec(),
                axis,
            },
        )
    }

    /// Splits `x` along `axis` into pieces of the given sizes; outputs are `{name}_{i}`.
    pub fn split(
        &mut self,
        name: &str,
        x: Var,
        split_sizes: &[usize],
        axis: i64,
    ) -> Result<Vec<Var>> {
        let axis = self.axis(name, OpKind::Split.mil_type(), x, axis)?;
        self.push(
            name,
            Op::Split {
                x,
                split_sizes: split_sizes.to_vec(),
                axis,
            },
        )
    }

    /// Reshape; one entry may be -1 (inferred).
    pub fn reshape(&mut self, name: &str, x: Var, shape: &[i64]) -> Result<Var> {
        let numel = self.tensor_type(x)?.numel();
        let bad = |detail: String| MilError::TypeMismatch {
            op: name.to_string(),
            op_type: OpKind::Reshape.mil_type(),
            detail,
        };
        let known: i64 = shape
            .iter()
            .filter(|&&d| d != -1)
            .try_fold(1i64, |a, &d| a.checked_mul(d))
            .unwrap_or(0);
        let unknown = shape.iter().filter(|&&d| d == -1).count();
        if unknown > 1 || shape.iter().any(|&d| d == 0 || d < -1) || known <= 0 {
            return Err(bad(format!("target shape {shape:?} is invalid")));
        }
        let resolved: Vec<usize> = shape
            .iter()
            .map(|&d| {
                if d == -1 {
                    numel / known as usize
                } else {
                    d as usize
                }
            })
            .collect();
        self.push1(name, Op::Reshape { x, shape: resolved })
    }

    pub fn transpose(&mut self, name: &str, x: Var, perm: &[usize]) -> Result<Var> {
        self.push1(
            name,
            Op::Transpose {
                x,
                perm: perm.to_vec(),
            },
        )
    }

    pub fn expand_dims(&mut self, name: &str, x: Var, axes: &[i64]) -> Result<Var> {
        let rank = self.tensor_type(x)?.rank() + axes.len();
        let mut axes = self.axes(name, OpKind::ExpandDims.mil_type(), rank, axes)?;
        axes.sort_unstable();
        self.push1(name, Op::ExpandDims { x, axes })
    }

    pub fn squeeze(&mut self, name: &str, x: Var, axes: &[i64]) -> Result<Var> {
        let rank = self.tensor_type(x)?.rank();
        let mut axes = self.axes(name, OpKind::Squeeze.mil_type(), rank, axes)?;
        axes.sort_unstable();
        self.push1(name, Op::Squeeze { x, axes })
    }

    pub fn cast(&mut self, name: &str, x: Var, dtype: DType) -> Result<Var> {
        self.push1(name, Op::Cast { x, dtype })
    }

    // ---- compression -----------------------------------------------------------------------

    /// Dequantized weight `(data - offset) * scale`, scale/offset blockwise.
    pub fn constexpr_blockwise_shift_scale(
        &mut self,
        name: &str,
        data: TensorData,
        scale: TensorData,
        offset: Option<TensorData>,
    ) -> Result<Var> {
        self.push1(
            name,
            Op::ConstexprBlockwiseShiftScale {
                data,
                scale,
                offset,
            },
        )
    }

    /// Palettized weight `lut[groups…, indices]`.
    pub fn constexpr_lut_to_dense(
        &mut self,
        name: &str,
        indices: TensorData,
        lut: TensorData,
    ) -> Result<Var> {
        self.push1(name, Op::ConstexprLutToDense { indices, lut })
    }
}
