//! The intermediate representation: element and tensor types, constant data, programs and
//! functions, the closed op enum, the op signature table and identifier rules. Everything else
//! in the crate builds, checks, reads, writes or prints this.

pub(crate) mod args;
pub(crate) mod bytes;
pub(crate) mod identifier;
pub(crate) mod op;
pub(crate) mod program;
pub(crate) mod signature;
pub(crate) mod tensor;
pub(crate) mod types;
