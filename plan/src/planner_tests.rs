//! The planner over the in-memory store: counting once, the window, recovery, dead
//! letters and the cost limit, without a store on disk, tokio or NATS.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

use halyard_proto::{Completion, Job, JobId, JobResult, Outcome, Usage};
use uuid::Uuid;

use crate::planner::{publishes, Arrival, Effect, Event, Planner, MSG_ID_ROUND_BASE};
use crate::store::ItemKey;
use crate::store::{MemStore, RunStore};
use crate::sweep::{parse, Sweep};

fn noop_sweep(jobs: u32, extra: &str) -> Sweep {
    let text = format!(
        "name = \"t\"\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n{extra}\n\
         [[benchmark]]\npipeline = \"noop\"\njobs = {jobs}\nmodels = [\"free\"]\n"
    );
    parse(Path::new("/tmp/s.toml"), &text).unwrap()
}

fn with_window(jobs: u32, window: usize) -> Sweep {
    noop_sweep(jobs, &format!("[run]\nwindow = {window}\n"))
}

/// A worker's answer to `job`: its last message echoed back.
fn answer(job: &Job, worker: &str) -> JobResult {
    let text = job.key.messages.last().map(|m| m.content.clone()).unwrap_or_default();
    JobResult {
        v: halyard_proto::WIRE_VERSION,
        job: job.id,
        run: job.run,
        outcome: Outcome::Done(Completion {
            text,
            usage: Usage::default(),
            latency_ms: 1,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        }),
        deliveries: 1,
        worker: worker.into(),
        cached: false,
    }
}

/// Results as they arrive on the subject of the one pool of these tests' sweeps (`free`,
/// their one model's name).
fn results(rs: &[JobResult]) -> Event {
    Event::Results(rs.iter().map(|r| Arrival { pool: "free".into(), result: r.clone() }).collect())
}

/// Carry out the store effects; return the jobs to publish, with their rounds.
fn apply(store: &mut MemStore, fx: Vec<Effect>) -> Vec<(Job, Option<u32>)> {
    store.commit(&fx).unwrap();
    publishes(fx).collect()
}

fn jobs(published: &[(Job, Option<u32>)]) -> Vec<Job> {
    published.iter().map(|(j, _)| j.clone()).collect()
}

fn items(fx: &[Effect]) -> Vec<u32> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::MarkDone { item, .. } => Some(item.item),
            _ => None,
        })
        .collect()
}

fn stored(fx: &[Effect]) -> usize {
    fx.iter().filter(|e| matches!(e, Effect::StoreResult { .. })).count()
}

fn key(item: u32) -> ItemKey {
    ItemKey { bench: 0, model: 0, item }
}

/// A result is stored and counted once, whatever duplicates arrive in the same batch or
/// later; the first one stays.
#[test]
fn results_count_once() {
    let sweep = with_window(3, 3);
    let mut p = Planner::open(&sweep, MemStore::default(), Uuid::now_v7(), HashMap::new()).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    let published = jobs(&apply(p.store_mut(), fx));
    assert_eq!(published.len(), 3);
    let first = answer(&published[0], "w1");
    // The second copy differs in what the store keeps: served from a checkpoint.
    let again = JobResult { cached: true, ..answer(&published[0], "w2") };
    let other = answer(&published[1], "w1");
    let batch = [first, again.clone(), other];
    let fx = p.step(results(&batch), Instant::now()).unwrap();
    assert_eq!(stored(&fx), 2, "the copy in the same batch is not stored: {fx:?}");
    assert_eq!(items(&fx), vec![0, 1]);
    apply(p.store_mut(), fx);
    let redelivered = [again];
    let fx = p.step(results(&redelivered), Instant::now()).unwrap();
    assert_eq!((stored(&fx), items(&fx).len()), (0, 0), "a redelivered copy: {fx:?}");
    let progress = p.progress().clone();
    assert_eq!(
        (progress.figures.results, progress.figures.duplicates, progress.figures.items_done),
        (2, 2, 2)
    );
    let kept = p.store().result(&published[0].id).unwrap().unwrap();
    assert!(!kept.cached, "the first result stays");
}

/// Each lane plans at most `window` items; every finished item lets exactly one more in,
/// and the run ends when every item is done.
#[test]
fn window_bounds_planning() {
    let sweep = with_window(10, 2);
    let mut p = Planner::open(&sweep, MemStore::default(), Uuid::now_v7(), HashMap::new()).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    let mut queue = jobs(&apply(p.store_mut(), fx));
    assert_eq!(queue.len(), 2);
    assert_eq!(p.progress().figures.active, 2);
    let mut done = 0;
    while let Some(job) = queue.first().cloned() {
        queue.remove(0);
        let a = [answer(&job, "w")];
        let fx = p.step(results(&a), Instant::now()).unwrap();
        done += items(&fx).len();
        let more = jobs(&apply(p.store_mut(), fx));
        assert!(more.len() <= 1, "one finished item lets one more in: {more:?}");
        queue.extend(more);
        assert!(p.progress().figures.active <= 2);
        assert!(p.outstanding() <= 2);
    }
    assert_eq!(done, 10);
    assert!(p.all_done());
}

/// A restarted planner skips the items an earlier process finished and plans the rest
/// with the same job ids; a result that arrived while no coordinator ran (read after the
/// window is planned, before its jobs are published) finishes its item, is counted
/// against the model and stage of its job, and its job is then not published again.
#[test]
fn resume_skips_finished_items_and_takes_the_backlog_before_publishing() {
    let sweep = with_window(4, 4);
    let run = Uuid::now_v7();
    let (store, published) = {
        let mut p = Planner::open(&sweep, MemStore::default(), run, HashMap::new()).unwrap();
        let fx = p.step(Event::Fill, Instant::now()).unwrap();
        let published = jobs(&apply(p.store_mut(), fx));
        let a = [answer(&published[0], "w")];
        let fx = p.step(results(&a), Instant::now()).unwrap();
        apply(p.store_mut(), fx);
        // The process dies here; job 1 is answered while no coordinator runs.
        (std::mem::take(p.store_mut()), published)
    };
    let mut p = Planner::open(&sweep, store, run, HashMap::new()).unwrap();
    assert_eq!(p.progress().figures.items_done, 1);
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    let planned: Vec<JobId> = jobs(&apply(p.store_mut(), fx)).iter().map(|j| j.id).collect();
    assert_eq!(planned, vec![published[1].id, published[2].id, published[3].id], "same ids");
    let late = [answer(&published[1], "w")];
    let fx = p.step(results(&late), Instant::now()).unwrap();
    assert_eq!(items(&fx), vec![1], "item 1 finishes from the backlog's result");
    apply(p.store_mut(), fx);
    let still: Vec<JobId> =
        planned.into_iter().filter(|j| !p.store().has_result(j).unwrap()).collect();
    assert_eq!(still, vec![published[2].id, published[3].id], "only the missing jobs");
    assert_eq!(p.progress().figures.items_done, 2);
    let classes = p.store().costs().unwrap();
    assert!(classes.iter().all(|c| c.model != crate::cost::UNATTRIBUTED), "{classes:?}");
    assert_eq!(classes.iter().map(|c| c.jobs).sum::<u64>(), 2, "{classes:?}");
}

/// Jobs no worker will answer become dead letters: noted, stored as failed results, and
/// their items finish with the error; a second report of them changes nothing.
#[test]
fn lost_jobs_become_dead_letters() {
    let sweep = with_window(2, 2);
    let mut p = Planner::open(&sweep, MemStore::default(), Uuid::now_v7(), HashMap::new()).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    let published = jobs(&apply(p.store_mut(), fx));
    let lost = || Event::Lost {
        jobs: vec![published[0].clone()],
        error: "crashed the worker".into(),
        deliveries: 5,
    };
    let fx = p.step(lost(), Instant::now()).unwrap();
    assert!(matches!(&fx[0], Effect::NoteJob { job, .. } if *job == published[0].id), "{fx:?}");
    assert_eq!((stored(&fx), items(&fx)), (1, vec![0]));
    apply(p.store_mut(), fx);
    let label = String::from_utf8(p.store().label(key(0)).unwrap().to_vec()).unwrap();
    assert!(label.contains("crashed the worker"), "{label}");
    assert!(p.store().job_meta(&published[0].id).is_some());
    match p.store().result(&published[0].id).unwrap().unwrap().outcome {
        Outcome::Failed(f) => assert_eq!(f.error, "crashed the worker"),
        o => panic!("{o:?}"),
    }
    let fx = p.step(lost(), Instant::now()).unwrap();
    assert_eq!((stored(&fx), items(&fx).len()), (0, 0), "{fx:?}");
    assert_eq!((p.progress().figures.dead_letters, p.outstanding()), (1, 1));
}

/// Past the cost limit a paid job is held back, not published; with nothing in flight
/// the run stops.
#[test]
fn cost_limit_holds_paid_jobs() {
    let sweep = noop_sweep(3, "price = { input = 1.0, output = 1.0 }\n[run]\nmax_cost = 0.0\n");
    let mut p = Planner::open(&sweep, MemStore::default(), Uuid::now_v7(), HashMap::new()).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    assert!(!fx.iter().any(|e| matches!(e, Effect::Publish { .. })), "{fx:?}");
    assert_eq!(p.held(), 3);
    assert_eq!(p.cost_stop(false), Some((0.0, 0.0)));
}

/// Jobs re-queued by `halyard retry-failed` are published under their retry round.
#[test]
fn retried_jobs_carry_their_round() {
    let sweep = with_window(2, 2);
    let run = Uuid::now_v7();
    let mut first = Planner::open(&sweep, MemStore::default(), run, HashMap::new()).unwrap();
    let fx = first.step(Event::Fill, Instant::now()).unwrap();
    let published = apply(&mut MemStore::default(), fx);
    assert!(published.iter().all(|(_, round)| round.is_none()));
    let retried = HashMap::from([(published[1].0.id, 1)]);
    let mut p = Planner::open(&sweep, MemStore::default(), run, retried).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    let rounds: Vec<Option<u32>> =
        apply(&mut MemStore::default(), fx).into_iter().map(|(_, r)| r).collect();
    assert_eq!(rounds, vec![None, Some(MSG_ID_ROUND_BASE + 1)]);
}

/// Drive a planner over `store` to the end, answering `per_batch` jobs at a time (each
/// by echoing its prompt); stop early after `stop_after` batches. Returns the jobs
/// published, whether the run finished, and the batches of results.
fn drive(
    sweep: &Sweep,
    run: Uuid,
    store: &mut MemStore,
    per_batch: usize,
    stop_after: Option<usize>,
) -> (Vec<Job>, bool, usize) {
    let mut p = Planner::open(sweep, std::mem::take(store), run, HashMap::new()).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    let mut queue = jobs(&apply(p.store_mut(), fx));
    let mut published = queue.clone();
    let mut batches = 0;
    while !queue.is_empty() && stop_after != Some(batches) {
        assert!(batches < 10_000, "the run does not converge");
        let n = per_batch.min(queue.len());
        let answers: Vec<_> = queue.drain(..n).map(|j| answer(&j, "w")).collect();
        let fx = p.step(results(&answers), Instant::now()).unwrap();
        let more = jobs(&apply(p.store_mut(), fx));
        published.extend(more.iter().cloned());
        queue.extend(more);
        batches += 1;
    }
    let finished = p.all_done();
    *store = std::mem::take(p.store_mut());
    (published, finished, batches)
}

/// A multi-stage run (HypoTermQA: answers, then judge checks, judge retries) stopped
/// after every possible batch and resumed from its store ends with the labels of an
/// uninterrupted run, and never publishes again a job whose result is stored.
#[test]
fn crash_anywhere_then_resume_equals_uninterrupted() {
    let dataset =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/hypotermqa/HypoTermQA_180.jsonl");
    let text = format!(
        "name = \"h\"\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n\
         [[benchmark]]\npipeline = \"hypotermqa\"\ndataset = \"{}\"\nmodels = [\"free\"]\n\
         judge = \"free\"\nlimit = 4\n[run]\nwindow = 2\n",
        dataset.display()
    );
    let sweep = parse(Path::new("/tmp/h.toml"), &text).unwrap();
    let run = Uuid::now_v7();
    let mut whole = MemStore::default();
    let (all_jobs, finished, batches) = drive(&sweep, run, &mut whole, 3, None);
    assert!(finished);
    assert!(batches > 3, "a run of several stages: {} jobs", all_jobs.len());
    let labels = |s: &MemStore| -> BTreeMap<u32, Vec<u8>> {
        (0..4).filter_map(|i| s.label(key(i)).map(|l| (i, l.to_vec()))).collect()
    };
    for stop in 0..batches {
        let mut store = MemStore::default();
        let (_, finished, _) = drive(&sweep, run, &mut store, 3, Some(stop));
        assert!(!finished, "stopped after {stop} batches");
        let answered: HashSet<JobId> =
            all_jobs.iter().map(|j| j.id).filter(|id| store.has_result(id).unwrap()).collect();
        let (again, finished, _) = drive(&sweep, run, &mut store, 3, None);
        assert!(finished, "resumed after {stop} batches");
        assert!(
            again.iter().all(|j| !answered.contains(&j.id)),
            "a job with a stored result was published again (stop {stop})"
        );
        assert_eq!(labels(&store), labels(&whole), "labels differ (stop {stop})");
    }
}

fn refused_and_held(p: &mut Planner<'_, MemStore>) -> (u64, u64) {
    let f = &p.progress().figures;
    (f.refused_results, f.held_results)
}

/// Issue 33: a result for a planned job that came on another pool's subject (what a
/// holder of another pool's credentials can publish) is refused and counted, and the
/// honest one is still taken.
#[test]
fn a_result_from_another_pools_subject_is_refused() {
    let sweep = with_window(1, 1);
    let mut p = Planner::open(&sweep, MemStore::default(), Uuid::now_v7(), HashMap::new()).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    let job = jobs(&apply(p.store_mut(), fx)).remove(0);
    let forged = Arrival { pool: "other".into(), result: answer(&job, "forger") };
    let fx = p.step(Event::Results(vec![forged]), Instant::now()).unwrap();
    assert_eq!((stored(&fx), items(&fx).len()), (0, 0), "{fx:?}");
    assert!(fx.iter().any(|e| matches!(e, Effect::Intake(i) if i.refused_results == 1)));
    apply(p.store_mut(), fx);
    assert_eq!(refused_and_held(&mut p), (1, 0));
    let fx = p.step(results(&[answer(&job, "honest")]), Instant::now()).unwrap();
    assert_eq!((stored(&fx), items(&fx)), (1, vec![0]));
    apply(p.store_mut(), fx);
    assert_eq!(p.store().result(&job.id).unwrap().unwrap().outcome, answer(&job, "w").outcome);
    assert_eq!(p.store().intake().unwrap().refused_results, 1, "kept in the store");
    assert!(p.all_done());
}

/// The jobs of a noop sweep of `n` items, as a planner with room for all plans them.
fn all_jobs(n: u32, run: Uuid) -> Vec<Job> {
    let sweep = with_window(n, n as usize);
    let mut p = Planner::open(&sweep, MemStore::default(), run, HashMap::new()).unwrap();
    jobs(&apply(&mut MemStore::default(), p.step(Event::Fill, Instant::now()).unwrap()))
}

/// Results for jobs not planned yet (a run resumed with a smaller window finds those its
/// earlier process asked for) are held aside, not counted, and answer their jobs when
/// they are planned: nothing is published again, and the store holds nothing aside at
/// the end. One that came on another pool's subject is refused when its job is planned,
/// and the job is published.
#[test]
fn results_for_jobs_not_planned_yet_are_held_and_answer_them_later() {
    let run = Uuid::now_v7();
    let every = all_jobs(4, run);
    let sweep = with_window(4, 1);
    let mut p = Planner::open(&sweep, MemStore::default(), run, HashMap::new()).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    let first = jobs(&apply(p.store_mut(), fx));
    assert_eq!(first.len(), 1);
    let mut early = results(&[answer(&every[1], "w"), answer(&every[2], "w")]);
    if let Event::Results(a) = &mut early {
        a.push(Arrival { pool: "other".into(), result: answer(&every[3], "forger") });
    }
    let fx = p.step(early, Instant::now()).unwrap();
    assert_eq!((stored(&fx), items(&fx).len()), (0, 0), "held, not stored: {fx:?}");
    apply(p.store_mut(), fx);
    assert_eq!(refused_and_held(&mut p), (0, 3));
    assert_eq!(p.progress().figures.results, 0);
    // A second copy of a held result is a duplicate.
    let fx = p.step(results(&[answer(&every[1], "w2")]), Instant::now()).unwrap();
    apply(p.store_mut(), fx);
    assert_eq!(refused_and_held(&mut p), (0, 3));

    // Item 0 finishes: items 1 and 2 are answered by what was held, item 3's held result
    // came on another pool's subject, so its job is published.
    let fx = p.step(results(&[answer(&first[0], "w")]), Instant::now()).unwrap();
    assert_eq!(items(&fx), vec![0, 1, 2], "{fx:?}");
    let published = jobs(&apply(p.store_mut(), fx));
    assert_eq!(published.iter().map(|j| j.id).collect::<Vec<_>>(), vec![every[3].id]);
    assert_eq!(refused_and_held(&mut p), (1, 0));
    assert_eq!(p.progress().figures.results, 3);
    let fx = p.step(results(&[answer(&published[0], "w")]), Instant::now()).unwrap();
    apply(p.store_mut(), fx);
    assert!(p.all_done());
    assert_eq!(p.store().held_at_open().unwrap(), crate::store::Held::default());
    for j in &every {
        assert!(p.store().has_result(&j.id).unwrap());
    }
}

/// Results for ids nobody planned are held aside up to the bound, then refused: a flood of
/// forged ids costs a bounded store and is counted.
#[test]
fn results_for_jobs_never_planned_are_bounded() {
    use crate::planner::HELD_MAX_RESULTS;
    let sweep = with_window(1, 1);
    let run = Uuid::now_v7();
    let mut p = Planner::open(&sweep, MemStore::default(), run, HashMap::new()).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    let job = jobs(&apply(p.store_mut(), fx)).remove(0);
    let extra = 5;
    let forged: Vec<JobResult> = (0..HELD_MAX_RESULTS + extra)
        .map(|n| {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&n.to_be_bytes());
            JobResult { job: JobId(b), ..answer(&job, "forger") }
        })
        .collect();
    let fx = p.step(results(&forged), Instant::now()).unwrap();
    assert_eq!(stored(&fx), 0);
    apply(p.store_mut(), fx);
    assert_eq!(refused_and_held(&mut p), (extra, HELD_MAX_RESULTS));
    // A planner opened on the same store knows what is held (the bound holds across
    // restarts) and the refusals counted so far.
    let store = std::mem::take(p.store_mut());
    let mut p = Planner::open(&sweep, store, run, HashMap::new()).unwrap();
    let one_more = JobResult { job: JobId([0xff; 16]), ..answer(&job, "forger") };
    let fx = p.step(results(&[one_more]), Instant::now()).unwrap();
    apply(p.store_mut(), fx);
    assert_eq!(refused_and_held(&mut p), (extra + 1, HELD_MAX_RESULTS));
}

/// A result for a job not planned yet that arrives in the same batch as the result that
/// lets its item in answers it in that step: held and taken back at once, never
/// published, and nothing is left held.
#[test]
fn a_result_held_in_a_step_answers_its_job_planned_in_the_same_step() {
    let run = Uuid::now_v7();
    let every = all_jobs(2, run);
    let sweep = with_window(2, 1);
    let mut p = Planner::open(&sweep, MemStore::default(), run, HashMap::new()).unwrap();
    let fx = p.step(Event::Fill, Instant::now()).unwrap();
    assert_eq!(jobs(&apply(p.store_mut(), fx)).len(), 1);
    let both = [answer(&every[0], "w"), answer(&every[1], "w")];
    let fx = p.step(results(&both), Instant::now()).unwrap();
    assert_eq!(items(&fx), vec![0, 1], "{fx:?}");
    assert!(jobs(&apply(p.store_mut(), fx)).is_empty(), "the held result's job was published");
    assert_eq!(refused_and_held(&mut p), (0, 0));
    assert_eq!(p.progress().figures.results, 2);
    assert!(p.all_done());
    assert_eq!(p.store().held_at_open().unwrap(), crate::store::Held::default());
}
