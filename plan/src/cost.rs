//! Cost accounting: tokens, calls, latency and money per (model, stage).
//!
//! The sweep gives each model an optional price (USD per million input and output
//! tokens, `price = { input = …, output = … }`). The planner tells the [`Meter`] about
//! every job it publishes (which sweep model and stage it belongs to: results carry only
//! the job id) and about every new result; the meter adds the result's usage to its
//! (model, stage) class. The totals are stored in the run state with every committed
//! batch, so a resumed run continues from what the earlier processes spent.
//!
//! `--max-cost` (`[run] max_cost`): once the spent total reaches the limit, the planner
//! publishes no new job of a priced model; jobs already published finish, free (unpriced)
//! models keep going, and then the run stops, resumable with a higher limit.
//!
//! The totals are written in the same transaction as the batch's results
//! ([`crate::store::RunStore::commit_writes`]): after a hard kill the store holds both or
//! neither.

use std::collections::HashMap;

use halyard_pipelines::common::JobRequest;
use halyard_proto::{AnswerSource, JobId, JobResult, Outcome};
use serde::{Deserialize, Serialize};

use crate::sweep::models::Model;
use crate::sweep::price::Price;

/// Upper bounds (seconds) of the per-model call latency histogram buckets (Prometheus
/// style: cumulative at export, `+Inf` implied).
pub const LATENCY_BUCKETS_S: [f64; 12] =
    [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// Model alias of results whose job this process never published (none in practice:
/// a resumed run publishes again every job its unfinished items wait for).
pub const UNATTRIBUTED: &str = "(unattributed)";

/// The figures of one (model, stage).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassTotals {
    pub model: String,
    pub stage: String,
    /// Completed jobs: paid ([`ClassTotals::paid`]) and answered from the result cache
    /// ([`ClassTotals::machine_cache`], [`ClassTotals::shared_cache`]).
    pub jobs: u64,
    pub dead_letters: u64,
    /// Backend calls (HTTP attempts, retries included) of completed jobs, cache hits excluded.
    pub calls: u64,
    /// Completions of paid answers replayed from a worker checkpoint (the run paid for
    /// them; their first result was lost, e.g. to a kill): billed.
    pub cache_hits: u64,
    /// Attempts beyond the first (`calls - 1` per completed job).
    pub retries: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub latency_ms_total: u64,
    /// Per bucket of [`LATENCY_BUCKETS_S`], plus one for larger values (not cumulative).
    pub latency_buckets: Vec<u64>,
    /// USD, from the model's price (0 when it has none).
    pub cost: f64,
    /// Of `prompt_tokens`, those written to the provider's prompt cache (issue 52).
    #[serde(default)]
    pub prompt_cache_writes: u64,
    /// Of `prompt_tokens`, those read from the provider's prompt cache: its hits.
    #[serde(default)]
    pub prompt_cache_reads: u64,
    /// Completed jobs whose answer stopped at `max_tokens` (`finish_reason` "length";
    /// Anthropic's `stop_reason` "max_tokens").
    #[serde(default)]
    pub truncated: u64,
    /// Completed jobs whose answer this run paid for (issue 51): every completed job
    /// not answered from the result cache, checkpoint replays of paid answers included.
    /// Tokens, latency and cost are theirs.
    #[serde(default)]
    pub paid: u64,
    /// Completed jobs answered from the result cache on the worker's machine: no call,
    /// nothing billed.
    #[serde(default)]
    pub machine_cache: u64,
    /// Completed jobs answered from the broker's shared result cache.
    #[serde(default)]
    pub shared_cache: u64,
    /// USD the answers from the result cache would have cost at the model's price (their
    /// recorded usage): money saved, not in `cost`.
    #[serde(default)]
    pub saved: f64,
}

impl ClassTotals {
    /// Mean latency (ms) of the paid jobs (a cache answer made no call).
    pub fn mean_latency_ms(&self) -> f64 {
        let paid = self.jobs.saturating_sub(self.machine_cache).saturating_sub(self.shared_cache);
        if paid == 0 {
            0.0
        } else {
            self.latency_ms_total as f64 / paid as f64
        }
    }
}

struct ModelEntry {
    alias: String,
    model_ref: halyard_proto::ModelRef,
    temperature: f32,
    max_tokens: Option<u32>,
    seed: Option<u64>,
    price: Price,
}

/// Live accounting of a run (see the module docs).
pub struct Meter {
    models: Vec<ModelEntry>,
    classes: Vec<ClassTotals>,
    /// Class of each (model index or usize::MAX, stage).
    index: HashMap<(usize, String), u32>,
    /// Price of each class's model.
    prices: Vec<Price>,
    /// Published jobs without a result yet → class, and the most usage each may bill.
    pending: HashMap<JobId, (u32, UsageBound)>,
    /// Results whose usage claimed more than their job could use (clamped).
    pub clamped: u64,
    max_cost: Option<f64>,
    /// Jobs not published because the cost limit was reached.
    pub held: u64,
}

impl Meter {
    /// A meter over the sweep's `models`, stopping at `max_cost` (`[run] max_cost`).
    pub fn new(models: &[Model], max_cost: Option<f64>) -> Meter {
        let models = models
            .iter()
            .map(|m| ModelEntry {
                alias: m.spec.name.clone(),
                model_ref: m.spec.model_ref.clone(),
                temperature: m.spec.temperature,
                max_tokens: m.spec.max_tokens,
                seed: m.spec.seed,
                price: m.price.unwrap_or_default(),
            })
            .collect();
        Meter {
            models,
            classes: Vec::new(),
            index: HashMap::new(),
            prices: Vec::new(),
            pending: HashMap::new(),
            clamped: 0,
            max_cost,
            held: 0,
        }
    }

    /// Continue from totals stored by an earlier process.
    pub fn restore(&mut self, stored: Vec<ClassTotals>) {
        for t in stored {
            let m = self.models.iter().position(|m| m.alias == t.model).unwrap_or(usize::MAX);
            let c = self.class(m, &t.stage);
            let slot = &mut self.classes[c as usize];
            let buckets = merge_buckets(&slot.latency_buckets, &t.latency_buckets);
            *slot = ClassTotals { latency_buckets: buckets, ..t };
        }
    }

    fn class(&mut self, model: usize, stage: &str) -> u32 {
        if let Some(c) = self.index.get(&(model, stage.to_string())) {
            return *c;
        }
        let c = self.classes.len() as u32;
        let (alias, price) = match self.models.get(model) {
            Some(m) => (m.alias.clone(), m.price),
            None => (UNATTRIBUTED.to_string(), Price::default()),
        };
        self.classes.push(ClassTotals {
            model: alias,
            stage: stage.to_string(),
            latency_buckets: vec![0; LATENCY_BUCKETS_S.len() + 1],
            ..Default::default()
        });
        self.prices.push(price);
        self.index.insert((model, stage.to_string()), c);
        c
    }

    /// The sweep model a job calls (the first with its endpoint, model and sampling).
    fn model_of(&self, j: &JobRequest) -> usize {
        let k = &j.key;
        self.models
            .iter()
            .position(|m| {
                m.model_ref == k.model
                    && m.temperature == k.sampling.temperature
                    && m.max_tokens == k.sampling.max_tokens
                    && m.seed == k.sampling.seed
            })
            .or_else(|| self.models.iter().position(|m| m.model_ref == k.model))
            .unwrap_or(usize::MAX)
    }

    /// The limit is reached: priced jobs must not be published.
    pub fn limit_reached(&self) -> bool {
        self.max_cost.is_some_and(|max| self.spent() >= max)
    }

    pub fn max_cost(&self) -> Option<f64> {
        self.max_cost
    }

    /// Whether the run must stop at its cost limit: the limit is reached and the calls in
    /// flight are back, or no result came for a while (`stalled`: those calls were lost,
    /// and a resumed run plans them again). Returns (spent, limit).
    pub fn stop_at_limit(&self, stalled: bool) -> Option<(f64, f64)> {
        (self.limit_reached() && (self.in_flight() == 0 || stalled))
            .then(|| (self.spent(), self.max_cost.unwrap_or_default()))
    }

    /// Whether `j` may be published now (false: a paid call while over the limit).
    pub fn may_publish(&self, j: &JobRequest) -> bool {
        if !self.limit_reached() {
            return true;
        }
        let m = self.model_of(j);
        !self.models.get(m).is_some_and(|m| m.price.is_paid())
    }

    /// A job was published.
    pub fn published(&mut self, j: &JobRequest, id: JobId) {
        let m = self.model_of(j);
        let c = self.class(m, &j.key.stage);
        self.pending.insert(id, (c, UsageBound::of(&j.key)));
    }

    /// Jobs published and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// A new (first) result of a job.
    pub fn record(&mut self, r: &JobResult) {
        let (c, bound) = match self.pending.remove(&r.job) {
            Some(p) => p,
            None => (self.class(usize::MAX, "?"), UsageBound::CEILING),
        };
        let price = self.prices[c as usize];
        let t = &mut self.classes[c as usize];
        match &r.outcome {
            Outcome::Done(done) => {
                // A result is input (anyone with a worker credential may publish one): it
                // bills at most what its job could use (issue 49, item 4).
                let mut usage = done.usage;
                if bound.clamp(&mut usage) {
                    self.clamped += 1;
                }
                t.jobs += 1;
                // An answer from the result cache (issue 51) made no call this run: it is
                // money saved at the model's price, never billed.
                match done.source {
                    AnswerSource::MachineCache | AnswerSource::SharedCache => {
                        if done.source == AnswerSource::MachineCache {
                            t.machine_cache += 1;
                        } else {
                            t.shared_cache += 1;
                        }
                        t.saved += price.cost(&usage);
                        return;
                    }
                    AnswerSource::Paid => t.paid += 1,
                }
                if r.cached {
                    t.cache_hits += 1;
                } else {
                    t.calls = t.calls.saturating_add(done.calls as u64);
                }
                t.retries = t.retries.saturating_add((done.calls as u64).saturating_sub(1));
                t.prompt_tokens = t.prompt_tokens.saturating_add(usage.prompt_tokens);
                t.completion_tokens = t.completion_tokens.saturating_add(usage.completion_tokens);
                t.latency_ms_total = t.latency_ms_total.saturating_add(done.latency_ms);
                let secs = done.latency_ms as f64 / 1000.0;
                let b = LATENCY_BUCKETS_S
                    .iter()
                    .position(|ub| secs <= *ub)
                    .unwrap_or(LATENCY_BUCKETS_S.len());
                t.latency_buckets[b] += 1;
                t.cost += price.cost(&usage);
                let cache = usage.cache.unwrap_or_default();
                t.prompt_cache_writes = t
                    .prompt_cache_writes
                    .saturating_add(cache.write_5m.saturating_add(cache.write_1h));
                t.prompt_cache_reads = t.prompt_cache_reads.saturating_add(cache.read);
                if done.finish_reason.as_deref() == Some("length") {
                    t.truncated += 1;
                }
            }
            Outcome::Failed(_) => t.dead_letters += 1,
        }
    }

    /// USD spent so far (this run, all processes).
    pub fn spent(&self) -> f64 {
        self.classes.iter().map(|c| c.cost).sum()
    }

    pub fn totals(&self) -> &[ClassTotals] {
        &self.classes
    }
}

/// The most usage a job may bill (issue 49, item 4): the worker's own bound, from proto.
pub use halyard_proto::UsageBound;

fn merge_buckets(a: &[u64], b: &[u64]) -> Vec<u64> {
    let n = LATENCY_BUCKETS_S.len() + 1;
    (0..n).map(|i| a.get(i).copied().unwrap_or(0) + b.get(i).copied().unwrap_or(0)).collect()
}

/// Totals per model (stages summed), in first-seen order.
pub fn by_model(classes: &[ClassTotals]) -> Vec<ClassTotals> {
    let mut out: Vec<ClassTotals> = Vec::new();
    for c in classes {
        let slot = match out.iter_mut().find(|o| o.model == c.model) {
            Some(s) => s,
            None => {
                out.push(ClassTotals {
                    model: c.model.clone(),
                    stage: "*".into(),
                    ..Default::default()
                });
                out.last_mut().expect("just pushed")
            }
        };
        slot.jobs = slot.jobs.saturating_add(c.jobs);
        slot.dead_letters = slot.dead_letters.saturating_add(c.dead_letters);
        slot.calls = slot.calls.saturating_add(c.calls);
        slot.cache_hits = slot.cache_hits.saturating_add(c.cache_hits);
        slot.retries = slot.retries.saturating_add(c.retries);
        slot.prompt_tokens = slot.prompt_tokens.saturating_add(c.prompt_tokens);
        slot.completion_tokens = slot.completion_tokens.saturating_add(c.completion_tokens);
        slot.latency_ms_total = slot.latency_ms_total.saturating_add(c.latency_ms_total);
        slot.latency_buckets = merge_buckets(&slot.latency_buckets, &c.latency_buckets);
        slot.cost += c.cost;
        slot.prompt_cache_writes = slot.prompt_cache_writes.saturating_add(c.prompt_cache_writes);
        slot.prompt_cache_reads = slot.prompt_cache_reads.saturating_add(c.prompt_cache_reads);
        slot.truncated = slot.truncated.saturating_add(c.truncated);
        slot.paid = slot.paid.saturating_add(c.paid);
        slot.machine_cache = slot.machine_cache.saturating_add(c.machine_cache);
        slot.shared_cache = slot.shared_cache.saturating_add(c.shared_cache);
        slot.saved += c.saved;
    }
    out
}

/// The `costs` section of `report.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CostSection {
    /// USD over every model and stage.
    pub total: f64,
    /// USD the answers from the result cache would have cost (issue 51), over every model
    /// and stage.
    #[serde(default)]
    pub saved: f64,
    pub max_cost: Option<f64>,
    /// The sweep's prices (USD per million tokens) of the models that have one.
    pub prices: std::collections::BTreeMap<String, Price>,
    pub by_model: Vec<ClassTotals>,
    pub by_model_stage: Vec<ClassTotals>,
}

impl CostSection {
    pub fn new(models: &[Model], max_cost: Option<f64>, classes: Vec<ClassTotals>) -> CostSection {
        CostSection {
            total: classes.iter().map(|c| c.cost).sum(),
            saved: classes.iter().map(|c| c.saved).sum(),
            max_cost,
            prices: models
                .iter()
                .filter_map(|m| m.price.map(|p| (m.spec.name.clone(), p)))
                .collect(),
            by_model: by_model(&classes),
            by_model_stage: classes,
        }
    }

    pub fn render_markdown(&self) -> String {
        let mut md = format!(
            "## Tokens and cost

Total cost: **${:.4}**",
            self.total
        );
        if let Some(m) = self.max_cost {
            md.push_str(&format!(" (limit ${m:.2})"));
        }
        md.push_str("

| model | stage | jobs | calls | retries | cache hits | prompt tokens | completion tokens | mean latency (ms) | cost (USD) |
|---|---|---|---|---|---|---|---|---|---|
");
        for c in self.by_model_stage.iter().chain(self.by_model.iter()) {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.4} |\n",
                c.model,
                c.stage,
                c.jobs,
                c.calls,
                c.retries,
                c.cache_hits,
                c.prompt_tokens,
                c.completion_tokens,
                c.mean_latency_ms(),
                c.cost
            ));
        }
        md.push('\n');
        md.push_str(&result_cache_markdown(self.saved, &self.by_model_stage));
        md.push_str(&prompt_cache_markdown(&self.by_model));
        md
    }
}

/// The report's result-cache table (issue 51): per model and stage, the jobs paid for
/// and those answered from the machine's and the broker's result cache, and the money
/// those answers saved at the model's price. Nothing when no answer came from a cache.
fn result_cache_markdown(saved: f64, classes: &[ClassTotals]) -> String {
    if !classes.iter().any(|c| c.machine_cache > 0 || c.shared_cache > 0) {
        return String::new();
    }
    let mut md = format!(
        "Result cache: **${saved:.4}** saved (answers from the cache, at the models' prices; not in the cost above).\n\n| model | stage | paid | machine cache | shared cache | saved (USD) |\n|---|---|---|---|---|---|\n"
    );
    for c in classes {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.4} |\n",
            c.model, c.stage, c.paid, c.machine_cache, c.shared_cache, c.saved
        ));
    }
    md.push('\n');
    md
}

/// The report's prompt-cache lines (issue 52): per model that used the provider's prompt
/// cache, its prompt tokens written to it and read from it (hits), and the share of its
/// prompt tokens read. Nothing when no model used it.
fn prompt_cache_markdown(by_model: &[ClassTotals]) -> String {
    let used: Vec<&ClassTotals> =
        by_model.iter().filter(|c| c.prompt_cache_writes > 0 || c.prompt_cache_reads > 0).collect();
    if used.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "Prompt cache (`prompt_cache`):\n\n| model | prompt tokens | written to the cache | read from the cache (hits) | share read |\n|---|---|---|---|---|\n",
    );
    for c in used {
        let share = c.prompt_cache_reads as f64 / c.prompt_tokens.max(1) as f64;
        md.push_str(&format!(
            "| {} | {} | {} | {} | {:.1}% |\n",
            c.model,
            c.prompt_tokens,
            c.prompt_cache_writes,
            c.prompt_cache_reads,
            100.0 * share
        ));
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use halyard_proto::Usage;

    use super::*;

    /// A noop job of model `m` on the pool "paid" asking `prompt`.
    fn noop_job(m: &halyard_pipelines::common::ModelSpec, prompt: &str) -> JobRequest {
        let key = halyard_proto::JobKey {
            pipeline: "noop".into(),
            stage: "call".into(),
            stage_version: 1,
            model: m.model_ref.clone(),
            messages: vec![halyard_proto::ChatMessage::user(prompt)],
            sampling: halyard_proto::Sampling {
                temperature: m.temperature,
                max_tokens: m.max_tokens,
                seed: m.seed,
                ..Default::default()
            },
            sample_index: 0,
        };
        JobRequest { key, pool: "paid".into(), api_key_env: None, timeout_ms: 1000 }
    }

    #[test]
    fn price_is_per_million_tokens() {
        let p = Price::new(2.5, 10.0);
        assert!((p.cost(&Usage::new(1_000_000, 0)) - 2.5).abs() < 1e-12);
        assert!((p.cost(&Usage::new(200_000, 50_000)) - (0.5 + 0.5)).abs() < 1e-12);
        assert!(!Price::default().is_paid());
    }

    /// Issue 52: cached prompt tokens are billed at their own rates, by default Anthropic's
    /// published multiples of the input price (Claude Sonnet 4.5 at $3/$15: a 5-minute
    /// write $3.75, a 1-hour write $6, a read $0.30 per million), given ones over them.
    #[test]
    fn prompt_cache_tokens_at_their_own_rates() {
        let p = Price::new(3.0, 15.0);
        let cache =
            halyard_proto::CacheUsage { write_5m: 200_000, write_1h: 100_000, read: 500_000 };
        let u = Usage { prompt_tokens: 1_000_000, completion_tokens: 10_000, cache: Some(cache) };
        assert_eq!(u.uncached_prompt_tokens(), 200_000);
        let want = 0.2 * 3.0 + 0.2 * 3.75 + 0.1 * 6.0 + 0.5 * 0.30 + 0.01 * 15.0;
        assert!((p.cost(&u) - want).abs() < 1e-12, "{} vs {want}", p.cost(&u));
        let given = Price { cache_read: Some(0.0), ..p };
        assert!((given.cost(&u) - (want - 0.5 * 0.30)).abs() < 1e-12);
        // A batch discount applies to every rate.
        assert!((p.scaled(0.5).cost(&u) - want / 2.0).abs() < 1e-12);
    }

    /// Issue 49, item 4: a result reporting u64::MAX tokens (anyone with a worker
    /// credential may publish one for a planned job) is priced at what its job could use
    /// at most: its prompt's bytes plus the template's allowance, and its `max_tokens`.
    #[test]
    fn a_result_bills_at_most_what_its_job_could_use() {
        let text = "name = \"t\"\n[[model]]\nname = \"paid\"\nbackend = \"noop\"\n\
                    max_tokens = 100\nprice = { input = 10.0, output = 30.0 }\n\
                    [[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"paid\"]\n";
        let sweep = crate::sweep::parse(std::path::Path::new("/tmp/s.toml"), text).unwrap();
        let mut meter = Meter::new(&sweep.models, Some(1.0));
        let m = &sweep.models[0].spec;
        let prompt = "What is 2 + 2?";
        let j = noop_job(m, prompt);
        let id = j.id();
        meter.published(&j, id);
        let forged = Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
            cache: Some(halyard_proto::CacheUsage { write_5m: 0, write_1h: 0, read: u64::MAX }),
        };
        let result = JobResult {
            v: halyard_proto::WIRE_VERSION,
            job: id,
            run: uuid::Uuid::nil(),
            outcome: Outcome::Done(halyard_proto::Completion {
                text: "4".into(),
                usage: forged,
                latency_ms: 1,
                finish_reason: None,
                calls: 1,
                logprobs: None,
                refusal: false,
                source: Default::default(),
            }),
            deliveries: 1,
            worker: "forger".into(),
            cached: false,
        };
        meter.record(&result);
        let prompt_most = prompt.len() as u64 + 16 + 64;
        let most = (prompt_most as f64 * 10.0 + 100.0 * 30.0) / 1e6;
        assert!(meter.spent() <= most + 1e-12, "{} > {most}", meter.spent());
        assert!(!meter.limit_reached(), "a forged usage reached --max-cost");
        assert_eq!(meter.clamped, 1);
        let t = &meter.totals()[0];
        assert_eq!((t.prompt_tokens, t.completion_tokens), (prompt_most, 100));
        assert!(t.prompt_cache_reads <= prompt_most);
    }

    /// Issue 51: an answer from the result cache is counted by its tier and priced as
    /// money saved, never billed; a checkpoint replay of a paid answer stays billed (the
    /// run paid for it, its first result was lost).
    #[test]
    fn cache_answers_are_saved_not_billed() {
        let text = "name = \"t\"\n[[model]]\nname = \"paid\"\nbackend = \"noop\"\n\
                    max_tokens = 100\nprice = { input = 10.0, output = 30.0 }\n\
                    [[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"paid\"]\n";
        let sweep = crate::sweep::parse(std::path::Path::new("/tmp/s.toml"), text).unwrap();
        let mut meter = Meter::new(&sweep.models, None);
        let m = &sweep.models[0].spec;
        let sources = [
            (AnswerSource::Paid, false),
            (AnswerSource::Paid, true),
            (AnswerSource::MachineCache, true),
            (AnswerSource::MachineCache, true),
            (AnswerSource::SharedCache, true),
        ];
        for (i, (source, cached)) in sources.into_iter().enumerate() {
            let j = noop_job(m, &format!("question {i}"));
            let id = j.id();
            meter.published(&j, id);
            meter.record(&JobResult {
                v: halyard_proto::WIRE_VERSION,
                job: id,
                run: uuid::Uuid::nil(),
                outcome: Outcome::Done(halyard_proto::Completion {
                    text: "4".into(),
                    usage: Usage::new(10, 20),
                    latency_ms: 100,
                    finish_reason: None,
                    calls: 2,
                    logprobs: None,
                    refusal: false,
                    source,
                }),
                deliveries: 1,
                worker: "w".into(),
                cached,
            });
        }
        let one = (10.0 * 10.0 + 20.0 * 30.0) / 1e6;
        let t = &meter.totals()[0];
        assert_eq!((t.jobs, t.paid, t.machine_cache, t.shared_cache), (5, 2, 2, 1));
        assert_eq!((t.calls, t.cache_hits, t.retries), (2, 1, 2), "{t:?}");
        assert_eq!((t.prompt_tokens, t.completion_tokens, t.latency_ms_total), (20, 40, 200));
        assert!((t.cost - 2.0 * one).abs() < 1e-12, "{}", t.cost);
        assert!((t.saved - 3.0 * one).abs() < 1e-12, "{}", t.saved);
        assert!((meter.spent() - 2.0 * one).abs() < 1e-12);
        assert_eq!(t.mean_latency_ms(), 100.0);
        let section = CostSection::new(&sweep.models, None, meter.totals().to_vec());
        assert!((section.saved - 3.0 * one).abs() < 1e-12);
        let md = section.render_markdown();
        assert!(md.contains("| paid | call | 2 | 2 | 1 | 0.0021 |"), "{md}");
        let m = by_model(meter.totals());
        assert_eq!((m[0].paid, m[0].machine_cache, m[0].shared_cache), (2, 2, 1));
    }

    #[test]
    fn by_model_sums_stages() {
        let a = ClassTotals {
            model: "m".into(),
            stage: "answer".into(),
            jobs: 2,
            cost: 1.0,
            latency_buckets: vec![1; 13],
            ..Default::default()
        };
        let b = ClassTotals {
            model: "m".into(),
            stage: "judge".into(),
            jobs: 3,
            cost: 0.5,
            latency_buckets: vec![2; 13],
            ..Default::default()
        };
        let c =
            ClassTotals { model: "j".into(), stage: "judge".into(), jobs: 1, ..Default::default() };
        let m = by_model(&[a, b, c]);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].jobs, m[0].cost, m[0].latency_buckets[0]), (5, 1.5, 3));
        assert_eq!(m[1].model, "j");
    }
}
