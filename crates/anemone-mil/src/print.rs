//! A readable, stable MIL text form (golden tests, `inspect`). Large consts print as dtype,
//! shape and a content hash; small ones print their values.

use std::fmt::Write;

use sha2::{Digest, Sha256};

use crate::ir::args::ParamValue;
use crate::ir::program::{Function, Program};
use crate::ir::signature::Presence;
use crate::ir::tensor::TensorData;
use crate::ir::types::DType;

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

fn fmt_param(p: &ParamValue) -> String {
    match p {
        ParamValue::I32(v) => v.to_string(),
        ParamValue::I32s(v) => format!("{v:?}"),
        ParamValue::Bool(b) => b.to_string(),
        ParamValue::Str(s) => format!("{s:?}"),
        ParamValue::Float(f) => format!("{f:?}"),
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
        let sig = op.kind().signature();
        for (key, data) in op.payload_args() {
            args.push(format!("{key}={}", fmt_data(data)));
        }
        for (key, vars) in op.operand_args() {
            let names: Vec<&str> = vars.iter().map(|&v| f.value_name(v)).collect();
            let variadic = sig.operand(key).map(|s| s.presence) == Some(Presence::Variadic);
            if variadic {
                args.push(format!("{key}=({})", names.join(", ")));
            } else {
                args.push(format!("{key}={}", names.join(", ")));
            }
        }
        for (key, p) in op.param_args() {
            args.push(format!("{key}={}", fmt_param(&p)));
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
