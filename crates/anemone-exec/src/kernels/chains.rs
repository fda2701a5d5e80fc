//! Two op chains of a decoder layer computed in one pass each, with the values of the unfused
//! ops bit for bit: every intermediate is rounded where its op's output would be
//! ([`Rounding`]), every operation is the generic op's scalar operation, and the one sum is
//! folded in the order [`super::norm::reduce`] folds it.
//!
//! - the max-scaled RMSNorm (`abs → reduce_max → maximum → real_div → square → reduce_mean →
//!   real_div → square → add → rsqrt → mul → mul`) over the `n` channels of `[n, T]` values,
//!   each of the `T` columns alone;
//! - RoPE (`split → mul → concat → mul → mul → add`) over `[rows, D, T]` values with `[D, T]`
//!   tables.

use anemone_backend::{round_f16, round_f16_in_place};

/// Which intermediate values of a chain are rounded to fp16 (one flag per op output, in chain
/// order: fp16 precision and an fp16 output type).
#[derive(Clone, Copy, Debug)]
pub struct Rounding<const N: usize>(pub [bool; N]);

impl<const N: usize> Rounding<N> {
    #[inline]
    fn at(&self, k: usize, v: f32) -> f32 {
        if self.0[k] {
            round_f16(v)
        } else {
            v
        }
    }

    /// Rounds a whole op output at once (F16C where the CPU has it; the same values).
    fn slice(&self, k: usize, values: &mut [f32]) {
        if self.0[k] {
            round_f16_in_place(values);
        }
    }
}

/// The scalar constants of the max-scaled RMSNorm.
#[derive(Clone, Copy, Debug)]
pub struct NormConstants {
    /// The `maximum` floor of the row's largest magnitude.
    pub floor: f32,
    /// The `real_div` numerator `sqrt(eps)`.
    pub sqrt_eps: f32,
    /// The `rsqrt` op's own epsilon.
    pub rsqrt_epsilon: f32,
}

/// `out = rms_norm_max_scaled(x) · weight` over the `n` channels of `x` viewed as `[n, t]`
/// (each of the `t` columns normalised alone; `weight` of `n`), rounding the twelve op outputs
/// as `round` says (index = op position in the chain). Each column's sum folds its channels in
/// order from the same start, as the generic reduce does.
pub fn rms_norm_max_scaled(
    x: &[f32],
    (weight, t): (&[f32], usize),
    c: NormConstants,
    round: Rounding<12>,
    out: &mut [f32],
) {
    if t == 1 {
        rms_norm_one_column(x, weight, c, round, out);
        return;
    }
    let r = |k: usize, v: f32| round.at(k, v);
    let n = weight.len();
    // abs (0) and reduce_max (1); rounding is monotonic, so the largest rounded magnitude is
    // the rounded largest one
    let mut scale = vec![f32::NEG_INFINITY; t];
    for row in x.chunks_exact(t) {
        scale
            .iter_mut()
            .zip(row)
            .for_each(|(m, v)| *m = m.max(v.abs()));
    }
    // maximum (2)
    scale
        .iter_mut()
        .for_each(|m| *m = r(2, f32::max(r(1, r(0, *m)), c.floor)));
    // real_div (3) into `out`; square (4) summed by reduce_mean (5)
    for (o_row, x_row) in out.chunks_exact_mut(t).zip(x.chunks_exact(t)) {
        let it = o_row.iter_mut().zip(x_row).zip(&scale);
        it.for_each(|((o, v), m)| *o = v / m);
    }
    round.slice(3, out);
    let mut squares: Vec<f32> = out.iter().map(|v| v * v).collect();
    round.slice(4, &mut squares);
    let mut inv_rms = vec![std::iter::empty::<f32>().sum::<f32>(); t];
    for row in squares.chunks_exact(t) {
        inv_rms.iter_mut().zip(row).for_each(|(s, v)| *s += v);
    }
    for (s, m) in inv_rms.iter_mut().zip(&scale) {
        let mean_sq = r(5, *s / n as f32);
        let eps_scaled = r(6, c.sqrt_eps / m);
        let eps_sq = r(7, eps_scaled * eps_scaled);
        let total = r(8, mean_sq + eps_sq);
        *s = r(9, 1.0 / (total + c.rsqrt_epsilon).sqrt());
    }
    for o_row in out.chunks_exact_mut(t) {
        o_row.iter_mut().zip(&inv_rms).for_each(|(o, i)| *o *= i);
    }
    round.slice(10, out);
    for (o_row, w) in out.chunks_exact_mut(t).zip(weight) {
        o_row.iter_mut().for_each(|o| *o *= w);
    }
    round.slice(11, out);
}

/// [`rms_norm_max_scaled`] of one column (`t = 1`, a decode step's hidden vector), with the
/// running maximum and sum in registers: the same values (the maximum of magnitudes does not
/// depend on the order it is taken in; the sum still folds the channels one by one, in order).
fn rms_norm_one_column(
    x: &[f32],
    weight: &[f32],
    c: NormConstants,
    round: Rounding<12>,
    out: &mut [f32],
) {
    let r = |k: usize, v: f32| round.at(k, v);
    let n = weight.len();
    // abs (0) and reduce_max (1) in eight lanes; `f32::max` skips a NaN wherever it stands
    let mut lanes = [f32::NEG_INFINITY; 8];
    let blocks = x.chunks_exact(8);
    let tail = blocks.remainder();
    for block in blocks {
        lanes
            .iter_mut()
            .zip(block)
            .for_each(|(m, v)| *m = m.max(v.abs()));
    }
    let largest = tail.iter().fold(
        lanes.into_iter().fold(f32::NEG_INFINITY, f32::max),
        |m, v| m.max(v.abs()),
    );
    // maximum (2), real_div (3)
    let scale = r(2, f32::max(r(1, r(0, largest)), c.floor));
    out.iter_mut().zip(x).for_each(|(o, v)| *o = v / scale);
    round.slice(3, out);
    // square (4) a block at a time, summed in channel order by reduce_mean (5)
    let mut sum = std::iter::empty::<f32>().sum::<f32>();
    let mut squares = [0.0f32; 64];
    for block in out.chunks(64) {
        let sq = &mut squares[..block.len()];
        sq.iter_mut().zip(block).for_each(|(s, v)| *s = v * v);
        round.slice(4, sq);
        for v in sq.iter() {
            sum += v;
        }
    }
    let mean_sq = r(5, sum / n as f32);
    let eps_scaled = r(6, c.sqrt_eps / scale);
    let eps_sq = r(7, eps_scaled * eps_scaled);
    let total = r(8, mean_sq + eps_sq);
    let inv_rms = r(9, 1.0 / (total + c.rsqrt_epsilon).sqrt());
    out.iter_mut().for_each(|o| *o *= inv_rms);
    round.slice(10, out);
    out.iter_mut().zip(weight).for_each(|(o, w)| *o *= w);
    round.slice(11, out);
}

/// The layout of a RoPE chain's operand: `rows` of `[d, t]` (the rotated axis `d` of even
/// length, positions `t` innermost); the tables are `[d, t]`.
#[derive(Clone, Copy, Debug)]
pub struct RopeShape {
    pub rows: usize,
    pub d: usize,
    pub t: usize,
}

/// `out = x·cos + rotate_half(x)·sin` with `rotate_half(x) = concat(x[d/2:]·neg, x[:d/2])`
/// along `d`; `round` flags the outputs of `mul neg` (0), `mul cos` (1), `mul sin` (2) and
/// `add` (3) (split and concat move values only). One row at a time: each op's output over
/// the row, then rounded.
pub fn rope(
    x: &[f32],
    (cos, sin): (&[f32], &[f32]),
    neg: f32,
    shape: RopeShape,
    round: Rounding<4>,
    out: &mut [f32],
) {
    let RopeShape { d, t, .. } = shape;
    let (row_len, half) = (d * t, d / 2 * t);
    let mut with_cos = vec![0.0f32; row_len];
    for (xr, or) in x.chunks_exact(row_len).zip(out.chunks_exact_mut(row_len)) {
        // rotate_half into `out`: the negated upper half (rounded), then the lower half
        or[..half]
            .iter_mut()
            .zip(&xr[half..])
            .for_each(|(o, v)| *o = v * neg);
        round.slice(0, &mut or[..half]);
        or[half..].copy_from_slice(&xr[..half]);
        with_cos
            .iter_mut()
            .zip(xr)
            .zip(cos)
            .for_each(|((a, v), c)| *a = v * c);
        round.slice(1, &mut with_cos);
        or.iter_mut().zip(sin).for_each(|(o, s)| *o *= s);
        round.slice(2, or);
        // IEEE addition is commutative: the add op's `a + b`
        or.iter_mut().zip(&with_cos).for_each(|(o, a)| *o += a);
        round.slice(3, or);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::elementwise::{self, Operand};
    use crate::kernels::{norm, shape, Accumulation};
    use anemone_mil::{BinaryOp, DType, ReduceOp, UnaryOp};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                round_f16(((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 7.0)
            })
            .collect()
    }

    fn round_all(round: bool, mut v: Vec<f32>) -> Vec<f32> {
        if round {
            v.iter_mut().for_each(|x| *x = round_f16(*x));
        }
        v
    }

    fn bin(
        kind: BinaryOp,
        x: (&[f32], &[usize]),
        y: (&[f32], &[usize]),
        out: &[usize],
    ) -> Vec<f32> {
        let x = Operand {
            data: x.0,
            shape: x.1,
        };
        let y = Operand {
            data: y.0,
            shape: y.1,
        };
        elementwise::binary(kind, DType::F32, x, y, out, None)
    }

    /// The twelve ops one by one through the generic kernels, on `[1, n, 1, t]` values.
    fn norm_unfused(x: &[f32], w: &[f32], c: NormConstants, round: bool) -> Vec<f32> {
        let n = w.len();
        let t = x.len() / n;
        let row = [1, n, 1, t];
        let one = [1, 1, 1, t];
        let weight = [1, n, 1, 1];
        let scalar = [1, 1, 1, 1];
        let unary = |kind, v: &[f32]| {
            let mut v = v.to_vec();
            elementwise::unary(kind, &mut v);
            round_all(round, v)
        };
        let red = |kind, v: &[f32]| {
            round_all(round, norm::reduce(kind, v, &row, &[1], Accumulation::F32))
        };
        let b = |kind, x: (&[f32], &[usize]), y: (&[f32], &[usize]), out: &[usize]| {
            round_all(round, bin(kind, x, y, out))
        };
        let (floor, sqrt_eps) = ([c.floor], [c.sqrt_eps]);
        let a = unary(UnaryOp::Abs, x);
        let m = red(ReduceOp::Max, &a);
        let m = b(BinaryOp::Maximum, (&m, &one), (&floor, &scalar), &one);
        let xs = b(BinaryOp::RealDiv, (x, &row), (&m, &one), &row);
        let sq = unary(UnaryOp::Square, &xs);
        let ms = red(ReduceOp::Mean, &sq);
        let e = b(BinaryOp::RealDiv, (&sqrt_eps, &scalar), (&m, &one), &one);
        let e2 = unary(UnaryOp::Square, &e);
        let s = b(BinaryOp::Add, (&ms, &one), (&e2, &one), &one);
        let mut inv = s.clone();
        elementwise::rsqrt(&mut inv, c.rsqrt_epsilon);
        let inv = round_all(round, inv);
        let y = b(BinaryOp::Mul, (&xs, &row), (&inv, &one), &row);
        b(BinaryOp::Mul, (&y, &row), (w, &weight), &row)
    }

    /// A decoder's norm constants as the graph builder writes them (fp16 floor and √eps).
    fn decoder_norm_constants() -> NormConstants {
        NormConstants {
            floor: round_f16(1e-3),
            sqrt_eps: round_f16(1e-5f32.sqrt()),
            rsqrt_epsilon: 0.0,
        }
    }

    #[test]
    fn the_fused_norm_is_the_twelve_ops_bit_for_bit() {
        let c = decoder_norm_constants();
        let cases = [
            (576, 1, true),
            (576, 1, false),
            (896, 1, true),
            (7, 1, false),
        ];
        for (n, t, round) in cases.into_iter().chain([(576, 64, true), (64, 5, false)]) {
            let x = values(n * t, n as u32);
            let w = values(n, 99);
            let mut got = vec![0.0; n * t];
            rms_norm_max_scaled(&x, (&w, t), c, Rounding([round; 12]), &mut got);
            let want = norm_unfused(&x, &w, c, round);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "n {n}, t {t}, fp16 rounding {round}"
            );
        }
    }

    /// A decode step's norm (one column, registers) gives each value the many-column pass
    /// gives that column, also over NaN, ±0, ±∞ and a length that is no multiple of 8.
    #[test]
    fn the_one_column_norm_is_a_column_of_the_general_one() {
        let c = decoder_norm_constants();
        let specials = [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, -7.5];
        for (n, special) in [(576, None), (77, Some(0)), (77, Some(1)), (9, Some(3))]
            .into_iter()
            .chain((0..specials.len()).map(|k| (130, Some(k))))
        {
            let mut x = values(n, n as u32 + 5);
            if let Some(k) = special {
                x[n / 3] = specials[k];
                x[n - 1] = specials[(k + 1) % specials.len()];
            }
            let w = values(n, 17);
            let other = values(n, 23);
            // `[n, 2]`: `x` as column 0, another vector as column 1
            let both: Vec<f32> = x.iter().zip(&other).flat_map(|(a, b)| [*a, *b]).collect();
            for round in [true, false] {
                let mut one = vec![0.0; n];
                rms_norm_max_scaled(&x, (&w, 1), c, Rounding([round; 12]), &mut one);
                let mut two = vec![0.0; 2 * n];
                rms_norm_max_scaled(&both, (&w, 2), c, Rounding([round; 12]), &mut two);
                let column: Vec<u32> = two.iter().step_by(2).map(|v| v.to_bits()).collect();
                let one: Vec<u32> = one.iter().map(|v| v.to_bits()).collect();
                assert_eq!(
                    one, column,
                    "n {n}, special {special:?}, fp16 rounding {round}"
                );
            }
        }
    }

    /// The six ops one by one through the generic kernels, on `[rows, 1, d, t]` values.
    fn rope_unfused(x: &[f32], cos: &[f32], sin: &[f32], s: RopeShape, round: bool) -> Vec<f32> {
        let xs = [s.rows, 1, s.d, s.t];
        let hs = [s.rows, 1, s.d / 2, s.t];
        let ts = [1, 1, s.d, s.t];
        let halves = shape::split(x, &xs, 2, &[s.d / 2, s.d / 2]);
        let neg = round_all(
            round,
            bin(BinaryOp::Mul, (&halves[1], &hs), (&[-1.0], &[1]), &hs),
        );
        let rot = shape::concat(&[(&neg, &hs), (&halves[0], &hs)], 2, &xs);
        let a = round_all(round, bin(BinaryOp::Mul, (x, &xs), (cos, &ts), &xs));
        let b = round_all(round, bin(BinaryOp::Mul, (&rot, &xs), (sin, &ts), &xs));
        round_all(round, bin(BinaryOp::Add, (&a, &xs), (&b, &xs), &xs))
    }

    #[test]
    fn the_fused_rope_is_the_six_ops_bit_for_bit() {
        for (rows, d, t, round) in [(9, 64, 1, true), (3, 64, 5, false), (2, 8, 3, true)] {
            let s = RopeShape { rows, d, t };
            let x = values(rows * d * t, 7);
            let cos = values(d * t, 11);
            let sin = values(d * t, 13);
            let mut got = vec![0.0; x.len()];
            rope(&x, (&cos, &sin), -1.0, s, Rounding([round; 4]), &mut got);
            let want = rope_unfused(&x, &cos, &sin, s, round);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{s:?}, fp16 rounding {round}");
        }
    }
}
