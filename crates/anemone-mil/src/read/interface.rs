//! A program's function interfaces (inputs, states, outputs: names and types) read from the
//! model proto alone: no weight file is opened and no op is built, so checking a package's
//! signature costs the proto's bytes, not its weights'.

use std::cell::RefCell;
use std::collections::HashMap;

use coreml_proto::proto as pb;
use pb::mil_spec as mil;
use prost::Message;

use super::FunctionReader;
use crate::builder::FunctionBuilder;
use crate::error::{MilError, Result};
use crate::ir::types::ValueType;

/// One function's interface as the proto declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionInterface {
    pub name: String,
    /// Inputs in declaration order, tensors and states alike.
    pub inputs: Vec<(String, ValueType)>,
    /// Outputs in order, with the types the ops producing them declare.
    pub outputs: Vec<(String, ValueType)>,
}

impl FunctionInterface {
    /// Tensor (non-state) inputs in order.
    pub fn tensor_inputs(&self) -> impl Iterator<Item = &(String, ValueType)> {
        self.inputs.iter().filter(|(_, t)| !t.is_state())
    }

    /// State inputs in order.
    pub fn state_inputs(&self) -> impl Iterator<Item = &(String, ValueType)> {
        self.inputs.iter().filter(|(_, t)| t.is_state())
    }
}

/// The interfaces of every function of `model.mlmodel` bytes, in the order
/// [`super::read_model_proto`] reads them. `file` names the model in errors.
pub fn read_model_interface(file: &str, model_bytes: &[u8]) -> Result<Vec<FunctionInterface>> {
    let bad = |detail: String| MilError::Model {
        file: file.to_string(),
        detail,
    };
    let model = pb::Model::decode(model_bytes)
        .map_err(|e| bad(format!("not a CoreML.Specification.Model: {e}")))?;
    let Some(pb::model::Type::MlProgram(prog)) = model.r#type.as_ref() else {
        return Err(bad("not an ML program".into()));
    };
    let desc = model.description.clone().unwrap_or_default();
    let order = super::function_order(&desc, prog);
    let (blobs, blob_cache) = (HashMap::new(), RefCell::new(HashMap::new()));
    order
        .iter()
        .map(|name| {
            let f = prog.functions.get(name).ok_or_else(|| {
                bad(format!(
                    "description names function `{name}` which the program lacks"
                ))
            })?;
            // the reader's type parsing, with nothing to read weights from
            let reader = FunctionReader {
                file,
                function: name.clone(),
                blobs: &blobs,
                blob_cache: &blob_cache,
                consts: HashMap::new(),
                strings: HashMap::new(),
                vars: HashMap::new(),
                b: FunctionBuilder::new(name),
            };
            interface(&reader, name, f)
        })
        .collect()
}

fn interface(
    reader: &FunctionReader<'_>,
    name: &str,
    f: &mil::Function,
) -> Result<FunctionInterface> {
    let block = f
        .block_specializations
        .get(&f.opset)
        .ok_or_else(|| reader.err(format!("opset `{}` has no block", f.opset)))?;
    let mut declared: HashMap<&str, Option<&mil::ValueType>> = HashMap::new();
    let mut inputs = Vec::with_capacity(f.inputs.len());
    for input in &f.inputs {
        let ty = reader.value_type(input.r#type.as_ref(), &format!("input `{}`", input.name))?;
        declared.insert(&input.name, input.r#type.as_ref());
        inputs.push((input.name.clone(), ty));
    }
    for op in &block.operations {
        for o in &op.outputs {
            declared.insert(&o.name, o.r#type.as_ref());
        }
    }
    let outputs = block
        .outputs
        .iter()
        .map(|out| {
            let vt = declared
                .get(out.as_str())
                .ok_or_else(|| reader.err(format!("block output `{out}` is not defined")))?;
            Ok((
                out.clone(),
                reader.value_type(*vt, &format!("output `{out}`"))?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(FunctionInterface {
        name: name.to_string(),
        inputs,
        outputs,
    })
}
