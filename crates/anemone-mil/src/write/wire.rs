//! Write-side mirror of the subset of `CoreML.Specification` messages we emit. Same field
//! numbers as `coreml-proto`, but maps are `BTreeMap` so that writing is byte-deterministic
//! (prost encodes `HashMap`s in random iteration order). The reader uses `coreml-proto` itself,
//! and a test checks both agree.

use std::collections::BTreeMap;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Model {
    #[prost(int32, tag = "1")]
    pub specification_version: i32,
    #[prost(message, optional, tag = "2")]
    pub description: Option<ModelDescription>,
    #[prost(message, optional, tag = "502")]
    pub ml_program: Option<Program>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelDescription {
    #[prost(message, repeated, tag = "1")]
    pub input: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "10")]
    pub output: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "13")]
    pub state: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "20")]
    pub functions: Vec<FunctionDescription>,
    #[prost(string, tag = "21")]
    pub default_function_name: String,
    #[prost(message, optional, tag = "100")]
    pub metadata: Option<Metadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FunctionDescription {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub input: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "3")]
    pub output: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "6")]
    pub state: Vec<FeatureDescription>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    #[prost(btree_map = "string, string", tag = "100")]
    pub user_defined: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FeatureDescription {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "3")]
    pub r#type: Option<FeatureType>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FeatureType {
    #[prost(oneof = "feature_type::Type", tags = "5, 8")]
    pub r#type: Option<feature_type::Type>,
}

pub mod feature_type {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "5")]
        MultiArrayType(super::ArrayFeatureType),
        #[prost(message, tag = "8")]
        StateType(super::StateFeatureType),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ArrayFeatureType {
    #[prost(int64, repeated, tag = "1")]
    pub shape: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StateFeatureType {
    #[prost(message, optional, tag = "1")]
    pub array_type: Option<ArrayFeatureType>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Program {
    #[prost(int64, tag = "1")]
    pub version: i64,
    #[prost(btree_map = "string, message", tag = "2")]
    pub functions: BTreeMap<String, Function>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(message, repeated, tag = "1")]
    pub inputs: Vec<NamedValueType>,
    #[prost(string, tag = "2")]
    pub opset: String,
    #[prost(btree_map = "string, message", tag = "3")]
    pub block_specializations: BTreeMap<String, Block>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Block {
    #[prost(string, repeated, tag = "2")]
    pub outputs: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    pub operations: Vec<Operation>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Argument {
    #[prost(message, repeated, tag = "1")]
    pub arguments: Vec<Binding>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Binding {
    #[prost(oneof = "binding::Binding", tags = "1, 2")]
    pub binding: Option<binding::Binding>,
}

pub mod binding {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Binding {
        #[prost(string, tag = "1")]
        Name(String),
        #[prost(message, tag = "2")]
        Value(super::Value),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Operation {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(btree_map = "string, message", tag = "2")]
    pub inputs: BTreeMap<String, Argument>,
    #[prost(message, repeated, tag = "3")]
    pub outputs: Vec<NamedValueType>,
    #[prost(btree_map = "string, message", tag = "5")]
    pub attributes: BTreeMap<String, Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedValueType {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<ValueType>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(oneof = "value_type::Type", tags = "1, 5")]
    pub r#type: Option<value_type::Type>,
}

pub mod value_type {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "1")]
        TensorType(super::TensorType),
        #[prost(message, tag = "5")]
        StateType(Box<super::StateType>),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorType {
    #[prost(int32, tag = "1")]
    pub data_type: i32,
    #[prost(int64, tag = "2")]
    pub rank: i64,
    #[prost(message, repeated, tag = "3")]
    pub dimensions: Vec<Dimension>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StateType {
    #[prost(message, optional, boxed, tag = "1")]
    pub wrapped_type: Option<Box<ValueType>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    #[prost(message, optional, tag = "1")]
    pub constant: Option<ConstantDimension>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConstantDimension {
    #[prost(uint64, tag = "1")]
    pub size: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<ValueType>,
    #[prost(oneof = "value::Value", tags = "3, 5")]
    pub value: Option<value::Value>,
}

pub mod value {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImmediateValue {
        #[prost(message, optional, tag = "1")]
        pub tensor: Option<super::TensorValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BlobFileValue {
        #[prost(string, tag = "1")]
        pub file_name: String,
        #[prost(uint64, tag = "2")]
        pub offset: u64,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(message, tag = "3")]
        ImmediateValue(ImmediateValue),
        #[prost(message, tag = "5")]
        BlobFileValue(BlobFileValue),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorValue {
    #[prost(oneof = "tensor_value::Value", tags = "1, 2, 3, 4, 7")]
    pub value: Option<tensor_value::Value>,
}

pub mod tensor_value {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RepeatedFloats {
        #[prost(float, repeated, tag = "1")]
        pub values: Vec<f32>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RepeatedInts {
        #[prost(int32, repeated, tag = "1")]
        pub values: Vec<i32>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RepeatedBools {
        #[prost(bool, repeated, tag = "1")]
        pub values: Vec<bool>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RepeatedStrings {
        #[prost(string, repeated, tag = "1")]
        pub values: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RepeatedBytes {
        #[prost(bytes = "vec", tag = "1")]
        pub values: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(message, tag = "1")]
        Floats(RepeatedFloats),
        #[prost(message, tag = "2")]
        Ints(RepeatedInts),
        #[prost(message, tag = "3")]
        Bools(RepeatedBools),
        #[prost(message, tag = "4")]
        Strings(RepeatedStrings),
        #[prost(message, tag = "7")]
        Bytes(RepeatedBytes),
    }
}
