//! From topic labels to the dataset file: de-duplication, ids, the JSONL lines of spec
//! part (f), and the build report.
//!
//! Ids: hypothetical terms are numbered 1, 2, … in order of first use; a valid term's
//! id is its knowledge-base row + 1 (the two namespaces overlap, as in the published
//! dataset: the key is (isHypotheticalTerm, termId)). Questions come in triples with
//! consecutive ids starting at 1: `none`, `programmatic`, `fresh`. A triple any of
//! whose questions repeats one already written (case and spacing ignored) is dropped.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use super::kb::Kb;
use super::{TopicLabel, Triple};
use crate::hypotermqa::TermSet;

#[derive(Serialize)]
struct TermOut<'a> {
    #[serde(rename = "termId")]
    term_id: i64,
    #[serde(rename = "isHypotheticalTerm")]
    is_hypothetical: bool,
    #[serde(rename = "termSetId")]
    term_set_id: i64,
    #[serde(rename = "termSet")]
    term_set: &'static str,
    term: &'a str,
    explanation: &'a str,
}

#[derive(Serialize)]
struct QuestionOut<'a> {
    #[serde(rename = "questionId")]
    question_id: i64,
    #[serde(rename = "isHypotheticalQuestion")]
    is_hypothetical: bool,
    question: &'a str,
    #[serde(rename = "replacementType")]
    replacement: &'static str,
    terms: [TermOut<'a>; 2],
}

/// The built dataset and its figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Built {
    /// JSONL lines, without newlines.
    #[serde(skip)]
    pub lines: Vec<String>,
    pub topics: u64,
    pub topics_failed: u64,
    /// Every gate's count, summed over topics, plus `output.*`.
    pub counts: BTreeMap<String, u64>,
    pub questions: u64,
    pub hypothetical_terms: u64,
    pub valid_terms: u64,
}

fn key(q: &str) -> String {
    q.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// JSON with every non-ASCII character as a `\uXXXX` escape, as the published files are.
fn ascii_json(v: &impl Serialize) -> String {
    let s = serde_json::to_string(v).unwrap_or_default();
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for u in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// Assemble the dataset from the labels of every topic, in topic order.
pub fn assemble(labels: &[TopicLabel], kb: &Kb) -> Built {
    let mut b = Built { topics: labels.len() as u64, ..Built::default() };
    let mut seen: HashSet<String> = HashSet::new();
    let mut hyp_ids: HashMap<(String, String), i64> = HashMap::new();
    let mut valid_ids: HashSet<usize> = HashSet::new();
    let mut next_q = 1i64;
    for l in labels {
        if l.error.is_some() {
            b.topics_failed += 1;
        }
        for (k, v) in &l.counts {
            *b.counts.entry(k.clone()).or_insert(0) += v;
        }
        for t in &l.triples {
            let qs = [&t.hypothetical_question, &t.programmatic_question, &t.fresh_question];
            let keys: Vec<String> = qs.iter().map(|q| key(q)).collect();
            let distinct: HashSet<&String> = keys.iter().collect();
            if distinct.len() < 3 || keys.iter().any(|k| seen.contains(k)) {
                *b.counts.entry("output.dropped_duplicate".into()).or_insert(0) += 1;
                continue;
            }
            seen.extend(keys);
            let n = hyp_ids.len() as i64 + 1;
            let hid = *hyp_ids
                .entry((t.hypothetical.clone(), t.hypothetical_explanation.clone()))
                .or_insert(n);
            valid_ids.insert(t.secondary);
            valid_ids.insert(t.replacement);
            for line in triple_lines(t, hid, next_q, kb) {
                b.lines.push(line);
            }
            next_q += 3;
            *b.counts.entry("output.triples".into()).or_insert(0) += 1;
        }
    }
    b.questions = b.lines.len() as u64;
    b.hypothetical_terms = hyp_ids.len() as u64;
    b.valid_terms = valid_ids.len() as u64;
    b
}

fn triple_lines<'a>(t: &'a Triple, hid: i64, first_id: i64, kb: &'a Kb) -> [String; 3] {
    let valid = |row: usize| TermOut {
        term_id: row as i64 + 1,
        is_hypothetical: false,
        term_set_id: t.set.id(),
        term_set: t.set.as_str(),
        term: &kb.titles[row],
        explanation: &kb.texts[row],
    };
    let hyp = TermOut {
        term_id: hid,
        is_hypothetical: true,
        term_set_id: TermSet::Hypothetical.id(),
        term_set: TermSet::Hypothetical.as_str(),
        term: &t.hypothetical,
        explanation: &t.hypothetical_explanation,
    };
    // Terms sorted by termId (the published files' order); on a tie the hypothetical first.
    let order = |a: TermOut<'a>, b: TermOut<'a>| -> [TermOut<'a>; 2] {
        if (b.term_id, !b.is_hypothetical) < (a.term_id, !a.is_hypothetical) {
            [b, a]
        } else {
            [a, b]
        }
    };
    let line = |id: i64, q: &str, replacement: &'static str, terms: [TermOut<'_>; 2]| {
        ascii_json(&QuestionOut {
            question_id: id,
            is_hypothetical: replacement == "none",
            question: q,
            replacement,
            terms,
        })
    };
    [
        line(first_id, &t.hypothetical_question, "none", order(valid(t.secondary), hyp)),
        line(
            first_id + 1,
            &t.programmatic_question,
            "programmatic",
            order(valid(t.secondary), valid(t.replacement)),
        ),
        line(
            first_id + 2,
            &t.fresh_question,
            "fresh",
            order(valid(t.secondary), valid(t.replacement)),
        ),
    ]
}

/// The build's figures as a Markdown section.
pub fn render_markdown(b: &Built, file: &str) -> String {
    let mut md = format!(
        "Dataset `{file}`: {} questions ({} triples), {} hypothetical terms, {} valid terms; {} topics ({} failed).\n\n| gate | count |\n|---|---|\n",
        b.questions,
        b.questions / 3,
        b.hypothetical_terms,
        b.valid_terms,
        b.topics,
        b.topics_failed
    );
    for (k, v) in &b.counts {
        md.push_str(&format!("| {k} | {v} |\n"));
    }
    md
}
