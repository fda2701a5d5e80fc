//! Deterministic pseudo-random test data (xorshift64): the same seed gives the same values on
//! every machine, so a failing case can be rerun.

/// A xorshift64 generator; the seed must not be zero (zero stays zero).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 pseudo-random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// An integer in `lo..=hi`.
    pub fn int(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next() % (hi - lo + 1) as u64) as i32
    }

    /// A value in `[-scale, scale]` on a grid of 2,000,001 steps.
    pub fn float(&mut self, scale: f32) -> f32 {
        (self.next() % 2_000_001) as f32 / 1_000_000.0 * scale - scale
    }

    /// `n` values of [`Rng::float`].
    pub fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.float(scale)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_sequence_and_values_stay_in_range() {
        let (mut a, mut b) = (Rng(42), Rng(42));
        let first: Vec<u64> = (0..8).map(|_| a.next()).collect();
        assert_eq!(first, (0..8).map(|_| b.next()).collect::<Vec<_>>());
        assert_eq!(first[0], 45454805674); // xorshift64 (13, 7, 17) of 42
        assert!(first.windows(2).all(|w| w[0] != w[1]));
        let mut r = Rng(7);
        for _ in 0..1000 {
            assert!((-3..=5).contains(&r.int(-3, 5)));
            assert!(r.float(0.5).abs() <= 0.5);
        }
    }
}
