//! GGUF metadata values and typed access to them.

use crate::error::{CheckpointError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One metadata value, as GGUF types it.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            // The shortest decimal that round-trips the f32 (1e-6, not 9.99999997e-7): what the
            // checkpoint's author wrote.
            Self::F32(v) => Some(v.to_string().parse().unwrap_or(v.into())),
            Self::F64(v) => Some(v),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F32(_) => "f32",
            Self::F64(_) => "f64",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
        }
    }
}

/// The metadata of one GGUF file, with typed getters whose errors name the file and the key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    pub path: PathBuf,
    pub entries: BTreeMap<String, MetaValue>,
}

impl Metadata {
    pub fn new(path: &Path, entries: BTreeMap<String, MetaValue>) -> Self {
        Self {
            path: path.to_path_buf(),
            entries,
        }
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.entries.get(key)
    }

    pub fn bad(&self, key: &str, problem: impl Into<String>) -> CheckpointError {
        CheckpointError::BadField {
            path: self.path.clone(),
            field: key.to_string(),
            problem: problem.into(),
        }
    }

    fn wrong_type(&self, key: &str, want: &str, found: &MetaValue) -> CheckpointError {
        self.bad(key, format!("expected {want}, found {}", found.type_name()))
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.wrong_type(key, "a non-negative integer", v))
            })
            .transpose()
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.opt_u64(key)?
            .map(|v| usize::try_from(v).map_err(|_| self.bad(key, format!("{v} is too large"))))
            .transpose()
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.bad(key, "required key is missing"))
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.opt_u64(key)?
            .map(|v| u32::try_from(v).map_err(|_| self.bad(key, format!("{v} is too large"))))
            .transpose()
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| self.wrong_type(key, "a number", v))
            })
            .transpose()
    }

    pub fn f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?
            .ok_or_else(|| self.bad(key, "required key is missing"))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.wrong_type(key, "a string", v))
            })
            .transpose()
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.opt_str(key)?
            .ok_or_else(|| self.bad(key, "required key is missing"))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| self.wrong_type(key, "a bool", v)))
            .transpose()
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&[MetaValue]>> {
        self.get(key)
            .map(|v| {
                v.as_array()
                    .ok_or_else(|| self.wrong_type(key, "an array", v))
            })
            .transpose()
    }

    /// An array of strings (`tokenizer.ggml.tokens`, `.merges`).
    pub fn opt_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(items) = self.opt_array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().ok_or_else(|| {
                    self.bad(
                        key,
                        format!("element {i} is a {}, not a string", v.type_name()),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// An array of integers (`tokenizer.ggml.token_type`).
    pub fn opt_int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(items) = self.opt_array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match *v {
                MetaValue::I8(x) => Ok(x.into()),
                MetaValue::I16(x) => Ok(x.into()),
                MetaValue::I32(x) => Ok(x.into()),
                MetaValue::I64(x) => Ok(x),
                _ => v
                    .as_u64()
                    .and_then(|x| i64::try_from(x).ok())
                    .ok_or_else(|| {
                        self.bad(
                            key,
                            format!("element {i} is a {}, not an integer", v.type_name()),
                        )
                    }),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}
