//! The on-disk run state as the planner sees it: [`RunStore`] and [`LabelStore`] for
//! [`RunDb`] (the planner's in-memory twin, `MemStore`, lives beside the trait in
//! `halyard-plan`).

use halyard_plan::cost::ClassTotals;
use halyard_plan::planner::{Effect, Share};
use halyard_plan::store::{Held, Intake, ItemKey, LabelIter, LabelStore, RunStore, StoreError};
use halyard_proto::{JobId, StoredResult};

use crate::state::{RunDb, Write};

impl RunStore for RunDb {
    fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StoreError> {
        Ok(RunDb::result(self, job)?)
    }
    fn has_result(&self, job: &JobId) -> Result<bool, StoreError> {
        Ok(RunDb::has_result(self, job)?)
    }
    fn is_done(&self, item: ItemKey) -> Result<bool, StoreError> {
        Ok(RunDb::is_done(self, item)?)
    }
    fn done_count(&self) -> u64 {
        RunDb::done_count(self) as u64
    }
    fn done_count_of(&self, bench: u32, model: u32) -> u64 {
        RunDb::done_count_of(self, bench, model)
    }
    fn results_at_open(&self) -> u64 {
        RunDb::results_at_open(self)
    }
    fn costs(&self) -> Result<Vec<ClassTotals>, StoreError> {
        Ok(RunDb::costs(self)?)
    }
    fn intake(&self) -> Result<Intake, StoreError> {
        Ok(RunDb::intake(self)?)
    }
    fn held(&self, job: &JobId) -> Result<Option<(String, Vec<u8>)>, StoreError> {
        Ok(RunDb::held(self, job)?)
    }
    fn held_at_open(&self) -> Result<Held, StoreError> {
        Ok(RunDb::held_count(self)?)
    }
    fn commit(&mut self, effects: &[Effect]) -> Result<(), StoreError> {
        let writes: Vec<Write<'_>> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::StoreResult { job, pool, encoded, share } => {
                    let share = if self.shares(pool) { *share } else { Share::No };
                    Some(Write::Result(job, encoded, share))
                }
                Effect::MarkDone { item, label } => Some(Write::Label(*item, label)),
                Effect::NoteJob { job, meta } => Some(Write::JobNote(job, meta)),
                Effect::Costs(totals) => Some(Write::Costs(totals)),
                Effect::Intake(i) => Some(Write::Intake(i)),
                Effect::HoldResult { job, pool, encoded } => Some(Write::Hold(job, pool, encoded)),
                Effect::Unhold { job } => Some(Write::Unhold(job)),
                Effect::Publish { .. } => None,
            })
            .collect();
        if writes.is_empty() {
            return Ok(());
        }
        Ok(RunDb::commit_writes(self, &writes)?)
    }
}

impl LabelStore for RunDb {
    fn labels_of(&self, bench: u32, model: u32) -> LabelIter<'_> {
        Box::new(RunDb::labels_of(self, bench, model).map(|r| r.map_err(StoreError::from)))
    }
}

#[cfg(test)]
mod tests {
    use halyard_plan::cost::ClassTotals;
    use halyard_plan::planner::{Effect, Share};
    use halyard_plan::store::{Intake, ItemKey, JobMeta, LabelStore, MemStore, RunStore};
    use halyard_proto::stored::encode_result;
    use halyard_proto::{Completion, Failure, FailureKind, JobId, Outcome, StoredResult, Usage};

    use crate::state::RunDb;

    /// A seeded splitmix64.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    const JOBS: u64 = 24;
    const ITEMS: u32 = 12;

    fn job(i: u64) -> JobId {
        JobId([i as u8; 16])
    }

    fn item(i: u32) -> ItemKey {
        ItemKey { bench: i % 2, model: i % 3, item: i }
    }

    fn encoded(r: &mut Rng) -> Vec<u8> {
        let n = r.below(1000);
        let c = Completion {
            text: format!("answer {n} {}", "words ".repeat((n % 40) as usize)),
            usage: Usage { prompt_tokens: n, completion_tokens: 1, cache: None },
            latency_ms: n,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        };
        // Some dead letters, for the requeue.
        let outcome = if n.is_multiple_of(5) {
            Outcome::Failed(Failure {
                kind: FailureKind::Permanent,
                error: format!("HTTP 400: {n}"),
                http_status: Some(400),
            })
        } else {
            Outcome::Done(c)
        };
        let s = StoredResult { outcome, deliveries: 1, cached: n.is_multiple_of(2) };
        encode_result(&s).unwrap()
    }

    /// One random store effect over a few jobs and items, so that repeats of a key (in
    /// one commit and across commits) are common.
    fn effect(r: &mut Rng) -> Effect {
        let j = job(r.below(JOBS));
        match r.below(8) {
            0 | 1 => Effect::StoreResult {
                job: j,
                pool: "p".into(),
                encoded: encoded(r),
                share: [Share::No, Share::Put, Share::Used][r.below(3) as usize],
            },
            2 => Effect::MarkDone {
                item: item(r.below(ITEMS as u64) as u32),
                label: format!("label {}", r.below(5)).into_bytes(),
            },
            3 => Effect::NoteJob {
                job: j,
                meta: JobMeta {
                    pool: "p".into(),
                    stage: format!("s{}", r.below(3)),
                    model: "m".into(),
                },
            },
            4 => Effect::Costs(vec![ClassTotals { jobs: r.below(100), ..Default::default() }]),
            5 => {
                Effect::Intake(Intake { refused_messages: r.below(9), refused_results: r.below(9) })
            }
            6 => Effect::HoldResult {
                job: j,
                pool: ["a", "b"][r.below(2) as usize].into(),
                encoded: encoded(r),
            },
            _ => Effect::Unhold { job: j },
        }
    }

    /// Every read of the planner's store interface, from `s`.
    fn reads(s: &dyn RunStore, labels: &dyn LabelStore, reopened: bool) -> String {
        let mut out = String::new();
        for i in 0..JOBS {
            let j = job(i);
            out += &format!(
                "job {i}: {:?} {:?} {:?}\n",
                s.result(&j).unwrap(),
                s.has_result(&j).unwrap(),
                s.held(&j).unwrap()
            );
        }
        for i in 0..ITEMS {
            out += &format!("item {i}: {:?}\n", s.is_done(item(i)).unwrap());
        }
        out += &format!(
            "done {} costs {:?} intake {:?}\n",
            s.done_count(),
            s.costs().unwrap(),
            s.intake().unwrap()
        );
        for (b, m) in [(0, 0), (0, 1), (1, 2), (1, 0)] {
            let l: Vec<_> = labels.labels_of(b, m).collect::<Result<_, _>>().unwrap();
            out += &format!("labels {b}/{m}: {} {l:?}\n", s.done_count_of(b, m));
        }
        if reopened {
            out += &format!("at open: {} {:?}\n", s.results_at_open(), s.held_at_open().unwrap());
        }
        out
    }

    /// Issue 51: what the planner says the shared cache makes of a stored result reaches
    /// the sharing task by the right road, for pools that share only, and once per job:
    /// a paid completion is marked (durable, offered), an answer read from the bucket is
    /// not marked but listed as used (its entry's use is counted), anything else neither.
    #[test]
    fn stored_results_reach_the_shared_cache_as_the_planner_says() {
        let run = tempfile::tempdir().unwrap();
        let mut db = RunDb::open(&run.path().join("state")).unwrap();
        db.share_pools(["shared".to_string()].into());
        let mut r = Rng(7);
        let store = |i: u64, pool: &str, share: Share, r: &mut Rng| Effect::StoreResult {
            job: job(i),
            pool: pool.into(),
            encoded: encoded(r),
            share,
        };
        let effects = [
            store(1, "shared", Share::Put, &mut r),
            store(2, "shared", Share::Used, &mut r),
            store(3, "shared", Share::No, &mut r),
            store(4, "private", Share::Put, &mut r),
            store(5, "private", Share::Used, &mut r),
            // A second result for a job stored already: neither marked nor used again.
            store(2, "shared", Share::Used, &mut r),
        ];
        RunStore::commit(&mut db, &effects).unwrap();
        RunStore::commit(&mut db, &[store(1, "shared", Share::Put, &mut r)]).unwrap();
        assert_eq!(db.take_marked(), (vec![job(1)], vec![job(2)]));
        assert_eq!(db.share_marks().count().unwrap(), 1);
        assert_eq!(db.take_marked(), (vec![], vec![]), "taken twice");
    }

    /// Issue 32: the run state on disk behaves as its in-memory twin, which the planner's
    /// tests rely on: the same random commits (repeated keys within and across commits,
    /// holds and unholds), the store reopened after each, the same answer to every read.
    /// Issue 50: also after a crash after each step (a copy of the files of the open
    /// store), after a compaction every seventh step and after the dead letters are put
    /// back every eleventh (some results are failures).
    #[test]
    fn the_run_state_equals_its_in_memory_twin() {
        let mut requeued = 0;
        for seed in 1..=4u64 {
            let mut r = Rng(seed);
            let run = tempfile::tempdir().unwrap();
            let state = run.path().join("state");
            let mut twin = MemStore::default();
            let mut db = RunDb::open(&state).unwrap();
            for step in 0..40 {
                let effects: Vec<Effect> = (0..r.below(12)).map(|_| effect(&mut r)).collect();
                twin.commit(&effects).unwrap();
                RunStore::commit(&mut db, &effects).unwrap();
                assert_eq!(
                    reads(&db, &db, false),
                    reads(&twin, &twin, false),
                    "seed {seed}, step {step}, after {effects:?}"
                );
                // A crash after this step: the store's files as a killed process leaves
                // them (what it wrote is in the files; no close, no compaction), opened
                // from a copy while the store stays open. Its memtables (8 MiB) never
                // fill here, so no flush runs while it is copied.
                let crashed = tempfile::tempdir().unwrap();
                halyard_tests::copy_tree(&state, crashed.path());
                let after_crash = RunDb::open(crashed.path()).unwrap();
                assert_eq!(
                    reads(&after_crash, &after_crash, true),
                    reads(&twin, &twin, true),
                    "seed {seed}, step {step}, after a crash"
                );
                drop(after_crash);
                if step % 3 == 2 {
                    drop(db);
                    db = RunDb::open(&state).unwrap();
                    assert_eq!(
                        reads(&db, &db, true),
                        reads(&twin, &twin, true),
                        "seed {seed}, step {step}, reopened"
                    );
                }
                if step % 7 == 6 {
                    // Compacted as `halyard gc` compacts it (a rewrite into a new engine
                    // directory, swapped in), then used on.
                    drop(db);
                    let c = halyard_store::compact(&state, crate::state::OPTIONS).unwrap();
                    assert!(c.after > 0, "{c:?}");
                    db = RunDb::open(&state).unwrap();
                    assert_eq!(
                        reads(&db, &db, true),
                        reads(&twin, &twin, true),
                        "seed {seed}, step {step}, compacted"
                    );
                }
                if step % 11 == 10 {
                    // The dead letters put back, as `halyard dead-letters requeue` does.
                    drop(db);
                    let put_back = crate::dead_letters::requeue(run.path()).unwrap();
                    requeued += put_back.jobs.len();
                    twin.requeue();
                    db = RunDb::open(&state).unwrap();
                    assert_eq!(
                        reads(&db, &db, true),
                        reads(&twin, &twin, true),
                        "seed {seed}, step {step}, requeued"
                    );
                }
            }
        }
        // Some of the requeues put dead letters back.
        assert!(requeued > 0);
    }
}
