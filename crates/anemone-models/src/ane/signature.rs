//! Serializable descriptions of a package function's inputs, outputs and states (recorded in the
//! bundle manifest, so a runtime can bind values without reading the package).

use anemone_mil::DType;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One tensor a function takes, returns or keeps as state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSignature {
    pub name: String,
    /// MIL dtype name: `fp16`, `fp32`, `int32`.
    #[serde(serialize_with = "ser_dtype", deserialize_with = "de_dtype")]
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub description: String,
}

impl TensorSignature {
    pub fn new(name: &str, dtype: DType, shape: Vec<usize>, description: &str) -> Self {
        TensorSignature {
            name: name.to_string(),
            dtype,
            shape,
            description: description.to_string(),
        }
    }
}

/// One function of a package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionSignature {
    pub name: String,
    pub inputs: Vec<TensorSignature>,
    pub outputs: Vec<TensorSignature>,
    pub states: Vec<TensorSignature>,
}

impl FunctionSignature {
    /// The signature of a built function, with descriptions copied from `described` by name.
    pub fn of_function(f: &anemone_mil::Function, described: Option<&FunctionSignature>) -> Self {
        let describe = |name: &str| -> String {
            described
                .into_iter()
                .flat_map(|d| d.inputs.iter().chain(&d.outputs).chain(&d.states))
                .find(|s| s.name == name)
                .map(|s| s.description.clone())
                .unwrap_or_default()
        };
        let sig = |v: anemone_mil::Var| {
            let name = f.value_name(v);
            let t = f.tensor_type(v);
            TensorSignature::new(name, t.dtype, t.shape.clone(), &describe(name))
        };
        FunctionSignature {
            name: f.name().to_string(),
            inputs: f.tensor_inputs().map(sig).collect(),
            outputs: f.outputs().iter().map(|v| sig(*v)).collect(),
            states: f.state_inputs().map(sig).collect(),
        }
    }

    /// The signature of a function as its package's model proto declares it (no
    /// descriptions).
    pub fn of_interface(f: &anemone_mil::FunctionInterface) -> Self {
        let sig = |(name, ty): &(String, anemone_mil::ValueType)| {
            let t = ty.tensor();
            TensorSignature::new(name, t.dtype, t.shape.clone(), "")
        };
        FunctionSignature {
            name: f.name.clone(),
            inputs: f.tensor_inputs().map(sig).collect(),
            outputs: f.outputs.iter().map(sig).collect(),
            states: f.state_inputs().map(sig).collect(),
        }
    }
}

fn ser_dtype<S: Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.mil_name())
}

fn de_dtype<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
    let name = String::deserialize(d)?;
    DType::from_mil_name(&name)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown dtype `{name}`")))
}
