//! The proto reader: `CoreML.Specification.Model` bytes (+ weight blobs) → `Program`. Reads
//! what the writer writes, and simple coremltools-written programs using the same ops:
//! parameter consts are folded back into op parameters, negative axes normalized, `pad_type`
//! resolved. Every op type and argument name is checked against the op signature table: an
//! unknown op type, an unexpected argument or a missing required one is an error.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};

use coreml_proto::proto as pb;
use pb::mil_spec as mil;
use prost::Message;

mod interface;
mod ops;

pub use interface::{read_model_interface, FunctionInterface};

use crate::blob::BlobFile;
use crate::builder::FunctionBuilder;
use crate::error::{MilError, Result};
use crate::ir::op::Op;
use crate::ir::program::{Function, Program, Var};
use crate::ir::signature::{OpKind, Signature};
use crate::ir::tensor::TensorData;
use crate::ir::types::{DType, SpecVersion, TensorType, ValueType};
use crate::proto::dtype_from_proto;

struct FunctionReader<'a> {
    file: &'a str,
    function: String,
    blobs: &'a HashMap<String, BlobFile>,
    /// Blob tensors already read, by (file, offset): functions sharing a weight share its bytes.
    blob_cache: &'a RefCell<HashMap<(String, u64), TensorData>>,
    consts: HashMap<String, TensorData>,
    strings: HashMap<String, String>,
    vars: HashMap<String, Var>,
    b: FunctionBuilder,
}

impl<'a> FunctionReader<'a> {
    fn err(&self, detail: String) -> MilError {
        MilError::Model {
            file: self.file.to_string(),
            detail: format!("function `{}`: {detail}", self.function),
        }
    }

    fn tensor_type(&self, vt: Option<&mil::ValueType>, what: &str) -> Result<TensorType> {
        let Some(mil::value_type::Type::TensorType(t)) = vt.and_then(|v| v.r#type.as_ref()) else {
            return Err(self.err(format!("{what}: expected a tensor type")));
        };
        let dtype = dtype_from_proto(t.data_type)
            .ok_or_else(|| self.err(format!("{what}: unsupported data type {}", t.data_type)))?;
        let shape = t
            .dimensions
            .iter()
            .map(|d| match d.dimension {
                Some(mil::dimension::Dimension::Constant(c)) => Ok(c.size as usize),
                _ => Err(self.err(format!("{what}: dynamic dimensions are not supported"))),
            })
            .collect::<Result<Vec<_>>>()?;
        if t.rank != shape.len() as i64 {
            return Err(self.err(format!(
                "{what}: rank {} but {} dimensions",
                t.rank,
                shape.len()
            )));
        }
        let ty = TensorType::new(dtype, shape);
        if ty.checked_numel().is_none() {
            return Err(self.err(format!("{what}: {ty} has a zero-size or oversized shape")));
        }
        Ok(ty)
    }

    fn value_type(&self, vt: Option<&mil::ValueType>, what: &str) -> Result<ValueType> {
        match vt.and_then(|v| v.r#type.as_ref()) {
            Some(mil::value_type::Type::StateType(s)) => Ok(ValueType::State(
                self.tensor_type(s.wrapped_type.as_deref(), what)?,
            )),
            _ => Ok(ValueType::Tensor(self.tensor_type(vt, what)?)),
        }
    }

    /// A string value (pad_type, mode, dtype…).
    fn string_of(&self, v: &mil::Value, what: &str) -> Result<String> {
        use mil::tensor_value::Value as TV;
        match v.value.as_ref() {
            Some(mil::value::Value::ImmediateValue(mil::value::ImmediateValue {
                value:
                    Some(mil::value::immediate_value::Value::Tensor(mil::TensorValue {
                        value: Some(TV::Strings(s)),
                    })),
            })) if s.values.len() == 1 => Ok(s.values[0].clone()),
            _ => Err(self.err(format!("{what}: expected a string"))),
        }
    }

    fn tensor_of(&self, v: &mil::Value, what: &str) -> Result<TensorData> {
        use mil::tensor_value::Value as TV;
        let ty = self.tensor_type(v.r#type.as_ref(), what)?;
        let bad = |d: String| self.err(format!("{what}: {d}"));
        match v.value.as_ref() {
            Some(mil::value::Value::BlobFileValue(bf)) => {
                let name = bf.file_name.rsplit('/').next().unwrap_or_default();
                let blob = self
                    .blobs
                    .get(name)
                    .ok_or_else(|| bad(format!("blob file `{}` not found", bf.file_name)))?;
                let key = (name.to_string(), bf.offset);
                if let Some(t) = self.blob_cache.borrow().get(&key) {
                    if t.tensor_type() == &ty {
                        return Ok(t.clone());
                    }
                }
                let t = blob.tensor(bf.offset, ty.dtype, &ty.shape)?;
                self.blob_cache.borrow_mut().insert(key, t.clone());
                Ok(t)
            }
            Some(mil::value::Value::ImmediateValue(mil::value::ImmediateValue {
                value: Some(mil::value::immediate_value::Value::Tensor(t)),
            })) => {
                let n = ty.numel();
                let count = |len: usize| {
                    if len == n {
                        Ok(())
                    } else {
                        Err(bad(format!(
                            "{} holds {len} values, type {ty} needs {n}",
                            "immediate tensor"
                        )))
                    }
                };
                match (&t.value, ty.dtype) {
                    (Some(TV::Floats(f)), DType::F32) => {
                        count(f.values.len())?;
                        TensorData::from_f32(ty.shape, &f.values)
                    }
                    (Some(TV::Floats(f)), DType::F16) => {
                        count(f.values.len())?;
                        TensorData::f16_from_f32(ty.shape, &f.values)
                    }
                    (Some(TV::Ints(i)), DType::I32) => {
                        count(i.values.len())?;
                        TensorData::from_i32(ty.shape, &i.values)
                    }
                    (Some(TV::LongInts(i)), DType::I32) => {
                        count(i.values.len())?;
                        let v: Vec<i32> = i.values.iter().map(|&x| x as i32).collect();
                        TensorData::from_i32(ty.shape, &v)
                    }
                    (Some(TV::Ints(i)), d) if !d.is_float() && d != DType::Bool => {
                        count(i.values.len())?;
                        TensorData::pack_ints(d, ty.shape, &i.values)
                    }
                    (Some(TV::Bools(b)), DType::Bool) => {
                        count(b.values.len())?;
                        TensorData::from_bool(ty.shape, &b.values)
                    }
                    (Some(TV::Bytes(b)), d)
                        if d != DType::Bool && d != DType::I32 && d != DType::F32 =>
                    {
                        TensorData::from_bytes(d, ty.shape, b.values.clone())
                    }
                    _ => Err(bad(format!("unsupported immediate encoding for {ty}"))),
                }
                .map_err(|e| bad(e.to_string()))
            }
            _ => Err(bad("expected a tensor value".into())),
        }
    }

    /// The op kind of a proto op; an op type outside the table is an error naming the op.
    fn kind(&self, op: &mil::Operation) -> Result<OpKind> {
        OpKind::from_mil_type(&op.r#type).ok_or_else(|| MilError::UnsupportedOp {
            file: self.file.to_string(),
            function: self.function.clone(),
            op: op_name(op),
            op_type: format!("{} (not in the supported op set)", op.r#type),
        })
    }

    /// Checks an op's argument names against its signature: every input must be a known
    /// operand, parameter or payload, and every required one must be bound.
    fn check_arguments(&self, op: &mil::Operation, kind: OpKind, sig: &Signature) -> Result<()> {
        if let Some(key) = op
            .inputs
            .keys()
            .find(|k| !sig.input_slots().any(|s| s.name == k.as_str()))
        {
            return Err(self.err(format!(
                "op `{}` ({}): unexpected input `{key}`",
                op_name(op),
                op.r#type
            )));
        }
        // A const carries its payload as an attribute; every other argument is an input.
        let is_bound = |name: &str| {
            if kind == OpKind::Const {
                op.attributes.contains_key(name)
            } else {
                op.inputs.contains_key(name)
            }
        };
        let required = sig
            .operands
            .iter()
            .chain(sig.params)
            .chain(sig.payloads)
            .filter(|s| s.is_required());
        if let Some(missing) = required.into_iter().find(|s| !is_bound(s.name)) {
            return Err(self.err(format!(
                "op `{}` ({}): missing input `{}`",
                op_name(op),
                op.r#type,
                missing.name
            )));
        }
        Ok(())
    }

    /// A parameter: a bound value or the name of a const op.
    fn param(&self, op: &mil::Operation, key: &str) -> Result<Option<TensorData>> {
        debug_assert_in_signature(op, key);
        let Some(arg) = op.inputs.get(key) else {
            return Ok(None);
        };
        match arg.arguments.as_slice() {
            [mil::argument::Binding {
                binding: Some(mil::argument::binding::Binding::Name(n)),
            }] => self.consts.get(n).cloned().map(Some).ok_or_else(|| {
                self.err(format!(
                    "op `{}`: parameter `{key}` = `{n}` is not a const",
                    op_name(op)
                ))
            }),
            [mil::argument::Binding {
                binding: Some(mil::argument::binding::Binding::Value(v)),
            }] => self
                .tensor_of(v, &format!("op `{}` parameter `{key}`", op_name(op)))
                .map(Some),
            _ => Err(self.err(format!(
                "op `{}`: parameter `{key}` must bind one value",
                op_name(op)
            ))),
        }
    }

    fn param_string(&self, op: &mil::Operation, key: &str) -> Result<Option<String>> {
        debug_assert_in_signature(op, key);
        let Some(arg) = op.inputs.get(key) else {
            return Ok(None);
        };
        let what = format!("op `{}` parameter `{key}`", op_name(op));
        match arg.arguments.as_slice() {
            [mil::argument::Binding {
                binding: Some(mil::argument::binding::Binding::Value(v)),
            }] => self.string_of(v, &what).map(Some),
            [mil::argument::Binding {
                binding: Some(mil::argument::binding::Binding::Name(n)),
            }] => Ok(Some(self.strings.get(n).cloned().ok_or_else(|| {
                self.err(format!("{what}: `{n}` is not a string const"))
            })?)),
            _ => Err(self.err(format!("{what}: must bind one value"))),
        }
    }
}

/// Every argument the reader looks up must be in the op's signature.
fn debug_assert_in_signature(op: &mil::Operation, key: &str) {
    debug_assert!(
        OpKind::from_mil_type(&op.r#type)
            .is_some_and(|k| k.signature().input_slots().any(|s| s.name == key)),
        "the reader looks up `{key}` of `{}`, which its signature lacks",
        op.r#type
    );
}

/// The `&'static` type name of a proto op already checked against the table.
fn static_type(op: &mil::Operation) -> &'static str {
    OpKind::from_mil_type(&op.r#type).map_or("unsupported op", OpKind::mil_type)
}

fn op_name(op: &mil::Operation) -> String {
    use mil::tensor_value::Value as TV;
    op.attributes
        .get("name")
        .and_then(|v| match v.value.as_ref() {
            Some(mil::value::Value::ImmediateValue(mil::value::ImmediateValue {
                value:
                    Some(mil::value::immediate_value::Value::Tensor(mil::TensorValue {
                        value: Some(TV::Strings(s)),
                    })),
            })) => s.values.first().cloned(),
            _ => None,
        })
        .or_else(|| op.outputs.first().map(|o| o.name.clone()))
        .unwrap_or_else(|| op.r#type.clone())
}

fn normalize(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

fn read_function(
    file: &str,
    name: &str,
    f: &mil::Function,
    blobs: &HashMap<String, BlobFile>,
    blob_cache: &RefCell<HashMap<(String, u64), TensorData>>,
) -> Result<Function> {
    let block = f
        .block_specializations
        .get(&f.opset)
        .ok_or_else(|| MilError::Model {
            file: file.to_string(),
            detail: format!("function `{name}`: opset `{}` has no block", f.opset),
        })?;
    let mut d = FunctionReader {
        file,
        function: name.to_string(),
        blobs,
        blob_cache,
        consts: HashMap::new(),
        strings: HashMap::new(),
        vars: HashMap::new(),
        b: FunctionBuilder::new(name),
    };
    for input in &f.inputs {
        let v = match d.value_type(input.r#type.as_ref(), &format!("input `{}`", input.name))? {
            ValueType::Tensor(t) => d.b.input(&input.name, t)?,
            ValueType::State(t) => d.b.state(&input.name, t)?,
        };
        d.vars.insert(input.name.clone(), v);
    }
    // Values named as tensor operands (or block outputs) must stay as const ops; consts only
    // bound to parameters fold into their ops.
    let mut operand_uses: HashSet<&str> = block.outputs.iter().map(String::as_str).collect();
    let mut param_uses: HashSet<&str> = HashSet::new();
    let mut kinds = Vec::with_capacity(block.operations.len());
    for op in &block.operations {
        let kind = d.kind(op)?;
        let sig = kind.signature();
        d.check_arguments(op, kind, &sig)?;
        kinds.push(kind);
        for (key, arg) in &op.inputs {
            let uses = if sig.operand(key).is_some() {
                &mut operand_uses
            } else {
                &mut param_uses
            };
            for b in &arg.arguments {
                if let Some(mil::argument::binding::Binding::Name(n)) = &b.binding {
                    uses.insert(n);
                }
            }
        }
    }
    for (op, kind) in block.operations.iter().zip(kinds) {
        let name = op_name(op);
        let out_names: Vec<String> = op.outputs.iter().map(|o| o.name.clone()).collect();
        if kind == OpKind::Const {
            let val = d.const_val(op)?;
            let out = out_names
                .first()
                .ok_or_else(|| d.err(format!("const `{name}` has no output")))?;
            if let Ok(s) = d.string_of(val, "const") {
                d.strings.insert(out.clone(), s);
                continue;
            }
            let data = d.tensor_of(val, &format!("const `{name}`"))?;
            d.consts.insert(out.clone(), data.clone());
            if param_uses.contains(out.as_str()) && !operand_uses.contains(out.as_str()) {
                continue;
            }
            let vars =
                d.b.push_named(&name, Op::Const { value: data }, &out_names)?;
            d.vars.insert(out.clone(), vars[0]);
            continue;
        }
        let read = d.op(op, kind)?;
        let vars = d.b.push_named(&name, read, &out_names)?;
        for (n, v) in out_names.into_iter().zip(vars) {
            let declared = d.value_type(
                op.outputs
                    .iter()
                    .find(|o| o.name == n)
                    .and_then(|o| o.r#type.as_ref()),
                &format!("output `{n}` of op `{name}`"),
            )?;
            let inferred = d.b.ty(v).cloned();
            if inferred.as_ref() != Some(&declared) {
                return Err(MilError::TypeMismatch {
                    op: name.clone(),
                    op_type: kind.mil_type(),
                    detail: format!(
                        "output `{n}` declared {declared} but inferred {}",
                        inferred.map_or_else(|| "nothing".into(), |t| t.to_string())
                    ),
                });
            }
            d.vars.insert(n, v);
        }
    }
    for out in &block.outputs {
        let v = *d
            .vars
            .get(out)
            .ok_or_else(|| d.err(format!("block output `{out}` is not defined")))?;
        d.b.output(v)?;
    }
    d.b.finish()
}

/// The order functions are read in: as the model description lists them, then any others the
/// program holds, by name.
pub(super) fn function_order(desc: &pb::ModelDescription, prog: &mil::Program) -> Vec<String> {
    let mut order: Vec<String> = desc.functions.iter().map(|f| f.name.clone()).collect();
    let mut rest: Vec<&String> = prog
        .functions
        .keys()
        .filter(|k| !order.contains(k))
        .collect();
    rest.sort();
    order.extend(rest.into_iter().cloned());
    order
}

/// Reads `model.mlmodel` bytes into a program; `blobs` maps weight file names (e.g.
/// `weight.bin`) to parsed blob files. `file` names the model in errors.
pub fn read_model_proto(
    file: &str,
    model_bytes: &[u8],
    blobs: &HashMap<String, BlobFile>,
) -> Result<Program> {
    let bad = |detail: String| MilError::Model {
        file: file.to_string(),
        detail,
    };
    let model = pb::Model::decode(model_bytes)
        .map_err(|e| bad(format!("not a CoreML.Specification.Model: {e}")))?;
    let spec = SpecVersion::from_number(model.specification_version).ok_or_else(|| {
        bad(format!(
            "unsupported specificationVersion {}",
            model.specification_version
        ))
    })?;
    let Some(pb::model::Type::MlProgram(prog)) = model.r#type.as_ref() else {
        return Err(bad("not an ML program".into()));
    };
    let desc = model.description.clone().unwrap_or_default();
    let order = function_order(&desc, prog);
    let mut program = Program::new(spec);
    let blob_cache = RefCell::new(HashMap::new());
    for name in &order {
        let f = prog.functions.get(name).ok_or_else(|| {
            bad(format!(
                "description names function `{name}` which the program lacks"
            ))
        })?;
        let func = read_function(file, name, f, blobs, &blob_cache)?;
        program.add_function(func)?;
    }
    let default = if desc.default_function_name.is_empty() {
        "main"
    } else {
        &desc.default_function_name
    };
    if program.function(default).is_some() {
        program.set_default_function(default)?;
    }
    program.metadata = desc
        .metadata
        .map(|m| m.user_defined.into_iter().collect::<BTreeMap<_, _>>())
        .unwrap_or_default();
    Ok(program)
}
