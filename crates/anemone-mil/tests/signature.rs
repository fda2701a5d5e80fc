//! The op signature table against the proto writer and reader: every op kind the writer emits
//! carries exactly the argument names of its signature and reads back unchanged, and the reader
//! refuses op types and argument names outside the table, naming the op and the key.

mod common;

use std::collections::{BTreeSet, HashMap};

use anemone_mil::{read_model_proto, write_model_proto, BlobFile, MilError, OpKind, Program};
use coreml_proto::proto::{mil_spec, model, Model};
use prost::Message;

fn programs() -> Vec<Program> {
    vec![
        common::every_op_program(),
        common::two_function_program(),
        common::conv_program(),
        common::constexpr_program(),
    ]
}

/// The written model proto and its weight blob, ready for the reader.
fn written(p: &Program) -> (Model, HashMap<String, BlobFile>) {
    let bytes = write_model_proto(p).unwrap();
    let blobs = HashMap::from([(
        "weight.bin".to_string(),
        BlobFile::parse("weight.bin", bytes.weights).unwrap(),
    )]);
    (Model::decode(bytes.model.as_slice()).unwrap(), blobs)
}

fn blocks_mut(m: &mut Model) -> impl Iterator<Item = &mut mil_spec::Block> {
    let Some(model::Type::MlProgram(prog)) = m.r#type.as_mut() else {
        panic!("not an ML program")
    };
    prog.functions
        .values_mut()
        .flat_map(|f| f.block_specializations.values_mut())
}

fn read(m: &Model, blobs: &HashMap<String, BlobFile>) -> Result<Program, MilError> {
    read_model_proto("model.mlmodel", &m.encode_to_vec(), blobs)
}

#[test]
fn every_op_kind_round_trips_through_the_table() {
    let mut covered = BTreeSet::new();
    for p in programs() {
        let (mut m, blobs) = written(&p);
        for block in blocks_mut(&mut m) {
            for op in &block.operations {
                let kind = OpKind::from_mil_type(&op.r#type)
                    .unwrap_or_else(|| panic!("writer emitted `{}`", op.r#type));
                covered.insert(kind.mil_type());
                let sig = kind.signature();
                for key in op.inputs.keys() {
                    assert!(
                        sig.input_slots().any(|s| s.name == key.as_str()),
                        "{}: input `{key}` is not in the signature",
                        op.r#type
                    );
                }
                let bound = |name: &str| match kind {
                    OpKind::Const => op.attributes.contains_key(name),
                    _ => op.inputs.contains_key(name),
                };
                for slot in sig.operands.iter().chain(sig.params).chain(sig.payloads) {
                    assert!(
                        !slot.is_required() || bound(slot.name),
                        "{}: required `{}` not written",
                        op.r#type,
                        slot.name
                    );
                }
                for param in sig.params {
                    assert!(
                        bound(param.name),
                        "{}: `{}` not written",
                        op.r#type,
                        param.name
                    );
                }
            }
        }
        assert_eq!(read(&m, &blobs).unwrap(), p);
    }
    let all: BTreeSet<&str> = OpKind::all().map(OpKind::mil_type).collect();
    assert_eq!(covered, all, "some op kind is in no test program");
}

/// The first written op of `mil_type`, in a copy of the written every-op program.
fn with_op(
    mil_type: &str,
    edit: impl FnOnce(&mut mil_spec::Operation),
) -> Result<Program, MilError> {
    let (mut m, blobs) = written(&common::every_op_program());
    let op = blocks_mut(&mut m)
        .flat_map(|b| b.operations.iter_mut())
        .find(|o| o.r#type == mil_type)
        .unwrap_or_else(|| panic!("no `{mil_type}` op written"));
    edit(op);
    read(&m, &blobs)
}

fn op_name(op: &mil_spec::Operation) -> String {
    op.outputs[0].name.clone()
}

#[test]
fn reader_rejects_an_unknown_op_type() {
    let mut name = String::new();
    let err = with_op("softmax", |op| {
        name = op_name(op);
        op.r#type = "frobnicate".into();
    })
    .unwrap_err();
    assert!(matches!(err, MilError::UnsupportedOp { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("frobnicate") && msg.contains(&format!("`{name}`")),
        "{msg}"
    );
}

#[test]
fn reader_rejects_an_unexpected_operand_key() {
    let mut name = String::new();
    let err = with_op("add", |op| {
        name = op_name(op);
        let y = op.inputs.remove("y").unwrap();
        op.inputs.insert("z".into(), y);
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("op `{name}` (add): unexpected input `z`")),
        "{msg}"
    );
}

#[test]
fn reader_rejects_a_missing_required_argument() {
    let mut name = String::new();
    let err = with_op("transpose", |op| {
        name = op_name(op);
        op.inputs.remove("perm").unwrap();
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("op `{name}` (transpose): missing input `perm`")),
        "{msg}"
    );
}
