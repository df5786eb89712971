//! The item browser over a finished run's `labels.jsonl`: one pass builds a small index
//! (each row's byte offset, benchmark, item, model, judge, label and flags); a page reads
//! only its own rows back from the file. A run of a million rows is never held in memory,
//! only its index (a few dozen bytes a row).
//!
//! Flags, per row:
//! - `refusal_or_empty`: the model's answer was empty or a refusal (`answer_kind`);
//! - `failed`: the answer job is a dead letter (`answer_error`), or the label says the
//!   answer or its judging failed (`unanswered`, `judge_error`);
//! - `judge_disagreement`: another judge labelled the same model's answer to the same
//!   item differently (a panel);
//! - `human_disagreement`: a human label of the same item and model (imported with
//!   `halyard labels import`) differs from the row's label.
//!
//! Rows belong to a benchmark through `report.json`'s `labels_lines` ranges.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const REFUSAL_OR_EMPTY: u8 = 1;
pub const FAILED: u8 = 2;
pub const JUDGE_DISAGREEMENT: u8 = 4;
pub const HUMAN_DISAGREEMENT: u8 = 8;
const FLAGS: [(u8, &str); 4] = [
    (REFUSAL_OR_EMPTY, "refusal_or_empty"),
    (FAILED, "failed"),
    (JUDGE_DISAGREEMENT, "judge_disagreement"),
    (HUMAN_DISAGREEMENT, "human_disagreement"),
];

/// The most rows one page may ask for.
pub const MAX_PAGE: usize = 200;

/// One row of `labels.jsonl` in the index.
struct Row {
    offset: u64,
    /// The 1-based line in the file.
    line: u32,
    len: u32,
    bench: u32,
    model: u16,
    judge: u16,
    label: u16,
    flags: u8,
    item: Box<str>,
}

/// Human labels per (benchmark, item, model): (label, annotator).
type HumanLabels = HashMap<(u32, String, String), Vec<(String, Option<String>)>>;

/// The index of one run's `labels.jsonl`.
pub struct Index {
    path: PathBuf,
    rows: Vec<Row>,
    /// Interned names: models, judges, labels.
    names: [Vec<String>; 3],
    /// (benchmark, item) → its rows.
    by_item: HashMap<(u32, Box<str>), Vec<u32>>,
    /// (benchmark, item, model) → human labels (label, annotator).
    human: HumanLabels,
    /// Benchmark index → pipeline.
    pipelines: BTreeMap<u32, String>,
    /// (benchmark, item) → its rows in the benchmark's panel verdicts file (`panel/`,
    /// written with the report by the judging module): (offset, length).
    panel: PanelIndex,
}

/// The fields of a row the index needs; the rest is skipped unparsed.
#[derive(Deserialize)]
struct Light {
    #[serde(default)]
    question_id: Option<Value>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    index: Option<Value>,
    #[serde(default)]
    item: Option<Value>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    judge: Option<String>,
    #[serde(default)]
    answer_label: Option<String>,
    #[serde(default)]
    label: Option<Value>,
    #[serde(default)]
    answer_kind: Option<Value>,
    #[serde(default)]
    answer_error: Option<Value>,
}

fn key_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn intern(names: &mut Vec<String>, lookup: &mut HashMap<String, u16>, s: &str) -> u16 {
    if let Some(&i) = lookup.get(s) {
        return i;
    }
    // More than 65,535 distinct models, judges or labels in one run: the rest share one.
    let i = names.len().min(u16::MAX as usize) as u16;
    if names.len() < u16::MAX as usize {
        names.push(s.to_string());
        lookup.insert(s.to_string(), i);
    }
    i
}

impl Index {
    /// Index the run in `dir` (its `labels.jsonl`, `report.json` and imported human
    /// labels). A line that is not a JSON object is an error naming the file and line.
    pub fn build(dir: &Path) -> Result<Index, String> {
        let path = dir.join("labels.jsonl");
        let report = super::runs::read_json(&dir.join("report.json"))?.unwrap_or(Value::Null);
        // labels_lines ranges → benchmark.
        let mut ranges: Vec<(u64, u64, u32)> = Vec::new();
        let mut pipelines = BTreeMap::new();
        for e in report["benchmarks"].as_array().into_iter().flatten() {
            let b = e["benchmark"].as_u64().unwrap_or(0) as u32;
            pipelines.insert(b, e["pipeline"].as_str().unwrap_or("?").to_string());
            if let (Some(lo), Some(hi)) =
                (e["labels_lines"][0].as_u64(), e["labels_lines"][1].as_u64())
            {
                ranges.push((lo, hi, b));
            }
        }
        ranges.sort();
        let human = read_human(dir, &pipelines)?;
        let f = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut r = std::io::BufReader::with_capacity(1 << 20, f);
        let mut names: [Vec<String>; 3] = Default::default();
        let mut lookups: [HashMap<String, u16>; 3] = Default::default();
        let mut rows = Vec::new();
        let mut by_item: HashMap<(u32, Box<str>), Vec<u32>> = HashMap::new();
        let mut buf = Vec::new();
        let (mut offset, mut line) = (0u64, 0u64);
        let mut range = 0usize;
        loop {
            buf.clear();
            let n =
                r.read_until(b'\n', &mut buf).map_err(|e| format!("{}: {e}", path.display()))?;
            if n == 0 {
                break;
            }
            let body = buf.strip_suffix(b"\n").unwrap_or(&buf);
            if !body.iter().all(u8::is_ascii_whitespace) {
                let l: Light = serde_json::from_slice(body).map_err(|e| {
                    format!("{}, line {}: not a labels row: {e}", path.display(), line + 1)
                })?;
                while range < ranges.len() && ranges[range].1 <= line {
                    range += 1;
                }
                let bench = ranges
                    .get(range)
                    .filter(|(lo, hi, _)| (*lo..*hi).contains(&line))
                    .map_or(u32::MAX, |r| r.2);
                let item = [&l.question_id, &l.id, &l.item, &l.index]
                    .into_iter()
                    .find_map(|v| v.as_ref().and_then(key_text))
                    .unwrap_or_else(|| format!("line {}", line + 1));
                let label = l.answer_label.clone().or_else(|| match &l.label {
                    Some(Value::Bool(b)) => {
                        Some(if *b { "hallucinated" } else { "not hallucinated" }.into())
                    }
                    Some(v) => key_text(v),
                    None => None,
                });
                let label = label.unwrap_or_else(|| "-".into());
                let mut flags = 0;
                if l.answer_kind.as_ref().is_some_and(|k| !k.is_null()) {
                    flags |= REFUSAL_OR_EMPTY;
                }
                if l.answer_error.as_ref().is_some_and(|e| !e.is_null())
                    || matches!(label.as_str(), "unanswered" | "judge_error")
                {
                    flags |= FAILED;
                }
                let model = l.model.clone().unwrap_or_else(|| "?".into());
                if let Some(h) = human.get(&(bench, item.clone(), model.clone())) {
                    if h.iter().any(|(hl, _)| *hl != label) {
                        flags |= HUMAN_DISAGREEMENT;
                    }
                }
                let row = Row {
                    offset,
                    line: (line + 1) as u32,
                    len: body.len() as u32,
                    bench,
                    model: intern(&mut names[0], &mut lookups[0], &model),
                    judge: intern(
                        &mut names[1],
                        &mut lookups[1],
                        l.judge.as_deref().unwrap_or("-"),
                    ),
                    label: intern(&mut names[2], &mut lookups[2], &label),
                    flags,
                    item: item.into(),
                };
                by_item.entry((bench, row.item.clone())).or_default().push(rows.len() as u32);
                rows.push(row);
            }
            offset += n as u64;
            line += 1;
        }
        // A panel: judges of one model's answer to one item that disagree.
        for ids in by_item.values() {
            let mut per_model: HashMap<u16, Vec<u32>> = HashMap::new();
            for &i in ids {
                per_model.entry(rows[i as usize].model).or_default().push(i);
            }
            for same in per_model.values() {
                let first = rows[same[0] as usize].label;
                if same.iter().any(|&i| rows[i as usize].label != first) {
                    for &i in same {
                        rows[i as usize].flags |= JUDGE_DISAGREEMENT;
                    }
                }
            }
        }
        let panel = index_panel(dir, &pipelines)?;
        Ok(Index { path, rows, names, by_item, human, pipelines, panel })
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// What the filters can choose from, with counts.
    pub fn facets(&self) -> Facets {
        let mut f = Facets { rows: self.rows.len(), ..Default::default() };
        let mut models = vec![0usize; self.names[0].len()];
        let mut labels = vec![0usize; self.names[2].len()];
        let mut benches: BTreeMap<u32, usize> = BTreeMap::new();
        let mut flags = [0usize; 4];
        for r in &self.rows {
            models[r.model as usize] += 1;
            labels[r.label as usize] += 1;
            *benches.entry(r.bench).or_default() += 1;
            for (i, (bit, _)) in FLAGS.iter().enumerate() {
                if r.flags & bit != 0 {
                    flags[i] += 1;
                }
            }
        }
        f.models = self.names[0].iter().cloned().zip(models).collect();
        f.labels = self.names[2].iter().cloned().zip(labels).collect();
        f.benchmarks = benches
            .into_iter()
            .map(|(b, n)| (b, self.pipelines.get(&b).cloned().unwrap_or_else(|| "?".into()), n))
            .collect();
        f.flags = FLAGS.iter().zip(flags).map(|((_, n), c)| (n.to_string(), c)).collect();
        f
    }

    /// The rows matching `q`, one page of them read back from the file.
    pub fn page(&self, q: &Query) -> Result<Page, String> {
        let flag = match q.flag.as_deref().filter(|s| !s.is_empty()) {
            None => 0,
            Some(name) => FLAGS
                .iter()
                .find(|(_, n)| *n == name)
                .map(|(b, _)| *b)
                .ok_or_else(|| format!("unknown flag {name:?} (one of: refusal_or_empty, failed, judge_disagreement, human_disagreement)"))?,
        };
        let want = |names: &[String], v: &Option<String>| -> Result<Option<u16>, String> {
            match v.as_deref().filter(|s| !s.is_empty()) {
                None => Ok(None),
                // A name the run does not have matches nothing.
                Some(s) => {
                    Ok(Some(names.iter().position(|n| n == s).map_or(u16::MAX, |i| i as u16)))
                }
            }
        };
        let model = want(&self.names[0], &q.model)?;
        let label = want(&self.names[2], &q.label)?;
        let limit = q.limit.unwrap_or(50).clamp(1, MAX_PAGE);
        let offset = q.offset.unwrap_or(0);
        let mut total = 0usize;
        let mut picked = Vec::new();
        for (i, r) in self.rows.iter().enumerate() {
            if q.benchmark.is_some_and(|b| b != r.bench)
                || model.is_some_and(|m| m != r.model)
                || label.is_some_and(|l| l != r.label)
                || (flag != 0 && r.flags & flag == 0)
                || q.item.as_deref().is_some_and(|it| !it.is_empty() && it != &*r.item)
            {
                continue;
            }
            if total >= offset && picked.len() < limit {
                picked.push(i);
            }
            total += 1;
        }
        let mut f =
            std::fs::File::open(&self.path).map_err(|e| format!("{}: {e}", self.path.display()))?;
        let mut rows = Vec::with_capacity(picked.len());
        for i in picked {
            let v = self.read(&mut f, i)?;
            let r = &self.rows[i];
            rows.push(PageRow {
                row: i,
                benchmark: r.bench,
                item: r.item.to_string(),
                model: self.names[0][r.model as usize].clone(),
                judge: self.names[1][r.judge as usize].clone(),
                label: self.names[2][r.label as usize].clone(),
                flags: self.flag_names(r.flags),
                prompt: snippet(prompt_of(&v)),
                answer: snippet(answer_of(&v)),
            });
        }
        Ok(Page { total, offset, limit, rows })
    }

    /// Row `i` and every other row of its item (every model's answer, every judge), the
    /// human labels of the item, and the run's dead letters among the rows' jobs.
    pub fn item(&self, i: usize, dead_letters: &[Value]) -> Result<Item, String> {
        let r = self
            .rows
            .get(i)
            .ok_or_else(|| format!("no row {i} (the run has {})", self.rows.len()))?;
        let mut f =
            std::fs::File::open(&self.path).map_err(|e| format!("{}: {e}", self.path.display()))?;
        let ids = self.by_item.get(&(r.bench, r.item.clone())).cloned().unwrap_or_default();
        let mut rows = Vec::new();
        let mut jobs = Vec::new();
        for &j in &ids {
            let v = self.read(&mut f, j as usize)?;
            collect_jobs(&v, &mut jobs);
            let rr = &self.rows[j as usize];
            rows.push(ItemRow {
                row: j as usize,
                line: self.line_of(j as usize),
                model: self.names[0][rr.model as usize].clone(),
                judge: self.names[1][rr.judge as usize].clone(),
                label: self.names[2][rr.label as usize].clone(),
                flags: self.flag_names(rr.flags),
                value: v,
            });
        }
        let human = self
            .human
            .iter()
            .filter(|((b, it, _), _)| *b == r.bench && **it == *r.item)
            .flat_map(|((_, _, m), ls)| {
                ls.iter().map(move |(l, a)| HumanRow {
                    model: m.clone(),
                    label: l.clone(),
                    annotator: a.clone(),
                })
            })
            .collect();
        let panel = match self.panel.get(&(r.bench, r.item.clone())) {
            None => Vec::new(),
            Some(at) => {
                let p = halyard_plan::judging::verdict_file::path(self.dir(), r.bench as usize);
                let mut f = std::fs::File::open(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                let mut out = Vec::with_capacity(at.len());
                for &(offset, len) in at {
                    let mut buf = vec![0u8; len as usize];
                    f.seek(SeekFrom::Start(offset))
                        .and_then(|_| f.read_exact(&mut buf))
                        .map_err(|e| format!("{}: {e}", p.display()))?;
                    out.push(
                        serde_json::from_slice(&buf)
                            .map_err(|e| format!("{}: {e} (the file changed?)", p.display()))?,
                    );
                }
                out
            }
        };
        let dead = dead_letters
            .iter()
            .filter(|d| d["job"].as_str().is_some_and(|j| jobs.iter().any(|x| x == j)))
            .cloned()
            .collect();
        Ok(Item {
            benchmark: r.bench,
            pipeline: self.pipelines.get(&r.bench).cloned().unwrap_or_else(|| "?".into()),
            item: r.item.to_string(),
            rows,
            human,
            panel,
            panel_file: self.panel.keys().any(|(b, _)| *b == r.bench),
            dead_letters: dead,
        })
    }

    /// The run directory.
    fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// The 1-based line of row `i` in `labels.jsonl`.
    fn line_of(&self, i: usize) -> u64 {
        self.rows[i].line as u64
    }

    fn read(&self, f: &mut std::fs::File, i: usize) -> Result<Value, String> {
        let r = &self.rows[i];
        let mut buf = vec![0u8; r.len as usize];
        f.seek(SeekFrom::Start(r.offset))
            .and_then(|_| f.read_exact(&mut buf))
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        serde_json::from_slice(&buf)
            .map_err(|e| format!("{}, row {}: {e} (the file changed?)", self.path.display(), i + 1))
    }

    fn flag_names(&self, flags: u8) -> Vec<&'static str> {
        FLAGS.iter().filter(|(b, _)| flags & b != 0).map(|(_, n)| *n).collect()
    }
}

/// Imported human labels per (benchmark, item, model).
fn read_human(dir: &Path, pipelines: &BTreeMap<u32, String>) -> Result<HumanLabels, String> {
    let mut out = HumanLabels::new();
    for &b in pipelines.keys() {
        let p = halyard_plan::report::imported_labels_path(dir, b as usize);
        let Ok(text) = std::fs::read_to_string(&p) else { continue };
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line)
                .map_err(|e| format!("{}, line {}: {e}", p.display(), n + 1))?;
            // A label of a part (a term, a sentence) is not the row's label.
            if v.get("term").is_some() || v.get("sentence").is_some() {
                continue;
            }
            if v["provenance"].as_str().is_some_and(|s| s != "human") {
                continue;
            }
            let (Some(item), Some(model), Some(label)) =
                (key_text(&v["item"]), v["model"].as_str(), key_text(&v["label"]))
            else {
                continue;
            };
            out.entry((b, item, model.to_string()))
                .or_default()
                .push((label, v["annotator"].as_str().map(str::to_string)));
        }
    }
    Ok(out)
}

/// Where each item's rows are in the run's panel verdicts files (`panel/benchmark-N.jsonl`,
/// one per benchmark whose judges were measured): a line that is not a verdict row is an
/// error naming the file and line.
/// (benchmark, item) → its rows in the panel verdicts file: (offset, length).
type PanelIndex = HashMap<(u32, Box<str>), Vec<(u64, u32)>>;

fn index_panel(dir: &Path, pipelines: &BTreeMap<u32, String>) -> Result<PanelIndex, String> {
    #[derive(Deserialize)]
    struct Key {
        item: Value,
    }
    let mut out: PanelIndex = HashMap::new();
    for &b in pipelines.keys() {
        let p = halyard_plan::judging::verdict_file::path(dir, b as usize);
        let Ok(f) = std::fs::File::open(&p) else { continue };
        let mut r = std::io::BufReader::new(f);
        let (mut buf, mut offset, mut line) = (Vec::new(), 0u64, 0u64);
        loop {
            buf.clear();
            let n = r.read_until(b'\n', &mut buf).map_err(|e| format!("{}: {e}", p.display()))?;
            if n == 0 {
                break;
            }
            line += 1;
            let body = buf.strip_suffix(b"\n").unwrap_or(&buf);
            if !body.iter().all(u8::is_ascii_whitespace) {
                let k: Key = serde_json::from_slice(body).map_err(|e| {
                    format!("{}, line {line}: not a panel verdict row: {e}", p.display())
                })?;
                let item = key_text(&k.item).ok_or_else(|| {
                    format!("{}, line {line}: `item` is not a string or number", p.display())
                })?;
                out.entry((b, item.into())).or_default().push((offset, body.len() as u32));
            }
            offset += n as u64;
        }
    }
    Ok(out)
}

/// The prompt of a row: its question, prompt or claim.
fn prompt_of(v: &Value) -> &str {
    ["question", "prompt", "claim", "input", "text"]
        .iter()
        .find_map(|k| v[*k].as_str())
        .unwrap_or("")
}

/// The model's answer in a row.
fn answer_of(v: &Value) -> &str {
    ["answer", "output", "completion", "response", "reference"]
        .iter()
        .find_map(|k| v[*k].as_str())
        .unwrap_or("")
}

fn snippet(s: &str) -> String {
    let mut out: String = s.chars().take(160).collect();
    if s.chars().count() > 160 {
        out.push('…');
    }
    out
}

/// Every job id a row names (`answer_job`, `job_id`, `*_job`), in order.
fn collect_jobs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if k == "job_id" || k == "job" || k.ends_with("_job") {
                    if let Some(s) = x.as_str() {
                        out.push(s.to_string());
                    }
                }
                collect_jobs(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_jobs(x, out)),
        _ => {}
    }
}

/// The item browser's query string.
#[derive(Debug, Default, Deserialize)]
pub struct Query {
    pub benchmark: Option<u32>,
    pub model: Option<String>,
    pub label: Option<String>,
    pub flag: Option<String>,
    /// One item's rows (its id: a question id, an item id).
    pub item: Option<String>,
    pub offset: Option<usize>,
    pub limit: Option<usize>,
}

#[derive(Default, Serialize)]
pub struct Facets {
    pub rows: usize,
    pub benchmarks: Vec<(u32, String, usize)>,
    pub models: Vec<(String, usize)>,
    pub labels: Vec<(String, usize)>,
    pub flags: Vec<(String, usize)>,
}

#[derive(Serialize)]
pub struct Page {
    pub total: usize,
    pub offset: usize,
    pub limit: usize,
    pub rows: Vec<PageRow>,
}

#[derive(Serialize)]
pub struct PageRow {
    pub row: usize,
    pub benchmark: u32,
    pub item: String,
    pub model: String,
    pub judge: String,
    pub label: String,
    pub flags: Vec<&'static str>,
    pub prompt: String,
    pub answer: String,
}

#[derive(Serialize)]
pub struct Item {
    pub benchmark: u32,
    pub pipeline: String,
    pub item: String,
    pub rows: Vec<ItemRow>,
    pub human: Vec<HumanRow>,
    /// The panel's verdict on each unit of the item (every model's answer, every part),
    /// with each judge's vote, as `panel/benchmark-N.jsonl` has them.
    pub panel: Vec<Value>,
    /// Whether the benchmark has a panel verdicts file (else: one judge, no human labels,
    /// its label is the verdict).
    pub panel_file: bool,
    pub dead_letters: Vec<Value>,
}

#[derive(Serialize)]
pub struct ItemRow {
    pub row: usize,
    pub line: u64,
    pub model: String,
    pub judge: String,
    pub label: String,
    pub flags: Vec<&'static str>,
    /// The whole `labels.jsonl` row.
    pub value: Value,
}

#[derive(Serialize)]
pub struct HumanRow {
    pub model: String,
    pub label: String,
    pub annotator: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_dir(rows: &[Value]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(d.path().join("labels.jsonl"), text).unwrap();
        let report = serde_json::json!({"benchmarks": [
            {"benchmark": 0, "pipeline": "hypotermqa", "model": "a", "labels_lines": [0, rows.len()]}
        ]});
        std::fs::write(d.path().join("report.json"), report.to_string()).unwrap();
        d
    }

    fn row(q: i64, model: &str, judge: &str, label: &str) -> Value {
        serde_json::json!({"question_id": q, "question": format!("q{q}"), "model": model,
            "judge": judge, "answer": "x", "answer_label": label, "answer_job": format!("job{q}{model}")})
    }

    /// Filters and pages pick exactly the rows that match; panel disagreement, human
    /// disagreement and failures are flagged from the rows themselves.
    #[test]
    fn pages_and_flags() {
        let mut rows = Vec::new();
        for q in 0..30 {
            rows.push(row(q, "a", "j1", if q % 3 == 0 { "hallucination" } else { "valid" }));
            // The second judge differs on question 4 only.
            let j2 = if q == 4 || q % 3 == 0 { "hallucination" } else { "valid" };
            rows.push(row(q, "a", "j2", j2));
        }
        rows.push(row(99, "b", "j1", "unanswered"));
        let d = run_dir(&rows);
        std::fs::create_dir(d.path().join("human-labels")).unwrap();
        std::fs::write(
            d.path().join("human-labels/benchmark-0.jsonl"),
            "{\"item\": 1, \"model\": \"a\", \"label\": \"hallucination\", \"annotator\": \"h\"}\n",
        )
        .unwrap();
        let ix = Index::build(d.path()).unwrap();
        assert_eq!(ix.len(), 61);
        let q = |label: Option<&str>, flag: Option<&str>, offset: usize| Query {
            label: label.map(str::to_string),
            flag: flag.map(str::to_string),
            offset: Some(offset),
            limit: Some(7),
            ..Default::default()
        };
        let p = ix.page(&q(Some("hallucination"), None, 0)).unwrap();
        assert_eq!(p.total, 21, "10 questions × 2 judges + q4's j2");
        assert_eq!(p.rows.len(), 7);
        let last = ix.page(&q(Some("hallucination"), None, 14)).unwrap();
        assert_eq!(last.rows.len(), 7);
        assert!(last.rows.iter().all(|r| r.label == "hallucination"));
        let panel = ix.page(&q(None, Some("judge_disagreement"), 0)).unwrap();
        assert_eq!((panel.total, panel.rows[0].item.as_str()), (2, "4"));
        let human = ix.page(&q(None, Some("human_disagreement"), 0)).unwrap();
        assert_eq!(human.total, 2, "both judges' rows of q1 say valid");
        let failed = ix.page(&q(None, Some("failed"), 0)).unwrap();
        assert_eq!((failed.total, failed.rows[0].model.as_str()), (1, "b"));
        assert!(ix.page(&q(None, Some("nonsense"), 0)).err().unwrap().contains("unknown flag"));
        let item = ix.item(panel.rows[0].row, &[serde_json::json!({"job": "job4a"})]).unwrap();
        assert_eq!(item.rows.len(), 2);
        assert_eq!(item.dead_letters.len(), 1);
        let one = ix.item(2, &[]).unwrap();
        assert_eq!(one.human.len(), 1);
    }

    /// A line that is not a row is an error naming the file and the line.
    #[test]
    fn a_bad_line_is_named() {
        let d = run_dir(&[row(1, "a", "j", "valid")]);
        let p = d.path().join("labels.jsonl");
        let mut text = std::fs::read_to_string(&p).unwrap();
        text.push_str("{not json\n");
        std::fs::write(&p, text).unwrap();
        let e = Index::build(d.path()).err().unwrap();
        assert!(e.contains("labels.jsonl, line 2"), "{e}");
    }

    /// An item shows the panel's verdicts on its units from the run's panel file, only
    /// its own (by benchmark and item); a bad line in that file is named.
    #[test]
    fn panel_verdicts_of_an_item() {
        let d = run_dir(&[
            row(1, "a", "j1", "valid"),
            row(1, "a", "j2", "hallucination"),
            row(2, "a", "j1", "valid"),
        ]);
        std::fs::create_dir(d.path().join("panel")).unwrap();
        let v = |item: i64, verdict: &str| {
            serde_json::json!({"item": item.to_string(), "model": "a", "verdict": verdict, "rule": "primary:j2",
                "votes": [{"judge": "j1", "label": "valid"}, {"judge": "j2", "label": verdict}]})
        };
        let text = format!("{}\n{}\n", v(1, "hallucination"), v(2, "valid"));
        std::fs::write(d.path().join("panel/benchmark-0.jsonl"), text).unwrap();
        let ix = Index::build(d.path()).unwrap();
        let it = ix.item(0, &[]).unwrap();
        assert!(it.panel_file);
        assert_eq!(it.panel, vec![v(1, "hallucination")]);
        assert_eq!(ix.item(2, &[]).unwrap().panel, vec![v(2, "valid")]);
        std::fs::write(d.path().join("panel/benchmark-0.jsonl"), "{\"item\": 1}\nnope\n").unwrap();
        let e = Index::build(d.path()).err().unwrap();
        assert!(e.contains("panel/benchmark-0.jsonl, line 2: not a panel verdict row"), "{e}");
    }
}
