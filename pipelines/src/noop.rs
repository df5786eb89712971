//! The `noop` pipeline: one job per item whose answer does not matter, for measuring
//! the job path itself.
//!
//! A noop benchmark has `jobs` items per model under test; item `i` needs one job
//! (stage `noop`, the user message `noop item <i>`). Its jobs travel the whole path of
//! any other job: planned by the coordinator, published with `Nats-Msg-Id`, pulled by a
//! worker, checkpointed, published back, acknowledged, counted once, reported.
//! Only the model call is free: the sweep gives the pipeline models with
//! `backend = "noop"`, which the worker answers at once.
//!
//! Like every planner here, [`evaluate`] is a pure function of the configuration, the
//! item and the results known so far, and [`Tally`] turns labels into a [`Report`].

use serde::{Deserialize, Serialize};

use crate::common::{JobOutcome, JobRequest, ModelSpec, Plan, ResultLookup};
use halyard_proto::ChatMessage;

/// The pipeline name in job keys.
pub const PIPELINE: &str = "noop";
/// The only stage.
pub const STAGE: &str = "noop";
/// Bumped if the request of an item ever changes.
pub const STAGE_VERSION: u32 = 1;

/// How one model runs the noop benchmark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// The model under test (normally `backend = "noop"`).
    pub model: ModelSpec,
}

impl Config {
    /// The one job of item `item`.
    pub fn request(&self, item: u64) -> JobRequest {
        self.model.request(
            PIPELINE,
            STAGE,
            STAGE_VERSION,
            vec![ChatMessage::user(format!("noop item {item}"))],
            0,
        )
    }
}

/// The final label of one item: kept small, a million of them are stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemLabel {
    pub item: u64,
    /// The job's error when it became a dead letter; `None` when it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Item `item` is done once its job has a terminal result.
pub fn evaluate(cfg: &Config, item: u64, results: &dyn ResultLookup) -> Plan<ItemLabel> {
    let req = cfg.request(item);
    match results.get(&req.id()) {
        None => Plan::Waiting(vec![req]),
        Some(JobOutcome::Done(_)) => Plan::Done(ItemLabel { item, error: None }),
        Some(JobOutcome::Failed(e)) => Plan::Done(ItemLabel { item, error: Some(e.to_string()) }),
    }
}

/// The figures of one (benchmark, model).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub pipeline: String,
    pub model: String,
    /// Items the benchmark has (`jobs` in the sweep).
    pub items: u64,
    /// Items with a label, each counted once.
    pub labelled: u64,
    pub completed: u64,
    pub dead_letters: u64,
    /// Labels for items outside `0..items`, or a second label for an item (never
    /// expected; counted rather than trusted).
    pub ignored: u64,
}

/// Folds labels into a [`Report`] without holding them: labels arrive in item order from
/// the run state, and a million of them need not be in memory at once.
#[derive(Clone, Debug)]
pub struct Tally {
    report: Report,
    last: Option<u64>,
}

impl Tally {
    pub fn new(model: &str, items: u64) -> Tally {
        Tally {
            report: Report {
                pipeline: PIPELINE.into(),
                model: model.into(),
                items,
                ..Report::default()
            },
            last: None,
        }
    }

    /// Count one label. Labels must come in increasing item order (the state's key
    /// order); a repeated or out-of-range item is counted as ignored.
    pub fn add(&mut self, label: &ItemLabel) {
        let r = &mut self.report;
        if label.item >= r.items || self.last.is_some_and(|l| label.item <= l) {
            r.ignored += 1;
            return;
        }
        self.last = Some(label.item);
        r.labelled += 1;
        match label.error {
            None => r.completed += 1,
            Some(_) => r.dead_letters += 1,
        }
    }

    pub fn finish(self) -> Report {
        self.report
    }
}

/// The report as a Markdown section.
pub fn render_markdown(r: &Report) -> String {
    format!(
        "## noop: `{}`\n\n| items | labelled | completed | dead letters |\n|---|---|---|---|\n| {} | {} | {} | {} |\n",
        r.model, r.items, r.labelled, r.completed, r.dead_letters
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_proto::{Completion, JobId, ModelRef, Outcome, Usage};
    use std::collections::HashMap;

    fn cfg(name: &str) -> Config {
        Config {
            model: ModelSpec {
                model_ref: ModelRef {
                    backend: "noop".into(),
                    endpoint: String::new(),
                    model: name.into(),
                },
                ..crate::common::test_model(name)
            },
        }
    }

    fn done() -> Outcome {
        Outcome::Done(Completion {
            text: String::new(),
            usage: Usage::default(),
            latency_ms: 0,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        })
    }

    /// An item waits for exactly its one job, then is done; a dead letter is labelled with its error.
    #[test]
    fn one_job_per_item() {
        let c = cfg("m");
        let mut known: HashMap<JobId, Outcome> = HashMap::new();
        let jobs = match evaluate(&c, 7, &known) {
            Plan::Waiting(j) => j,
            d => panic!("{d:?}"),
        };
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].key.pipeline, "noop");
        assert_eq!(jobs[0].pool, "m");
        known.insert(jobs[0].id(), done());
        assert_eq!(evaluate(&c, 7, &known), Plan::Done(ItemLabel { item: 7, error: None }));
        let other = c.request(8).id();
        known.insert(
            other,
            Outcome::Failed(halyard_proto::Failure {
                kind: halyard_proto::FailureKind::Permanent,
                error: "boom".into(),
                http_status: None,
            }),
        );
        assert_eq!(
            evaluate(&c, 8, &known),
            Plan::Done(ItemLabel { item: 8, error: Some("boom".into()) })
        );
    }

    /// Job ids differ between items and between models, and are stable.
    #[test]
    fn ids_are_distinct_and_stable() {
        let (a, b) = (cfg("a"), cfg("b"));
        let mut seen = std::collections::HashSet::new();
        for i in 0..1000 {
            assert!(seen.insert(a.request(i).id()));
            assert!(seen.insert(b.request(i).id()));
        }
        assert_eq!(a.request(3).id(), cfg("a").request(3).id());
    }

    /// The tally counts each item once and sets aside repeats and out-of-range items.
    #[test]
    fn tally_counts_each_item_once() {
        let mut t = Tally::new("m", 4);
        for l in [
            ItemLabel { item: 0, error: None },
            ItemLabel { item: 1, error: Some("x".into()) },
            ItemLabel { item: 1, error: None },
            ItemLabel { item: 3, error: None },
            ItemLabel { item: 9, error: None },
        ] {
            t.add(&l);
        }
        let r = t.finish();
        assert_eq!((r.items, r.labelled, r.completed, r.dead_letters, r.ignored), (4, 3, 2, 1, 2));
        assert!(render_markdown(&r).contains("| 4 | 3 | 2 | 1 |"));
    }
}
