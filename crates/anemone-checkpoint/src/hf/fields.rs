//! Typed access to the fields of a JSON object (`config.json` and its nested objects), with errors
//! naming file and field. Which fields mean what is each family's business
//! (`anemone_models::families`).

use crate::error::{CheckpointError, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// Typed access to the fields of one JSON object, with errors naming file and field.
pub struct JsonFields<'a> {
    pub path: &'a Path,
    pub object: &'a Map<String, Value>,
}

impl<'a> JsonFields<'a> {
    pub fn new(path: &'a Path, value: &'a Value) -> Result<Self> {
        let object = value.as_object().ok_or_else(|| CheckpointError::BadField {
            path: path.to_path_buf(),
            field: "(root)".into(),
            problem: "expected a JSON object".into(),
        })?;
        Ok(Self { path, object })
    }

    pub fn bad(&self, field: &str, problem: impl Into<String>) -> CheckpointError {
        CheckpointError::BadField {
            path: self.path.to_path_buf(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A feature the file asks for that anemone does not implement.
    pub fn unsupported(&self, field: &str, what: impl std::fmt::Display) -> CheckpointError {
        CheckpointError::Unsupported {
            path: self.path.to_path_buf(),
            what: format!("`{field}` = {what}"),
        }
    }

    /// The field's value, treating JSON `null` as absent.
    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.object.get(field).filter(|v| !v.is_null())
    }

    pub fn usize_opt(&self, field: &str) -> Result<Option<usize>> {
        self.get(field)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        self.bad(field, format!("expected a non-negative integer, found {v}"))
                    })
            })
            .transpose()
    }

    pub fn usize(&self, field: &str) -> Result<usize> {
        self.usize_opt(field)?
            .ok_or_else(|| self.bad(field, "missing"))
    }

    /// A required positive integer (a zero dimension would make an empty model).
    pub fn positive(&self, field: &str) -> Result<usize> {
        match self.usize(field)? {
            0 => Err(self.bad(field, "must be positive")),
            n => Ok(n),
        }
    }

    pub fn f64_opt(&self, field: &str) -> Result<Option<f64>> {
        self.get(field)
            .map(|v| {
                v.as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| self.bad(field, format!("expected a number, found {v}")))
            })
            .transpose()
    }

    pub fn bool_opt(&self, field: &str) -> Result<Option<bool>> {
        self.get(field)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.bad(field, format!("expected true or false, found {v}")))
            })
            .transpose()
    }

    pub fn str_opt(&self, field: &str) -> Result<Option<&'a str>> {
        self.get(field)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.bad(field, format!("expected a string, found {v}")))
            })
            .transpose()
    }

    pub fn token_id(&self, field: &str) -> Result<Option<u32>> {
        self.usize_opt(field)?
            .map(|n| u32::try_from(n).map_err(|_| self.bad(field, "token id out of range")))
            .transpose()
    }

    /// Token ids given as one integer or a list of integers (`eos_token_id`).
    pub fn token_ids(&self, field: &str) -> Result<Vec<u32>> {
        let to_id = |v: &Value| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.bad(field, format!("expected a token id, found {v}")))
        };
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(to_id).collect(),
            Some(v) => Ok(vec![to_id(v)?]),
        }
    }
}
