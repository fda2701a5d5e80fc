//! Dequantizers against independent references:
//! 1. hand-built blocks: chosen quants and scales are packed into a block by encoders written
//!    here from the format description (element → byte/bit), and the expected values come from
//!    the plain formula (`d·sc·q − dmin·m` …), not from the decoder's loop structure;
//! 2. seeded random blocks of every type dequantized by the gguf python package
//!    (`tests/fixtures/gguf/gguf_quant_blocks.json`, made by `tests/fixtures/gguf/make_gguf_fixtures.py`).

use anemone_checkpoint::gguf::dequant::{dequantize, dequantize_serial, GgmlType};
use half::{bf16, f16};

/// Same float operations in the same order as ggml: results must agree to rounding noise only.
const DEQUANT_TOL: f32 = 1e-6;

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut worst, mut worst_i) = (0.0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(1.0);
        if err > worst || err.is_nan() {
            worst = err;
            worst_i = i;
        }
    }
    assert!(
        worst <= tol,
        "{what}: worst relative error {worst:e} at element {worst_i}: got {}, want {}",
        got[worst_i],
        want[worst_i]
    );
}

fn run(ty: GgmlType, block: &[u8]) -> Vec<f32> {
    let n = block.len() / ty.block_bytes() * ty.block_len();
    let mut out = vec![f32::NAN; n];
    dequantize_serial(ty, block, &mut out);
    out
}

fn h(x: f32) -> (f32, [u8; 2]) {
    let v = f16::from_f32(x);
    (v.to_f32(), v.to_le_bytes())
}

/// Deterministic pseudo-random integers in `0..m` (xorshift), so blocks cover every code.
struct Codes(u64);
impl Codes {
    fn next(&mut self, m: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % m as u64) as u32
    }
}

#[test]
fn f32_f16_bf16_widen_exactly() {
    let xs = [0.0f32, -1.5, 3.140625, 65504.0, -(2f32.powi(-14))];
    let f32_bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(run(GgmlType::F32, &f32_bytes), xs);
    let f16_bytes: Vec<u8> = xs
        .iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect();
    assert_eq!(run(GgmlType::F16, &f16_bytes), xs);
    let b = [1.0f32, -2.5, 2f32.powi(100), 0.0078125];
    let bf_bytes: Vec<u8> = b
        .iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect();
    assert_eq!(run(GgmlType::BF16, &bf_bytes), b);
}

/// Legacy 32-element blocks: element j < 16 lives in the low nibble of byte j, element j ≥ 16 in
/// the high nibble of byte j − 16; Q5 keeps bit 4 of element j in bit j of `qh`.
fn nibbles_and_high_bits(q: &[u32; 32]) -> ([u8; 16], u32) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qs[j % 16] |= ((v & 0xF) as u8) << (4 * (j / 16));
        qh |= ((v >> 4) & 1) << j;
    }
    (qs, qh)
}

#[test]
fn q4_0_and_q4_1_hand_built() {
    let mut codes = Codes(7);
    let q: [u32; 32] = std::array::from_fn(|_| codes.next(16));
    let (qs, _) = nibbles_and_high_bits(&q);
    let (d, d_bytes) = h(0.0625);
    let (m, m_bytes) = h(-0.375);

    let block: Vec<u8> = d_bytes.iter().chain(&qs).copied().collect();
    let want: Vec<f32> = q.iter().map(|&v| (v as f32 - 8.0) * d).collect();
    assert_close("Q4_0", &run(GgmlType::Q4_0, &block), &want, DEQUANT_TOL);

    let block: Vec<u8> = d_bytes.iter().chain(&m_bytes).chain(&qs).copied().collect();
    let want: Vec<f32> = q.iter().map(|&v| v as f32 * d + m).collect();
    assert_close("Q4_1", &run(GgmlType::Q4_1, &block), &want, DEQUANT_TOL);
}

#[test]
fn q5_0_and_q5_1_hand_built() {
    let mut codes = Codes(11);
    let q: [u32; 32] = std::array::from_fn(|_| codes.next(32));
    let (qs, qh) = nibbles_and_high_bits(&q);
    let (d, d_bytes) = h(-0.03125);
    let (m, m_bytes) = h(0.5);

    let block: Vec<u8> = d_bytes
        .iter()
        .chain(&qh.to_le_bytes())
        .chain(&qs)
        .copied()
        .collect();
    let want: Vec<f32> = q.iter().map(|&v| (v as f32 - 16.0) * d).collect();
    assert_close("Q5_0", &run(GgmlType::Q5_0, &block), &want, DEQUANT_TOL);

    let block: Vec<u8> = d_bytes
        .iter()
        .chain(&m_bytes)
        .chain(&qh.to_le_bytes())
        .chain(&qs)
        .copied()
        .collect();
    let want: Vec<f32> = q.iter().map(|&v| v as f32 * d + m).collect();
    assert_close("Q5_1", &run(GgmlType::Q5_1, &block), &want, DEQUANT_TOL);
}

#[test]
fn q8_0_hand_built() {
    let q: Vec<i8> = (0..32).map(|i| (i * 9 - 128) as i8).collect();
    let (d, d_bytes) = h(0.0078125);
    let block: Vec<u8> = d_bytes
        .iter()
        .copied()
        .chain(q.iter().map(|&v| v as u8))
        .collect();
    let want: Vec<f32> = q.iter().map(|&v| v as f32 * d).collect();
    assert_close("Q8_0", &run(GgmlType::Q8_0, &block), &want, DEQUANT_TOL);
}

/// K-quant 2-bit planes (Q2_K qs, Q3_K low bits): element e sits in byte 32·(e/128) + e%32, at
/// bit 2·((e%128)/32).
fn two_bit_planes(q: &[u32; 256]) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (e, &v) in q.iter().enumerate() {
        out[32 * (e / 128) + e % 32] |= ((v & 3) as u8) << (2 * ((e % 128) / 32));
    }
    out
}

#[test]
fn q2_k_hand_built() {
    let mut codes = Codes(3);
    let q: [u32; 256] = std::array::from_fn(|_| codes.next(4));
    let sc: [u32; 16] = std::array::from_fn(|_| codes.next(16));
    let mn: [u32; 16] = std::array::from_fn(|_| codes.next(16));
    let (d, d_bytes) = h(0.125);
    let (dmin, dmin_bytes) = h(0.0625);
    let mut block: Vec<u8> = (0..16).map(|s| (sc[s] | (mn[s] << 4)) as u8).collect();
    block.extend(two_bit_planes(&q));
    block.extend(d_bytes);
    block.extend(dmin_bytes);
    // Sub-block of 16 elements s = e / 16.
    let want: Vec<f32> = (0..256)
        .map(|e| d * sc[e / 16] as f32 * q[e] as f32 - dmin * mn[e / 16] as f32)
        .collect();
    assert_close("Q2_K", &run(GgmlType::Q2_K, &block), &want, DEQUANT_TOL);
}

#[test]
fn q3_k_hand_built() {
    let mut codes = Codes(5);
    // 3-bit signed quants in -4..=3, stored as low 2 bits plus a high bit that is SET for
    // non-negative values (the "subtract 4 unless set" convention).
    let q: [i32; 256] = std::array::from_fn(|_| codes.next(8) as i32 - 4);
    let sc: [i32; 16] = std::array::from_fn(|_| codes.next(64) as i32 - 32);
    let (d, d_bytes) = h(0.25);
    let low: [u32; 256] = std::array::from_fn(|e| (q[e] & 3) as u32);
    let mut hmask = [0u8; 32];
    for (e, &v) in q.iter().enumerate() {
        if v >= 0 {
            hmask[e % 32] |= 1 << (e / 32);
        }
    }
    // 6-bit scales biased by 32: low nibbles of scales 0..8 in bytes 0..8, of 8..16 in the high
    // nibbles of bytes 0..8; the top 2 bits of scale s in byte 8 + s%4 at bit 2·(s/4).
    let mut packed = [0u8; 12];
    for (s, &v) in sc.iter().enumerate() {
        let u = (v + 32) as u8;
        packed[s % 8] |= (u & 0xF) << (4 * (s / 8));
        packed[8 + s % 4] |= (u >> 4) << (2 * (s / 4));
    }
    let mut block = hmask.to_vec();
    block.extend(two_bit_planes(&low));
    block.extend(packed);
    block.extend(d_bytes);
    let want: Vec<f32> = (0..256)
        .map(|e| d * sc[e / 16] as f32 * q[e] as f32)
        .collect();
    assert_close("Q3_K", &run(GgmlType::Q3_K, &block), &want, DEQUANT_TOL);
}

/// Packs eight 6-bit (scale, min) pairs the Q4_K/Q5_K way.
fn pack_scale_min(sc: &[u32; 8], mn: &[u32; 8]) -> [u8; 12] {
    let mut p = [0u8; 12];
    for j in 0..8 {
        let (s, m) = (sc[j] as u8, mn[j] as u8);
        if j < 4 {
            p[j] |= s & 63;
            p[j + 4] |= m & 63;
        } else {
            p[j + 4] |= (s & 0xF) | ((m & 0xF) << 4);
            p[j - 4] |= (s >> 4) << 6;
            p[j] |= (m >> 4) << 6;
        }
    }
    p
}

/// Q4_K/Q5_K nibbles: element e in byte 32·(e/64) + e%32, low nibble when e%64 < 32.
fn k_nibbles(q: &[u32; 256]) -> [u8; 128] {
    let mut out = [0u8; 128];
    for (e, &v) in q.iter().enumerate() {
        out[32 * (e / 64) + e % 32] |= ((v & 0xF) as u8) << (4 * ((e % 64) / 32));
    }
    out
}

#[test]
fn q4_k_and_q5_k_hand_built() {
    let mut codes = Codes(13);
    let sc: [u32; 8] = std::array::from_fn(|_| codes.next(64));
    let mn: [u32; 8] = std::array::from_fn(|_| codes.next(64));
    let (d, d_bytes) = h(0.01171875);
    let (dmin, dmin_bytes) = h(0.0234375);
    let scales = pack_scale_min(&sc, &mn);

    let q4: [u32; 256] = std::array::from_fn(|_| codes.next(16));
    let mut block: Vec<u8> = d_bytes
        .iter()
        .chain(&dmin_bytes)
        .chain(&scales)
        .copied()
        .collect();
    block.extend(k_nibbles(&q4));
    let want: Vec<f32> = (0..256)
        .map(|e| d * sc[e / 32] as f32 * q4[e] as f32 - dmin * mn[e / 32] as f32)
        .collect();
    assert_close("Q4_K", &run(GgmlType::Q4_K, &block), &want, DEQUANT_TOL);

    let q5: [u32; 256] = std::array::from_fn(|_| codes.next(32));
    // Bit 4 of element e: byte e%32 of qh, bit e/32.
    let mut qh = [0u8; 32];
    for (e, &v) in q5.iter().enumerate() {
        qh[e % 32] |= (((v >> 4) & 1) as u8) << (e / 32);
    }
    let mut block: Vec<u8> = d_bytes
        .iter()
        .chain(&dmin_bytes)
        .chain(&scales)
        .copied()
        .collect();
    block.extend(qh);
    block.extend(k_nibbles(&q5));
    let want: Vec<f32> = (0..256)
        .map(|e| d * sc[e / 32] as f32 * q5[e] as f32 - dmin * mn[e / 32] as f32)
        .collect();
    assert_close("Q5_K", &run(GgmlType::Q5_K, &block), &want, DEQUANT_TOL);
}

#[test]
fn q6_k_hand_built() {
    let mut codes = Codes(17);
    let q: [i32; 256] = std::array::from_fn(|_| codes.next(64) as i32 - 32);
    let sc: [i8; 16] = std::array::from_fn(|_| (codes.next(256) as i32 - 128) as i8);
    let (d, d_bytes) = h(0.001953125);
    // Element e of half n = e/128, position p = e%128: low nibble in ql[64n + p%64] (high nibble
    // when p ≥ 64); top 2 bits in qh[32n + p%32] at bit 2·(p/32).
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for (e, &v) in q.iter().enumerate() {
        let u = (v + 32) as u8;
        let (n, p) = (e / 128, e % 128);
        ql[64 * n + p % 64] |= (u & 0xF) << (4 * (p / 64));
        qh[32 * n + p % 32] |= (u >> 4) << (2 * (p / 32));
    }
    let mut block = ql.to_vec();
    block.extend(qh);
    block.extend(sc.iter().map(|&s| s as u8));
    block.extend(d_bytes);
    let want: Vec<f32> = (0..256)
        .map(|e| d * sc[e / 16] as f32 * q[e] as f32)
        .collect();
    assert_close("Q6_K", &run(GgmlType::Q6_K, &block), &want, DEQUANT_TOL);
}

#[test]
fn random_blocks_match_gguf_python() {
    let text = include_str!("../../../tests/fixtures/gguf/gguf_quant_blocks.json");
    let fixture: serde_json::Value = serde_json::from_str(text).unwrap();
    let fixture = fixture.as_object().unwrap();
    let mut seen = 0;
    for ty in GgmlType::ALL {
        let Some(entry) = fixture.get(ty.name()) else {
            assert!(
                matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16),
                "fixture lacks {}",
                ty.name()
            );
            continue;
        };
        let hex = entry["hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let want: Vec<f32> = entry["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_close(ty.name(), &run(ty, &bytes), &want, DEQUANT_TOL);
        // The parallel entry point agrees with the serial one.
        let mut par = vec![0.0; want.len()];
        dequantize(ty, &bytes, &mut par);
        assert_eq!(par, run(ty, &bytes), "{}: parallel vs serial", ty.name());
        seen += 1;
    }
    assert_eq!(seen, 10, "every quantized type is covered");
}

#[test]
fn block_geometry_matches_ggml() {
    // (type, elements per block, bytes per block) from ggml's type traits.
    let expected = [
        (GgmlType::F32, 1, 4),
        (GgmlType::F16, 1, 2),
        (GgmlType::BF16, 1, 2),
        (GgmlType::Q4_0, 32, 18),
        (GgmlType::Q4_1, 32, 20),
        (GgmlType::Q5_0, 32, 22),
        (GgmlType::Q5_1, 32, 24),
        (GgmlType::Q8_0, 32, 34),
        (GgmlType::Q2_K, 256, 84),
        (GgmlType::Q3_K, 256, 110),
        (GgmlType::Q4_K, 256, 144),
        (GgmlType::Q5_K, 256, 176),
        (GgmlType::Q6_K, 256, 210),
    ];
    for (ty, len, bytes) in expected {
        assert_eq!(
            (ty.block_len(), ty.block_bytes()),
            (len, bytes),
            "{}",
            ty.name()
        );
        assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
    }
    assert_eq!(GgmlType::from_id(16), None, "IQ2_XXS is not supported");
}
