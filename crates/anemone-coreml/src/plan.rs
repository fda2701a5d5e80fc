//! A compute plan (`MLComputePlan`) as data: per op of every function of every chunk, the device
//! Core ML prefers, the devices that support it and its estimated cost; and the summary
//! `inspect --plan` and `doctor` print (the Neural Engine's share of the cost per chunk and in
//! total, the ops not on it by type). The summary is plain arithmetic, tested on any OS; only
//! gathering the plan needs macOS 14.4+.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

/// A compute device as `MLComputePlanDeviceUsage` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Device {
    Cpu,
    Gpu,
    NeuralEngine,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
            Device::NeuralEngine => "neural-engine",
        }
    }
}

/// One operation of a function.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpPlan {
    pub function: String,
    pub op_type: String,
    /// `None` for ops Core ML does not place (constants).
    pub preferred: Option<Device>,
    pub supported: Vec<Device>,
    /// Core ML's estimated relative cost (0..1 within a function), when it gives one.
    pub cost: Option<f64>,
}

/// The plan of one package.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PackagePlan {
    pub package: PathBuf,
    pub ops: Vec<OpPlan>,
}

/// Share and the ops not on the Neural Engine, of one package or of all.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Residency {
    /// Neural Engine's share of the estimated cost (by op count when no op has a cost).
    pub ane_share: f64,
    pub placed_ops: usize,
    pub ane_ops: usize,
    /// Op type → count of placed ops whose preferred device is not the Neural Engine.
    pub off_ane_by_type: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanSummary {
    pub packages: Vec<(PathBuf, Residency)>,
    pub total: Residency,
}

/// The residency of `ops`.
pub fn residency<'a>(ops: impl IntoIterator<Item = &'a OpPlan>) -> Residency {
    let (mut cost_all, mut cost_ane) = (0.0, 0.0);
    let (mut placed, mut on_ane) = (0usize, 0usize);
    let mut off = BTreeMap::new();
    for op in ops {
        let Some(device) = op.preferred else {
            continue;
        };
        placed += 1;
        let cost = op.cost.unwrap_or(0.0).max(0.0);
        cost_all += cost;
        match device {
            Device::NeuralEngine => {
                on_ane += 1;
                cost_ane += cost;
            }
            Device::Cpu | Device::Gpu => *off.entry(op.op_type.clone()).or_insert(0) += 1,
        }
    }
    let ane_share = if cost_all > 0.0 {
        cost_ane / cost_all
    } else if placed > 0 {
        on_ane as f64 / placed as f64
    } else {
        0.0
    };
    Residency {
        ane_share,
        placed_ops: placed,
        ane_ops: on_ane,
        off_ane_by_type: off,
    }
}

/// Per package and in total. The total weighs every package's ops by their cost.
pub fn summarize(plans: &[PackagePlan]) -> PlanSummary {
    PlanSummary {
        packages: plans
            .iter()
            .map(|p| (p.package.clone(), residency(&p.ops)))
            .collect(),
        total: residency(plans.iter().flat_map(|p| &p.ops)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(t: &str, preferred: Option<Device>, cost: Option<f64>) -> OpPlan {
        OpPlan {
            function: "decode".into(),
            op_type: t.into(),
            preferred,
            supported: preferred.into_iter().collect(),
            cost,
        }
    }

    #[test]
    fn the_share_is_by_cost_and_off_ane_ops_are_counted_by_type() {
        let a = PackagePlan {
            package: "a".into(),
            ops: vec![
                op("conv", Some(Device::NeuralEngine), Some(0.6)),
                op("gather", Some(Device::Cpu), Some(0.2)),
                op("gather", Some(Device::Cpu), Some(0.2)),
                op("const", None, None),
            ],
        };
        let b = PackagePlan {
            package: "b".into(),
            ops: vec![op("conv", Some(Device::NeuralEngine), Some(1.0))],
        };
        let s = summarize(&[a, b]);
        assert!((s.packages[0].1.ane_share - 0.6).abs() < 1e-12);
        assert_eq!(s.packages[0].1.placed_ops, 3);
        assert_eq!(s.packages[0].1.off_ane_by_type["gather"], 2);
        assert_eq!(s.packages[1].1.ane_share, 1.0);
        assert!((s.total.ane_share - 0.8).abs() < 1e-12);
    }

    #[test]
    fn without_costs_the_share_is_by_op_count() {
        let r = residency(&[
            op("a", Some(Device::NeuralEngine), None),
            op("b", Some(Device::Gpu), None),
        ]);
        assert_eq!(r.ane_share, 0.5);
        assert_eq!(residency(&[]).ane_share, 0.0);
    }
}
