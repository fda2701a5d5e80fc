//! ggml tensor types and their dequantization to f32, following ggml's reference dequantizers
//! (`dequantize_row_*` in ggml-quants.c) operation for operation, so the results are bit-identical.
//!
//! Block layouts (little-endian, `f16` = IEEE half):
//! - `Q4_0`  {d: f16, qs: [u8; 16]}                     x = (q - 8)·d
//! - `Q4_1`  {d, m: f16, qs: [u8; 16]}                  x = q·d + m
//! - `Q5_0`  {d: f16, qh: u32, qs: [u8; 16]}            x = (q - 16)·d
//! - `Q5_1`  {d, m: f16, qh: u32, qs: [u8; 16]}         x = q·d + m
//! - `Q8_0`  {d: f16, qs: [i8; 32]}                     x = q·d
//! - `Q2_K`  {scales: [u8; 16], qs: [u8; 64], d, dmin: f16}
//! - `Q3_K`  {hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16}
//! - `Q4_K`  {d, dmin: f16, scales: [u8; 12], qs: [u8; 128]}
//! - `Q5_K`  {d, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]}
//! - `Q6_K`  {ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16}

use half::{bf16, f16};
use rayon::prelude::*;

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Elements per legacy-quant block (Q4_0 … Q8_0).
pub const QK: usize = 32;

/// The ggml tensor types anemone can dequantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl GgmlType {
    pub const ALL: [GgmlType; 13] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
    ];

    /// The type for a ggml type id, if it is one we support.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The id ggml gives this type (`enum ggml_type`).
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::BF16 => 30,
        }
    }

    pub fn name(self) -> &'static str {
        type_name(self.id()).unwrap_or("?")
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => QK,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 2 + QK / 2,
            Self::Q4_1 => 4 + QK / 2,
            Self::Q5_0 => 2 + 4 + QK / 2,
            Self::Q5_1 => 4 + 4 + QK / 2,
            Self::Q8_0 => 2 + QK,
            Self::Q2_K => QK_K / 16 + QK_K / 4 + 4,
            Self::Q3_K => QK_K / 8 + QK_K / 4 + 12 + 2,
            Self::Q4_K => 4 + 12 + QK_K / 2,
            Self::Q5_K => 4 + 12 + QK_K / 8 + QK_K / 2,
            Self::Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        }
    }

    /// Bytes holding `n` elements, or `None` if `n` is not a whole number of blocks or overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let block = self.block_len() as u64;
        if !n.is_multiple_of(block) {
            return None;
        }
        (n / block).checked_mul(self.block_bytes() as u64)
    }
}

/// ggml's name of a type id, including types anemone cannot dequantize (for error messages).
pub fn type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

/// Dequantizes `bytes` (whole blocks of `ty`) into `out`, in parallel over chunks of blocks.
///
/// Precondition (checked by the caller, asserted here): `out.len()` is a whole number of blocks
/// and `bytes.len()` is exactly the bytes those blocks take.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let (bl, bb) = (ty.block_len(), ty.block_bytes());
    assert!(
        out.len().is_multiple_of(bl) && bytes.len() == out.len() / bl * bb,
        "dequantize: {} bytes do not hold {} {} elements",
        bytes.len(),
        out.len(),
        ty.name()
    );
    // ~64K elements per task: enough work to amortize scheduling, small enough to balance.
    let blocks_per_task = (65536 / bl).max(1);
    out.par_chunks_mut(blocks_per_task * bl)
        .zip(bytes.par_chunks(blocks_per_task * bb))
        .for_each(|(o, b)| dequantize_serial(ty, b, o));
}

/// Single-threaded [`dequantize`]; same precondition.
pub fn dequantize_serial(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let block_fn: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            return;
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
            return;
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
            return;
        }
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q4_1 => block_q4_1,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q2_K => block_q2_k,
        GgmlType::Q3_K => block_q3_k,
        GgmlType::Q4_K => block_q4_k,
        GgmlType::Q5_K => block_q5_k,
        GgmlType::Q6_K => block_q6_k,
    };
    for (o, b) in out
        .chunks_exact_mut(ty.block_len())
        .zip(bytes.chunks_exact(ty.block_bytes()))
    {
        block_fn(b, o);
    }
}

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qs = &b[2..18];
    for j in 0..QK / 2 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + QK / 2] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qs = &b[4..20];
    for j in 0..QK / 2 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + QK / 2] = (qs[j] >> 4) as f32 * d + m;
    }
}

fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((qs[j] & 0x0F) as u32 | h0) as i32 - 16) as f32 * d;
        y[j + QK / 2] = (((qs[j] >> 4) as u32 | h1) as i32 - 16) as f32 * d;
    }
}

fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((qs[j] & 0x0F) as u32 | h0) as f32 * d + m;
        y[j + QK / 2] = ((qs[j] >> 4) as u32 | h1) as f32 * d + m;
    }
}

fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..2 + QK]) {
        *o = (q as i8) as f32 * d;
    }
}

fn block_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let (d, dmin) = (half_at(b, 80), half_at(b, 82));
    let mut is = 0;
    for n in 0..QK_K / 128 {
        let q = &qs[32 * n..32 * n + 32];
        for j in 0..4 {
            let shift = 2 * j;
            let out = &mut y[128 * n + 32 * j..128 * n + 32 * j + 32];
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                for l in 0..16 {
                    let ql = (q[16 * half + l] >> shift) & 3;
                    out[16 * half + l] = dl * ql as f32 - ml;
                }
            }
        }
    }
}

/// The sixteen signed 6-bit sub-block scales of a Q3_K block, unpacked from its 12 bytes
/// (low nibbles in bytes 0..8, high 2-bit pairs in bytes 8..12), minus the bias of 32.
fn q3_k_scales(packed: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 {
            packed[i] & 0x0F
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

fn block_q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = q3_k_scales(&b[96..108]);
    let d_all = half_at(b, 108);
    let mut is = 0;
    let mut m: u8 = 1;
    for n in 0..QK_K / 128 {
        let q = &qs[32 * n..32 * n + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for half in 0..2 {
                let dl = d_all * scales[is] as f32;
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let low = ((q[l] >> shift) & 3) as i32;
                    let sub = if hmask[l] & m != 0 { 0 } else { 4 };
                    y[128 * n + 32 * j + l] = dl * (low - sub) as f32;
                }
            }
            m = m.wrapping_shl(1);
        }
    }
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, out) in y.chunks_exact_mut(64).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * chunk..32 * chunk + 32];
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0F) as f32 - min1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (chunk, out) in y.chunks_exact_mut(64).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        let q = &qs[32 * chunk..32 * chunk + 32];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * ((q[l] & 0x0F) + h1) as f32 - min1;
            out[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - min2;
        }
    }
}

fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let ql_all = &b[0..128];
    let qh_all = &b[128..192];
    let sc_all = &b[192..208];
    let d = half_at(b, 208);
    for (n, out) in y.chunks_exact_mut(128).enumerate() {
        let ql = &ql_all[64 * n..64 * n + 64];
        let qh = &qh_all[32 * n..32 * n + 32];
        let sc = &sc_all[8 * n..8 * n + 8];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let scale = |k: usize| d * (sc[is + k] as i8) as f32;
            out[l] = scale(0) * q1 as f32;
            out[l + 32] = scale(2) * q2 as f32;
            out[l + 64] = scale(4) * q3 as f32;
            out[l + 96] = scale(6) * q4 as f32;
        }
    }
}
