//! The proto writer: `Program` → `CoreML.Specification.Model` bytes, with large consts
//! streamed to weight.bin. Argument names come from the op signature table.

use std::collections::BTreeMap;
use std::io::{Cursor, Seek, Write};

use crate::blob::{blob_dtype_code, BlobWriter};
use crate::error::Result;
use crate::ir::args::ParamValue;
use crate::ir::op::Op;
use crate::ir::program::{Function, Program, Var};
use crate::ir::signature::{arg, param_const_name, OpKind};
use crate::ir::tensor::TensorData;
use crate::ir::types::{DType, TensorType, ValueType};
use crate::proto::{array_dtype, proto_dtype};
use crate::valid::verify_program;

mod wire;

/// Consts with at least this many elements go to weight.bin (as coremltools does).
pub const BLOB_MIN_ELEMENTS: usize = 10;
/// The blob file name as referenced from the model.
pub const WEIGHT_FILE_REF: &str = "@model_path/weights/weight.bin";

/// A serialized model and its weight blob.
pub struct ModelBytes {
    /// `model.mlmodel` bytes.
    pub model: Vec<u8>,
    /// `weight.bin` bytes.
    pub weights: Vec<u8>,
    /// Distinct blobs in `weights`.
    pub blob_count: u32,
}

fn tensor_vt(t: &TensorType) -> wire::ValueType {
    wire::ValueType {
        r#type: Some(wire::value_type::Type::TensorType(wire::TensorType {
            data_type: proto_dtype(t.dtype),
            rank: t.rank() as i64,
            dimensions: t
                .shape
                .iter()
                .map(|&d| wire::Dimension {
                    constant: Some(wire::ConstantDimension { size: d as u64 }),
                })
                .collect(),
        })),
    }
}

fn string_vt() -> wire::ValueType {
    wire::ValueType {
        r#type: Some(wire::value_type::Type::TensorType(wire::TensorType {
            data_type: coreml_proto::proto::mil_spec::DataType::String as i32,
            rank: 0,
            dimensions: vec![],
        })),
    }
}

fn value_vt(t: &ValueType) -> wire::ValueType {
    match t {
        ValueType::Tensor(t) => tensor_vt(t),
        ValueType::State(t) => wire::ValueType {
            r#type: Some(wire::value_type::Type::StateType(Box::new(
                wire::StateType {
                    wrapped_type: Some(Box::new(tensor_vt(t))),
                },
            ))),
        },
    }
}

fn immediate(ty: wire::ValueType, v: wire::tensor_value::Value) -> wire::Value {
    wire::Value {
        r#type: Some(ty),
        value: Some(wire::value::Value::ImmediateValue(
            wire::value::ImmediateValue {
                tensor: Some(wire::TensorValue { value: Some(v) }),
            },
        )),
    }
}

fn string_value(s: &str) -> wire::Value {
    immediate(
        string_vt(),
        wire::tensor_value::Value::Strings(wire::tensor_value::RepeatedStrings {
            values: vec![s.to_string()],
        }),
    )
}

/// Whether a const goes to weight.bin (int32 and bool stay inline, like small consts).
pub(crate) fn goes_to_blob(t: &TensorData) -> bool {
    t.numel() >= BLOB_MIN_ELEMENTS
        && blob_dtype_code(t.dtype()).is_some()
        && t.dtype() != DType::I32
}

/// A const's value: a blob reference for large data, else inline.
fn data_value<W: Write + Seek>(t: &TensorData, blob: &mut BlobWriter<W>) -> Result<wire::Value> {
    if goes_to_blob(t) {
        let offset = blob.add(t)?;
        return Ok(wire::Value {
            r#type: Some(tensor_vt(t.tensor_type())),
            value: Some(wire::value::Value::BlobFileValue(
                wire::value::BlobFileValue {
                    file_name: WEIGHT_FILE_REF.to_string(),
                    offset,
                },
            )),
        });
    }
    inline_value(t)
}

/// An immediate value in the field coremltools uses for the dtype (fp16 and 8-bit-or-less
/// types as packed bytes, fp32 floats, int32 ints, bool bools).
fn inline_value(t: &TensorData) -> Result<wire::Value> {
    use wire::tensor_value::{
        RepeatedBools, RepeatedBytes, RepeatedFloats, RepeatedInts, Value as TV,
    };
    let ty = tensor_vt(t.tensor_type());
    let v = match t.dtype() {
        DType::F32 => TV::Floats(RepeatedFloats {
            values: t.to_f32_vec(),
        }),
        DType::I32 => TV::Ints(RepeatedInts {
            values: t.to_i32_vec()?,
        }),
        DType::Bool => TV::Bools(RepeatedBools {
            values: t.bytes().iter().map(|&b| b != 0).collect(),
        }),
        DType::F16
        | DType::I8
        | DType::U8
        | DType::I4
        | DType::U1
        | DType::U2
        | DType::U3
        | DType::U4
        | DType::U6 => TV::Bytes(RepeatedBytes {
            values: t.bytes().to_vec(),
        }),
    };
    Ok(immediate(ty, v))
}

fn param_value(p: &ParamValue, float_dtype: DType) -> Result<(wire::Value, wire::ValueType)> {
    let data = match p {
        ParamValue::I32(v) => TensorData::from_i32(vec![], &[*v])?,
        ParamValue::I32s(v) => TensorData::from_i32(vec![v.len()], v)?,
        ParamValue::Bool(b) => TensorData::from_bool(vec![], &[*b])?,
        ParamValue::Float(f) => match float_dtype {
            DType::F16 => TensorData::f16_from_f32(vec![], &[*f])?,
            _ => TensorData::from_f32(vec![], &[*f])?,
        },
        ParamValue::Str(s) => return Ok((string_value(s), string_vt())),
    };
    Ok((inline_value(&data)?, tensor_vt(data.tensor_type())))
}

fn name_binding(name: &str) -> wire::Binding {
    wire::Binding {
        binding: Some(wire::binding::Binding::Name(name.to_string())),
    }
}

fn value_binding(v: wire::Value) -> wire::Argument {
    wire::Argument {
        arguments: vec![wire::Binding {
            binding: Some(wire::binding::Binding::Value(v)),
        }],
    }
}

fn const_op(name: &str, val: wire::Value, ty: wire::ValueType) -> wire::Operation {
    wire::Operation {
        r#type: OpKind::Const.mil_type().into(),
        inputs: BTreeMap::new(),
        outputs: vec![wire::NamedValueType {
            name: name.to_string(),
            r#type: Some(ty),
        }],
        attributes: BTreeMap::from([
            ("name".to_string(), string_value(name)),
            (arg::VAL.to_string(), val),
        ]),
    }
}

fn write_function<W: Write + Seek>(
    p: &Program,
    f: &Function,
    blob: &mut BlobWriter<W>,
) -> Result<wire::Function> {
    let mut ops = Vec::with_capacity(f.operations().len() * 2);
    for operation in f.operations() {
        let op = &operation.op;
        let outputs: Vec<wire::NamedValueType> = operation
            .outputs
            .iter()
            .map(|&v| wire::NamedValueType {
                name: f.value_name(v).to_string(),
                r#type: Some(value_vt(f.ty(v))),
            })
            .collect();
        let mut attributes = BTreeMap::from([("name".to_string(), string_value(&operation.name))]);
        let mut inputs = BTreeMap::new();
        if let Op::Const { value } = op {
            // A const carries its value as an attribute, every other payload is an input.
            attributes.insert(arg::VAL.to_string(), data_value(value, blob)?);
        } else {
            for (key, data) in op.payload_args() {
                inputs.insert(key.to_string(), value_binding(data_value(data, blob)?));
            }
            let float_dtype = op
                .operands()
                .first()
                .map_or(DType::F32, |&x| f.tensor_type(x).dtype);
            for (key, param) in op.param_args() {
                let cname = param_const_name(&operation.name, key);
                let (val, ty) = param_value(&param, float_dtype)?;
                ops.push(const_op(&cname, val, ty));
                inputs.insert(
                    key.to_string(),
                    wire::Argument {
                        arguments: vec![name_binding(&cname)],
                    },
                );
            }
            for (key, vars) in op.operand_args() {
                let arguments = vars
                    .iter()
                    .map(|&v| name_binding(f.value_name(v)))
                    .collect();
                inputs.insert(key.to_string(), wire::Argument { arguments });
            }
        }
        ops.push(wire::Operation {
            r#type: op.mil_type().to_string(),
            inputs,
            outputs,
            attributes,
        });
    }
    let block = wire::Block {
        outputs: f
            .outputs()
            .iter()
            .map(|&v| f.value_name(v).to_string())
            .collect(),
        operations: ops,
    };
    Ok(wire::Function {
        inputs: f
            .inputs()
            .iter()
            .map(|&v| wire::NamedValueType {
                name: f.value_name(v).to_string(),
                r#type: Some(value_vt(f.ty(v))),
            })
            .collect(),
        opset: p.spec.opset().to_string(),
        block_specializations: BTreeMap::from([(p.spec.opset().to_string(), block)]),
    })
}

fn feature(name: &str, t: &ValueType) -> wire::FeatureDescription {
    let array = |t: &TensorType| wire::ArrayFeatureType {
        shape: t.shape.iter().map(|&d| d as i64).collect(),
        data_type: array_dtype(t.dtype),
    };
    let ty = match t {
        ValueType::Tensor(t) => wire::feature_type::Type::MultiArrayType(array(t)),
        ValueType::State(t) => wire::feature_type::Type::StateType(wire::StateFeatureType {
            array_type: Some(array(t)),
        }),
    };
    wire::FeatureDescription {
        name: name.to_string(),
        r#type: Some(wire::FeatureType { r#type: Some(ty) }),
    }
}

fn function_description(f: &Function) -> wire::FunctionDescription {
    let feats =
        |vs: &mut dyn Iterator<Item = Var>| vs.map(|v| feature(f.value_name(v), f.ty(v))).collect();
    wire::FunctionDescription {
        name: f.name().to_string(),
        input: feats(&mut f.tensor_inputs()),
        output: feats(&mut f.outputs().iter().copied()),
        state: feats(&mut f.state_inputs()),
    }
}

/// Whether the model description lists functions (anything but a single `main`).
pub(crate) fn uses_function_descriptions(p: &Program) -> bool {
    !(p.functions().len() == 1 && p.functions()[0].name() == "main")
}

/// Writes the model proto, streaming consts into `blob`. Verifies the program first.
pub(crate) fn write_model_with_blob<W: Write + Seek>(
    p: &Program,
    blob: &mut BlobWriter<W>,
) -> Result<Vec<u8>> {
    verify_program(p)?;
    let mut functions = BTreeMap::new();
    for f in p.functions() {
        functions.insert(f.name().to_string(), write_function(p, f, blob)?);
    }
    let mut description = wire::ModelDescription {
        metadata: (!p.metadata.is_empty()).then(|| wire::Metadata {
            user_defined: p.metadata.clone(),
        }),
        ..Default::default()
    };
    if uses_function_descriptions(p) {
        description.functions = p.functions().iter().map(function_description).collect();
        description.default_function_name = p.default_function_name().to_string();
    } else {
        let d = function_description(&p.functions()[0]);
        description.input = d.input;
        description.output = d.output;
        description.state = d.state;
    }
    let model = wire::Model {
        specification_version: p.spec.number(),
        description: Some(description),
        ml_program: Some(wire::Program {
            version: 1,
            functions,
        }),
    };
    Ok(prost::Message::encode_to_vec(&model))
}

/// Writes a program to `model.mlmodel` and `weight.bin` bytes in memory.
pub fn write_model_proto(p: &Program) -> Result<ModelBytes> {
    let mut blob = BlobWriter::new(Cursor::new(Vec::new()), "weight.bin")?;
    let model = write_model_with_blob(p, &mut blob)?;
    let blob_count = blob.count();
    let weights = blob.finish()?.into_inner();
    Ok(ModelBytes {
        model,
        weights,
        blob_count,
    })
}
