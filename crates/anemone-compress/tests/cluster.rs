//! 1-D k-means against brute force: the DP is optimal over ALL assignments (not only contiguous
//! ones), Lloyd never beats it and lands close to it.

mod common;

use anemone_compress::{cluster, KmeansAlgorithm, SortedPoints};
use common::Rng;

/// Tolerance tier for sums of squares computed two ways (prefix sums vs direct), relative to
/// the data's weighted second moment.
const SSE_REL_TOL: f64 = 1e-9;

/// Minimum weighted SSE over every assignment of the points to at most k labels.
fn brute_force(points: &[(f64, f64)], k: usize) -> f64 {
    let m = points.len();
    let mut labels = vec![0usize; m];
    let mut best = f64::INFINITY;
    loop {
        let mut sse = 0.0;
        for c in 0..k {
            let (mut w, mut wx) = (0.0, 0.0);
            for (p, &l) in points.iter().zip(&labels) {
                if l == c {
                    w += p.1;
                    wx += p.1 * p.0;
                }
            }
            if w > 0.0 {
                let mean = wx / w;
                for (p, &l) in points.iter().zip(&labels) {
                    if l == c {
                        sse += p.1 * (p.0 - mean) * (p.0 - mean);
                    }
                }
            }
        }
        best = best.min(sse);
        // next assignment in base k
        let mut i = 0;
        loop {
            if i == m {
                return best;
            }
            labels[i] += 1;
            if labels[i] < k {
                break;
            }
            labels[i] = 0;
            i += 1;
        }
    }
}

fn random_points(rng: &mut Rng, m: usize, weighted: bool) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = (0..m)
        .map(|_| {
            let w = if weighted {
                0.1 + 3.0 * rng.uniform()
            } else {
                1.0
            };
            // heavy tails and near-duplicates make local optima likely
            (rng.normal().powi(3), w)
        })
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts
}

#[test]
fn optimal_matches_brute_force_over_all_assignments() {
    let mut rng = Rng::new(7);
    for trial in 0..60 {
        let m = 3 + trial % 6; // 3..=8 points
        let k = 1 + trial % 4; // 1..=4 clusters
        let pts = random_points(&mut rng, m, trial % 2 == 1);
        let sp = SortedPoints::from_sorted(&pts);
        let got = cluster(&sp, k, KmeansAlgorithm::Optimal);
        let want = brute_force(&pts, k);
        // prefix sums lose precision relative to the data's second moment, not to the SSE
        let scale: f64 = pts.iter().map(|p| p.1 * p.0 * p.0).sum();
        assert!(
            (got.cost - want).abs() <= SSE_REL_TOL * (want + scale),
            "trial {trial} (m={m}, k={k}): DP cost {} != brute force {want}; points {pts:?}",
            got.cost
        );
        // the reported cost is the cost of the reported partition
        let direct: f64 = got
            .boundaries
            .windows(2)
            .zip(&got.centroids)
            .map(|(r, &c)| {
                pts[r[0]..r[1]]
                    .iter()
                    .map(|p| p.1 * (p.0 - c).powi(2))
                    .sum::<f64>()
            })
            .sum();
        assert!((direct - got.cost).abs() <= SSE_REL_TOL * (direct + scale));
    }
}

#[test]
fn lloyd_is_never_better_than_optimal_and_close_on_larger_inputs() {
    let mut rng = Rng::new(11);
    for (m, k) in [(8, 3), (200, 4), (2000, 16), (5000, 64), (3000, 256)] {
        let pts = random_points(&mut rng, m, true);
        let sp = SortedPoints::from_sorted(&pts);
        let opt = cluster(&sp, k, KmeansAlgorithm::Optimal);
        let lloyd = cluster(&sp, k, KmeansAlgorithm::LLOYD);
        assert_eq!(lloyd.boundaries.len(), k.min(m) + 1);
        assert!(
            lloyd.cost >= opt.cost * (1.0 - SSE_REL_TOL),
            "m={m} k={k}: Lloyd {} below the optimum {}",
            lloyd.cost,
            opt.cost
        );
        // measured: within a few percent on these heavy-tailed inputs
        assert!(
            lloyd.cost <= opt.cost * 1.05,
            "m={m} k={k}: Lloyd {} more than 5% above the optimum {}",
            lloyd.cost,
            opt.cost
        );
    }
}

#[test]
fn boundaries_are_strictly_increasing_and_clusters_sorted() {
    let mut rng = Rng::new(3);
    let pts = random_points(&mut rng, 500, false);
    let sp = SortedPoints::from_sorted(&pts);
    for alg in [KmeansAlgorithm::Optimal, KmeansAlgorithm::LLOYD] {
        let c = cluster(&sp, 16, alg);
        assert_eq!(c.boundaries.first(), Some(&0));
        assert_eq!(c.boundaries.last(), Some(&500));
        assert!(c.boundaries.windows(2).all(|w| w[0] < w[1]), "{alg:?}");
        assert!(c.centroids.windows(2).all(|w| w[0] < w[1]), "{alg:?}");
    }
}

#[test]
fn as_many_clusters_as_points_costs_nothing() {
    let pts = [(-1.0, 1.0), (0.5, 2.0), (3.0, 1.0)];
    let sp = SortedPoints::from_sorted(&pts);
    for k in [3, 4, 256] {
        let c = cluster(&sp, k, KmeansAlgorithm::Optimal);
        assert_eq!(c.cost, 0.0);
        assert_eq!(c.centroids, vec![-1.0, 0.5, 3.0]);
    }
}
