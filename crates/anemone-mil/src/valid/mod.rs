//! Validation: the verifier run before every write (SSA order, types, names, outputs, state
//! use, program structure) and the type and shape inference it shares with the builder. It
//! re-infers every op from scratch, so a hand-edited or read-back program is held to the same
//! rules as a built one.

use std::collections::{HashMap, HashSet};

use crate::error::{MilError, Result};
use crate::ir::identifier::is_valid_identifier;
use crate::ir::op::Op;
use crate::ir::program::{Function, Operation, Program, Var};
use crate::ir::signature::param_const_name;
use crate::ir::types::{DType, ValueType};

pub(crate) mod infer;

use infer::{infer, OperandTypes};

/// Names of the `const` ops the writer generates for an op's parameters.
fn param_const_names(operation: &Operation) -> impl Iterator<Item = String> + '_ {
    operation
        .op
        .kind()
        .signature()
        .params
        .iter()
        .map(|p| param_const_name(&operation.name, p.name))
}

struct Scope<'a> {
    func: &'a Function,
    defined: Vec<bool>,
    constant: Vec<bool>,
}

impl OperandTypes for Scope<'_> {
    fn operand_type(&self, v: Var) -> Option<&ValueType> {
        if *self.defined.get(v.index())? {
            Some(&self.func.values[v.index()].ty)
        } else {
            None
        }
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

fn invalid(f: &Function, detail: String) -> MilError {
    MilError::InvalidFunction {
        function: f.name.clone(),
        detail,
    }
}

/// Checks one function's SSA form, types, names, state use and outputs.
pub fn verify_function(f: &Function) -> Result<()> {
    if !is_valid_identifier(&f.name) {
        return Err(MilError::InvalidName {
            name: f.name.clone(),
        });
    }
    let n = f.values.len();
    let mut scope = Scope {
        func: f,
        defined: vec![false; n],
        constant: vec![false; n],
    };
    // Names the writer will give parameter consts, and the op each belongs to.
    let param_owner: HashMap<String, &str> = f
        .operations
        .iter()
        .flat_map(|o| param_const_names(o).map(move |n| (n, o.name.as_str())))
        .collect();
    let mut names: HashSet<String> = HashSet::new();
    let mut claim = |name: &str| -> Result<()> {
        if !is_valid_identifier(name) {
            return Err(MilError::InvalidName {
                name: name.to_string(),
            });
        }
        if !names.insert(name.to_string()) {
            if let Some(op) = param_owner.get(name) {
                return Err(invalid(
                    f,
                    format!(
                        "name `{name}` collides with the parameter const generated for op `{op}`"
                    ),
                ));
            }
            return Err(MilError::DuplicateName {
                function: f.name.clone(),
                name: name.to_string(),
            });
        }
        Ok(())
    };
    let define = |scope: &mut Scope, v: Var, what: &str| -> Result<()> {
        match scope.defined.get_mut(v.index()) {
            Some(d @ false) => {
                *d = true;
                Ok(())
            }
            Some(true) => Err(invalid(
                f,
                format!(
                    "{what}: value `{}` is defined twice",
                    f.values[v.index()].name
                ),
            )),
            None => Err(invalid(
                f,
                format!("{what}: value #{} has no entry in the value table", v.0),
            )),
        }
    };
    for &v in &f.inputs {
        define(&mut scope, v, "input")?;
        let info = &f.values[v.index()];
        if !info.ty.tensor().dtype.is_io_type() {
            return Err(invalid(
                f,
                format!(
                    "input `{}` has type {}; inputs must be fp16, fp32 or int32",
                    info.name, info.ty
                ),
            ));
        }
        if info.ty.is_state() && info.ty.tensor().dtype != DType::F16 {
            return Err(invalid(
                f,
                format!("state `{}` must wrap fp16, has {}", info.name, info.ty),
            ));
        }
        claim(&info.name)?;
    }
    for operation in &f.operations {
        let op_type = operation.op.mil_type();
        for v in operation.op.operands() {
            if scope.operand_type(v).is_none() {
                return Err(MilError::UndefinedValue {
                    function: f.name.clone(),
                    op: operation.name.clone(),
                    var: v.0,
                });
            }
            let is_state_op = matches!(operation.op, Op::ReadState { .. } | Op::WriteState { .. });
            if !is_state_op && f.values[v.index()].ty.is_state() {
                return Err(MilError::StateMisuse {
                    function: f.name.clone(),
                    state: f.values[v.index()].name.clone(),
                    op: operation.name.clone(),
                    op_type,
                });
            }
        }
        let inferred = infer(&operation.name, &operation.op, &scope)?;
        if inferred.len() != operation.outputs.len() {
            return Err(MilError::TypeMismatch {
                op: operation.name.clone(),
                op_type,
                detail: format!(
                    "declares {} outputs, infers {}",
                    operation.outputs.len(),
                    inferred.len()
                ),
            });
        }
        for (v, ty) in operation.outputs.iter().zip(&inferred) {
            let declared = f.values.get(v.index()).map(|i| &i.ty);
            if declared != Some(ty) {
                return Err(MilError::TypeMismatch {
                    op: operation.name.clone(),
                    op_type,
                    detail: format!(
                        "declared output type {} but inferred {ty}",
                        declared.map_or_else(|| "(missing)".to_string(), |t| t.to_string())
                    ),
                });
            }
        }
        // The op name may equal its first output's name (the usual convention).
        let first_out = operation
            .outputs
            .first()
            .map(|v| f.values[v.index()].name.as_str());
        if first_out != Some(operation.name.as_str()) {
            claim(&operation.name)?;
        }
        for &v in &operation.outputs {
            define(&mut scope, v, &operation.name)?;
            scope.constant[v.index()] = operation.op.is_constant();
            claim(&f.values[v.index()].name)?;
        }
        for p in param_const_names(operation) {
            claim(&p)?;
        }
    }
    if f.outputs.is_empty() {
        return Err(invalid(f, "a function needs at least one output".into()));
    }
    let mut seen = HashSet::new();
    for &v in &f.outputs {
        let Some(ty) = scope.operand_type(v) else {
            return Err(invalid(
                f,
                format!("output value #{} is never defined", v.0),
            ));
        };
        let name = &f.values[v.index()].name;
        match ty {
            ValueType::State(_) => return Err(invalid(f, format!("output `{name}` is a state"))),
            ValueType::Tensor(t) if !t.dtype.is_io_type() => {
                return Err(invalid(
                    f,
                    format!("output `{name}` has type {t}; outputs must be fp16, fp32 or int32"),
                ))
            }
            ValueType::Tensor(_) => {}
        }
        if f.inputs.contains(&v) {
            return Err(invalid(
                f,
                format!("output `{name}` is a function input; pass it through an op"),
            ));
        }
        if !seen.insert(v) {
            return Err(invalid(f, format!("output `{name}` listed twice")));
        }
    }
    Ok(())
}

/// Checks the whole program: every function, unique names, the default function, and the
/// features the spec version must support.
pub fn verify_program(p: &Program) -> Result<()> {
    if p.functions().is_empty() {
        return Err(MilError::InvalidProgram {
            detail: "program has no functions".into(),
        });
    }
    let mut names = HashSet::new();
    for f in p.functions() {
        if !names.insert(f.name()) {
            return Err(MilError::InvalidProgram {
                detail: format!("function `{}` defined twice", f.name()),
            });
        }
        verify_function(f)?;
        if !p.spec.supports_ios18_features() {
            if let Some(s) = f.state_inputs().next() {
                return Err(MilError::InvalidProgram {
                    detail: format!(
                        "function `{}` has state `{}`; states need spec version 9 or later (have {})",
                        f.name(),
                        f.value_name(s),
                        p.spec.number()
                    ),
                });
            }
            if let Some(o) = f.operations().iter().find(|o| {
                matches!(
                    o.op,
                    Op::ConstexprBlockwiseShiftScale { .. }
                        | Op::ConstexprLutToDense { .. }
                        | Op::ReadState { .. }
                        | Op::WriteState { .. }
                        | Op::SliceUpdate { .. }
                )
            }) {
                return Err(MilError::InvalidProgram {
                    detail: format!(
                        "function `{}` op `{}` ({}) needs spec version 9 or later (have {})",
                        f.name(),
                        o.name,
                        o.op.mil_type(),
                        p.spec.number()
                    ),
                });
            }
        }
    }
    if !p.spec.supports_ios18_features()
        && (p.functions().len() > 1 || p.functions()[0].name() != "main")
    {
        return Err(MilError::InvalidProgram {
            detail: format!(
                "before spec version 9 a program has exactly one function, named `main` (have {} with spec {})",
                p.functions().iter().map(|f| format!("`{}`", f.name())).collect::<Vec<_>>().join(", "),
                p.spec.number()
            ),
        });
    }
    if p.function(p.default_function_name()).is_none() {
        return Err(MilError::InvalidProgram {
            detail: format!(
                "default function `{}` is not defined",
                p.default_function_name()
            ),
        });
    }
    Ok(())
}
