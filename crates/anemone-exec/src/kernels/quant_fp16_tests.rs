//! The AVX512-FP16 8-bit kernels against the f32 kernels they stand in for: every value and
//! every dot bit-identical (the tests skip on a CPU without AVX512-FP16).

use std::arch::x86_64::*;

use anemone_testkit::Rng;
use half::f16;

use super::super::super::{available as f32_available, Offsets, Row, ShiftScale, Tables};
use super::super::{byte_values, dot as any_dot, expand as any_expand, Params};
use super::{available, block, values, Half16, Run, NO_OFFSET, ROUNDED};
use super::{dequantize, dequantize_at, int4_table};

fn runs() -> bool {
    f32_available() && available()
}

/// Scales at the edges: subnormals, the smallest normal, the largest finite, infinities, signs,
/// values whose products with 8-bit integers tie or overflow in fp16, and a spread between.
fn edge_scales() -> Vec<u16> {
    let mut s = vec![
        0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x0003, 0x01FF, 0x03FF, 0x0400, 0x0401, 0x07FF,
        0x1000, 0x2E66, 0x3555, 0x3800, 0x3BFF, 0x3C00, 0x3C01, 0xBC00, 0x4000, 0x5BFF, 0x5C00,
        0x7800, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
    ];
    s.extend((0..40u32).map(|i| (i * 0x0641 + 0x0123) as u16 & 0x7FFF));
    s
}

/// The f32 kernel's 32 values of the bytes at `c` (two runs of 16) as bits.
///
/// # Safety
/// 32 bytes readable at `c`; the CPU runs the f32 kernels.
unsafe fn old<const SIGNED: bool, const OFF: u8>(c: *const u8, s: u16, o: f32) -> [u32; 32] {
    let p = Params {
        s: _mm512_cvtph_ps(_mm256_set1_epi16(s as i16)),
        o: _mm512_set1_ps(o),
    };
    let mut out = [0u32; 32];
    for h in 0..2 {
        let v = byte_values::<SIGNED, OFF>(c.add(16 * h), p);
        _mm512_storeu_ps(out.as_mut_ptr().add(16 * h) as *mut f32, v);
    }
    out
}

/// These kernels' 32 values, or `None` when the offset is not an fp16 value.
///
/// # Safety
/// As [`old`], and the CPU has AVX512-FP16.
unsafe fn new<const SIGNED: bool, const OFF: u8>(
    c: *const u8,
    s: u16,
    o: f32,
) -> Option<[u32; 32]> {
    let scales = s.to_le_bytes();
    let offsets = [o];
    let parts = super::super::Parts {
        codes: c,
        scales: scales.as_ptr(),
        offsets: offsets.as_ptr(),
        offsets16: std::ptr::null(),
        palettes: std::ptr::null(),
    };
    let zero = _mm512_setzero_si512();
    let (mut runs, mut exact) = ([Run { s: zero, o: zero }], true);
    let [h]: [Half16; 1] = block::<1, OFF>(&[parts], 1, &mut runs, &mut exact, 0);
    let (lo, hi) = values::<SIGNED, OFF>(c, h);
    let mut out = [0u32; 32];
    _mm512_storeu_ps(out.as_mut_ptr() as *mut f32, lo);
    _mm512_storeu_ps(out.as_mut_ptr().add(16) as *mut f32, hi);
    exact.then_some(out)
}

fn all_bytes() -> Vec<u8> {
    (0..=255u8).collect()
}

#[test]
fn every_byte_times_every_scale_is_the_f32_value() {
    if !runs() {
        return;
    }
    let bytes = all_bytes();
    for s in 0..=u16::MAX {
        for c in bytes.chunks_exact(32) {
            // SAFETY: 32 bytes at `c`; the CPU features checked above.
            unsafe {
                let want = old::<true, NO_OFFSET>(c.as_ptr(), s, 0.0);
                assert_eq!(
                    new::<true, NO_OFFSET>(c.as_ptr(), s, 0.0),
                    Some(want),
                    "int8 s={s:#06x}"
                );
                let want = old::<false, NO_OFFSET>(c.as_ptr(), s, 0.0);
                assert_eq!(
                    new::<false, NO_OFFSET>(c.as_ptr(), s, 0.0),
                    Some(want),
                    "uint8 s={s:#06x}"
                );
            }
        }
    }
}

#[test]
fn every_byte_minus_every_fp16_offset_is_the_f32_value() {
    if !runs() {
        return;
    }
    let bytes = all_bytes();
    let scales = edge_scales();
    let mut fell_back = 0;
    for ob in 0..=u16::MAX {
        let o = f16::from_bits(ob).to_f32();
        for &s in &scales {
            for c in bytes.chunks_exact(32) {
                // SAFETY: as above.
                unsafe {
                    for signed in [true, false] {
                        let (want, got) = if signed {
                            (
                                old::<true, ROUNDED>(c.as_ptr(), s, o),
                                new::<true, ROUNDED>(c.as_ptr(), s, o),
                            )
                        } else {
                            (
                                old::<false, ROUNDED>(c.as_ptr(), s, o),
                                new::<false, ROUNDED>(c.as_ptr(), s, o),
                            )
                        };
                        match got {
                            Some(got) => assert_eq!(got, want, "o={ob:#06x} s={s:#06x}"),
                            // only a NaN whose payload the round trip changes
                            None => {
                                assert!(o.is_nan(), "o={ob:#06x}");
                                fell_back += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    let _ = fell_back;
}

#[test]
fn an_offset_not_in_fp16_is_reported() {
    if !runs() {
        return;
    }
    let bytes = all_bytes();
    for o in [4097.0f32, 0.1, 1e-9, 70000.0] {
        // SAFETY: as above.
        let got = unsafe { new::<true, ROUNDED>(bytes.as_ptr(), 0x3C00, o) };
        assert_eq!(got, None, "{o}");
    }
}

/// Random weights of `rows × k` in blocks of `per` columns, their layout `offsets`:
/// 0 none, 1 fp16 values, 2 integers, 3 integers some beyond fp16's (falls back).
struct Weight {
    codes: Vec<u8>,
    scales: Vec<u8>,
    offsets: Option<Vec<f32>>,
    /// The offsets as fp16 bit patterns, when every one is an fp16 value.
    offsets16: Option<Vec<u16>>,
    k: usize,
    per: usize,
    signed: bool,
}

impl Weight {
    fn new(rng: &mut Rng, rows: usize, k: usize, per: usize, signed: bool, offsets: u8) -> Self {
        let blocks = rows * k / per;
        let codes = (0..rows * k).map(|_| rng.next() as u8).collect();
        let scales = (0..blocks)
            .flat_map(|i| {
                let bits = match i % 7 {
                    // tiny and huge scales among ordinary ones
                    0 => (rng.next() % 0x0400) as u16,
                    1 => 0x7000 + (rng.next() % 0x0BFF) as u16,
                    _ => 0x1800 + (rng.next() % 0x1800) as u16,
                } | ((rng.next() as u16) & 0x8000);
                bits.to_le_bytes()
            })
            .collect();
        let offsets = match offsets {
            0 => None,
            1 => Some(
                (0..blocks)
                    .map(|_| {
                        f16::from_bits(
                            ((rng.next() as u16) & 0x7BFF) | (0x8000 * (rng.next() as u16 & 1)),
                        )
                        .to_f32()
                    })
                    .collect(),
            ),
            2 => Some(
                (0..blocks)
                    .map(|_| (rng.next() % 256) as f32 - 128.0)
                    .collect(),
            ),
            _ => Some(
                (0..blocks)
                    .map(|i| {
                        if i % 5 == 3 {
                            4097.0
                        } else {
                            (rng.next() % 16) as f32
                        }
                    })
                    .collect(),
            ),
        };
        let offsets16 = offsets.as_ref().and_then(|o: &Vec<f32>| {
            o.iter()
                .map(|&v| {
                    let h = f16::from_f32(v);
                    (h.to_f32().to_bits() == v.to_bits()).then_some(h.to_bits())
                })
                .collect()
        });
        Weight {
            codes,
            scales,
            offsets,
            offsets16,
            k,
            per,
            signed,
        }
    }

    fn row(&self, i: usize) -> Row<'_> {
        self.row_as(i, false, false)
    }

    /// Row `i` of 8-bit data, or (`nibbles`) of 4-bit data (the first half of its codes);
    /// offsets as f32, or (`half`) as fp16 where they all are fp16 values.
    fn row_as(&self, i: usize, nibbles: bool, half: bool) -> Row<'_> {
        let nb = self.k / self.per;
        let blocks = i * nb..(i + 1) * nb;
        let how = ShiftScale {
            signed: self.signed,
            scales: &self.scales[2 * blocks.start..2 * blocks.end],
            offsets: match (&self.offsets, &self.offsets16) {
                (Some(_), Some(o)) if half => Some(Offsets::F16(&o[blocks])),
                (Some(o), _) => Some(Offsets::F32(&o[blocks])),
                _ => None,
            },
            round_shift: true,
            split: super::super::super::Split::No,
        };
        let codes = &self.codes[i * self.k..(i + 1) * self.k];
        if nibbles {
            Row::Nibbles {
                codes: &codes[..self.k / 2],
                tables: Tables::ShiftScale(how),
                per: self.per,
            }
        } else {
            Row::Bytes {
                codes,
                how,
                per: self.per,
            }
        }
    }
}

#[test]
fn dots_and_expansions_of_real_shapes_are_the_f32_kernels() {
    if !runs() {
        return;
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // SmolLM2 / Qwen2.5 widths; blocks of 16 (runs straddle blocks), 32, 48, 64, whole rows
    for (k, pers) in [
        (576usize, &[16usize, 32, 48, 64, 576][..]),
        (1536, &[16, 32, 1536][..]),
        (896, &[16, 32, 896][..]),
        (4864, &[32, 4864][..]),
        (32, &[16, 32][..]),
    ] {
        for &per in pers {
            for signed in [true, false] {
                for offsets in 0..4u8 {
                    let w = Weight::new(&mut rng, 8, k, per, signed, offsets);
                    let x: Vec<f32> = (0..k)
                        .map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    let rows: [Row; 4] = std::array::from_fn(|r| w.row(r + 1));
                    // SAFETY: the rows are covered (shapes above), of one layout and of
                    // `x.len()` elements; the CPU features checked above.
                    unsafe {
                        let want = any_dot(&rows, &x, false).map(f32::to_bits);
                        assert_eq!(
                            any_dot(&rows, &x, true).map(f32::to_bits),
                            want,
                            "k={k} per={per}"
                        );
                        let one = [w.row(5)];
                        let want = any_dot(&one, &x, false)[0].to_bits();
                        assert_eq!(any_dot(&one, &x, true)[0].to_bits(), want);
                        let (mut a, mut b) = (vec![0f32; k], vec![0f32; k]);
                        any_expand(&one[0], &mut a, false);
                        any_expand(&one[0], &mut b, true);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&b), bits(&a), "expand k={k} per={per}");
                    }
                }
            }
        }
    }
}

/// [`dequantize_at`] (scale and offset broadcast from memory, MXCSR rounding) against
/// [`dequantize`] (broadcast registers, `{rn-sae}`): every 8-bit value with every scale, and
/// with every fp16 offset at the edge scales.
#[test]
fn memory_broadcasts_are_the_register_values() {
    if !runs() {
        return;
    }
    // every int8 and uint8 value as 16-bit integers, 32 a vector
    let ints: Vec<i16> = (-128..256).collect();
    let bits = |v: __m512i| {
        let mut out = [0u16; 32];
        // SAFETY: 32 lanes of 16 bits into 32 u16.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr() as *mut __m512i, v) };
        out
    };
    let check = |s: u16, o: u16, off: bool| {
        for c in ints.chunks_exact(32) {
            // SAFETY: 32 values at `c`; `s` and `o` are readable; the CPU features checked
            // above.
            unsafe {
                let v = _mm512_loadu_si512(c.as_ptr() as *const __m512i);
                let p = Half16 {
                    s: _mm512_set1_epi16(s as i16),
                    o: _mm512_set1_epi16(o as i16),
                };
                let (want, got) = if off {
                    (
                        dequantize::<ROUNDED>(v, p),
                        dequantize_at::<ROUNDED>(v, &s, &o),
                    )
                } else {
                    (
                        dequantize::<NO_OFFSET>(v, p),
                        dequantize_at::<NO_OFFSET>(v, &s, std::ptr::null()),
                    )
                };
                assert_eq!(bits(got), bits(want), "s={s:#06x} o={o:#06x} {off}");
            }
        }
    };
    for s in 0..=u16::MAX {
        check(s, 0, false);
    }
    for o in 0..=u16::MAX {
        for &s in &edge_scales() {
            check(s, o, true);
        }
    }
}

/// The int4 / uint4 tables formed in fp16 arithmetic against the f32 kernels' tables: every
/// scale without an offset, every fp16 offset at the edge scales.
#[test]
fn int4_tables_in_fp16_are_the_f32_tables() {
    if !runs() {
        return;
    }
    let lanes = |v: __m512| {
        let mut out = [0u32; 16];
        // SAFETY: 16 lanes into 16 u32.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr() as *mut f32, v) };
        out
    };
    let check = |s: u16, o: u16, off: bool| {
        // SAFETY: `s` and `o` are readable; the CPU features checked above.
        unsafe {
            let p = Params {
                s: _mm512_cvtph_ps(_mm256_set1_epi16(s as i16)),
                o: _mm512_set1_ps(f16::from_bits(o).to_f32()),
            };
            use super::super::int4_table as f32_table;
            let pairs = if off {
                [
                    (
                        f32_table::<true, ROUNDED>(p),
                        int4_table::<true, ROUNDED>(&s, &o),
                    ),
                    (
                        f32_table::<false, ROUNDED>(p),
                        int4_table::<false, ROUNDED>(&s, &o),
                    ),
                ]
            } else {
                [
                    (
                        f32_table::<true, NO_OFFSET>(p),
                        int4_table::<true, NO_OFFSET>(&s, std::ptr::null()),
                    ),
                    (
                        f32_table::<false, NO_OFFSET>(p),
                        int4_table::<false, NO_OFFSET>(&s, std::ptr::null()),
                    ),
                ]
            };
            for (want, got) in pairs {
                assert_eq!(lanes(got), lanes(want), "s={s:#06x} o={o:#06x} {off}");
            }
        }
    };
    for s in 0..=u16::MAX {
        check(s, 0, false);
    }
    for o in 0..=u16::MAX {
        for &s in &edge_scales() {
            check(s, o, true);
        }
    }
}

/// Dots of 8-bit and 4-bit rows with fp16 offsets (the memory-broadcast kernels, with their
/// prefetches) against the same rows with f32 offsets through the f32 kernels (the path they
/// replace): four rows a pass and one.
#[test]
fn dots_with_fp16_offsets_are_the_f32_kernels() {
    if !runs() {
        return;
    }
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for (k, pers) in [
        (576usize, &[16usize, 32, 64, 576][..]),
        (1536, &[32, 1536][..]),
        (896, &[32, 896][..]),
        (64, &[32][..]),
    ] {
        for &per in pers {
            for signed in [true, false] {
                for offsets in 0..3u8 {
                    let w = Weight::new(&mut rng, 12, k, per, signed, offsets);
                    let x: Vec<f32> = (0..k)
                        .map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    for nibbles in [false, true] {
                        let xs = &x[..];
                        let rows = |half| -> [Row; 4] {
                            std::array::from_fn(|r| w.row_as(2 * r + 1, nibbles, half))
                        };
                        // SAFETY: the rows are covered (shapes above), of one layout and of
                        // `xs.len()` elements; the CPU features checked above.
                        unsafe {
                            let want = any_dot(&rows(false), xs, false).map(f32::to_bits);
                            let got = any_dot(&rows(true), xs, true).map(f32::to_bits);
                            assert_eq!(got, want, "k={k} per={per} {signed} {offsets}");
                            // the f32 kernels reading fp16 offsets (a CPU without AVX512-FP16)
                            let got = any_dot(&rows(true), xs, false).map(f32::to_bits);
                            assert_eq!(got, want, "f32 k={k} per={per} {signed} {offsets}");
                            let one = |half| [w.row_as(7, nibbles, half)];
                            let want = any_dot(&one(false), xs, false)[0].to_bits();
                            assert_eq!(any_dot(&one(true), xs, true)[0].to_bits(), want);
                        }
                    }
                }
            }
        }
    }
}
