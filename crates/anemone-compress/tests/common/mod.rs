//! Deterministic test data and a naive reference decoder shared by the integration tests.
#![allow(dead_code)]

use anemone_compress::{Compressed, Payload};
use half::f16;

/// splitmix64: a fixed-seed generator, so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.uniform().max(1e-300);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    pub fn normals(&mut self, n: usize, std: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * std) as f32).collect()
    }
}

/// `n` values dequantized like a GGUF Q4_1 source with `block`-value blocks: `min + d·q`, q in
/// 0..15, fp16 `d` (in `[d_lo, d_lo + d_span)`) and `min` (ggml computes `d·q + m` in f32).
pub fn q4_1_like(rng: &mut Rng, n: usize, block: usize, d_lo: f64, d_span: f64) -> Vec<f32> {
    let mut w = Vec::with_capacity(n);
    while w.len() < n {
        let d = f16::from_f64(d_lo + d_span * rng.uniform()).to_f32();
        let m = f16::from_f64(-8.0 * d as f64 * (0.5 + rng.uniform())).to_f32();
        for _ in 0..block {
            let q = (rng.uniform() * 16.0).floor().min(15.0);
            w.push(d * q as f32 + m);
        }
    }
    w.truncate(n);
    w
}

/// Decodes a payload with `anemone_mil`'s own unpacker (independent of the crate's packer):
/// `fp16(scale[block] · fp16(q − offset[block]))` or `lut[group][index]`, following the iOS18
/// op definitions.
pub fn naive_decode(c: &Compressed) -> Vec<f32> {
    match c.payload() {
        Payload::BlockwiseShiftScale {
            data,
            scale,
            offset,
        } => {
            let q = data.to_i32_vec().unwrap();
            let s = scale.to_f32_vec();
            let o = offset.as_ref().map(|o| {
                assert_eq!(o.shape(), scale.shape());
                o.to_f32_vec()
            });
            let (dshape, sshape) = (data.shape(), scale.shape());
            let strides = |shape: &[usize]| {
                let mut st = vec![1usize; shape.len()];
                for i in (0..shape.len() - 1).rev() {
                    st[i] = st[i + 1] * shape[i + 1];
                }
                st
            };
            let (ds, ss) = (strides(dshape), strides(sshape));
            (0..q.len())
                .map(|flat| {
                    // output[i…] = scale[i_k / block_k …] * data[i…]
                    let mut sidx = 0;
                    for k in 0..dshape.len() {
                        let i = flat / ds[k] % dshape[k];
                        let block = dshape[k] / sshape[k];
                        sidx += i / block * ss[k];
                    }
                    let shifted = match &o {
                        Some(o) => f16::from_f32(q[flat] as f32 - o[sidx]).to_f32(),
                        None => q[flat] as f32,
                    };
                    f16::from_f32(shifted * s[sidx]).to_f32()
                })
                .collect()
        }
        Payload::LutToDense { indices, lut } => {
            let idx = indices.to_i32_vec().unwrap();
            let table = lut.to_f32_vec();
            let ishape = indices.shape();
            let lshape = lut.shape();
            let palette = lshape[ishape.len()];
            let group = ishape[0] / lshape[0];
            assert!(lshape[1..ishape.len()].iter().all(|&d| d == 1));
            let per_row = idx.len() / ishape[0];
            (0..idx.len())
                .map(|flat| {
                    let g = flat / per_row / group;
                    table[g * palette + idx[flat] as usize]
                })
                .collect()
        }
    }
}

/// `‖a − b‖ / ‖a‖` and `max |a − b|`, in f64, the plain way.
pub fn naive_error(a: &[f32], b: &[f32]) -> (f64, f64) {
    let mut e2 = 0.0;
    let mut r2 = 0.0;
    let mut m: f64 = 0.0;
    for (&x, &y) in a.iter().zip(b) {
        let d = x as f64 - y as f64;
        e2 += d * d;
        r2 += x as f64 * x as f64;
        m = m.max(d.abs());
    }
    (if e2 == 0.0 { 0.0 } else { (e2 / r2).sqrt() }, m)
}

/// Asserts two slices agree within `tol` (absolute), naming the worst element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let (worst, err) = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b as f64).abs())
        .enumerate()
        .fold((0, 0.0), |acc, (i, e)| if e > acc.1 { (i, e) } else { acc });
    assert!(
        err <= tol,
        "{what}: worst element {worst}: got {} want {} (|diff| {err:e} > {tol:e})",
        got[worst],
        want[worst]
    );
}
