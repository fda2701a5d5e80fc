//! Rotary position embedding as graph ops, shared by the decoder and encoder builders.

use anemone_mil::{FunctionBuilder, Var};

use super::AneError;

/// RoPE tables in the graph (host inputs or constants), viewed for `[heads, 1, D, T]` values:
/// `cos` and `sin` broadcast over heads, each frequency repeated in both halves of `D`.
pub struct RopeTables {
    pub cos: Var,
    pub sin: Var,
    /// `D / 2`.
    pub half: usize,
}

impl RopeTables {
    /// `x·cos + rotate_half(x)·sin` with `rotate_half(x) = concat(−x[D/2:], x[:D/2])` along axis 2.
    pub fn apply(&self, f: &mut FunctionBuilder, prefix: &str, x: Var) -> Result<Var, AneError> {
        let dtype = f.tensor_type(x)?.dtype;
        let halves = f.split(&format!("{prefix}_halves"), x, &[self.half, self.half], 2)?;
        let minus_one = f.scalar(&format!("{prefix}_minus_one"), dtype, -1.0)?;
        let neg_hi = f.mul(&format!("{prefix}_neg_hi"), halves[1], minus_one)?;
        let rotated = f.concat(&format!("{prefix}_rot_half"), &[neg_hi, halves[0]], 2)?;
        let a = f.mul(&format!("{prefix}_cos"), x, self.cos)?;
        let b = f.mul(&format!("{prefix}_sin"), rotated, self.sin)?;
        Ok(f.add(prefix, a, b)?)
    }
}
