//! RMSNorm in the three graph forms of [`NormForm`], over one axis of a BC1S-shaped value.

use anemone_mil::{FunctionBuilder, TensorData, Var};

use super::options::NormForm;
use super::AneError;

/// Smallest divisor the max-scaled form uses, so an all-zero row never divides by zero.
const MAX_SCALED_FLOOR: f32 = 1e-3;

/// `data` with a new shape of the same element count, sharing its bytes (so weight.bin holds
/// it once however it is viewed).
pub fn reshaped(data: &TensorData, shape: Vec<usize>) -> Result<TensorData, AneError> {
    Ok(TensorData::from_bytes(
        data.dtype(),
        shape,
        data.shared_bytes().clone(),
    )?)
}

/// `rms_norm(x) · weight` over `axis` of the rank-4 value `x`; `weight` is `[x.shape[axis]]`.
/// Op names start with `prefix`.
pub fn rms_norm(
    f: &mut FunctionBuilder,
    prefix: &str,
    x: Var,
    axis: usize,
    weight: &TensorData,
    eps: f32,
    form: NormForm,
) -> Result<Var, AneError> {
    let ty = f.tensor_type(x)?.clone();
    let dtype = ty.dtype;
    let n = ty.shape[axis];
    let mut bshape = vec![1usize; ty.rank()];
    bshape[axis] = n;
    let ax = axis as i64;
    match form {
        NormForm::Naive => {
            let sq = f.square(&format!("{prefix}_sq"), x)?;
            let ms = f.reduce_mean(&format!("{prefix}_mean_sq"), sq, &[ax], true)?;
            let inv = f.rsqrt(&format!("{prefix}_inv_rms"), ms, eps)?;
            let y = f.mul(&format!("{prefix}_normed"), x, inv)?;
            let w = f.constant(&format!("{prefix}_weight"), reshaped(weight, bshape)?)?;
            Ok(f.mul(prefix, y, w)?)
        }
        NormForm::LayernormTrick => {
            let minus_one = f.scalar(&format!("{prefix}_minus_one"), dtype, -1.0)?;
            let neg = f.mul(&format!("{prefix}_neg"), x, minus_one)?;
            let both = f.concat(&format!("{prefix}_pm"), &[x, neg], ax)?;
            // gamma over the doubled axis: [w, w]; only the first half is kept
            let mut doubled = weight.bytes().to_vec();
            doubled.extend_from_slice(weight.bytes());
            let gamma = f.constant(
                &format!("{prefix}_gamma"),
                TensorData::from_bytes(dtype, vec![2 * n], doubled)?,
            )?;
            let ln = f.layer_norm(&format!("{prefix}_ln"), both, &[ax], Some(gamma), None, eps)?;
            let mut begin = vec![0i64; ty.rank()];
            let mut end: Vec<i64> = ty.shape.iter().map(|&d| d as i64).collect();
            begin[axis] = 0;
            end[axis] = n as i64;
            Ok(f.slice_by_index(prefix, ln, &begin, &end, None)?)
        }
        NormForm::MaxScaled => {
            let a = f.abs(&format!("{prefix}_abs"), x)?;
            let m = f.reduce_max(&format!("{prefix}_max"), a, &[ax], true)?;
            let floor = f.scalar(&format!("{prefix}_floor"), dtype, MAX_SCALED_FLOOR)?;
            let m = f.maximum(&format!("{prefix}_scale"), m, floor)?;
            let xs = f.real_div(&format!("{prefix}_scaled"), x, m)?;
            let sq = f.square(&format!("{prefix}_sq"), xs)?;
            let ms = f.reduce_mean(&format!("{prefix}_mean_sq"), sq, &[ax], true)?;
            let sqrt_eps = f.scalar(&format!("{prefix}_sqrt_eps"), dtype, eps.sqrt())?;
            let e = f.real_div(&format!("{prefix}_eps_scaled"), sqrt_eps, m)?;
            let e2 = f.square(&format!("{prefix}_eps_sq"), e)?;
            let s = f.add(&format!("{prefix}_mean_sq_eps"), ms, e2)?;
            let inv = f.rsqrt(&format!("{prefix}_inv_rms"), s, 0.0)?;
            let y = f.mul(&format!("{prefix}_normed"), xs, inv)?;
            let w = f.constant(&format!("{prefix}_weight"), reshaped(weight, bshape)?)?;
            Ok(f.mul(prefix, y, w)?)
        }
    }
}
