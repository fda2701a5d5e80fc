//! Protobuf codes shared by the reader and the writer: MIL and feature element types.

use crate::ir::types::DType;

/// The MIL `DataType` code of an element type.
pub(crate) fn proto_dtype(d: DType) -> i32 {
    use coreml_proto::proto::mil_spec::DataType as P;
    (match d {
        DType::F16 => P::Float16,
        DType::F32 => P::Float32,
        DType::I32 => P::Int32,
        DType::Bool => P::Bool,
        DType::I8 => P::Int8,
        DType::U8 => P::Uint8,
        DType::I4 => P::Int4,
        DType::U1 => P::Uint1,
        DType::U2 => P::Uint2,
        DType::U3 => P::Uint3,
        DType::U4 => P::Uint4,
        DType::U6 => P::Uint6,
    }) as i32
}

/// The element type of a MIL `DataType` code, if this crate supports it.
pub(crate) fn dtype_from_proto(code: i32) -> Option<DType> {
    DType::ALL.into_iter().find(|d| proto_dtype(*d) == code)
}

/// The `ArrayFeatureType` code of an input, output or state element type.
pub(crate) fn array_dtype(d: DType) -> i32 {
    use coreml_proto::proto::array_feature_type::ArrayDataType as A;
    (match d {
        DType::F16 => A::Float16,
        DType::F32 => A::Float32,
        DType::I32 => A::Int32,
        DType::I8 => A::Int8,
        _ => A::InvalidArrayDataType,
    }) as i32
}
