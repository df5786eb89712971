//! Paired comparisons across runs, for every pipeline (issue 29): `halyard report A B ...`
//! compares each two results of one benchmark figure on the items both results share.
//!
//! Two models evaluated on the same items are not independent samples; a paired test looks
//! at how they differ item by item. Each figure names its test:
//!
//! | pipeline | figure (per item, from `labels.jsonl`) | test |
//! |---|---|---|
//! | hypotermqa | valid answer to a hypothetical question | McNemar exact |
//! | autohall | hallucinated reference (classified claims) | McNemar exact |
//! | uhgeval | selective: correct (valid items) | McNemar exact |
//! | uhgeval | keyword / sentence accuracy, generative ROUGE-L, kwPrec, BLEU-4 (valid items) | paired bootstrap of the mean |
//! | chainpoll | AUROC of each metric's score against the item labels | DeLong paired |
//! | hvi | share of a prompt's judged sentences that are hallucinated | paired bootstrap of the mean |
//!
//! Results are compared only within one comparability group: the same pipeline, dataset
//! and figure, and (where the entry names them) the same judge, semantics and variant. A
//! pair that cannot be tested says why (no shared items, one class only, no variance).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use halyard_pipelines::metrics::interval::Bootstrap;
use halyard_pipelines::metrics::paired::{
    delong_paired, mcnemar, paired_bootstrap_mean, PairedTest,
};
use serde_json::Value;

/// One item's observation of a figure.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Obs {
    /// A success (a rate's numerator).
    Bin(bool),
    /// A per-item score to average.
    Score(f64),
    /// A score to rank against the item's label (hallucinated = positive).
    Ranked { label: bool, score: f64 },
}

/// One result (a model in a run) of one figure: its items.
struct Series {
    who: String,
    items: BTreeMap<String, Obs>,
}

/// The comparison of two results of one figure.
#[derive(Clone, Debug, PartialEq)]
pub struct PairedRow {
    /// The comparability group: pipeline, dataset, judge, semantics, variant.
    pub group: String,
    pub figure: String,
    /// "model (run)".
    pub a: String,
    pub b: String,
    /// Items both results have.
    pub shared: usize,
    /// A − B with its interval, or why no test was made.
    pub test: Result<PairedTest, String>,
}

/// The observations of one `labels.jsonl` row of `pipeline`: (figure, item id, value).
fn observations(pipeline: &str, row: &Value) -> Vec<(String, String, Obs)> {
    let id = |k: &str| match &row[k] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let mut out = Vec::new();
    let mut push = |figure: &str, item: Option<String>, obs: Option<Obs>| {
        if let (Some(i), Some(o)) = (item, obs) {
            out.push((figure.to_string(), i, o));
        }
    };
    match pipeline {
        "hypotermqa" if row["question_type"] == "hypothetical" => push(
            "valid answer to a hypothetical question (HTS)",
            id("question_id"),
            row["answer_label"].as_str().map(|l| Obs::Bin(l == "valid")),
        ),
        "autohall" => push(
            "hallucinated reference (classified claims)",
            id("claim_id"),
            row["hallucinated"].as_bool().map(Obs::Bin),
        ),
        "uhgeval" => {
            let valid = |form: &str| row[form]["valid"].as_bool() == Some(true);
            let score = |form: &str, k: &str| {
                valid(form).then(|| row[form][k].as_f64().map(Obs::Score)).flatten()
            };
            push("keyword accuracy", id("id"), score("keyword", "accuracy"));
            push("sentence accuracy", id("id"), score("sentence", "accuracy"));
            push(
                "selective: correct",
                id("id"),
                valid("selective")
                    .then(|| row["selective"]["correct"].as_bool().map(Obs::Bin))
                    .flatten(),
            );
            push("generative ROUGE-L", id("id"), score("generative", "rouge_l"));
            push("generative kwPrec", id("id"), score("generative", "kw_prec"));
            push("generative BLEU-4 [paper]", id("id"), score("generative", "bleu4_paper"));
        }
        "chainpoll" => {
            let label = row["label"].as_bool();
            for m in row["metrics"].as_array().into_iter().flatten() {
                let metric = m["metric"].as_str().unwrap_or("?");
                let obs = label
                    .zip(m["score"].as_f64())
                    .map(|(label, score)| Obs::Ranked { label, score });
                push(&format!("AUROC ({metric})"), id("id"), obs);
            }
        }
        "hvi" => {
            let judged: Vec<&Value> = row["sentences"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|s| s["verdict"].is_string())
                .collect();
            let hallucinated = judged.iter().filter(|s| s["verdict"] != "not_hallucinated").count();
            let share =
                (!judged.is_empty()).then(|| Obs::Score(hallucinated as f64 / judged.len() as f64));
            push("share of a prompt's sentences hallucinated", id("id"), share);
        }
        _ => {}
    }
    out
}

/// The comparability group of a `report.json` entry.
fn group_of(entry: &Value) -> String {
    let mut g = format!(
        "{} on {}",
        entry["pipeline"].as_str().unwrap_or("?"),
        entry["dataset"].as_str().unwrap_or("?")
    );
    for k in ["judge", "semantics", "variant"] {
        if let Some(v) = entry[k].as_str() {
            g.push_str(&format!(", {k} {v}"));
        }
    }
    g
}

/// Rows `lines.0 .. lines.1` of `labels` (0-based line numbers), each read as JSON.
pub(super) fn label_rows(labels: &Path, lines: (u64, u64)) -> Result<Vec<Value>, String> {
    let f = std::fs::File::open(labels).map_err(|e| format!("{}: {e}", labels.display()))?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let n = n as u64;
        if n >= lines.1 {
            break;
        }
        if n < lines.0 {
            continue;
        }
        let at = || format!("{}: line {}", labels.display(), n + 1);
        let line = line.map_err(|e| format!("{}: {e}", at()))?;
        out.push(serde_json::from_str(&line).map_err(|e| format!("{}: {e}", at()))?);
    }
    Ok(out)
}

/// Series of every entry of one run's report: group → figure → series. Entries whose labels
/// cannot be read are reported in `warnings`.
fn collect(
    run: &str,
    run_dir: &Path,
    entries: &[Value],
    into: &mut BTreeMap<(String, String), Vec<Series>>,
    warnings: &mut Vec<String>,
) {
    for e in entries {
        let pipeline = e["pipeline"].as_str().unwrap_or("?");
        let Some(lines) = e["labels_lines"][0].as_u64().zip(e["labels_lines"][1].as_u64()) else {
            continue;
        };
        let rows = match label_rows(&run_dir.join("labels.jsonl"), lines) {
            Ok(r) => r,
            Err(err) => {
                warnings.push(format!("{run}: {pipeline} results not compared: {err}"));
                continue;
            }
        };
        let who = format!("{} ({run})", e["model"].as_str().unwrap_or("?"));
        let mut by_figure: BTreeMap<String, BTreeMap<String, Obs>> = BTreeMap::new();
        for row in &rows {
            for (figure, item, obs) in observations(pipeline, row) {
                by_figure.entry(figure).or_default().insert(item, obs);
            }
        }
        for (figure, items) in by_figure {
            into.entry((group_of(e), figure)).or_default().push(Series { who: who.clone(), items });
        }
    }
}

/// A's and B's observations on their shared items, tested as the figure's kind requires.
fn test(a: &Series, b: &Series) -> (usize, Result<PairedTest, String>) {
    let shared: Vec<(&Obs, &Obs)> =
        a.items.iter().filter_map(|(k, x)| b.items.get(k).map(|y| (x, y))).collect();
    let n = shared.len();
    if n == 0 {
        return (0, Err("no shared items".into()));
    }
    let r = match shared[0] {
        (Obs::Bin(_), _) => {
            let (xs, ys): (Vec<bool>, Vec<bool>) = shared
                .iter()
                .filter_map(|p| match p {
                    (Obs::Bin(x), Obs::Bin(y)) => Some((*x, *y)),
                    _ => None,
                })
                .unzip();
            mcnemar(&xs, &ys)
        }
        (Obs::Score(_), _) => {
            let (xs, ys): (Vec<f64>, Vec<f64>) = shared
                .iter()
                .filter_map(|p| match p {
                    (Obs::Score(x), Obs::Score(y)) => Some((*x, *y)),
                    _ => None,
                })
                .unzip();
            paired_bootstrap_mean(&xs, &ys, Bootstrap::default())
        }
        (Obs::Ranked { .. }, _) => {
            let mut labels = Vec::new();
            let (mut xs, mut ys) = (Vec::new(), Vec::new());
            for p in &shared {
                if let (Obs::Ranked { label, score: x }, Obs::Ranked { label: l2, score: y }) = p {
                    if label != l2 {
                        return (n, Err("the two results label the same item differently".into()));
                    }
                    labels.push(*label);
                    xs.push(*x);
                    ys.push(*y);
                }
            }
            delong_paired(&labels, &xs, &ys)
        }
    };
    (n, r.map_err(|e| e.to_string()))
}

/// Every pair of results of each (group, figure), in the order the runs were given.
pub fn compare(
    runs: &[(String, std::path::PathBuf, Vec<Value>)],
    warnings: &mut Vec<String>,
) -> Vec<PairedRow> {
    let mut groups: BTreeMap<(String, String), Vec<Series>> = BTreeMap::new();
    for (run, dir, entries) in runs {
        collect(run, dir, entries, &mut groups, warnings);
    }
    let mut rows = Vec::new();
    for ((group, figure), series) in &groups {
        for (i, a) in series.iter().enumerate() {
            for b in &series[i + 1..] {
                let (shared, test) = test(a, b);
                rows.push(PairedRow {
                    group: group.clone(),
                    figure: figure.clone(),
                    a: a.who.clone(),
                    b: b.who.clone(),
                    shared,
                    test,
                });
            }
        }
    }
    rows
}

/// The items of a binary figure on which results `a` and `b` (as [`PairedRow`] names them)
/// disagree: (item id, `true` when A succeeds there and B does not), in item order; the
/// discordant pairs behind a McNemar row (`halyard view`'s comparison lists them).
pub fn discordant_items(
    runs: &[(String, std::path::PathBuf, Vec<Value>)],
    group: &str,
    figure: &str,
    a: &str,
    b: &str,
) -> Vec<(String, bool)> {
    let mut groups: BTreeMap<(String, String), Vec<Series>> = BTreeMap::new();
    let mut warnings = Vec::new();
    for (run, dir, entries) in runs {
        collect(run, dir, entries, &mut groups, &mut warnings);
    }
    let Some(series) = groups.get(&(group.to_string(), figure.to_string())) else {
        return Vec::new();
    };
    let (Some(sa), Some(sb)) =
        (series.iter().find(|s| s.who == a), series.iter().find(|s| s.who == b))
    else {
        return Vec::new();
    };
    sa.items
        .iter()
        .filter_map(|(k, x)| match (x, sb.items.get(k)) {
            (Obs::Bin(x), Some(Obs::Bin(y))) if x != y => Some((k.clone(), *x)),
            _ => None,
        })
        .collect()
}

/// "significant (p = 0.012)" / "not significant (p = 0.41)" / the reason no test was made.
pub fn verdict(t: &Result<PairedTest, String>) -> String {
    match t {
        Ok(t) if t.significant => format!("significant (p = {})", p_text(t.p_value)),
        Ok(t) => format!("not significant (p = {})", p_text(t.p_value)),
        Err(e) => format!("not tested: {e}"),
    }
}

pub fn p_text(p: f64) -> String {
    if p < 0.001 {
        "< 0.001".into()
    } else {
        format!("{p:.3}")
    }
}

/// The cells of a row after the group and the figure: A, B, shared items, A − B, 95% CI,
/// test, result.
pub fn cells(r: &PairedRow) -> [String; 7] {
    let (diff, ci, method) = match &r.test {
        Ok(t) => (
            format!("{:+.4}", t.difference.estimate),
            t.difference.range(4, " to "),
            t.test.name().to_string(),
        ),
        Err(_) => ("-".into(), "-".into(), "-".into()),
    };
    [r.a.clone(), r.b.clone(), r.shared.to_string(), diff, ci, method, verdict(&r.test)]
}

/// The Markdown section (empty without rows).
pub fn markdown(rows: &[PairedRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n## Paired comparisons (every pipeline)\n\nEach two results of one figure on the items both have: A − B (a rate or a mean in its own unit, an AUROC difference) with its 95% interval, and the test named (McNemar exact for per-item successes, paired bootstrap for per-item scores, DeLong paired for AUROC). Not significant: the shared items cannot tell A and B apart at the 5% level.\n\n| benchmark | figure | A | B | shared items | A − B | 95% CI | test | result |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        md.push_str(&format!("| {} | {} | {} |\n", r.group, r.figure, cells(r).join(" | ")));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        dir: &Path,
        name: &str,
        entries: Vec<(Value, Vec<Value>)>,
    ) -> (String, std::path::PathBuf, Vec<Value>) {
        std::fs::create_dir_all(dir).unwrap();
        let mut lines = String::new();
        let mut n = 0;
        let mut out = Vec::new();
        for (mut e, rows) in entries {
            e["labels_lines"] = serde_json::json!([n, n + rows.len()]);
            n += rows.len();
            for r in rows {
                lines.push_str(&format!("{r}\n"));
            }
            out.push(e);
        }
        std::fs::write(dir.join("labels.jsonl"), lines).unwrap();
        (name.to_string(), dir.to_path_buf(), out)
    }

    /// Issue 29: AutoHall rates get McNemar, UHGEval scores a paired bootstrap and ChainPoll
    /// AUROCs DeLong's paired test, each on the shared items only and with its method named;
    /// a pair without shared items says so.
    #[test]
    fn every_pipeline_gets_its_paired_test() {
        let t = tempfile::tempdir().unwrap();
        let autohall = |model: &str, flip: usize| {
            let rows = (0..40)
                .map(|i| serde_json::json!({"claim_id": format!("c{i}"), "hallucinated": i < flip}))
                .collect();
            (
                serde_json::json!({"pipeline": "autohall", "model": model, "dataset": "claims.csv"}),
                rows,
            )
        };
        let uhg = |model: &str, add: f64| {
            let rows = (0..30)
                .map(|i| serde_json::json!({"id": format!("u{i}"), "generative": {"valid": true, "rouge_l": (i as f64 / 60.0) + add, "kw_prec": 0.5, "bleu4_paper": 0.1}}))
                .collect();
            (
                serde_json::json!({"pipeline": "uhgeval", "model": model, "dataset": "u.jsonl", "variant": "paper"}),
                rows,
            )
        };
        let chainpoll = |model: &str, noisy: bool| {
            let rows = (0..40)
                .map(|i| {
                    let label = i % 2 == 0;
                    let score = if noisy { ((i * 7) % 10) as f64 / 10.0 } else if label { 0.9 } else { 0.1 };
                    serde_json::json!({"id": format!("p{i}"), "label": label, "metrics": [{"metric": "correctness", "score": score}]})
                })
                .collect();
            (
                serde_json::json!({"pipeline": "chainpoll", "model": model, "dataset": "cp.jsonl"}),
                rows,
            )
        };
        let a = run(
            &t.path().join("a"),
            "a",
            vec![autohall("m1", 30), uhg("m1", 0.2), chainpoll("j1", false)],
        );
        let b = run(
            &t.path().join("b"),
            "b",
            vec![autohall("m2", 5), uhg("m2", 0.0), chainpoll("j2", true)],
        );
        let mut warnings = Vec::new();
        let rows = compare(&[a, b], &mut warnings);
        assert!(warnings.is_empty(), "{warnings:?}");
        let find = |f: &str| {
            rows.iter().find(|r| r.figure.starts_with(f)).unwrap_or_else(|| panic!("{f}: {rows:?}"))
        };
        let ah = find("hallucinated reference");
        let t1 = ah.test.as_ref().unwrap();
        assert_eq!((ah.shared, t1.test.name()), (40, "McNemar exact"));
        assert!(t1.significant && (t1.difference.estimate - 25.0 / 40.0).abs() < 1e-12);
        let rouge = find("generative ROUGE-L");
        let t2 = rouge.test.as_ref().unwrap();
        assert_eq!(t2.test.name(), "paired bootstrap");
        assert!((t2.difference.estimate - 0.2).abs() < 1e-9 && t2.significant);
        let kw = find("generative kwPrec");
        assert!(kw.test.as_ref().is_ok_and(|t| !t.significant && t.difference.estimate == 0.0));
        let cp = find("AUROC (correctness)");
        let t3 = cp.test.as_ref().unwrap();
        assert_eq!(t3.test.name(), "DeLong paired");
        assert!(t3.difference.estimate > 0.3 && t3.significant, "{t3:?}");
        let md = markdown(&rows);
        assert!(
            md.contains("| autohall on claims.csv | hallucinated reference")
                && md.contains("DeLong paired"),
            "{md}"
        );
        // Different datasets are different groups: nothing shared, nothing compared.
        let c = run(
            &t.path().join("c"),
            "c",
            vec![(
                serde_json::json!({"pipeline": "autohall", "model": "m3", "dataset": "other.csv"}),
                vec![serde_json::json!({"claim_id": "c0", "hallucinated": true})],
            )],
        );
        let d = run(
            &t.path().join("d"),
            "d",
            vec![(
                serde_json::json!({"pipeline": "autohall", "model": "m4", "dataset": "other.csv"}),
                vec![serde_json::json!({"claim_id": "zz", "hallucinated": true})],
            )],
        );
        let rows = compare(&[c, d], &mut warnings);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].test, Err("no shared items".into()));
    }
}
