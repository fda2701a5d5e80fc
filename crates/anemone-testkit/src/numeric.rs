//! Numeric comparisons in named tolerance tiers; a failure names the worst element.

/// A named absolute tolerance: the name says why the bound is what it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tier {
    pub name: &'static str,
    pub abs: f32,
}

impl Tier {
    // Bounds are absolute for `assert_close`, and scaled by max(1, |want|) for
    // `assert_close_scaled`.

    /// Bit-for-bit equal.
    pub const EXACT: Tier = Tier {
        name: "exact",
        abs: 0.0,
    };
    /// fp32 sums in a different order.
    pub const F32_SUM: Tier = Tier {
        name: "fp32 summation order",
        abs: 1e-5,
    };
    /// fp32 transcendental functions (exp, tanh, erf) from different libraries.
    pub const F32_TRANSCENDENTAL: Tier = Tier {
        name: "fp32 transcendental",
        abs: 2e-6,
    };
    /// One fp16 rounding of values of magnitude ≤ 1.
    pub const F16_ONE_ROUNDING: Tier = Tier {
        name: "one fp16 rounding",
        abs: 4.9e-4,
    };
    /// An fp16-rounded sum against the f64 sum rounded to fp16: f32 accumulation may land on
    /// the other side of a rounding boundary, one fp16 ulp (2^-8 for outputs up to 4).
    pub const F16_ROUNDED_SUM: Tier = Tier {
        name: "fp16-rounded sum",
        abs: 9.8e-4 * 4.0,
    };
    /// Two fp32 forwards of a whole model against transformers (logits, hidden states).
    pub const F32_MODEL: Tier = Tier {
        name: "fp32 model vs transformers",
        abs: 1e-3,
    };

    /// A tier of its own for one comparison.
    pub const fn custom(name: &'static str, abs: f32) -> Tier {
        Tier { name, abs }
    }
}

/// `(index, got, want)` of the largest absolute difference (a NaN counts as the largest).
pub fn worst(got: &[f32], want: &[f32]) -> (usize, f32, f32) {
    assert_eq!(
        got.len(),
        want.len(),
        "length mismatch: got {}, want {}",
        got.len(),
        want.len()
    );
    let distance = |g: f32, w: f32| {
        let d = (g - w).abs();
        if d.is_nan() {
            f32::INFINITY
        } else {
            d
        }
    };
    got.iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| (i, *g, *w))
        .max_by(|a, b| distance(a.1, a.2).total_cmp(&distance(b.1, b.2)))
        .unwrap_or((0, 0.0, 0.0))
}

/// Asserts `|got − want| ≤ tier.abs` everywhere (and that `got` is finite where `want` is),
/// naming the worst element and the tier.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tier: Tier) {
    let (i, g, w) = worst(got, want);
    let diff = (g - w).abs();
    assert!(
        diff <= tier.abs || (g == w),
        "{what}: worst element {i}: got {g}, want {w} (|diff| {diff} > {} [{}])",
        tier.abs,
        tier.name
    );
}

/// The index of the largest value (the first of equals; a NaN wins): greedy decoding's choice.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] || values[best].is_nan() {
            best = i;
        }
    }
    u32::try_from(best).unwrap_or(u32::MAX)
}

/// Asserts `|got − want| ≤ tier.abs · max(1, |want|)` elementwise (absolute below 1, relative
/// above; an inf or NaN must match exactly), naming the worst element and the tier.
pub fn assert_close_scaled(what: &str, got: &[f32], want: &[f32], tier: Tier) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: length {} vs {}",
        got.len(),
        want.len()
    );
    let mut worst: Option<(usize, f32)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !w.is_finite() || !g.is_finite() {
            let same = (g.is_nan() && w.is_nan()) || g == w;
            assert!(same, "{what}: element {i}: got {g}, want {w}");
            continue;
        }
        let err = (g - w).abs() / w.abs().max(1.0);
        if worst.is_none_or(|(_, e)| err > e) {
            worst = Some((i, err));
        }
    }
    if let Some((i, err)) = worst {
        assert!(
            err <= tier.abs,
            "{what}: worst element {i}: got {}, want {} (scaled error {err:e} > {:e} [{}])",
            got[i],
            want[i],
            tier.abs,
            tier.name
        );
    }
}

/// Cosine similarity in f64.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        ab += f64::from(*x) * f64::from(*y);
        aa += f64::from(*x) * f64::from(*x);
        bb += f64::from(*y) * f64::from(*y);
    }
    ab / (aa.sqrt() * bb.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_names_the_largest_difference_and_nan_first() {
        assert_eq!(worst(&[1.0, 2.5, 3.0], &[1.0, 2.0, 3.1]), (1, 2.5, 2.0));
        assert_eq!(worst(&[1.0, f32::NAN], &[1.0, 0.0]).0, 1);
    }

    #[test]
    #[should_panic(expected = "worst element 1: got 2.5, want 2")]
    fn assert_close_fails_with_the_worst_element() {
        assert_close("x", &[1.0, 2.5], &[1.0, 2.0], Tier::F32_SUM);
    }

    #[test]
    fn cosine_of_parallel_vectors_is_one() {
        assert!((cosine(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-12);
    }
}
