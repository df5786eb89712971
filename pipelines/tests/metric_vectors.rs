//! The worked examples of `shared/golden/metric_vectors.json` (spec `metrics.md` §5), every
//! one of them, against `halyard_pipelines::metrics`.
//!
//! Each vector is run through the functions it exercises; the results are put in a JSON
//! object shaped like the vector's `expected`, and every leaf of `expected` is compared
//! under the vector's `tolerance` (a number = absolute, `{"rel": x}` = relative, 0 = exact;
//! strings, booleans, nulls and list lengths exactly). A leaf may only be left unchecked
//! through [`UNCHECKED`], which says why.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use halyard_pipelines::metrics::auroc::{aggregate_auroc, auroc, relative_quality};
use halyard_pipelines::metrics::autohall::{
    detect, is_hallucinated, pair_conflicts, parse_claim_verdict, selfck_1gm_hallucinated,
    ClaimVerdict, GoldLabel, NoConflictPhrases,
};
use halyard_pipelines::metrics::bleu::{bleu4_paper, bleu4_v2, NgramPrecision};
use halyard_pipelines::metrics::chainpoll::{
    chainpoll_score, chainpoll_score_parsed, parse_verdict_final_answer, parse_verdict_first_word,
    Unparseable,
};
use halyard_pipelines::metrics::classification::Confusion;
use halyard_pipelines::metrics::hvi::{hvi, HviCounts, HviParams};
use halyard_pipelines::metrics::kwprec::{kw_prec, parse_extracted_keywords};
use halyard_pipelines::metrics::pseudo_entropy::token_pseudo_entropy;
use halyard_pipelines::metrics::rouge::rouge_l;
use halyard_pipelines::metrics::selfcheck::{
    selfcheck_unigram, selfcheck_unigram_text, SelfCheckNgram,
};
use halyard_pipelines::metrics::tokenize::jieba_cut;
use halyard_pipelines::metrics::uhgeval::{
    generative_item, keyword_item, keyword_overall, option_order_v2, paper_block_coverage,
    paper_option_orders, parse_keyword_judgement, parse_selective_choice, parse_sentence_judgement,
    select_keywords_paper, select_keywords_v2, selective_overall, sentence_item, sentence_overall,
    v2_batch_sizes, Judgement, KeywordCase, KeywordItem, OptionOrder, SelectiveItem, UhgVariant,
};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

/// The number of vectors the golden file holds (spec §5).
const EXPECTED_VECTORS: usize = 41;

/// `(metric, expected key)` leaves deliberately not checked, with the reason.
const UNCHECKED: &[(&str, &str, &str)] = &[(
    "bleu4_uhgeval_v2_nltk",
    "sacrebleu_default_exp_smoothing",
    "a cross-check against sacrebleu's exponential smoothing, which neither UHGEval variant uses (spec §1.6)",
)];

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/metric_vectors.json")
}

fn golden_text() -> String {
    let path = golden_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "golden file {} is missing or unreadable ({e}); it ships in shared/golden/",
            path.display()
        )
    })
}

// ---------------------------------------------------------------------------------------
// Comparison under the file's tolerance semantics

#[derive(Clone, Copy, Debug)]
enum Tolerance {
    Abs(f64),
    Rel(f64),
}

impl Tolerance {
    fn from_json(v: &Value) -> Tolerance {
        match v {
            Value::Number(n) => Tolerance::Abs(n.as_f64().expect("numeric tolerance")),
            Value::Object(o) => Tolerance::Rel(o["rel"].as_f64().expect("{\"rel\": x} tolerance")),
            other => panic!("unknown tolerance {other}"),
        }
    }

    fn accepts(self, expected: f64, actual: f64) -> bool {
        let diff = (actual - expected).abs();
        match self {
            Tolerance::Abs(t) | Tolerance::Rel(t) if t == 0.0 => actual == expected,
            Tolerance::Abs(t) => diff <= t,
            Tolerance::Rel(t) => diff <= t * expected.abs(),
        }
    }
}

struct Mismatch(String);

impl fmt::Debug for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Compares every leaf of `expected` with `actual`; returns the number of leaves checked.
fn compare(
    expected: &Value,
    actual: &Value,
    tol: Tolerance,
    path: &str,
) -> Result<usize, Mismatch> {
    let fail =
        |why: String| Err(Mismatch(format!("{path}: {why} (expected {expected}, got {actual})")));
    match (expected, actual) {
        (Value::Number(e), Value::Number(a)) => {
            let (e, a) = (e.as_f64().expect("finite"), a.as_f64().expect("finite"));
            if tol.accepts(e, a) {
                Ok(1)
            } else {
                fail(format!("outside tolerance {tol:?}"))
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            if e.len() != a.len() {
                return fail(format!("list length {} vs {}", e.len(), a.len()));
            }
            let mut n = 0;
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                n += compare(ev, av, tol, &format!("{path}[{i}]"))?;
            }
            Ok(n.max(1))
        }
        (Value::Object(e), Value::Object(a)) => {
            let mut n = 0;
            for (k, ev) in e {
                match a.get(k) {
                    Some(av) => n += compare(ev, av, tol, &format!("{path}.{k}"))?,
                    None => return fail(format!("no actual value for key {k:?}")),
                }
            }
            Ok(n)
        }
        (e, a) if e == a => Ok(1),
        _ => fail("differs".into()),
    }
}

// ---------------------------------------------------------------------------------------
// Input helpers

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("list of strings")
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array().expect("list of numbers").iter().map(|x| x.as_f64().expect("number")).collect()
}

fn bools(v: &Value) -> Vec<bool> {
    v.as_array().expect("list of booleans").iter().map(|b| b.as_bool().expect("boolean")).collect()
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().expect("non-negative integer")
}

fn labels01(v: &Value) -> Vec<bool> {
    v.as_array().expect("0/1 list").iter().map(|x| u64_of(x) == 1).collect()
}

fn token_lists(v: &Value) -> Vec<Vec<String>> {
    v.as_array().expect("list of token lists").iter().map(strs).collect()
}

fn judgement(v: &Value) -> Judgement {
    let code = v.as_i64().expect("integer verdict");
    Judgement::from_code(code).unwrap_or_else(|| panic!("verdict code {code} is not 1, 0 or -1"))
}

fn fraction(p: &NgramPrecision) -> String {
    format!("{}/{}", p.matches, p.possible)
}

fn selfcheck_json(r: &SelfCheckNgram) -> Value {
    json!({
        "sent_avg_neg_logprob": r.sent_avg_neg_logprob,
        "sent_max_neg_logprob": r.sent_max_neg_logprob,
        "doc_avg_neg_logprob": r.doc_avg_neg_logprob,
        "doc_avg_max_neg_logprob": r.doc_avg_max_neg_logprob,
        "mean_of_sentence_avg_neg_logprob": r.mean_of_sentence_avg(),
        "N_tokens": r.training_tokens,
    })
}

/// `allKeywords` in file order (a `serde_json::Value` object would sort its keys).
struct OrderedPairs(Vec<(String, String)>);

impl<'de> Deserialize<'de> for OrderedPairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedPairs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedPairs, A::Error> {
                let mut pairs = Vec::new();
                while let Some(entry) = map.next_entry::<String, String>()? {
                    pairs.push(entry);
                }
                Ok(OrderedPairs(pairs))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct OrderedFile {
    vectors: Vec<OrderedVector>,
}

#[derive(Deserialize)]
struct OrderedVector {
    inputs: OrderedInputs,
}

#[derive(Deserialize)]
struct OrderedInputs {
    #[serde(rename = "allKeywords", default)]
    all_keywords: Option<OrderedPairs>,
}

// ---------------------------------------------------------------------------------------
// One vector → the actual values

/// Context shared by vectors that refer to one another.
struct Golden<'a> {
    vectors: &'a [Value],
    ordered: &'a [OrderedVector],
}

impl Golden<'_> {
    /// The reference text of the generative vector whose continuation is `continuation`
    /// (spec §5.2 "kwPrec vs row-3 reference").
    fn reference_for(&self, continuation: &str) -> String {
        self.vectors
            .iter()
            .find(|v| {
                v["metric"] == "uhgeval_generative_metrics_zh"
                    && v["inputs"]["continuation"] == continuation
            })
            .and_then(|v| v["inputs"]["reference"].as_str())
            .unwrap_or_else(|| panic!("no generative vector with continuation {continuation:?}"))
            .to_owned()
    }

    fn actual(&self, index: usize) -> Value {
        let v = &self.vectors[index];
        let i = &v["inputs"];
        let metric = v["metric"].as_str().expect("metric name");
        match metric {
            "bleu4_uhgeval_paper_v1" => {
                let b = bleu4_paper(&strs(&i["candidate_tokens"]), &strs(&i["reference_tokens"]));
                json!({
                    "modified_precisions": b.precisions.iter().map(fraction).collect::<Vec<_>>(),
                    "brevity_penalty": b.brevity_penalty,
                    "score": b.score,
                })
            }
            "bleu4_uhgeval_v2_nltk" => {
                let (c, r) = (strs(&i["candidate_tokens"]), strs(&i["reference_tokens"]));
                json!({
                    "score": bleu4_v2(&c, &r).score,
                    // sacrebleu without smoothing = the library BLEU of the paper variant (geo·BP).
                    "sacrebleu_smooth_none": bleu4_paper(&c, &r).library_bleu,
                })
            }
            "rougeL_f" => {
                let r = rouge_l(&strs(&i["candidate_tokens"]), &strs(&i["reference_tokens"]));
                json!({ "lcs": r.lcs, "precision": r.precision, "recall": r.recall, "f": r.f })
            }
            "uhgeval_generative_metrics_zh" => {
                let (cont, refr) =
                    (i["continuation"].as_str().unwrap(), i["reference"].as_str().unwrap());
                let (c, r) = (jieba_cut(cont), jieba_cut(refr));
                assert_eq!(
                    c,
                    strs(&i["jieba_candidate_tokens"]),
                    "jieba-rs differs from jieba 0.42.1 on {cont:?}"
                );
                assert_eq!(
                    r,
                    strs(&i["jieba_reference_tokens"]),
                    "jieba-rs differs from jieba 0.42.1 on {refr:?}"
                );
                let kws = strs(&i["keywords"]);
                let paper = generative_item(cont, refr, &kws, UhgVariant::Paper);
                let v2 = generative_item(cont, refr, &kws, UhgVariant::V2);
                json!({
                    "modified_precisions": bleu4_paper(&c, &r).precisions.iter().map(fraction).collect::<Vec<_>>(),
                    "bleu4_paper_v1_no_bp": paper.bleu4,
                    "bleu4_v2_nltk": v2.bleu4,
                    "rougeL_f": paper.rouge_l,
                    "kwPrec": paper.kw_prec,
                    "length_chars": paper.length,
                })
            }
            "uhgeval_kwprec" => {
                json!({ "score": kw_prec(&strs(&i["keywords"]), i["reference"].as_str().unwrap()) })
            }
            "uhgeval_keyword_extraction_parse" => {
                let cont = i["continuation"].as_str().unwrap();
                let kws = parse_extracted_keywords(i["llm_response"].as_str().unwrap(), cont);
                json!({ "keywords": kws, "kwPrec_vs_reference": kw_prec(&kws, &self.reference_for(cont)) })
            }
            "uhgeval_parse_keyword_level"
            | "uhgeval_parse_sentence_level"
            | "uhgeval_parse_selective" => {
                let parse = |variant| -> Vec<i8> {
                    strs(&i["responses"])
                        .iter()
                        .map(|r| match metric {
                            "uhgeval_parse_keyword_level" => {
                                parse_keyword_judgement(r, variant).code()
                            }
                            "uhgeval_parse_sentence_level" => {
                                parse_sentence_judgement(r, variant).code()
                            }
                            _ => parse_selective_choice(r, variant).code(),
                        })
                        .collect()
                };
                json!({ "v1_paper": parse(UhgVariant::Paper), "v2_eval_suite": parse(UhgVariant::V2) })
            }
            "uhgeval_disc_sentence_item" => {
                let items: Vec<_> = i["pairs_pred_on_hallucinated_pred_on_real"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| sentence_item(judgement(&p[0]), judgement(&p[1])))
                    .collect();
                let overall = sentence_overall(&items);
                json!({
                    "accuracy": items.iter().map(|x| x.accuracy).collect::<Vec<_>>(),
                    "valid": items.iter().map(|x| x.valid).collect::<Vec<_>>(),
                    "avg_accuracy_over_valid": overall.accuracy,
                    "num_valid": overall.num,
                })
            }
            "uhgeval_disc_keyword_balancing" => {
                let pairs =
                    &self.ordered[index].inputs.all_keywords.as_ref().expect("allKeywords").0;
                let preds = |key: &str, cases: &[KeywordCase]| -> Vec<Judgement> {
                    cases.iter().map(|c| judgement(&i[key][c.keyword.as_str()])).collect()
                };
                let v1 = select_keywords_paper(pairs, &strs(&i["appearedKeywords"]));
                let v1_item =
                    keyword_item(&v1, &preds("predictions_v1", &v1), UhgVariant::Paper).unwrap();
                let lines: Vec<String> =
                    pairs.iter().map(|(k, a)| format!("{k}<sep>{a}")).collect();
                let v2 = select_keywords_v2(&lines).unwrap();
                let v2_item =
                    keyword_item(&v2, &preds("predictions_v2", &v2), UhgVariant::V2).unwrap();
                let names =
                    |cs: &[KeywordCase]| cs.iter().map(|c| c.keyword.clone()).collect::<Vec<_>>();
                let labels = |cs: &[KeywordCase]| {
                    cs.iter().map(|c| u8::from(c.hallucinated)).collect::<Vec<_>>()
                };
                json!({
                    "v1_selected": names(&v1), "v1_labels": labels(&v1),
                    "v1_num_kws": v1_item.num_kws, "v1_accuracy": v1_item.accuracy,
                    "v2_selected": names(&v2), "v2_labels": labels(&v2),
                    "v2_num_kws": v2_item.num_kws, "v2_accuracy": v2_item.accuracy,
                })
            }
            "uhgeval_selective_order" => {
                let seed = u64_of(&i["v1_seed"]);
                let swaps: Vec<bool> = paper_option_orders(seed)
                    .take(6)
                    .map(|o| o == OptionOrder::RealFirst)
                    .collect();
                let v2: Vec<bool> = i["v2_hallucinated_lengths"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| {
                        option_order_v2(&"字".repeat(u64_of(n) as usize))
                            == OptionOrder::HallucinatedFirst
                    })
                    .collect();
                json!({ "v1_first_six_swaps": swaps, "v2_hallucinated_is_option_A": v2 })
            }
            "uhgeval_selective_accuracy" => {
                let items: Vec<SelectiveItem> = bools(&i["correct"])
                    .into_iter()
                    .zip(bools(&i["valid"]))
                    .map(|(correct, valid)| SelectiveItem { correct, valid })
                    .collect();
                let o = selective_overall(&items);
                json!({ "accuracy": o.accuracy, "num_valid": o.num })
            }
            "uhgeval_disc_keyword_overall" => {
                let items: Vec<KeywordItem> = i["item_results"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| KeywordItem {
                        accuracy: r["accuracy"].as_f64().unwrap(),
                        num_kws: u64_of(&r["num_kws"]) as usize,
                        valid: r["valid"].as_bool().unwrap(),
                    })
                    .collect();
                let o = keyword_overall(&items);
                json!({ "avg_accuracy": o.avg_accuracy, "avg_num_kws": o.avg_num_kws, "num": o.num })
            }
            "uhgeval_v1_experiment_in_blocks_coverage" => {
                let cov: Vec<_> = i["cases"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| {
                        paper_block_coverage(
                            u64_of(&c["total"]) as usize,
                            u64_of(&c["num_blocks"]) as usize,
                            0,
                        )
                        .unwrap()
                    })
                    .collect();
                json!({
                    "block_size": cov.iter().map(|c| c.block_size).collect::<Vec<_>>(),
                    "items_ever_evaluated": cov.iter().map(|c| c.items_scheduled).collect::<Vec<_>>(),
                    "last_index_evaluated": cov.iter().map(|c| c.last_index).collect::<Vec<_>>(),
                })
            }
            "uhgeval_v2_to_batched" => {
                let k = u64_of(&i["num_batches"]) as usize;
                json!({
                    "batch_sizes": v2_batch_sizes(u64_of(&i["n"]) as usize, k).unwrap(),
                    "batch_sizes_n2": v2_batch_sizes(u64_of(&i["n2"]) as usize, k).unwrap(),
                })
            }
            "autohall_claim_classification_parse" => {
                let cats: Vec<Option<&str>> = strs(&i["answers"])
                    .iter()
                    .map(|a| {
                        parse_claim_verdict(a).map(|c| match c {
                            ClaimVerdict::True => "T",
                            ClaimVerdict::False => "F",
                        })
                    })
                    .collect();
                json!({ "category": cats })
            }
            "autohall_hallucination_label" => {
                let h: Vec<bool> = i["pairs_classification_groundtruth"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        let verdict = match p[0].as_str() {
                            Some("T") => ClaimVerdict::True,
                            Some("F") => ClaimVerdict::False,
                            other => panic!("classification {other:?}"),
                        };
                        let gold = GoldLabel::from_dataset(p[1].as_str().unwrap())
                            .expect("a kept gold label");
                        is_hallucinated(verdict, gold)
                    })
                    .collect();
                json!({ "hallucinated": h })
            }
            "autohall_selfcontradiction_decision" => {
                let conflicts: Vec<bool> = strs(&i["pair_answers_K3"])
                    .iter()
                    .map(|a| pair_conflicts(a, NoConflictPhrases::Standard))
                    .collect();
                let d = detect(&conflicts).unwrap();
                json!({
                    "conflict_per_pair": conflicts,
                    "predicted_hallucination": d.hallucinated,
                    "num_conflicts": d.num_conflicts,
                })
            }
            "autohall_accuracy_f1" => {
                let c = if i.get("TP").is_some() {
                    let n = |k: &str| u64_of(&i[k]);
                    Confusion::from_counts(
                        n("num_hallucinated"),
                        n("num_factual"),
                        n("TP"),
                        n("FP"),
                    )
                    .unwrap()
                } else {
                    Confusion::from_labels(
                        &labels01(&i["y_true_hallucination"]),
                        &labels01(&i["y_pred_hallucination"]),
                    )
                    .unwrap()
                };
                let m = c.metrics();
                json!({ "accuracy": m.accuracy, "precision": m.precision, "recall": m.recall, "f1": m.f1 })
            }
            "autohall_selfcheck_1gram_threshold" => {
                let p: Vec<bool> = f64s(&i["doc_avg_neg_logprob"])
                    .into_iter()
                    .map(|x| selfck_1gm_hallucinated(x).unwrap())
                    .collect();
                json!({ "predicted_hallucination": p })
            }
            "chainpoll_score" => {
                if let Some(verdicts) = i.get("verdicts") {
                    json!({ "score": chainpoll_score(&bools(verdicts)).unwrap() })
                } else if i["parse"].as_str().unwrap().starts_with("first word") {
                    let verdicts: Vec<bool> = strs(&i["judge_responses"])
                        .iter()
                        .map(|r| parse_verdict_first_word(r))
                        .collect();
                    json!({ "verdicts": verdicts, "score": chainpoll_score(&verdicts).unwrap() })
                } else {
                    let verdicts: Vec<Option<bool>> = strs(&i["judge_responses"])
                        .iter()
                        .map(|r| parse_verdict_final_answer(r))
                        .collect();
                    json!({
                        "verdicts": verdicts,
                        "score_over_parsed": chainpoll_score_parsed(&verdicts, Unparseable::Exclude).unwrap(),
                        "score_unparsed_as_no": chainpoll_score_parsed(&verdicts, Unparseable::CountAsNo).unwrap(),
                    })
                }
            }
            "auroc" => {
                json!({ "auroc": auroc(&labels01(&i["labels_hallucinated"]), &f64s(&i["scores"])).unwrap() })
            }
            "realhall_aggregate_and_relative_quality" => {
                let per: BTreeMap<String, Vec<f64>> = i["per_dataset_auroc"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), f64s(v)))
                    .collect();
                let aggregate: BTreeMap<&String, f64> =
                    per.iter().map(|(k, v)| (k, aggregate_auroc(v).unwrap())).collect();
                json!({
                    "aggregate": aggregate,
                    "other_quality_vs_chainpoll": relative_quality(&per["Other"], &per["ChainPoll"]).unwrap(),
                })
            }
            "selfcheck_unigram" => {
                let r = if let Some(sentences) = i.get("sentences") {
                    let s = strs(sentences);
                    let samples = strs(&i["sampled_passages"]);
                    selfcheck_unigram_text(
                        &s.iter().map(String::as_str).collect::<Vec<_>>(),
                        i["passage"].as_str().unwrap(),
                        &samples.iter().map(String::as_str).collect::<Vec<_>>(),
                    )
                } else {
                    selfcheck_unigram(
                        &token_lists(&i["sentence_tokens"]),
                        &token_lists(&i["training_tokens_passage_plus_samples"]),
                    )
                };
                selfcheck_json(&r.unwrap())
            }
            "pseudo_entropy_token" => {
                let t = token_pseudo_entropy(&f64s(&i["top_probs"])).unwrap();
                json!({
                    "sum_top": t.sum_top,
                    "PPL5": t.ppl5,
                    "pseudo_entropy": t.pseudo_entropy,
                    "identity_PE_minus_PPL5_equals_minus_ln_sum": t.pseudo_entropy - t.ppl5,
                })
            }
            "hvi" => {
                let counts = HviCounts {
                    sentences: u64_of(&i["U"]),
                    hallucinated: u64_of(&i["N"]),
                    efm: u64_of(&i["Nefm"]),
                    esl: u64_of(&i["Nesl"]),
                };
                let f = |k: &str| i[k].as_f64().unwrap();
                let params = HviParams::new(f("Pefm"), f("Pesl")).with_deltas(f("d1"), f("d2"));
                json!({ "hvi": hvi(counts, params).unwrap() })
            }
            other => panic!("vector #{index}: no handler for metric {other:?}"),
        }
    }
}

/// Every one of the 41 golden vectors matches, leaf by leaf, within its tolerance.
#[test]
fn all_golden_vectors() {
    let text = golden_text();
    let file: Value = serde_json::from_str(&text).expect("golden vectors file is valid JSON");
    let ordered: OrderedFile =
        serde_json::from_str(&text).expect("golden vectors file re-reads in key order");
    let vectors = file["vectors"].as_array().expect("a `vectors` list");
    assert_eq!(
        vectors.len(),
        EXPECTED_VECTORS,
        "the golden file should hold {EXPECTED_VECTORS} vectors"
    );
    let golden = Golden { vectors, ordered: &ordered.vectors };

    let mut checked_vectors = 0;
    let mut checked_leaves = 0;
    let mut unchecked_used = 0;
    let mut failures = Vec::new();
    for (index, v) in vectors.iter().enumerate() {
        let metric = v["metric"].as_str().expect("metric name");
        let tol = Tolerance::from_json(&v["tolerance"]);
        let mut expected = v["expected"].clone();
        for (m, key, _why) in UNCHECKED {
            if *m == metric && expected.as_object_mut().and_then(|o| o.remove(*key)).is_some() {
                unchecked_used += 1;
            }
        }
        let actual = golden.actual(index);
        match compare(&expected, &actual, tol, &format!("#{index} {metric}")) {
            Ok(0) => failures.push(format!("#{index} {metric}: no leaf checked")),
            Ok(n) => {
                checked_vectors += 1;
                checked_leaves += n;
            }
            Err(m) => failures.push(m.0),
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden vector(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(checked_vectors, EXPECTED_VECTORS, "every vector must be checked");
    assert_eq!(
        unchecked_used,
        UNCHECKED.len(),
        "every UNCHECKED entry must match a leaf of the file"
    );
    eprintln!("checked {checked_vectors} vectors, {checked_leaves} leaves");
}

/// The comparator rejects a value just outside an absolute or relative tolerance, and a list length change.
#[test]
fn comparator_detects_deviations() {
    let e = json!({ "x": 1.0, "l": [1, 2] });
    assert!(
        compare(&e, &json!({ "x": 1.0 + 2e-9, "l": [1, 2] }), Tolerance::Abs(1e-9), "t").is_err()
    );
    assert!(
        compare(&e, &json!({ "x": 1.0 + 5e-10, "l": [1, 2] }), Tolerance::Abs(1e-9), "t").is_ok()
    );
    assert!(compare(&e, &json!({ "x": 1.000002, "l": [1, 2] }), Tolerance::Rel(1e-6), "t").is_err());
    assert!(compare(&e, &json!({ "x": 1.0, "l": [1, 2, 3] }), Tolerance::Abs(0.0), "t").is_err());
    assert!(compare(&e, &json!({ "l": [1, 2] }), Tolerance::Abs(0.0), "t").is_err());
    assert!(compare(&json!([null]), &json!([0]), Tolerance::Abs(1.0), "t").is_err());
    assert!(compare(&json!(0.0), &json!(1e-300), Tolerance::Rel(1e-6), "t").is_err());
}
