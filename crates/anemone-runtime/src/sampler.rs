//! Next-token selection: greedy (temperature 0) or sampling with temperature, top-k and top-p
//! (applied in that order, as transformers does), from a seeded RNG.

use crate::error::RuntimeError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy (argmax); otherwise logits are divided by it before the softmax.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability mass reaches `p`.
    pub top_p: Option<f32>,
    /// RNG seed; `None` = from the operating system's entropy.
    pub seed: Option<u64>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: None,
        }
    }
}

impl SamplerConfig {
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let bad = |option, problem: String| Err(RuntimeError::Sampler { option, problem });
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature", format!("{} is not ≥ 0", self.temperature));
        }
        if self.top_k == Some(0) {
            return bad("top_k", "must be ≥ 1".into());
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return bad("top_p", format!("{p} is not in (0, 1]"));
            }
        }
        Ok(())
    }
}

/// Index of the largest logit; the first one on ties (as `torch.argmax`). NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

/// The tokens still eligible after temperature, top-k and top-p, with their renormalised
/// probabilities, most likely first.
pub fn candidates(
    logits: &[f32],
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
) -> Vec<(u32, f32)> {
    let mut order: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (i as u32, v / temperature))
        .collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if let Some(k) = top_k {
        order.truncate(k.max(1));
    }
    let max = order.first().map_or(0.0, |c| c.1);
    let mut total = 0f64;
    for c in order.iter_mut() {
        c.1 = (c.1 - max).exp();
        total += c.1 as f64;
    }
    for c in order.iter_mut() {
        c.1 = (c.1 as f64 / total) as f32;
    }
    if let Some(p) = top_p {
        let mut mass = 0f32;
        let keep = order
            .iter()
            .position(|c| {
                mass += c.1;
                mass >= p
            })
            .map_or(order.len(), |i| i + 1);
        order.truncate(keep);
        let kept: f32 = order.iter().map(|c| c.1).sum();
        order.iter_mut().for_each(|c| c.1 /= kept);
    }
    order
}

pub struct Sampler {
    config: SamplerConfig,
    rng: StdRng,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Result<Self, RuntimeError> {
        config.validate()?;
        let rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        Ok(Self { config, rng })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Picks the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.config.temperature == 0.0 {
            return argmax(logits);
        }
        let pool = candidates(
            logits,
            self.config.temperature,
            self.config.top_k,
            self.config.top_p,
        );
        let mut u: f32 = self.rng.gen();
        for &(id, p) in &pool {
            if u < p {
                return id;
            }
            u -= p;
        }
        pool.last().map_or_else(|| argmax(logits), |c| c.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: Option<usize>, top_p: Option<f32>, seed: u64) -> Sampler {
        Sampler::new(SamplerConfig {
            temperature,
            top_k,
            top_p,
            seed: Some(seed),
        })
        .unwrap()
    }

    #[test]
    fn greedy_is_argmax_with_first_tie_winning() {
        assert_eq!(argmax(&[0.0, 3.0, 1.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -2.0]), 1);
        let mut s = sampler(0.0, Some(1), None, 1);
        assert_eq!(s.sample(&[0.1, 0.5, 0.2]), 1);
    }

    #[test]
    fn top_k_keeps_only_the_k_largest_and_renormalises() {
        let logits = [1.0, 4.0, 3.0, 2.0, 0.0];
        let c = candidates(&logits, 1.0, Some(2), None);
        assert_eq!(c.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 2]);
        let e = 1f32.exp();
        assert!((c[0].1 - e / (e + 1.0)).abs() < 1e-6);
        let mut s = sampler(1.0, Some(2), None, 7);
        for _ in 0..500 {
            assert!(matches!(s.sample(&logits), 1 | 2));
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // Probabilities 0.5, 0.3, 0.15, 0.05.
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let ids = |p| {
            candidates(&logits, 1.0, None, Some(p))
                .iter()
                .map(|c| c.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(0.5), vec![0]);
        assert_eq!(ids(0.6), vec![0, 1]);
        assert_eq!(ids(0.9), vec![0, 1, 2]);
        assert_eq!(ids(1.0), vec![0, 1, 2, 3]);
        let kept = candidates(&logits, 1.0, None, Some(0.6));
        assert!((kept[0].1 - 0.625).abs() < 1e-5 && (kept[1].1 - 0.375).abs() < 1e-5);
    }

    #[test]
    fn sampling_frequencies_follow_the_distribution() {
        let logits: Vec<f32> = [0.6f32, 0.3, 0.1].iter().map(|p| p.ln()).collect();
        let mut s = sampler(1.0, None, None, 42);
        let mut counts = [0usize; 3];
        let n = 20000;
        for _ in 0..n {
            counts[s.sample(&logits) as usize] += 1;
        }
        for (c, p) in counts.iter().zip([0.6, 0.3, 0.1]) {
            let f = *c as f64 / n as f64;
            assert!((f - p).abs() < 0.02, "frequency {f} for probability {p}");
        }
        // Temperature 0.5 sharpens: p ∝ p², so the first token's share grows to 0.6²/0.46.
        let mut s = sampler(0.5, None, None, 42);
        let first = (0..n).filter(|_| s.sample(&logits) == 0).count() as f64 / n as f64;
        assert!(
            (first - 0.36 / 0.46).abs() < 0.02,
            "sharpened frequency {first}"
        );
    }

    #[test]
    fn same_seed_same_tokens_different_seed_different_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut s = sampler(1.0, None, Some(0.95), seed);
            (0..64).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }

    #[test]
    fn rejects_invalid_options() {
        for config in [
            SamplerConfig {
                temperature: -1.0,
                ..Default::default()
            },
            SamplerConfig {
                top_k: Some(0),
                ..Default::default()
            },
            SamplerConfig {
                top_p: Some(1.5),
                ..Default::default()
            },
            SamplerConfig {
                top_p: Some(0.0),
                ..Default::default()
            },
        ] {
            assert!(matches!(
                Sampler::new(config),
                Err(RuntimeError::Sampler { .. })
            ));
        }
    }
}
