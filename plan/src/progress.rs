//! A run's live figures ([`Progress`]), published by the coordinator on a watch channel
//! after every committed batch: what `halyard run` draws, what the status file and the
//! metrics endpoint report.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::latency::LatencyHistogram;
use crate::store::ItemKey;
use crate::store::RunStore;
use crate::sweep::Sweep;

/// Live figures of a run: what the coordinator knows after every committed batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub run: Option<Uuid>,
    /// What every reader of the run's status sees (`halyard status`, `status.json`,
    /// `/metrics`, the progress display).
    pub figures: Figures,
    /// Batches of results committed by this process (one flush each).
    pub result_batches: u64,
    /// Publish-to-result latency of the jobs this process published.
    pub latency: LatencyHistogram,
}

/// A run's figures as they travel: the part of [`Progress`] that the one run-status type
/// on the wire (`halyard_node::status::Status`: `status.json`, the broker's status
/// bucket, `halyard status --json`) carries, flattened into it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    pub items_total: u64,
    pub items_done: u64,
    pub results: u64,
    pub duplicates: u64,
    pub dead_letters: u64,
    pub published: u64,
    /// Results messages refused (undecodable, of another run, a worker's refusal of a
    /// forged job, naming an unusable object): acked and never stored.
    #[serde(default)]
    pub refused_messages: u64,
    /// Results refused: from a pool that does not serve their job, or for a job never
    /// planned once the results held aside were at their bound (`halyard_plan::planner`).
    #[serde(default)]
    pub refused_results: u64,
    /// Results held aside now for jobs not planned (yet).
    #[serde(default)]
    pub held_results: u64,
    /// Items planned and unfinished (bounded by the window).
    pub active: u64,
    /// Items per benchmark and model under test.
    pub targets: Vec<TargetProgress>,
    /// Tokens, calls and cost per (model, stage), all processes of the run.
    pub costs: Vec<crate::cost::ClassTotals>,
    /// `[run] max_cost` / `--max-cost`, and paid jobs held back because it was reached.
    pub max_cost: Option<f64>,
    pub held: u64,
    /// Pools of the run whose endpoint is down now (their workers paused them).
    #[serde(default)]
    pub outages: Vec<crate::outage::PoolOutage>,
    /// Provider batches of the run's batch pools that are not over (`mode = "batch"`):
    /// the run is waiting for them. (`batches` in the status files of earlier builds.)
    #[serde(default, alias = "batches")]
    pub provider_batches: Vec<halyard_proto::provider_batch::BatchGroup>,
    /// Accepted results not in the shared result cache when the coordinator stopped
    /// sharing (the bucket was away or full): marked in the run state, and shared by the
    /// run's next coordinator (issue 51).
    #[serde(default)]
    pub unshared: u64,
}

/// Items of one benchmark and model under test.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetProgress {
    pub bench: u32,
    pub pipeline: String,
    pub model: String,
    pub done: u64,
    pub total: u64,
}

/// Every target of a sweep with the items already finished in `store`.
pub fn targets(sweep: &Sweep, store: &impl RunStore) -> Vec<TargetProgress> {
    let mut out = Vec::new();
    for (b, bench) in sweep.benchmarks.iter().enumerate() {
        for (m, model) in bench.ops().model_names().into_iter().enumerate() {
            out.push(TargetProgress {
                bench: b as u32,
                pipeline: bench.pipeline().to_string(),
                model,
                done: store.done_count_of(b as u32, m as u32),
                total: bench.item_count() as u64,
            });
        }
    }
    out
}

impl Figures {
    /// USD spent so far, over every (model, stage): `0.0` while nothing is counted. A fold
    /// from `+0.0`, not `Iterator::sum`: the sum of no `f64` is `-0.0` (IEEE 754's
    /// additive identity), which a terminal shows as `$-0.0000` while a run starts.
    pub fn spent(&self) -> f64 {
        self.costs.iter().fold(0.0, |total, c| total + c.cost)
    }
}

impl Progress {
    /// An item finished.
    pub(crate) fn item_done(&mut self, key: ItemKey) {
        let f = &mut self.figures;
        f.items_done += 1;
        // Targets of a benchmark are consecutive, in model order.
        if let Some(first) = f.targets.iter().position(|x| x.bench == key.bench) {
            if let Some(t) = f.targets.get_mut(first + key.model as usize) {
                t.done += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::ClassTotals;

    /// Issue 45: a run that has counted nothing has spent 0.0, positive zero (IEEE 754:
    /// `-0.0` has the sign bit set, `0x8000_0000_0000_0000`, and Rust prints it
    /// `-0.0000`), shown as `$0.0000`; counted costs add up.
    #[test]
    fn nothing_spent_is_positive_zero() {
        let mut f = Figures::default();
        assert_eq!(f.spent().to_bits(), 0);
        assert_eq!(format!("${:.4}", f.spent()), "$0.0000");
        // Classes with no price count -0.0 or 0.0 alike.
        let class = |cost: f64| ClassTotals { cost, ..ClassTotals::default() };
        f.costs = vec![class(-0.0), class(0.0)];
        assert_eq!(format!("${:.4}", f.spent()), "$0.0000");
        f.costs = vec![class(0.25), class(0.5)];
        assert_eq!(f.spent(), 0.75);
    }
}
