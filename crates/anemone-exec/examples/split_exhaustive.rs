//! Checks the split roundings of the 8-bit kernels (`kernels::quant::split_product`,
//! `split_round`) against `f16::from_f32` over their whole domain wherever
//! `kernels::quant::splits` admits a block, and that `splits` admits the usual blocks:
//! - `r16(v · s)`: every 8-bit value `v` (−128..=255) × every fp16 scale `s` (2^16), subnormal
//!   ones included (integer data: a subnormal product is an fp16 value);
//! - `r16(v − o)`: every `v` × every fp16 offset `o`;
//! - `r16(y · s)`: every fp16 `y` × every fp16 `s` (2^32 pairs, about a minute), wherever the
//!   product is zero or an fp16 normal below 65520 (the range `splits` keeps the products in).
//!
//! Exits non-zero on a mismatch.
//!
//! `cargo run --release -p anemone-exec --example split_exhaustive`

use anemone_exec::kernels::quant::{split_product, split_round, splits};
use half::f16;

fn r16(x: f32) -> u32 {
    f16::from_f32(x).to_f32().to_bits()
}

fn main() {
    let mut bad = 0u64;
    let mut report = |what: &str, got: u32, want: u32| {
        bad += 1;
        if bad <= 10 {
            println!(
                "{what}: got {:e}, want {:e}",
                f32::from_bits(got),
                f32::from_bits(want)
            );
        }
    };
    let (mut products, mut shifts) = (0u64, 0u64);
    for (bits, signed) in (0..=u16::MAX).flat_map(|b| [(b, true), (b, false)]) {
        let h = f16::from_bits(bits);
        let (scale_ok, offset_ok) = (splits(signed, h, None), splits(signed, f16::ONE, Some(h)));
        let data = if signed { -128..=127i32 } else { 0..=255 };
        for v in data {
            let t = v as f32;
            // products of data and scale, where `splits` admits the scale
            if scale_ok {
                let (got, want) = (split_product(t, h.to_f32()).to_bits(), r16(t * h.to_f32()));
                products += 1;
                if got != want {
                    report(&format!("{v} × {:#06x}", bits), got, want);
                }
            }
            // data minus offset, where `splits` admits the offset (with scale 1)
            if offset_ok {
                let d = t - h.to_f32();
                let (got, want) = (split_round(d).to_bits(), r16(d));
                shifts += 1;
                if got != want {
                    report(&format!("{v} − {:#06x}", bits), got, want);
                }
            }
        }
    }
    println!("v·s: {products} pairs checked; v − o: {shifts} pairs checked");
    // every fp16 y × every fp16 s where the product is in the admitted range
    let mut pairs = 0u64;
    for yb in 0..=u16::MAX {
        let y = f16::from_bits(yb);
        if !y.is_finite() {
            continue;
        }
        for sb in 0..=u16::MAX {
            let s = f16::from_bits(sb);
            if !s.is_finite() {
                continue;
            }
            let p = (y.to_f32() * s.to_f32()).abs();
            if p != 0.0 && !((1.0 / 16384.0)..65520.0).contains(&p) {
                continue;
            }
            pairs += 1;
            let (got, want) = (
                split_product(y.to_f32(), s.to_f32()).to_bits(),
                r16(y.to_f32() * s.to_f32()),
            );
            if got != want {
                report(&format!("{yb:#06x} × {sb:#06x}"), got, want);
            }
        }
    }
    println!("y·s: {pairs} pairs checked");
    // the usual blocks are admitted: int8 symmetric scales, grid offsets
    let usual = [(0.01f32, None), (0.003, Some(37.4f32)), (0.02, Some(-3.0))];
    for (s, o) in usual {
        let ok = splits(true, f16::from_f32(s), o.map(f16::from_f32));
        println!("splits(int8, s = {s}, o = {o:?}) = {ok}");
        bad += u64::from(!ok);
    }
    println!("{bad} mismatches");
    std::process::exit(i32::from(bad != 0));
}
