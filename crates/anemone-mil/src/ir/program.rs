//! Programs, functions, operations and value handles.

use std::collections::BTreeMap;

use crate::error::{MilError, Result};
use crate::ir::op::Op;
use crate::ir::types::{SpecVersion, TensorType, ValueType};

/// A value handle, valid within the function that created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Var(pub(crate) u32);

impl Var {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Name and type of one value (function input or op output).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueInfo {
    pub name: String,
    pub ty: ValueType,
}

/// One op with its unique `name` attribute and its output values.
#[derive(Clone, Debug, PartialEq)]
pub struct Operation {
    pub name: String,
    pub op: Op,
    pub outputs: Vec<Var>,
}

/// A function: inputs (tensors and states), one block of ops in SSA order, outputs.
/// Built by [`crate::FunctionBuilder`], which checks types as ops are added.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub(crate) name: String,
    pub(crate) values: Vec<ValueInfo>,
    pub(crate) inputs: Vec<Var>,
    pub(crate) operations: Vec<Operation>,
    pub(crate) outputs: Vec<Var>,
}

impl Function {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Inputs in declaration order, tensors and states alike.
    pub fn inputs(&self) -> &[Var] {
        &self.inputs
    }

    /// Tensor (non-state) inputs in order.
    pub fn tensor_inputs(&self) -> impl Iterator<Item = Var> + '_ {
        self.inputs
            .iter()
            .copied()
            .filter(|v| !self.ty(*v).is_state())
    }

    /// State inputs in order.
    pub fn state_inputs(&self) -> impl Iterator<Item = Var> + '_ {
        self.inputs
            .iter()
            .copied()
            .filter(|v| self.ty(*v).is_state())
    }

    pub fn operations(&self) -> &[Operation] {
        &self.operations
    }

    pub fn outputs(&self) -> &[Var] {
        &self.outputs
    }

    /// Every value of the function, indexed by [`Var::index`].
    pub fn values(&self) -> &[ValueInfo] {
        &self.values
    }

    /// Panics if `v` does not belong to this function (a programming error, not bad input).
    pub fn value(&self, v: Var) -> &ValueInfo {
        &self.values[v.index()]
    }

    pub fn get_value(&self, v: Var) -> Option<&ValueInfo> {
        self.values.get(v.index())
    }

    pub fn ty(&self, v: Var) -> &ValueType {
        &self.value(v).ty
    }

    /// The tensor type of `v` (the wrapped type for a state).
    pub fn tensor_type(&self, v: Var) -> &TensorType {
        self.ty(v).tensor()
    }

    pub fn value_name(&self, v: Var) -> &str {
        &self.value(v).name
    }

    /// How many ops of each MIL type the function holds.
    pub fn op_counts(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for o in &self.operations {
            *counts.entry(o.op.mil_type()).or_insert(0) += 1;
        }
        counts
    }

    /// The op that defines `v`, if it is not a function input.
    pub fn producer(&self, v: Var) -> Option<&Operation> {
        self.operations.iter().find(|o| o.outputs.contains(&v))
    }

    /// Looks a value up by name.
    pub fn find_value(&self, name: &str) -> Option<Var> {
        self.values
            .iter()
            .position(|v| v.name == name)
            .map(|i| Var(i as u32))
    }
}

/// A whole ML program: spec version, named functions, the default function, metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub spec: SpecVersion,
    functions: Vec<Function>,
    default_function: Option<String>,
    /// Written to the model description's `userDefined` metadata.
    pub metadata: BTreeMap<String, String>,
}

impl Program {
    pub fn new(spec: SpecVersion) -> Self {
        Program {
            spec,
            functions: Vec::new(),
            default_function: None,
            metadata: BTreeMap::new(),
        }
    }

    /// Adds a function; names must be unique. The first function added is the default
    /// until [`Program::set_default_function`] says otherwise.
    pub fn add_function(&mut self, f: Function) -> Result<()> {
        if self.function(&f.name).is_some() {
            return Err(MilError::InvalidProgram {
                detail: format!("function `{}` defined twice", f.name),
            });
        }
        if self.default_function.is_none() {
            self.default_function = Some(f.name.clone());
        }
        self.functions.push(f);
        Ok(())
    }

    pub fn set_default_function(&mut self, name: &str) -> Result<()> {
        if self.function(name).is_none() {
            return Err(MilError::InvalidProgram {
                detail: format!("default function `{name}` is not defined"),
            });
        }
        self.default_function = Some(name.to_string());
        Ok(())
    }

    /// The default function's name (`main` for a program without functions).
    pub fn default_function_name(&self) -> &str {
        match (&self.default_function, self.functions.first()) {
            (Some(n), _) => n,
            (None, Some(f)) => &f.name,
            (None, None) => "main",
        }
    }

    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }
}
