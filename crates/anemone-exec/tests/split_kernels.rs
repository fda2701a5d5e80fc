//! The split forming of 8-bit rows and of 4-bit rows' tables (`quant_split.rs`): its roundings
//! are fp16's wherever `quant::splits` / `quant::split_level_of` admit a block, the rule refuses
//! what it must (over each width's data range), and the split dots are the f32 kernels' dots
//! bit for bit (on a CPU where the split kernels run; the rest everywhere).

use anemone_exec::kernels::quant::{
    self, split_level, split_level_of, split_levels, split_levels_of, split_product, split_round,
    splits, Bits, Offsets, Row, ShiftScale, Split, Tables,
};
use anemone_testkit::Rng;
use half::f16;

fn r16(x: f32) -> u32 {
    f16::from_f32(x).to_f32().to_bits()
}

/// Scales at the edges (subnormals, the smallest normal, ties, the overflow edge) and a
/// pseudo-random spread over every fp16 bit pattern.
fn scales() -> Vec<f16> {
    let mut s: Vec<u16> = vec![
        0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x0401, 0x07FF, 0x1000, 0x2E66, 0x3555, 0x3800,
        0x3C00, 0xBC00, 0x5BFF, 0x5C00, 0x5FFF, 0x6000, 0x7BFF, 0x7C00, 0xFC00, 0x7E00,
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    s.extend((0..3000).map(|_| rng.next() as u16));
    s.into_iter().map(f16::from_bits).collect()
}

#[test]
fn products_of_admitted_scales_round_as_fp16() {
    let (mut checked, mut admitted) = (0, 0);
    for s in scales() {
        for signed in [true, false] {
            if !splits(signed, s, None) {
                continue;
            }
            admitted += 1;
            let data = if signed { -128..=127i32 } else { 0..=255 };
            for v in data {
                let t = v as f32;
                let want = r16(t * s.to_f32());
                assert_eq!(split_product(t, s.to_f32()).to_bits(), want, "{v} × {s}");
                checked += 1;
            }
        }
    }
    assert!(
        admitted > 1000 && checked > 300_000,
        "{admitted} scales admitted"
    );
}

#[test]
fn every_admitted_offset_rounds_every_difference_as_fp16() {
    let mut admitted = 0;
    for bits in 0..=u16::MAX {
        let o = f16::from_bits(bits);
        for signed in [true, false] {
            // scale 1: the rule's offset conditions alone
            if !splits(signed, f16::ONE, Some(o)) {
                continue;
            }
            admitted += 1;
            let data = if signed { -128..=127i32 } else { 0..=255 };
            for v in data {
                let d = v as f32 - o.to_f32();
                assert_eq!(split_round(d).to_bits(), r16(d), "{v} − {o}");
            }
        }
    }
    assert!(admitted > 60_000, "{admitted} offsets admitted");
}

#[test]
fn the_rule_refuses_subnormal_and_overflowing_values() {
    let h = f16::from_f32;
    // a subnormal product, where splitting (11 significant bits) is not fp16's rounding:
    // (1 + 2^-10) · 2^-20 keeps its 2^-30, fp16 rounds it to 2^-20
    let (t, tiny) = (1.0 + 1.0 / 1024.0, f16::from_bits(0x0010));
    assert_ne!(
        split_product(t, tiny.to_f32()).to_bits(),
        r16(t * tiny.to_f32())
    );
    // so fp16 subnormal scales are refused where differences round, and offsets whose
    // differences times the scale can be subnormal (below)
    assert!(!splits(true, tiny, Some(h(37.4))));
    assert!(!splits(true, f16::from_bits(0x03FF), Some(h(-3.5))));
    // but integer data times any fp16 scale is a multiple of 2^-24: a subnormal product is
    // an fp16 value, which splitting keeps (no offset, or an integer one: `Split::Exact`)
    for s in [tiny, f16::from_bits(0x0001), f16::from_bits(0x03FF)] {
        assert_eq!(split_level(true, s, None), Split::Exact);
        assert_eq!(split_level(false, s, Some(h(32.0))), Split::Exact);
        for v in -128..=255 {
            let t = v as f32;
            assert_eq!(split_product(t, s.to_f32()).to_bits(), r16(t * s.to_f32()));
        }
    }
    // the smallest normal scale is admitted
    assert!(splits(true, f16::from_bits(0x0400), None));
    // overflow: 128 · s must stay below 65520 (signed), 255 · s (unsigned)
    assert!(splits(true, h(511.5), None));
    assert!(!splits(true, h(512.0), None));
    assert!(!splits(false, h(511.5), None));
    assert!(splits(false, h(256.0), None));
    // non-finite scales and offsets
    assert!(!splits(true, f16::INFINITY, None));
    assert!(!splits(true, f16::NAN, None));
    assert!(!splits(true, h(0.01), Some(f16::NAN)));
    // a subnormal offset: v = 0 gives a subnormal difference
    assert!(!splits(true, h(1.0), Some(f16::from_bits(0x0003))));
    // an offset 1/32 from an integer with scale 2^-10: that data value's product is 2^-15
    assert!(!splits(true, h(1.0 / 1024.0), Some(h(37.03125))));
    assert!(splits(true, h(1.0 / 256.0), Some(h(37.03125))));
    // an offset outside the data range: the nearest data value decides
    assert!(splits(true, h(0.01), Some(h(-300.5))));
    assert!(!splits(true, h(300.0), Some(h(-300.5))));
    // zero scale: every value is a zero
    assert!(splits(true, f16::ZERO, Some(h(37.4))));
    // levels: integer offsets within 2048 of the data are exact, others round
    assert_eq!(split_level(true, h(0.01), None), Split::Exact);
    assert_eq!(split_level(true, h(0.01), Some(h(-3.0))), Split::Exact);
    assert_eq!(split_level(true, h(0.001), Some(h(37.4))), Split::Rounds);
    assert_eq!(split_level(false, h(0.001), Some(h(2100.0))), Split::Rounds);
    assert_eq!(split_level(false, h(0.001), Some(h(2048.0))), Split::Exact);
}

#[test]
fn row_levels_are_the_least_block_level() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let n = 64 * 48;
    for signed in [true, false] {
        // mostly admitted values, some refused (overflowing scales; tiny ones and offsets
        // near integers where differences round)
        let scales: Vec<f16> = (0..n)
            .map(|_| match rng.next() % 50 {
                0 => f16::from_bits(0x0100),
                1 => f16::from_f32(600.0),
                _ => f16::from_f32(0.0005 + (rng.next() % 1000) as f32 * 1e-5),
            })
            .collect();
        let offsets: Vec<f16> = (0..n)
            .map(|_| match rng.next() % 4 {
                0 => f16::from_f32((rng.next() % 64) as f32 - 32.0),
                _ => f16::from_f32((rng.next() % 6400) as f32 / 100.0 - 32.0),
            })
            .collect();
        for offs in [None, Some(&offsets[..])] {
            let levels = split_levels(signed, &scales, offs, 48);
            assert_eq!(levels.len(), 64);
            for (r, &level) in levels.iter().enumerate() {
                let want = (r * 48..(r + 1) * 48)
                    .map(|b| split_level(signed, scales[b], offs.map(|o| o[b])))
                    .min()
                    .unwrap();
                assert_eq!(level, want, "row {r}");
            }
            assert!(levels.contains(&Split::No) && levels.iter().any(|&l| l != Split::No));
        }
    }
}

/// A random 8-bit or 4-bit weight of `rows × k`, blocks of `per`, with per-row split levels.
struct Weight {
    k: usize,
    per: usize,
    signed: bool,
    four: bool,
    codes: Vec<u8>,
    scales: Vec<u8>,
    offsets: Option<Vec<u16>>,
    levels: Vec<Split>,
}

impl Weight {
    /// `offsets`: 0 none, 1 integer ones, 2 any fp16 ones (mostly within the data range).
    fn new(rng: &mut Rng, rows: usize, k: usize, per: usize, signed: bool, offsets: u8) -> Self {
        let nb = rows * k / per;
        let codes = (0..rows * k).map(|_| rng.next() as u8).collect();
        let scales: Vec<f16> = (0..nb)
            .map(|_| match rng.next() % 40 {
                // a few blocks with a subnormal scale: refused where differences round
                // (`offsets` 2), so some rows fall back
                0 => f16::from_bits(0x0010),
                _ => f16::from_f32(0.0005 + (rng.next() % 3000) as f32 * 1e-5),
            })
            .collect();
        let offsets: Option<Vec<f16>> = match offsets {
            0 => None,
            1 => Some(
                (0..nb)
                    .map(|_| f16::from_f32((rng.next() % 61) as f32 - 30.0))
                    .collect(),
            ),
            _ => Some(
                (0..nb)
                    .map(|_| f16::from_f32((rng.next() % 20000) as f32 / 97.0 - 70.0))
                    .collect(),
            ),
        };
        let levels = split_levels(signed, &scales, offsets.as_deref(), k / per);
        Weight {
            k,
            per,
            signed,
            four: false,
            codes,
            scales: scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
            offsets: offsets.map(|o| o.iter().map(|o| o.to_bits()).collect()),
            levels,
        }
    }

    /// A 4-bit weight (int4 / uint4 codes, two a byte) with block-quantized-source-like
    /// parameters: steps of 0.006..0.036, offsets (`offsets` as for [`Weight::new`]) around
    /// the data range; one row in 8 holds a block with a subnormal scale, refused where
    /// differences round (`offsets` 2), so falls back.
    fn nibbles(
        rng: &mut Rng,
        rows: usize,
        k: usize,
        per: usize,
        signed: bool,
        offsets: u8,
    ) -> Self {
        let nb = k / per;
        let codes = (0..rows * k / 2).map(|_| rng.next() as u8).collect();
        let mut scales: Vec<f16> = (0..rows * nb)
            .map(|_| f16::from_f32(0.006 + (rng.next() % 3000) as f32 * 1e-5))
            .collect();
        for r in 0..rows {
            if rng.next().is_multiple_of(8) {
                scales[r * nb + (rng.next() as usize) % nb] = f16::from_bits(0x0010);
            }
        }
        let base = if signed { -8.0 } else { 0.0 };
        let offsets: Option<Vec<f16>> = match offsets {
            0 => None,
            1 => Some(
                (0..rows * nb)
                    .map(|_| f16::from_f32(base + (rng.next() % 21) as f32 - 3.0))
                    .collect(),
            ),
            _ => Some(
                (0..rows * nb)
                    .map(|_| f16::from_f32(base + (rng.next() % 2000) as f32 / 97.0 - 2.0))
                    .collect(),
            ),
        };
        let levels = split_levels_of(Bits::Four, signed, &scales, offsets.as_deref(), nb);
        Weight {
            k,
            per,
            signed,
            four: true,
            codes,
            scales: scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
            offsets: offsets.map(|o| o.iter().map(|o| o.to_bits()).collect()),
            levels,
        }
    }

    fn row(&self, i: usize, split: bool) -> Row<'_> {
        let nb = self.k / self.per;
        let b = i * nb..(i + 1) * nb;
        let how = ShiftScale {
            signed: self.signed,
            scales: &self.scales[2 * b.start..2 * b.end],
            offsets: self.offsets.as_ref().map(|o| Offsets::F16(&o[b])),
            round_shift: true,
            split: if split { self.levels[i] } else { Split::No },
        };
        match self.four {
            false => Row::Bytes {
                codes: &self.codes[i * self.k..(i + 1) * self.k],
                how,
                per: self.per,
            },
            true => Row::Nibbles {
                codes: &self.codes[i * self.k / 2..(i + 1) * self.k / 2],
                tables: Tables::ShiftScale(how),
                per: self.per,
            },
        }
    }

    /// Asserts the split dots of every row are the f32 kernels' and the fp16 dot of the
    /// expanded row, bit for bit; returns (rows split, rows not).
    fn check_dots(&self, rng: &mut Rng, at: &str) -> (usize, usize) {
        let (k, rows) = (self.k, self.levels.len());
        let x: Vec<f32> = (0..k)
            .map(|_| (rng.next() % 20001) as f32 / 10000.0 - 1.0)
            .collect();
        let (mut want, mut got) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        assert!(quant::matvec(&mut want, &x, |i| Some(self.row(i, false))));
        assert!(quant::matvec(&mut got, &x, |i| Some(self.row(i, true))));
        let mut values = vec![0.0f32; k];
        for (r, (g, w)) in got.iter().zip(&want).enumerate() {
            let at = format!("{at} row {r} ({:?})", self.levels[r]);
            assert_eq!(g.to_bits(), w.to_bits(), "{at}");
            assert!(quant::expand(&self.row(r, false), &mut values));
            let halves: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            let dot = anemone_exec::kernels::simd::dot_f16_kernel()(&halves, &x);
            assert_eq!(g.to_bits(), dot.to_bits(), "{at}: vs the expanded row");
        }
        let split = self.levels.iter().filter(|&&l| l != Split::No).count();
        (split, rows - split)
    }
}

#[test]
fn split_dots_are_the_f32_kernel_dots() {
    if !quant::split_used() {
        eprintln!("skipped: the split kernels do not run on this CPU");
        return;
    }
    let mut rng = Rng(0xDEAD_BEEF_CAFE_F00D);
    let (mut split_rows, mut plain_rows) = (0, 0);
    for (k, per) in [(576, 32), (1536, 32), (96, 16), (64, 64)] {
        for signed in [true, false] {
            for offsets in 0..3 {
                let w = Weight::new(&mut rng, 45, k, per, signed, offsets);
                let at = format!("k {k} per {per} signed {signed} offsets {offsets}");
                let (s, p) = w.check_dots(&mut rng, &at);
                (split_rows, plain_rows) = (split_rows + s, plain_rows + p);
            }
        }
    }
    assert!(
        split_rows > 200 && plain_rows > 20,
        "{split_rows} split, {plain_rows} not"
    );
}

#[test]
fn split_int4_dots_are_the_f32_kernel_dots() {
    if !quant::split_used() {
        eprintln!("skipped: the split kernels do not run on this CPU");
        return;
    }
    let mut rng = Rng(0x0F1E_2D3C_4B5A_6978);
    // levels seen: [No, Rounds, Exact] rows
    let mut seen = [0usize; 3];
    for k in [576, 1536, 896, 4864] {
        for per in [32, 16] {
            for signed in [true, false] {
                for offsets in 0..3 {
                    let w = Weight::nibbles(&mut rng, 21, k, per, signed, offsets);
                    let at = format!("int4 k {k} per {per} signed {signed} offsets {offsets}");
                    w.check_dots(&mut rng, &at);
                    for &l in &w.levels {
                        seen[l as usize] += 1;
                    }
                }
            }
        }
    }
    assert!(
        seen[0] > 30 && seen[1] > 200 && seen[2] > 400,
        "rows No / Rounds / Exact: {seen:?}"
    );
}

/// Every 4-bit value `v` of either signedness.
fn nibble_values(signed: bool) -> std::ops::RangeInclusive<i32> {
    if signed {
        -8..=7
    } else {
        0..=15
    }
}

#[test]
fn four_bit_tables_of_admitted_blocks_round_as_fp16() {
    let mut admitted = 0;
    for s in scales() {
        for signed in [true, false] {
            if split_level_of(Bits::Four, signed, s, None) == Split::No {
                continue;
            }
            admitted += 1;
            for v in nibble_values(signed) {
                let t = v as f32;
                let want = r16(t * s.to_f32());
                assert_eq!(split_product(t, s.to_f32()).to_bits(), want, "{v} × {s}");
            }
        }
    }
    assert!(admitted > 1500, "{admitted} scales admitted");
    let mut admitted = 0;
    for bits in 0..=u16::MAX {
        let o = f16::from_bits(bits);
        for signed in [true, false] {
            // scale 1: the rule's offset conditions alone
            if split_level_of(Bits::Four, signed, f16::ONE, Some(o)) == Split::No {
                continue;
            }
            admitted += 1;
            for v in nibble_values(signed) {
                let d = v as f32 - o.to_f32();
                assert_eq!(split_round(d).to_bits(), r16(d), "{v} − {o}");
            }
        }
    }
    assert!(admitted > 60_000, "{admitted} offsets admitted");
}

#[test]
fn four_bit_levels_follow_the_four_bit_range() {
    let h = f16::from_f32;
    let (four, eight) = (
        |signed, s, o| split_level_of(Bits::Four, signed, s, o),
        |signed, s, o| split_level(signed, s, o),
    );
    // blocks 4-bit data admits, 8-bit data not: the largest product |v · s| is 8 · 4000 =
    // 32000 (int4), 15 · 4000 (uint4), but 128 · 4000 for int8
    assert_eq!(four(true, h(4000.0), None), Split::Exact);
    assert_eq!(four(false, h(4000.0), None), Split::Exact);
    assert_eq!(eight(true, h(4000.0), None), Split::No);
    // an offset 1/32 from an 8-bit value but 5 + 1/32 from uint4's largest: with scale 2^-10
    // the 8-bit difference's product is 2^-15 (subnormal), the 4-bit ones are normal
    let (s, o) = (h(1.0 / 1024.0), h(20.03125));
    assert_eq!(eight(false, s, Some(o)), Split::No);
    assert_eq!(four(false, s, Some(o)), Split::Rounds);
    // an offset far below: |v − o| up to 127 + 300.5 (int8) overflows with scale 160,
    // 7 + 300.5 (int4) does not
    let (s, o) = (h(160.0), h(-300.5));
    assert_eq!(eight(true, s, Some(o)), Split::No);
    assert_eq!(four(true, s, Some(o)), Split::Rounds);
    // integer offsets: exact differences
    assert_eq!(four(true, h(0.01), Some(h(-3.0))), Split::Exact);
    assert_eq!(four(false, h(0.01), Some(h(40.0))), Split::Exact);
    // blocks 4-bit data refuses too: a subnormal scale where differences round, an offset
    // 2^-8 from a data value with scale 2^-8 (product 2^-16), overflow (8 · 8192 ≥ 65520;
    // 15 · 4368 = 65520); a subnormal scale of integer data is exact
    assert_eq!(four(true, f16::from_bits(0x0010), Some(h(3.5))), Split::No);
    assert_eq!(four(true, f16::from_bits(0x0010), None), Split::Exact);
    assert_eq!(
        four(true, h(1.0 / 256.0), Some(h(3.0 + 1.0 / 256.0))),
        Split::No
    );
    assert_eq!(
        four(true, h(1.0 / 64.0), Some(h(3.0 + 1.0 / 256.0))),
        Split::Rounds
    );
    assert_eq!(four(true, h(8192.0), None), Split::No);
    assert_eq!(four(false, h(4368.0), None), Split::No);
    assert_eq!(four(false, h(4364.0), None), Split::Exact);
    assert_eq!(four(true, h(0.01), Some(f16::NAN)), Split::No);
    // and 8-bit levels are those of `split_level`
    for s in scales().into_iter().take(200) {
        for o in [None, Some(h(37.4)), Some(h(-3.0))] {
            assert_eq!(
                split_level_of(Bits::Eight, true, s, o),
                split_level(true, s, o)
            );
        }
    }
}

#[test]
fn four_bit_row_levels_are_the_least_block_level() {
    let mut rng = Rng(0x7777_1234_ABCD_0001);
    let n = 64 * 28;
    for signed in [true, false] {
        let scales: Vec<f16> = (0..n)
            .map(|_| match rng.next() % 60 {
                // refused where differences round, and always (overflow: 8 · 8192)
                0 => f16::from_bits(0x0100),
                1 => f16::from_f32(8192.0),
                _ => f16::from_f32(0.004 + (rng.next() % 1000) as f32 * 3e-5),
            })
            .collect();
        let offsets: Vec<f16> = (0..n)
            .map(|_| match rng.next() % 4 {
                0 => f16::from_f32((rng.next() % 16) as f32 - 8.0),
                _ => f16::from_f32((rng.next() % 1600) as f32 / 100.0 - 8.0),
            })
            .collect();
        for offs in [None, Some(&offsets[..])] {
            let levels = split_levels_of(Bits::Four, signed, &scales, offs, 28);
            assert_eq!(levels.len(), 64);
            for (r, &level) in levels.iter().enumerate() {
                let want = (r * 28..(r + 1) * 28)
                    .map(|b| split_level_of(Bits::Four, signed, scales[b], offs.map(|o| o[b])))
                    .min()
                    .unwrap();
                assert_eq!(level, want, "row {r}");
            }
            assert!(levels.contains(&Split::No) && levels.iter().any(|&l| l != Split::No));
        }
    }
}

#[test]
fn table_levels_are_the_rule_for_every_offset() {
    // `split_levels_of` reads each offset's range from a packed table: the same levels as
    // the rule computed directly, for every fp16 offset
    let offsets: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    for bits in [Bits::Four, Bits::Eight] {
        for signed in [true, false] {
            for s in [1.0 / 1024.0, 0.01, 3.0, 300.0].map(f16::from_f32) {
                let scales = vec![s; offsets.len()];
                let levels = split_levels_of(bits, signed, &scales, Some(&offsets), 1);
                for (o, level) in offsets.iter().zip(levels) {
                    let want = split_level_of(bits, signed, s, Some(*o));
                    assert_eq!(level, want, "{bits:?} signed {signed} scale {s} offset {o}");
                }
            }
        }
    }
}
