//! A readable, stable MIL text form (golden tests, `inspect`). Large consts print as dtype,
//! shape and a content hash; small ones print their values.

use std::fmt::Write;

use sha2::{Digest, Sha256};

use crate::encode::{op_operands, op_params, Param};
use crate::op::Op;
use crate::program::{Function, Program};
use crate::tensor::TensorData;
use crate::types::DType;

const INLINE_PRINT_MAX: usize = 16;

fn fmt_data(t: &TensorData) -> String {
    if t.numel() <= INLINE_PRINT_MAX {
        let vals: Vec<String> = match t.dtype() {
            DType::F16 | DType::F32 => t.to_f32_vec().iter().map(|v| format!("{v:?}")).collect(),
            DType::Bool => t.bytes().iter().map(|&b| (b != 0).to_string()).collect(),
            _ => t
                .to_i32_vec()
                .map(|v| v.iter().map(|x| x.to_string()).collect())
                .unwrap_or_default(),
        };
        format!("{}({})", t.tensor_type(), vals.join(", "))
    } else {
        let digest = Sha256::digest(t.bytes());
        format!("{}(sha256:{})", t.tensor_type(), &hex::encode(digest)[..16])
    }
}

fn fmt_param(p: &Param) -> String {
    match p {
        Param::I32(v) => v.to_string(),
        Param::I32s(v) => format!("{v:?}"),
        Param::Bool(b) => b.to_string(),
        Param::Str(s) => format!("{s:?}"),
        Param::Float(f) => format!("{f:?}"),
    }
}

/// One function as MIL text.
pub fn print_function(f: &Function) -> String {
    let mut s = String::new();
    let inputs: Vec<String> = f
        .inputs()
        .iter()
        .map(|&v| format!("{} {}", f.ty(v), f.value_name(v)))
        .collect();
    let _ = writeln!(s, "func {}({}) {{", f.name(), inputs.join(", "));
    for operation in f.operations() {
        let op = &operation.op;
        let mut args: Vec<String> = Vec::new();
        match op {
            Op::Const { value } => args.push(format!("val={}", fmt_data(value))),
            Op::ConstexprBlockwiseShiftScale {
                data,
                scale,
                offset,
            } => {
                args.push(format!("data={}", fmt_data(data)));
                args.push(format!("scale={}", fmt_data(scale)));
                if let Some(o) = offset {
                    args.push(format!("offset={}", fmt_data(o)));
                }
            }
            Op::ConstexprLutToDense { indices, lut } => {
                args.push(format!("indices={}", fmt_data(indices)));
                args.push(format!("lut={}", fmt_data(lut)));
            }
            _ => {
                for (key, vars) in op_operands(op) {
                    let names: Vec<&str> = vars.iter().map(|&v| f.value_name(v)).collect();
                    if key == "values" {
                        args.push(format!("{key}=({})", names.join(", ")));
                    } else {
                        args.push(format!("{key}={}", names.join(", ")));
                    }
                }
                for (key, p) in op_params(op) {
                    args.push(format!("{key}={}", fmt_param(&p)));
                }
            }
        }
        let outs: Vec<String> = operation
            .outputs
            .iter()
            .map(|&v| format!("{} {}", f.ty(v), f.value_name(v)))
            .collect();
        let lhs = match outs.len() {
            0 => String::new(),
            1 => format!("{} = ", outs[0]),
            _ => format!("({}) = ", outs.join(", ")),
        };
        let _ = writeln!(
            s,
            "    {lhs}{}({})[name = {:?}];",
            op.mil_type(),
            args.join(", "),
            operation.name
        );
    }
    let outs: Vec<&str> = f.outputs().iter().map(|&v| f.value_name(v)).collect();
    let _ = writeln!(s, "}} -> ({});", outs.join(", "));
    s
}

/// The whole program as MIL text.
pub fn print_program(p: &Program) -> String {
    let mut s = format!(
        "program(spec = {}, opset = {}, default = {})\n",
        p.spec.number(),
        p.spec.opset(),
        p.default_function_name()
    );
    for (k, v) in &p.metadata {
        let _ = writeln!(s, "metadata {k:?} = {v:?}");
    }
    for f in p.functions() {
        s.push('\n');
        s.push_str(&print_function(f));
    }
    s
}
