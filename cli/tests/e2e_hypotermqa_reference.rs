//! End-to-end (issue 16): `halyard run` of the 180 HypoTermQA questions in `semantics =
//! "reference"` (the authors' labelling) against the fake model and judge, with the
//! meaning check of one term rejected by the API (a dead letter). The figures are computed
//! here from the fake's rules, the golden `reference` inclusion and the authors' label
//! rules (spec B.2, B.3, part c), without Halyard's code.

use std::collections::{HashMap, HashSet};

use crate::common::*;
use halyard_tests::{ChatCall, FakeOpenAi, Faults, Reply};
use serde_json::Value;

/// The authors' inclusion of each question's own terms, from the golden vectors.
fn reference_inclusion() -> HashMap<(String, String), bool> {
    let path = repo_root().join("../shared/golden/string_match.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut m = HashMap::new();
    for l in text.lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        if v["category"] == "dataset:question+own_term" {
            let key = (v["text"].as_str().unwrap().into(), v["term"].as_str().unwrap().into());
            m.insert(key, v["reference"].as_bool().unwrap());
        }
    }
    m
}

/// Label ranks: valid 0 < irrelevant 1 < judge_error 2 < hallucination 3.
const NAMES: [&str; 4] = ["valid", "irrelevant", "judge_error", "hallucination"];

/// One term's label under the authors' rules, with Halyard's deviation: a dead-lettered
/// judge job is judge_error (their Ollama path would read it as valid).
fn term_label(included: bool, term: &str, hypothetical: bool, meaning_dead: bool) -> usize {
    if !included {
        return 1;
    }
    // One acceptance call; the fake's garbage is a parse failure, which they label valid.
    let acceptance = match (acceptance_rule(term), hypothetical) {
        (Acc::Mentioned, true) => 3,
        (_, true) => 0,
        (Acc::Mentioned, false) => 0,
        (Acc::Unreal, false) => 3,
        (Acc::Unknown, false) => 1,
        (Acc::GarbageThenMentioned | Acc::AlwaysGarbage, false) => 0,
    };
    // The meaning check runs for every included valid term, whatever the acceptance.
    let meaning = match (hypothetical, meaning_dead) {
        (true, _) => 0,
        (false, true) => 2,
        (false, false) => {
            if meaning_rule(term) {
                0
            } else {
                3
            }
        }
    };
    acceptance.max(meaning)
}

/// The reference-semantics report equals the authors' rules applied independently; the
/// dead-lettered meaning check is counted as judge_error, never as valid.
#[test]
fn reference_semantics_run_matches_the_authors_rules() {
    let qs = load_questions(180);
    let incl = reference_inclusion();
    // Poison the meaning check of the first valid term that is included and whose answer
    // would otherwise be valid, so the deviation changes a label.
    let mut poisoned: Option<String> = None;
    for q in qs.iter().filter(|q| answers_with_question(q.id)) {
        let labels: Vec<usize> = q
            .terms
            .iter()
            .map(|(t, h)| term_label(incl[&(q.question.clone(), t.clone())], t, *h, false))
            .collect();
        let target = q.terms.iter().find(|(t, h)| !h && incl[&(q.question.clone(), t.clone())]);
        if let (Some((t, _)), true) = (target, labels.iter().all(|l| *l == 0)) {
            poisoned = Some(t.clone());
            break;
        }
    }
    let poisoned = poisoned.expect("some answer is valid with an included valid term");
    let rules = responder(question_index(&qs), None);
    let poison = poisoned.clone();
    let faults = Faults::new();
    let fake = FakeOpenAi::start_blocking(faults.wrap(move |call: &ChatCall| {
        let meaning = call.messages.first().is_some_and(|(_, s)| s.contains("real meaning"));
        let user = call.messages.get(1).map_or("", |(_, u)| u.as_str());
        if meaning && user.starts_with(&format!("TERM => {poison}:")) {
            return Reply::Status { code: 400, body: "rejected".into(), retry_after: None };
        }
        rules(call)
    }));
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "reference", &fake.base_url(), 180, 8);
    let text = std::fs::read_to_string(&sweep).unwrap();
    std::fs::write(&sweep, text.replace("semantics = \"paper\"", "semantics = \"reference\""))
        .unwrap();
    let out = dir.path().join("runs");
    let (_, stated) =
        run_complete(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let report = read_json(&out.join("reference/report.json"));
    assert_eq!(report["jobs"]["dead_letters"], stated, "the final line's count");
    let b = &report["benchmarks"][0];
    assert_eq!(b["semantics"], "reference");

    let mut counts: HashMap<(&str, &str), u64> = HashMap::new();
    let (mut valid_hyp, mut labelled_hyp, mut dead) = (0u64, 0u64, 0u64);
    for q in &qs {
        let answered = answers_with_question(q.id);
        let mut any_included = false;
        let worst = q
            .terms
            .iter()
            .map(|(t, h)| {
                let included = answered && incl[&(q.question.clone(), t.clone())];
                any_included |= included;
                let dead_here = included && !h && *t == poisoned;
                dead += u64::from(dead_here);
                term_label(included, t, *h, dead_here)
            })
            .max()
            .unwrap();
        let ty = if q.hypothetical { "hypothetical" } else { "valid" };
        *counts.entry((ty, NAMES[worst])).or_default() += 1;
        if q.hypothetical {
            valid_hyp += u64::from(worst == 0);
            labelled_hyp += u64::from(any_included);
        }
    }
    assert!(dead > 0, "the poisoned meaning check never ran");
    for ty in ["hypothetical", "valid"] {
        for label in NAMES {
            let got = b["answer_labels"][ty][label].as_u64().unwrap();
            assert_eq!(got, counts.get(&(ty, label)).copied().unwrap_or(0), "{ty} {label}");
        }
    }
    assert_eq!(b["valid_answers_to_hypothetical"], valid_hyp);
    assert!((b["hts"].as_f64().unwrap() - valid_hyp as f64 * 100.0 / 60.0).abs() < 1e-9);
    let l = &b["hts_labelled_only"];
    assert_eq!(
        (l["numerator"].as_u64(), l["denominator"].as_u64()),
        (Some(valid_hyp), Some(labelled_hyp))
    );
    // The interval of HTS (Wilson over the 60 hypothetical questions) is in the report.
    let ci = &b["hts_share"]["ci95"];
    assert_eq!((ci["method"].as_str(), ci["n"].as_u64()), (Some("wilson"), Some(60)));
    // The dead letters are the judge's errors, counted as such.
    assert_eq!(report["jobs"]["dead_letters"], dead);
    assert_eq!(b["judge_error"]["checks"]["numerator"], dead);
    let labels = std::fs::read_to_string(out.join("reference/labels.jsonl")).unwrap();
    let ids: HashSet<i64> = labels
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .inspect(|v| assert_eq!(v["semantics"], "reference"))
        .map(|v| v["question_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 180);
    // Issue 29: faults leave every figure and label of reference semantics as they were.
    rerun_with_faults(&fake, &faults, &sweep, "reference", &out, dir.path());
}
