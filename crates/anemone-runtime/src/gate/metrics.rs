//! Agreement measures between a bundle's numbers and the reference's, in f64.

/// `a·b / (|a| |b|)`; 1 for two all-zero vectors, 0 when only one is zero, NaN if either holds a
/// non-finite value.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 && bb == 0.0 {
        return 1.0;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

/// `(index, |got − want|)` of the largest absolute difference (infinite when `got` is not
/// finite where `want` is).
pub fn max_abs_error(got: &[f32], want: &[f32]) -> (usize, f32) {
    let mut worst = (0, 0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = if g.is_finite() {
            (g - w).abs()
        } else {
            f32::INFINITY
        };
        if d > worst.1 || (d.is_nan() && !worst.1.is_nan()) {
            worst = (i, d);
        }
    }
    worst
}

/// Largest |value|; infinite when any value is inf or NaN.
pub fn max_abs(values: &[f32]) -> f32 {
    values.iter().fold(0f32, |m, v| {
        if v.is_finite() {
            m.max(v.abs())
        } else {
            f32::INFINITY
        }
    })
}

/// `log_softmax` in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64));
    let sum: f64 = logits.iter().map(|v| (*v as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    logits.iter().map(|v| *v as f64 - log_z).collect()
}

/// `KL(softmax(reference) ‖ softmax(got))` in nats.
pub fn kl_divergence(reference: &[f32], got: &[f32]) -> f64 {
    let lp = log_softmax(reference);
    let lq = log_softmax(got);
    lp.iter()
        .zip(&lq)
        .map(|(p, q)| {
            if p.is_finite() {
                p.exp() * (p - q)
            } else {
                0.0
            }
        })
        .sum()
}

/// `(top-1 id, top-2 id, top-1 − top-2 logit)`.
pub fn top2(logits: &[f32]) -> (u32, u32, f32) {
    let (mut i1, mut i2) = (0usize, usize::MAX);
    for (i, &v) in logits.iter().enumerate().skip(1) {
        if v > logits[i1] {
            i2 = i1;
            i1 = i;
        } else if i2 == usize::MAX || v > logits[i2] {
            i2 = i;
        }
    }
    if i2 == usize::MAX {
        return (i1 as u32, i1 as u32, f32::INFINITY);
    }
    (i1 as u32, i2 as u32, logits[i1] - logits[i2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_of_known_vectors() {
        assert!((cosine(&[1., 0.], &[0., 1.])).abs() < 1e-12);
        assert!((cosine(&[1., 2., 3.], &[2., 4., 6.]) - 1.0).abs() < 1e-12);
        assert!((cosine(&[1., 1.], &[1., 0.]) - 0.5f64.sqrt()).abs() < 1e-12);
        assert!(cosine(&[1., f32::INFINITY], &[1., 1.]).is_nan());
    }

    #[test]
    fn kl_is_zero_for_equal_and_matches_a_hand_computation() {
        assert!(kl_divergence(&[1., 2., 3.], &[1., 2., 3.]).abs() < 1e-12);
        // p = softmax([0, 0]) = [.5, .5], q = softmax([0, ln 3]) = [.25, .75]
        let kl = kl_divergence(&[0., 0.], &[0., 3f32.ln()]);
        let want = 0.5 * (0.5f64 / 0.25).ln() + 0.5 * (0.5f64 / 0.75).ln();
        assert!((kl - want).abs() < 1e-7, "{kl} vs {want}");
    }

    #[test]
    fn top2_and_margin() {
        assert_eq!(top2(&[0.5, 3.0, 1.0, 2.5]), (1, 3, 0.5));
        assert_eq!(top2(&[5.0, 1.0, 4.0]), (0, 2, 1.0));
        assert_eq!(top2(&[1.0, 7.0]).0, 1);
    }

    #[test]
    fn worst_error_names_the_element_and_flags_non_finite() {
        assert_eq!(max_abs_error(&[1., 2., 3.5], &[1., 2., 3.]), (2, 0.5));
        assert_eq!(max_abs_error(&[1., f32::NAN], &[1., 2.]).1, f32::INFINITY);
        assert_eq!(max_abs(&[-3., 2.]), 3.0);
        assert_eq!(max_abs(&[1., f32::NEG_INFINITY]), f32::INFINITY);
    }
}
