//! AutoHall fake-model rules shared by the AutoHall and replay end-to-end tests, and
//! the figures those rules imply, computed here without Halyard's code.

use std::collections::BTreeSet;

use halyard_tests::{ChatCall, Reply};
use serde_json::Value;

use super::fnv;

pub const K: usize = 4;
pub const SEED: u64 = 100;
const REF_PREFIX: &str = "Given one claim whose authenticity is unknown, you should provide one reference about it and summarize the reference in a paragraph. Claim: ";
const CLS_PREFIX: &str = "Given the claim and the reference, you should answer whether the claim is true or false. Claim: ";
const PAIR_PREFIX: &str = "Are there any conflicting parts in these paragraphs P1,P2? P1: ";
const SELF_CHECK_PREFIX: &str = "You are given a claim and a reference written about it.";

/// Zero- (`few = false`) or Few-Self-Check verdict on a claim's reference: hallucinated,
/// factual, or an answer without a verdict (`None`).
pub fn self_check(model: &str, claim: &str, few: bool) -> Option<bool> {
    match fnv(&format!("{model}|{claim}|{few}")) % 3 {
        0 => Some(true),
        1 => Some(false),
        _ => None,
    }
}

fn h(model: &str, claim: &str) -> u64 {
    fnv(&format!("{model}|{claim}"))
}

pub fn refuses(model: &str, claim: &str) -> bool {
    h(model, claim).is_multiple_of(6)
}

/// The classification answer, and how AutoHall's substring rule reads it.
fn classification(model: &str, claim: &str) -> (&'static str, Option<bool>) {
    match (h(model, claim) >> 3) % 5 {
        0 => ("The claim is true.", Some(true)),
        1 => ("The claim is false.", Some(false)),
        2 => ("It is untrue.", Some(true)), // the authors' substring quirk
        3 => ("I cannot say.", None),
        _ => ("FALSE", Some(false)),
    }
}

fn conflict(model: &str, claim: &str, k: u64) -> bool {
    (h(model, claim) + 7 * k).is_multiple_of(3)
}

/// A claim whose classification request is rejected (HTTP 400): `classify_failed`.
pub fn poisoned(model: &str, claim: &str) -> bool {
    (h(model, claim) >> 9).is_multiple_of(17)
}

pub fn autohall_responder(call: &ChatCall) -> Reply {
    let bad = |why: String| Reply::Status { code: 400, body: why, retry_after: None };
    let user = call.messages.last().map(|(_, c)| c.as_str()).unwrap_or("");
    let m = call.model.as_str();
    let t = call.temperature.unwrap_or(-1.0);
    if let Some(claim) = user.strip_prefix(REF_PREFIX) {
        if (t - 0.7).abs() > 1e-6 {
            return bad(format!("reference at temperature {t}"));
        }
        let seed = call.body["seed"].as_u64().unwrap_or(0);
        return Reply::Text(match seed.checked_sub(SEED) {
            Some(0) if refuses(m, claim) => {
                "I cannot provide a specific reference for this claim.".into()
            }
            Some(0) => format!("REF[{claim}]"),
            Some(k) => format!("SAMPLE{k}[{claim}]"),
            None => return bad(format!("seed {seed}")),
        });
    }
    if (t - 0.1).abs() > 1e-6 {
        return bad(format!("check at temperature {t}"));
    }
    if let Some(rest) = user.strip_prefix(CLS_PREFIX) {
        let Some((claim, _)) = rest.split_once(" Reference: REF[") else {
            return bad("no reference".into());
        };
        if poisoned(m, claim) {
            return bad("poison".into());
        }
        return Reply::Text(classification(m, claim).0.into());
    }
    if user.starts_with(SELF_CHECK_PREFIX) {
        let few = user.contains("Here are three examples.");
        let Some((_, rest)) = user.rsplit_once("[claim]: ") else {
            return bad("self-check without a claim".into());
        };
        let Some((claim, _)) = rest.split_once("\n[reference]: REF[") else {
            return bad("self-check without the reference".into());
        };
        return Reply::Text(match self_check(m, claim, few) {
            Some(true) => "{\"reasoning\": \"made up\", \"factuality\": false}".into(),
            Some(false) => "{\"reasoning\": \"fine\", \"factuality\": true}".into(),
            None => "I cannot tell.".into(),
        });
    }
    if let Some(rest) = user.strip_prefix(PAIR_PREFIX) {
        let (Some(a), Some(b)) = (rest.find("REF["), rest.find(" P2: SAMPLE")) else {
            return bad("bad pair".into());
        };
        let claim = &rest[a + 4..b - 1];
        let k: u64 = rest[b + 11..].split('[').next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let text = if conflict(m, claim, k) {
            "Yes. P1 and P2 conflict."
        } else {
            "There are no conflicting parts in P1 and P2."
        };
        return Reply::Text(text.into());
    }
    bad(format!("unexpected request {user:?}"))
}

/// (claim, gold is "supported") of a claims file, read here without Halyard's reader.
pub fn claims(path: &std::path::Path) -> Vec<(String, bool)> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(&l.replace(": NaN", ": null")).unwrap();
            let label = v.get("claim_label").or(v.get("label")).and_then(Value::as_str).unwrap();
            (v["claim"].as_str().unwrap().to_string(), matches!(label, "SUPPORTS" | "true"))
        })
        .collect()
}

pub struct AutoHallExpected {
    pub status: [(&'static str, u64); 5],
    pub classified: u64,
    pub hallucinated: u64,
    /// (TP, FP, TN, FN) for k = 1..=K on the balanced set.
    pub ablation: Vec<(u64, u64, u64, u64)>,
    pub balanced: BTreeSet<usize>,
    /// Zero- and Few-Self-Check on the balanced set: (TP, FP, TN, FN) and unparseable
    /// answers (each scored as the wrong prediction).
    pub self_checks: [((u64, u64, u64, u64), u64); 2],
}

pub fn expected(model: &str, claims: &[(String, bool)]) -> AutoHallExpected {
    let (mut refused, mut failed, mut unclassified) = (0, 0, 0);
    let mut labelled: Vec<(usize, bool)> = Vec::new();
    for (i, (claim, supported)) in claims.iter().enumerate() {
        if refuses(model, claim) {
            refused += 1;
        } else if poisoned(model, claim) {
            failed += 1;
        } else {
            match classification(model, claim).1 {
                None => unclassified += 1,
                Some(says_true) => labelled.push((i, says_true != *supported)),
            }
        }
    }
    let hallucinated = labelled.iter().filter(|(_, h)| *h).count();
    let n = hallucinated.min(labelled.len() - hallucinated);
    let mut balanced = BTreeSet::new();
    for class in [true, false] {
        balanced.extend(labelled.iter().filter(|(_, h)| *h == class).take(n).map(|(i, _)| *i));
    }
    let ablation = (1..=K as u64)
        .map(|k| {
            let mut c = (0, 0, 0, 0);
            for &(i, halluc) in labelled.iter().filter(|(i, _)| balanced.contains(i)) {
                let predicted = (1..=k).any(|j| conflict(model, &claims[i].0, j));
                match (halluc, predicted) {
                    (true, true) => c.0 += 1,
                    (false, true) => c.1 += 1,
                    (false, false) => c.2 += 1,
                    (true, false) => c.3 += 1,
                }
            }
            c
        })
        .collect();
    let self_checks = [false, true].map(|few| {
        let (mut c, mut unparseable) = ((0, 0, 0, 0), 0);
        for &(i, halluc) in labelled.iter().filter(|(i, _)| balanced.contains(i)) {
            let predicted = self_check(model, &claims[i].0, few).unwrap_or_else(|| {
                unparseable += 1;
                !halluc
            });
            match (halluc, predicted) {
                (true, true) => c.0 += 1,
                (false, true) => c.1 += 1,
                (false, false) => c.2 += 1,
                (true, false) => c.3 += 1,
            }
        }
        (c, unparseable)
    });
    AutoHallExpected {
        self_checks,
        status: [
            ("reference_failed", 0),
            ("refused", refused),
            ("classify_failed", failed),
            ("unclassified", unclassified),
            ("classified", labelled.len() as u64),
        ],
        classified: labelled.len() as u64,
        hallucinated: hallucinated as u64,
        ablation,
        balanced,
    }
}

/// The `[[model]]` blocks of the two fake models (`fake-a`, `fake-b`) at `base_url`.
pub fn fake_models(base_url: &str) -> String {
    ["fake-a", "fake-b"]
        .iter()
        .map(|m| {
            format!(
                "[[model]]\nname = \"{m}\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"{m}\"\nmax_concurrency = 8\nseed = {SEED}\ntemperature = 0.3\n\n"
            )
        })
        .collect()
}

/// A sweep `name` with these model blocks and one AutoHall benchmark per file, run by
/// `models`, on the first `limit` claims.
pub fn autohall_sweep(
    dir: &std::path::Path,
    name: &str,
    model_blocks: &str,
    models: &[&str],
    files: &[std::path::PathBuf],
    limit: usize,
) -> std::path::PathBuf {
    let mut text = format!("name = \"{name}\"\n{model_blocks}");
    for f in files {
        text.push_str(&format!(
            "[[benchmark]]\npipeline = \"autohall\"\ndataset = \"{}\"\nmodels = {models:?}\ntemperature = 0.7\nsamples = {K}\nlimit = {limit}\n\n",
            f.display()
        ));
    }
    text.push_str("[run]\nack_wait_s = 5\nmax_deliver = 3\n");
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}
