//! Running a prepared function: input/state checks, one exhaustive match over the op enum,
//! fp16 rounding of op outputs, buffer reuse for values used for the last time.

use std::borrow::Cow;
use std::collections::HashMap;

use anemone_backend::{is_f16_exact, round_f16_in_place, Tensor, MAX_EXACT_INT};
use anemone_mil::{DType, Op, Precision, Var};

use crate::decompress::{blockwise_shift_scale, const_tensor, lut_to_dense};
use crate::error::{ExecError, Result};
use crate::kernels::elementwise::Operand;
use crate::kernels::kv_elem::KvSlice;
use crate::kernels::{elementwise, fp16acc, gemm_f16, linalg, norm, shape, spread, Accumulation};
use crate::package::{Fused, LoadedPackage, PreparedFunction, State, Step};
use crate::state::StateTensor;

pub(crate) mod attend;
pub(crate) mod chains;
mod decode_attend;
mod operands;
mod prefill_attend;
mod projections;
mod window;

use window::{check_window, update_state_in_place};

enum Slot<'a> {
    Empty,
    Borrowed(&'a Tensor),
    Owned(Tensor),
    /// A state input, by name.
    State(&'a str),
    /// A value of a chain running in place on the named state: the state's tensor itself.
    Alias(&'a str),
    /// A window of the named state's data (a [`Fused::View`]), read only by matmuls.
    Window {
        state: &'a str,
        offset: usize,
        shape: &'a [usize],
    },
}

struct Frame<'a, 's> {
    f: &'a PreparedFunction,
    slots: Vec<Slot<'a>>,
    state: &'s mut State,
    precision: Precision,
    acc: Accumulation,
}

impl<'a> Frame<'a, '_> {
    fn name(&self, v: Var) -> &str {
        self.f
            .value_names
            .get(v.index())
            .map_or("?", String::as_str)
    }

    /// The value's tensor: borrowed, except a whole state held as fp16 (a chain value read
    /// by an op other than the fused ones), which is widened (a copy; exact).
    fn get(&self, v: Var) -> Result<Cow<'_, Tensor>, String> {
        match self.slots.get(v.index()) {
            Some(Slot::Borrowed(t)) => Ok(Cow::Borrowed(t)),
            Some(Slot::Owned(t)) => Ok(Cow::Borrowed(t)),
            Some(Slot::Alias(name)) => Ok(match self.held_state(name)? {
                StateTensor::F32(t) => Cow::Borrowed(t),
                held => Cow::Owned(held.to_tensor()),
            }),
            Some(Slot::Window { .. }) => Err(format!(
                "`{}` is a window of a state, read only by matmuls",
                self.name(v)
            )),
            Some(Slot::State(_)) => Err(format!(
                "state `{}` used as a tensor (read it with read_state)",
                self.name(v)
            )),
            Some(Slot::Empty) | None => {
                Err(format!("value `{}` is not available here", self.name(v)))
            }
        }
    }

    /// For a window of a state whose rows run along the state's last axis (rows of the same
    /// length at a row-aligned offset): the column from which on the window holds ±0 only
    /// ([`State::zero_from`]).
    fn zero_columns_from(&self, v: Var) -> Option<usize> {
        let Some(&Slot::Window {
            state,
            offset,
            shape,
        }) = self.slots.get(v.index())
        else {
            return None;
        };
        let held = self.state.held(state)?.shape().last().copied()?;
        let cols = *shape.last()?;
        (cols == held && cols > 0 && offset % cols == 0).then(|| self.state.zero_from(state))
    }

    /// The operand's tensor, taken over when this step is its last use, else copied.
    fn take(&mut self, v: Var, step: &Step) -> Result<Tensor, String> {
        if step.movable.contains(&v) {
            if let Some(slot @ Slot::Owned(_)) = self.slots.get_mut(v.index()) {
                if let Slot::Owned(t) = std::mem::replace(slot, Slot::Empty) {
                    return Ok(t);
                }
            }
        }
        self.get(v).map(Cow::into_owned)
    }

    /// Stores `data` as the value of `step`'s (first) output, checked against its declared
    /// type and rounded as the precision says (what the step itself would have stored).
    fn store_output(&mut self, step: &Step, data: Vec<f32>) -> Result<(), String> {
        let (Some(&v), Some(ty)) = (step.outputs.first(), step.out_types.first()) else {
            return Err(format!("`{}` declares no output", step.name));
        };
        let t = Tensor {
            dtype: ty.dtype,
            shape: ty.shape.clone(),
            data,
        };
        self.slots[v.index()] = Slot::Owned(finish_output(t, ty, self.precision)?);
        Ok(())
    }

    /// Makes the step's output the named state itself (a chain running in place).
    fn alias(&mut self, step: &'a Step, name: &'a str) {
        if let Some(v) = step.outputs.first() {
            self.slots[v.index()] = Slot::Alias(name);
        }
    }

    fn state_name(&self, v: Var) -> Result<&'a str, String> {
        match self.slots.get(v.index()) {
            Some(Slot::State(name)) => Ok(name),
            _ => Err(format!("`{}` is not a state input", self.name(v))),
        }
    }
}

/// One op's result as the executor stored it (after the precision's rounding), shown to an
/// observer passed to [`LoadedPackage::predict_observed`].
#[derive(Debug, Clone, Copy)]
pub struct OpOutput<'t> {
    /// The op's name in the program (e.g. `l5_q_proj`).
    pub op: &'t str,
    /// The MIL op type (e.g. `conv`).
    pub op_type: &'static str,
    /// The output value's name (an op with several outputs reports each).
    pub value: &'t str,
    pub tensor: &'t Tensor,
}

impl LoadedPackage {
    /// Runs `function` with named tensor inputs, reading and writing `state`; returns the
    /// function's outputs by name.
    pub fn predict(
        &self,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut State,
    ) -> Result<HashMap<String, Tensor>> {
        self.run(function, inputs, state, None)
    }

    /// Like [`LoadedPackage::predict`], showing every op output to `observer` in program order,
    /// as stored (fp16-rounded in fp16 mode). Fused in-place KV writes produce no value and are
    /// not shown.
    pub fn predict_observed(
        &self,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut State,
        observer: &mut dyn FnMut(OpOutput<'_>),
    ) -> Result<HashMap<String, Tensor>> {
        self.run(function, inputs, state, Some(observer))
    }

    fn run(
        &self,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut State,
        mut observer: Option<&mut dyn FnMut(OpOutput<'_>)>,
    ) -> Result<HashMap<String, Tensor>> {
        let f = self.function(function)?;
        f.prefetch_program();
        let mut slots: Vec<Slot> = (0..f.value_names.len()).map(|_| Slot::Empty).collect();
        self.bind_inputs(f, inputs, &mut slots)?;
        for (port, &v) in f.signature.states.iter().zip(&f.state_vars) {
            let bad = |detail: String| ExecError::StateMismatch {
                path: self.path.clone(),
                function: f.name.clone(),
                state: port.name.clone(),
                detail,
            };
            match state.held(&port.name) {
                None => return Err(bad(format!("absent from the state (declared {})", port.ty))),
                Some(t) if t.shape() != port.ty.shape || t.dtype() != port.ty.dtype => {
                    return Err(bad(format!("holds {t}, declared {}", port.ty)))
                }
                Some(_) => slots[v.index()] = Slot::State(&port.name),
            }
        }
        for (v, t) in &f.constants {
            slots[v.index()] = Slot::Borrowed(t);
        }
        let mut frame = Frame {
            f,
            slots,
            state,
            precision: self.precision,
            acc: self.accumulation,
        };
        let mut next = 0;
        let mut hidden_memo: attend::HiddenMemo = None;
        let mut stash = projections::Stash::default();
        while let Some(step) = f.steps.get(next) {
            let i = next;
            let op_err = |detail: String| ExecError::Op {
                path: self.path.clone(),
                function: f.name.clone(),
                op: step.name.clone(),
                op_type: step.op.mil_type(),
                detail,
            };
            // a decode step's heads as one kernel each, over the team; a prefill step's heads
            // side by side over the team, or one head's attention over the filled KV columns
            // only (an observer sees every op)
            if observer.is_none() {
                let steps = &f.steps[next..];
                let heads = &f.head_starts[next..];
                if let Some(n) = decode_attend::try_run(&mut frame, steps, heads).map_err(op_err)? {
                    hidden_memo = None;
                    next += n;
                    continue;
                }
                if let Some(n) =
                    prefill_attend::try_run(&mut frame, steps, heads).map_err(op_err)?
                {
                    hidden_memo = None;
                    next += n;
                    continue;
                }
                if let Some(n) = attend::try_run(&mut frame, steps, heads[0], &mut hidden_memo)
                    .map_err(op_err)?
                {
                    next += n;
                    continue;
                }
                if let Some(chain) = f.chain_starts[next] {
                    if let Some(n) = chains::try_run(&mut frame, steps, chain).map_err(op_err)? {
                        hidden_memo = None;
                        next += n;
                        continue;
                    }
                }
            }
            hidden_memo = None;
            next += 1;
            let outs = match &step.fused {
                // an observer sees every value, so views are materialised for it
                Fused::No | Fused::View { .. } if observer.is_some() => {
                    run_any(&mut frame, &f.steps, i, &mut stash).map_err(op_err)?
                }
                Fused::No => {
                    let outs = run_any(&mut frame, &f.steps, i, &mut stash).map_err(op_err)?;
                    if let (Some(next), Some(team)) = (f.warm_after[i], crate::team::current()) {
                        team.warm(next.bytes.start as *const u8, next.bytes.len);
                    }
                    outs
                }
                Fused::Elided => vec![],
                Fused::ReadsInPlace(name) => {
                    frame.alias(step, name);
                    vec![]
                }
                Fused::UpdatesState(name) => {
                    update_state_in_place(&mut frame, step, name).map_err(op_err)?;
                    frame.alias(step, name);
                    vec![]
                }
                Fused::View { state, offset } => {
                    if let (Some(v), Some(ty)) = (step.outputs.first(), step.out_types.first()) {
                        frame.slots[v.index()] = Slot::Window {
                            state,
                            offset: *offset,
                            shape: &ty.shape,
                        };
                    }
                    vec![]
                }
            };
            // data movement of fp16 values (already fp16 in fp16 mode) needs no rounding
            let precision = if moves_data_only(&step.op) {
                Precision::Fp32
            } else {
                frame.precision
            };
            for ((t, &v), ty) in outs.into_iter().zip(&step.outputs).zip(&step.out_types) {
                let t = finish_output(t, ty, precision).map_err(op_err)?;
                if let Some(observe) = observer.as_mut() {
                    observe(OpOutput {
                        op: &step.name,
                        op_type: step.op.mil_type(),
                        value: frame.name(v),
                        tensor: &t,
                    });
                }
                frame.slots[v.index()] = Slot::Owned(t);
            }
            for v in &step.release {
                frame.slots[v.index()] = Slot::Empty;
            }
        }
        let mut out = HashMap::new();
        for (port, &v) in f.signature.outputs.iter().zip(&f.output_vars) {
            let t = match std::mem::replace(&mut frame.slots[v.index()], Slot::Empty) {
                Slot::Owned(t) => t,
                Slot::Borrowed(t) => t.clone(),
                Slot::Alias(_) | Slot::Window { .. } | Slot::State(_) | Slot::Empty => {
                    return Err(ExecError::Op {
                        path: self.path.clone(),
                        function: f.name.clone(),
                        op: port.name.clone(),
                        op_type: "output",
                        detail: "the output value was never computed".into(),
                    })
                }
            };
            out.insert(port.name.clone(), t);
        }
        Ok(out)
    }

    fn bind_inputs<'a>(
        &self,
        f: &'a PreparedFunction,
        inputs: &'a HashMap<String, Tensor>,
        slots: &mut [Slot<'a>],
    ) -> Result<()> {
        if let Some(extra) = inputs
            .keys()
            .find(|k| !f.signature.inputs.iter().any(|p| &p.name == *k))
        {
            return Err(ExecError::UnexpectedInput {
                path: self.path.clone(),
                function: f.name.clone(),
                input: extra.clone(),
                declared: f
                    .signature
                    .inputs
                    .iter()
                    .map(|p| format!("{}: {}", p.name, p.ty))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        for (port, &v) in f.signature.inputs.iter().zip(&f.input_vars) {
            let mismatch = |detail: String| ExecError::InputMismatch {
                path: self.path.clone(),
                function: f.name.clone(),
                input: port.name.clone(),
                detail,
            };
            let t = inputs
                .get(&port.name)
                .ok_or_else(|| ExecError::MissingInput {
                    path: self.path.clone(),
                    function: f.name.clone(),
                    input: port.name.clone(),
                    expected: port.ty.to_string(),
                })?;
            if t.dtype != port.ty.dtype || t.shape != port.ty.shape {
                return Err(mismatch(format!("got {t}, declared {}", port.ty)));
            }
            if t.data.len() != port.ty.numel() {
                return Err(mismatch(format!(
                    "holds {} values for shape {:?}",
                    t.data.len(),
                    t.shape
                )));
            }
            slots[v.index()] = match t.dtype {
                DType::I32 => {
                    if let Some((i, x)) = t
                        .data
                        .iter()
                        .enumerate()
                        .find(|(_, x)| x.fract() != 0.0 || x.abs() > MAX_EXACT_INT)
                    {
                        return Err(mismatch(format!("element {i} = {x} is not an exact int32")));
                    }
                    Slot::Borrowed(t)
                }
                DType::F16 if self.precision == Precision::Fp16 && !is_f16_exact(&t.data) => {
                    let mut r = t.clone();
                    round_f16_in_place(&mut r.data);
                    Slot::Owned(r)
                }
                _ => Slot::Borrowed(t),
            };
        }
        Ok(())
    }
}

/// Ops whose outputs only rearrange operand values of the same dtype.
fn moves_data_only(op: &Op) -> bool {
    match op {
        Op::ReadState { .. }
        | Op::SliceUpdate { .. }
        | Op::SliceByIndex { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::ExpandDims { .. }
        | Op::Squeeze { .. } => true,
        Op::Const { .. }
        | Op::WriteState { .. }
        | Op::Conv { .. }
        | Op::Matmul { .. }
        | Op::Linear { .. }
        | Op::Softmax { .. }
        | Op::LayerNorm { .. }
        | Op::Reduce { .. }
        | Op::Unary { .. }
        | Op::Rsqrt { .. }
        | Op::Gelu { .. }
        | Op::Binary { .. }
        | Op::Cast { .. }
        | Op::ConstexprBlockwiseShiftScale { .. }
        | Op::ConstexprLutToDense { .. } => false,
    }
}

/// Checks an op result against its declared type and applies the precision's rounding.
fn finish_output(
    mut t: Tensor,
    ty: &anemone_mil::TensorType,
    precision: Precision,
) -> Result<Tensor, String> {
    if t.shape != ty.shape || t.data.len() != ty.numel() {
        return Err(format!(
            "produced shape {:?} ({} values), declared {ty}",
            t.shape,
            t.data.len()
        ));
    }
    t.dtype = ty.dtype;
    match ty.dtype {
        DType::F16 if precision == Precision::Fp16 => {
            spread::blocks(&mut t.data, &round_f16_in_place)
        }
        DType::I32 => {
            if let Some((i, v)) = t.data.iter().enumerate().find(|(_, v)| v.is_nan()) {
                return Err(format!(
                    "int32 element {i} = {v} overflows the exactly representable range ±2^24"
                ));
            }
        }
        _ => {}
    }
    Ok(t)
}

fn tensor(out: &anemone_mil::TensorType, data: Vec<f32>) -> Tensor {
    Tensor {
        dtype: out.dtype,
        shape: out.shape.clone(),
        data,
    }
}

/// Step `i` of `steps`: computed ahead with a group of projections, or by [`run_step`].
fn run_any(
    fr: &mut Frame,
    steps: &[Step],
    i: usize,
    stash: &mut projections::Stash,
) -> Result<Vec<Tensor>, String> {
    match projections::run(fr, steps, i, stash)? {
        Some(outs) => Ok(outs),
        None => run_step(fr, &steps[i]),
    }
}

/// Executes one op. Every op of the enum is handled here (constants included, though the
/// planner decodes those at load time and never schedules them).
fn run_step(fr: &mut Frame, step: &Step) -> Result<Vec<Tensor>, String> {
    let out_ty = step.out_types.first();
    let one = |data: Vec<f32>| -> Result<Vec<Tensor>, String> {
        let ty = out_ty.ok_or("op declares no output")?;
        Ok(vec![tensor(ty, data)])
    };
    match &step.op {
        Op::Const { value } => Ok(vec![const_tensor(value)?]),
        Op::ConstexprBlockwiseShiftScale {
            data,
            scale,
            offset,
        } => Ok(vec![blockwise_shift_scale(data, scale, offset.as_ref())?]),
        Op::ConstexprLutToDense { indices, lut } => Ok(vec![lut_to_dense(indices, lut)?]),
        Op::ReadState { input } => {
            let name = fr.state_name(*input)?;
            Ok(vec![fr.held_state(name)?.to_tensor()])
        }
        Op::WriteState { input, data } => {
            let name = fr.state_name(*input)?;
            let mut t = fr.take(*data, step)?;
            let held = fr.held_state(name)?;
            if t.shape != held.shape() {
                return Err(format!("writes {t} into state `{name}` of {held}"));
            }
            t.dtype = held.dtype();
            if fr.precision == Precision::Fp16 {
                round_f16_in_place(&mut t.data);
            }
            fr.state.replace(name.to_string(), t);
            Ok(vec![])
        }
        Op::SliceUpdate {
            x,
            update,
            begin,
            end,
        } => {
            let b = fr.get(*begin)?.to_i32_vec();
            let e = fr.get(*end)?.to_i32_vec();
            let mut xt = fr.take(*x, step)?;
            let u = fr.get(*update)?;
            let begin = check_window(&b, &e, &xt.shape, &u.shape)
                .map_err(|detail| format!("{detail} x {xt} with update {u}"))?;
            shape::slice_update(&mut xt.data, &xt.shape, &u.data, &u.shape, &begin);
            Ok(vec![xt])
        }
        Op::Conv {
            x,
            weight,
            bias,
            params,
        } => {
            let ty = out_ty.ok_or("conv declares no output")?;
            let xt = fr.get(*x)?;
            let bt = bias.map(|b| fr.get(b)).transpose()?;
            let bt = bt.as_deref();
            let single_token =
                xt.numel() == xt.shape[1] && params.strides == [1, 1] && params.pad == [0, 0, 0, 0];
            let mut data = vec![0.0f32; ty.numel()];
            match (fr.f.half_weights.get(weight), fr.weight(*weight)) {
                (Some(w16), _) if single_token => {
                    w16.matvec(&mut data, &xt.data, fr.acc)?;
                    if let Some(b) = bt {
                        data.iter_mut().zip(&b.data).for_each(|(v, b)| *v += b);
                    }
                }
                (_, Ok((w, w_shape))) => linalg::conv2d(
                    &mut data,
                    &xt.data,
                    &xt.shape,
                    w,
                    w_shape,
                    bt.map(|b| b.data.as_slice()),
                    params,
                    &ty.shape,
                    fr.acc,
                )?,
                (Some(w16), Err(_))
                    if fr.acc == Accumulation::F32
                        && gemm_f16::is_pointwise(&xt.shape, &w16.shape, params) =>
                {
                    w16.pointwise_conv(
                        &mut data,
                        &xt.data,
                        &xt.shape,
                        bt.map(|b| b.data.as_slice()),
                    )?
                }
                (Some(w16), Err(_)) => w16.with_widened(|w| {
                    linalg::conv2d(
                        &mut data,
                        &xt.data,
                        &xt.shape,
                        w,
                        &w16.shape,
                        bt.map(|b| b.data.as_slice()),
                        params,
                        &ty.shape,
                        fr.acc,
                    )
                })?,
                (None, Err(e)) => return Err(e),
            }
            one(data)
        }
        Op::Matmul {
            x,
            y,
            transpose_x,
            transpose_y,
        } => {
            let ty = out_ty.ok_or("matmul declares no output")?;
            let data = linalg::batched_matmul(
                fr.operand(*x)?.op(),
                fr.operand(*y)?.op(),
                *transpose_x,
                *transpose_y,
                &ty.shape,
                fr.acc,
            )?;
            one(data)
        }
        Op::Linear { x, weight, bias } => {
            let ty = out_ty.ok_or("linear declares no output")?;
            let xt = fr.get(*x)?;
            let half = fr.f.half_weights.get(weight);
            let (out_f, in_f) = match (half, fr.weight(*weight)) {
                (Some(w16), _) => (w16.shape[0], w16.shape[1]),
                (None, Ok((_, w_shape))) => (w_shape[0], w_shape[1]),
                (None, Err(e)) => return Err(e),
            };
            let rows = xt.numel() / in_f.max(1);
            let mut data = vec![0.0f32; rows * out_f];
            let acc = fr.acc;
            let gemm = |data: &mut [f32], w: &[f32]| {
                let xm = linalg::MatRef::row_major(&xt.data, rows, in_f);
                let wm = linalg::MatRef::row_major(w, out_f, in_f).transposed();
                match acc {
                    Accumulation::F32 => linalg::matmul_into(data, xm, wm, false),
                    Accumulation::Fp16Blocks => fp16acc::matmul_into(data, xm, wm),
                }
            };
            match (half, fr.weight(*weight)) {
                (Some(w16), _) if rows == 1 => w16.matvec(&mut data, &xt.data, acc)?,
                (_, Ok((w, _))) => gemm(&mut data, w)?,
                (Some(w16), Err(_)) => w16.with_widened(|w| gemm(&mut data, w))?,
                (None, Err(e)) => return Err(e),
            }
            if let Some(b) = bias {
                let bt = fr.get(*b)?;
                for row in data.chunks_mut(out_f.max(1)) {
                    row.iter_mut().zip(&bt.data).for_each(|(v, b)| *v += b);
                }
            }
            debug_assert_eq!(data.len(), ty.numel());
            one(data)
        }
        Op::Softmax { x, axis } => {
            let mut t = fr.take(*x, step)?;
            norm::softmax(&mut t.data, &t.shape, *axis, fr.acc);
            Ok(vec![t])
        }
        Op::LayerNorm {
            x,
            axes,
            gamma,
            beta,
            epsilon,
        } => {
            let mut t = fr.take(*x, step)?;
            let g = gamma.map(|g| fr.get(g)).transpose()?;
            let b = beta.map(|b| fr.get(b)).transpose()?;
            let (g, b) = (g.as_deref(), b.as_deref());
            norm::layer_norm(
                &mut t.data,
                &t.shape,
                axes,
                g.map(|g| g.data.as_slice()),
                b.map(|b| b.data.as_slice()),
                *epsilon,
                fr.acc,
            );
            Ok(vec![t])
        }
        Op::Reduce { kind, x, axes, .. } => {
            let t = fr.get(*x)?;
            one(norm::reduce(*kind, &t.data, &t.shape, axes, fr.acc))
        }
        Op::Unary { kind, x } => {
            let mut t = fr.take(*x, step)?;
            spread::blocks(&mut t.data, &|d| elementwise::unary(*kind, d));
            Ok(vec![t])
        }
        Op::Rsqrt { x, epsilon } => {
            let mut t = fr.take(*x, step)?;
            elementwise::rsqrt(&mut t.data, *epsilon);
            Ok(vec![t])
        }
        Op::Gelu { x, mode } => {
            let mut t = fr.take(*x, step)?;
            elementwise::gelu(*mode, &mut t.data);
            Ok(vec![t])
        }
        Op::Binary { kind, x, y } => {
            let ty = out_ty.ok_or("binary op declares no output")?;
            let reuse_x = step.movable.contains(x) && fr.get(*x)?.shape == ty.shape;
            let reuse = if reuse_x {
                Some(fr.take(*x, step)?)
            } else {
                None
            };
            let yt = fr.get(*y)?;
            let data = match reuse {
                // in place, over the team when large
                Some(mut xt) => {
                    let y = Operand {
                        data: &yt.data,
                        shape: &yt.shape,
                    };
                    spread::binary_in_place(*kind, ty.dtype, &mut xt.data, &ty.shape, y);
                    xt.data
                }
                None => {
                    let xt = fr.get(*x)?;
                    elementwise::binary(
                        *kind,
                        ty.dtype,
                        Operand {
                            data: &xt.data,
                            shape: &xt.shape,
                        },
                        Operand {
                            data: &yt.data,
                            shape: &yt.shape,
                        },
                        &ty.shape,
                        None,
                    )
                }
            };
            one(data)
        }
        Op::SliceByIndex {
            x, begin, stride, ..
        } => {
            let ty = out_ty.ok_or("slice_by_index declares no output")?;
            // a slice of a whole state held as fp16 widens only the slice
            let (data, shape) = fr.kv_operand(*x)?;
            one(match data {
                KvSlice::F32(d) => shape::slice_by_index(d, shape, begin, stride, &ty.shape),
                KvSlice::F16(d) => {
                    let h = shape::slice_by_index(d, shape, begin, stride, &ty.shape);
                    h.iter().map(|x| x.to_f32()).collect()
                }
            })
        }
        Op::Concat { values, axis } => {
            let ty = out_ty.ok_or("concat declares no output")?;
            let held = values
                .iter()
                .map(|v| fr.get(*v))
                .collect::<Result<Vec<_>, String>>()?;
            let parts: Vec<_> = held
                .iter()
                .map(|t| (t.data.as_slice(), t.shape.as_slice()))
                .collect();
            one(shape::concat(&parts, *axis, &ty.shape))
        }
        Op::Split {
            x,
            split_sizes,
            axis,
        } => {
            let t = fr.get(*x)?;
            let pieces = shape::split(&t.data, &t.shape, *axis, split_sizes);
            Ok(pieces
                .into_iter()
                .zip(&step.out_types)
                .map(|(d, ty)| tensor(ty, d))
                .collect())
        }
        Op::Reshape { x, .. } | Op::ExpandDims { x, .. } | Op::Squeeze { x, .. } => {
            let ty = out_ty.ok_or("reshape declares no output")?;
            let mut t = fr.take(*x, step)?;
            t.shape = ty.shape.clone();
            Ok(vec![t])
        }
        Op::Transpose { x, perm } => {
            let t = fr.get(*x)?;
            one(shape::transpose(&t.data, &t.shape, perm))
        }
        Op::Cast { x, dtype } => {
            let mut t = fr.take(*x, step)?;
            // fp32 mode rounds nothing, casts to fp16 included (so an fp32 bundle's fp16 KV
            // state holds f32 values and the graph can be checked exactly)
            if !(*dtype == DType::F16 && fr.precision == Precision::Fp32) {
                elementwise::cast(*dtype, &mut t.data);
            }
            t.dtype = *dtype;
            Ok(vec![t])
        }
    }
}
