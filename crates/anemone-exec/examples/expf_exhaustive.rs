//! Checks `kernels::expf_avx512::exp16` against `f32::exp` on all 2³² f32 bit patterns (a few
//! minutes on one core). Exits non-zero on the first few mismatches.
//!
//! `cargo run --release -p anemone-exec --example expf_exhaustive`

fn main() {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        use anemone_exec::kernels::expf_avx512;
        println!("self-check on the sample set: {}", expf_avx512::verified());
        let mut bad = 0u64;
        let mut buf = vec![0.0f32; 1 << 16];
        for hi in 0..=u16::MAX as u32 {
            for (lo, v) in buf.iter_mut().enumerate() {
                *v = f32::from_bits(hi << 16 | lo as u32);
            }
            // SAFETY: AVX-512F was detected above.
            unsafe { expf_avx512::exp_all(&mut buf) };
            for (lo, g) in buf.iter().enumerate() {
                let x = f32::from_bits(hi << 16 | lo as u32);
                let want = x.exp();
                if g.to_bits() != want.to_bits() {
                    bad += 1;
                    if bad <= 10 {
                        println!("exp({x:e} = {:#010x}) = {g:e}, want {want:e}", x.to_bits());
                    }
                }
            }
        }
        println!("all 2^32 arguments: {bad} mismatches");
        std::process::exit(i32::from(bad != 0));
    }
    println!("no AVX-512F on this CPU: nothing to check");
}
