//! End-to-end: `halyard run` (embedded nats-server, coordinator, workers) over a sweep
//! that combines UHGEval (all four forms, two models), HVI with a judge, and HVI from a
//! labelled file, against a fake OpenAI-compatible server with fixed rules. The report's
//! figures are checked against a computation made here from the dataset files and the
//! rules, without the pipelines' parsers, planners or scorers (BLEU-4 and ROUGE-L values
//! use the golden-tested metric functions of `halyard_pipelines::metrics`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::common::*;
use halyard_pipelines::metrics::bleu::{bleu4_paper, bleu4_v2};
use halyard_pipelines::metrics::rouge::rouge_l;
use halyard_pipelines::metrics::tokenize::jieba_cut;
use halyard_tests::{ChatCall, FakeOpenAi, Faults, Reply};
use serde_json::Value;

const HVI_JUDGE_SYSTEM: &str = "You are a careful fact-checker";

fn uhgeval_dataset() -> PathBuf {
    repo_root().join("datasets/uhgeval/uhgeval_concise_sample_20.jsonl")
}

fn hvi_dataset() -> PathBuf {
    repo_root().join("datasets/hvi/climate_fever_claims_12.jsonl")
}

/// The text after the last `start` and before the next `end`.
fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let from = s.rfind(start).map(|i| i + start.len()).unwrap_or(0);
    let rest = &s[from..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// Per-model salt of the fake's rules.
fn salt(model: &str) -> u64 {
    if model == "fake-a" {
        0
    } else {
        1
    }
}

fn kw_answer(kw: &str, salt: u64) -> &'static str {
    match (fnv(kw) + salt) % 3 {
        0 => "不符合现实，因为没有依据。",
        1 => "符合现实。",
        _ => "无法判断。",
    }
}

fn sentence_answer(continuation: &str, salt: u64) -> &'static str {
    match (fnv(continuation) + salt) % 3 {
        0 => "续写不符合现实，因为与事实不符。",
        1 => "续写符合现实。",
        _ => "我认为续写符合现实。",
    }
}

/// The option text the fake prefers, or None for an unusable answer.
fn selective_preference<'a>(a: &'a str, b: &'a str, salt: u64) -> Option<&'a str> {
    if (fnv(a).wrapping_add(fnv(b)) + salt).is_multiple_of(4) {
        return None;
    }
    Some(if fnv(a) ^ salt < fnv(b) ^ salt { a } else { b })
}

/// The fake's continuation of a news slot (`《head》\ndate\nbeginning`).
fn continuation_answer(slot: &str, salt: u64) -> String {
    if (fnv(slot) + salt).is_multiple_of(5) {
        return "   ".into();
    }
    let beginning = slot.splitn(3, '\n').nth(2).unwrap_or("");
    let head: String = beginning
        .chars()
        .filter(|c| !matches!(c, '。' | '；' | '？' | '！'))
        .take(30 + salt as usize)
        .collect();
    format!("{head}。第二句不算。")
}

fn extraction_answer(sentence: &str) -> String {
    let c: Vec<char> = sentence.trim().chars().collect();
    let k1: String = c.iter().take(2).collect();
    let k2: String = c.iter().skip(2).take(3).collect();
    format!("关键词：\n<keywords>\n{k1}\n {k2} \n编造的词组\n</keywords>")
}

/// The HVI passage of a prompt: three sentences, none quoting the prompt.
fn passage_answer(model: &str, prompt: &str) -> String {
    format!("{model} writes about it. The figure is {}. It ends here.", fnv(prompt) % 100)
}

fn hvi_verdict(prompt: &str, sentence: &str) -> &'static str {
    match fnv(&format!("{prompt}|{sentence}")) % 5 {
        0 | 1 => "Looks fine.\nVERDICT: NOT_HALLUCINATED",
        2 => "VERDICT: INTRINSIC",
        3 => "Made up.\nVERDICT: EXTRINSIC",
        _ => "I cannot tell.",
    }
}

fn responder(call: &ChatCall) -> Reply {
    let s = salt(&call.model);
    let (first_role, first) =
        call.messages.first().map(|(r, c)| (r.as_str(), c.as_str())).unwrap_or(("", ""));
    if first_role == "system" && first.starts_with(HVI_JUDGE_SYSTEM) {
        let user = &call.messages[1].1;
        let prompt = between(user, "Prompt: \"\"\"", "\"\"\"");
        let sentence = between(user, "Sentence to judge: \"\"\"", "\"\"\"");
        return Reply::Text(hvi_verdict(prompt, sentence).into());
    }
    let p = first;
    let text = if p.contains("你需要判断新闻续写中的某个关键词是否符合现实") {
        kw_answer(between(p, "是否符合现实：续写中的\"\"\"", "\"\"\""), s).to_string()
    } else if p.contains("你需要判断新闻续写是否符合现实") {
        sentence_answer(between(p, "续写：\"\"\"", "\"\"\"\n\n判断："), s).to_string()
    } else if p.contains("续写评测器") {
        let a = between(p, "A：\"\"\"", "\"\"\"\n\nB：");
        let b = between(p, "B：\"\"\"", "\"\"\"\n\n哪个");
        match selective_preference(a, b, s) {
            None => "都不对".into(),
            Some(x) if x == a => "A".into(),
            Some(_) => "B".into(),
        }
    } else if p.contains("请你根据我已经写好的文本为我续写一段话") {
        continuation_answer(between(p, "已经写好的文本：\n\n", "\n\n续写的文本："), s)
    } else if p.contains("我需要你帮我从一句话中筛选出重要的词组或句子") {
        extraction_answer(between(p, "现在我的句子是：\n\n", "\n\n请给出"))
    } else {
        passage_answer(&call.model, p)
    };
    Reply::Text(text)
}

struct News {
    ty: String,
    slot: String,
    h: String,
    real_paper: String,
    remainder: String,
    annotations: Vec<(String, String)>,
    all_text: String,
}

fn first_sentence(s: &str) -> String {
    match s.char_indices().find(|(_, c)| matches!(c, '。' | '；' | '？' | '！')) {
        Some((i, c)) => s[..i + c.len_utf8()].to_string(),
        None => s.to_string(),
    }
}

fn load_news() -> Vec<News> {
    std::fs::read_to_string(uhgeval_dataset())
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let s = |k: &str| v[k].as_str().unwrap().to_string();
            let date: String = s("broadcastDate").chars().take(10).collect();
            News {
                ty: s("type"),
                slot: format!("《{}》\n{}\n{}", s("headLine"), date, s("newsBeginning")),
                h: s("hallucinatedContinuation"),
                real_paper: first_sentence(&s("newsRemainder")),
                remainder: s("newsRemainder"),
                annotations: v["annotations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| {
                        let (k, j) = a.as_str().unwrap().split_once("<sep>").unwrap();
                        (k.to_string(), j.to_string())
                    })
                    .collect(),
                all_text: format!("{}{}{}", s("headLine"), s("newsBeginning"), s("newsRemainder")),
            }
        })
        .collect()
}

#[derive(Debug, Default)]
struct Expected {
    kw: (f64, f64, usize),
    sentence: (f64, usize),
    selective: (f64, usize),
    /// bleu paper, bleu v2, rouge, kwprec, length, #valid
    generative: (f64, f64, f64, f64, f64, usize),
    selective_by_type: HashMap<String, (usize, usize)>,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// The paper-variant figures the rules imply for one model.
fn expected_uhgeval(news: &[News], salt: u64) -> Expected {
    let mut e = Expected::default();
    let (mut kw_acc, mut kw_n, mut se_acc) = (vec![], vec![], vec![]);
    let (mut sel_ok, mut sel_valid) = (0usize, 0usize);
    let mut gen: Vec<[f64; 5]> = vec![];
    for n in news {
        // Keyword level: appeared keywords excluded, first n of each class.
        let cands: Vec<&(String, String)> =
            n.annotations.iter().filter(|(k, _)| !n.all_text.contains(k.as_str())).collect();
        let yes: Vec<&str> = cands
            .iter()
            .filter(|(_, j)| j.starts_with("不合理"))
            .map(|(k, _)| k.as_str())
            .collect();
        let no: Vec<&str> =
            cands.iter().filter(|(_, j)| j.starts_with("合理")).map(|(k, _)| k.as_str()).collect();
        let m = yes.len().min(no.len());
        let preds: Vec<(i32, i32)> = yes[..m]
            .iter()
            .map(|k| (1, *k))
            .chain(no[..m].iter().map(|k| (0, *k)))
            .map(|(label, k)| {
                let a = kw_answer(k, salt);
                let p = if a.starts_with("不符合现实") {
                    1
                } else if a.starts_with("符合现实") {
                    0
                } else {
                    -1
                };
                (label, p)
            })
            .collect();
        if m > 0 && preds.iter().all(|(_, p)| *p >= 0) {
            kw_acc.push(preds.iter().filter(|(l, p)| l == p).count() as f64 / (2 * m) as f64);
            kw_n.push((2 * m) as f64);
        }
        // Sentence level.
        let verdict = |c: &str| {
            let a = sentence_answer(c, salt);
            if a.starts_with("续写不符合现实") {
                1
            } else if a.starts_with("续写符合现实") {
                0
            } else {
                -1
            }
        };
        let (vh, vr) = (verdict(&n.h), verdict(&n.real_paper));
        if vh >= 0 && vr >= 0 {
            se_acc.push(((vh == 1) as u8 + (vr == 0) as u8) as f64 / 2.0);
        }
        // Selective: the fake's preference does not depend on the option order.
        if let Some(p) = selective_preference(&n.h, &n.real_paper, salt) {
            sel_valid += 1;
            let ok = p == n.real_paper;
            sel_ok += ok as usize;
            let t = e.selective_by_type.entry(n.ty.clone()).or_default();
            t.0 += ok as usize;
            t.1 += 1;
        }
        // Generative.
        let answer = continuation_answer(&n.slot, salt);
        let cont = first_sentence(&answer);
        if !cont.trim().is_empty() {
            let c: Vec<char> = cont.trim().chars().collect();
            let kws: Vec<String> = [
                c.iter().take(2).collect::<String>(),
                c.iter().skip(2).take(3).collect::<String>(),
            ]
            .into_iter()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty() && cont.contains(k.as_str()))
            .collect();
            let kwprec = if kws.is_empty() {
                0.0
            } else {
                kws.iter().filter(|k| n.remainder.contains(k.as_str())).count() as f64
                    / kws.len() as f64
            };
            let (ct, rt) = (jieba_cut(&cont), jieba_cut(&n.remainder));
            gen.push([
                bleu4_paper(&ct, &rt).score,
                bleu4_v2(&ct, &rt).score,
                rouge_l(&ct, &rt).f,
                kwprec,
                cont.chars().count() as f64,
            ]);
        }
    }
    e.kw = (mean(&kw_acc), mean(&kw_n), kw_acc.len());
    e.sentence = (mean(&se_acc), se_acc.len());
    e.selective = (sel_ok as f64 / sel_valid as f64, sel_valid);
    let col = |i: usize| mean(&gen.iter().map(|g| g[i]).collect::<Vec<_>>());
    e.generative = (col(0), col(1), col(2), col(3), col(4), gen.len());
    e
}

/// (U, N, N_EFM, N_ESL, judge errors) of one model in judge mode.
fn expected_hvi_counts(model: &str) -> (u64, u64, u64, u64, u64) {
    let mut c = (0, 0, 0, 0, 0);
    for l in std::fs::read_to_string(hvi_dataset()).unwrap().lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        let (prompt, factual) = (v["prompt"].as_str().unwrap(), v["factual"].as_bool().unwrap());
        let passage = passage_answer(model, prompt);
        for s in passage.split_inclusive(". ").map(str::trim) {
            match hvi_verdict(prompt, s) {
                v if v.ends_with("NOT_HALLUCINATED") => c.0 += 1,
                v if v.ends_with("INTRINSIC") => {
                    c.0 += 1;
                    c.1 += 1;
                }
                v if v.ends_with("EXTRINSIC") => {
                    c.0 += 1;
                    c.1 += 1;
                    if factual {
                        c.2 += 1
                    } else {
                        c.3 += 1
                    }
                }
                _ => c.4 += 1,
            }
        }
    }
    c
}

#[allow(clippy::too_many_arguments)] // the paper's formula, term by term
fn hvi_formula(
    u: u64,
    n: u64,
    efm: u64,
    esl: u64,
    p_efm: f64,
    p_esl: f64,
    d1: f64,
    d2: f64,
) -> f64 {
    100.0 / (2.0 * u as f64)
        * ((n - efm) as f64 * (1.0 - p_efm + d1) + (n - esl) as f64 * (1.0 - p_esl + d2))
}

/// 100 labelled sentences: 40 hallucinated, 10 EFM, 5 ESL (spec §5.5).
fn write_labels(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for i in 0..100 {
        let (h, cat) = match i {
            0..=9 => (true, "\"EFM\""),
            10..=14 => (true, "\"ESL\""),
            15..=24 => (true, "\"IFM\""),
            25..=39 => (true, "null"),
            _ => (false, "null"),
        };
        text.push_str(&format!("{{\"model\": \"annotated-llm\", \"sentence\": \"s{i}.\", \"hallucinated\": {h}, \"category\": {cat}}}\n"));
    }
    text.push_str("{\"model\": \"other\", \"sentence\": \"x.\", \"hallucinated\": false}\n");
    let p = dir.join("labels.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

fn write_sweep(dir: &Path, base_url: &str, variant: &str) -> PathBuf {
    let labels = write_labels(dir);
    let path = dir.join("mixed.toml");
    let text = format!(
        r#"name = "mixed"

[[model]]
name = "model-a"
backend = "openai"
base_url = "{base_url}"
model = "fake-a"
max_concurrency = 8
temperature = 0.1

[[model]]
name = "model-b"
backend = "openai"
base_url = "{base_url}"
model = "fake-b"
max_concurrency = 8
temperature = 0.1

[[model]]
name = "judge-a"
backend = "openai"
base_url = "{base_url}"
model = "fake-judge"
max_concurrency = 8

[[benchmark]]
pipeline = "uhgeval"
dataset = "{uhg}"
models = ["model-a", "model-b"]
variant = "{variant}"

[[benchmark]]
pipeline = "hvi"
dataset = "{hvi}"
models = ["model-a", "model-b"]
judge = "judge-a"
delta1 = 0.1

[[benchmark]]
pipeline = "hvi"
labels = "{labels}"
models = ["annotated-llm"]
p_efm = 0.3
p_esl = 0.2
delta1 = 0.1
delta2 = 0.05

[run]
ack_wait_s = 5
max_deliver = 3
"#,
        uhg = uhgeval_dataset().display(),
        hvi = hvi_dataset().display(),
        labels = labels.display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn close(got: &Value, want: f64, what: &str) {
    let g = got.as_f64().unwrap_or_else(|| panic!("{what}: not a number: {got}"));
    assert!((g - want).abs() < 1e-9, "{what}: report {g} vs expected {want}");
}

fn entry<'a>(report: &'a Value, bench: u64, model: &str) -> &'a Value {
    report["benchmarks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["benchmark"] == bench && b["model"] == model)
        .unwrap_or_else(|| panic!("no entry for benchmark {bench} model {model}"))
}

/// The combined sweep's figures equal the independent computation, per benchmark and model.
#[test]
fn mixed_sweep_matches_independent_computation() {
    let faults = Faults::new();
    let fake = FakeOpenAi::start_blocking(faults.wrap(responder));
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), &fake.base_url(), "paper");
    let out = dir.path().join("runs");
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let report = read_json(&out.join("mixed/report.json"));
    let news = load_news();

    for (model, s) in [("model-a", 0), ("model-b", 1)] {
        let e = expected_uhgeval(&news, s);
        let r = entry(&report, 0, model);
        assert_eq!(r["pipeline"], "uhgeval");
        assert_eq!(r["variant"], "paper");
        assert_eq!(r["items"], 20);
        let kw = &r["keyword"]["overall"];
        close(&kw["avg_accuracy"], e.kw.0, "keyword avg acc");
        close(&kw["avg_num_kws"], e.kw.1, "keyword avg #kws");
        assert_eq!(kw["num"], e.kw.2, "keyword #valid");
        close(&r["sentence"]["overall"]["accuracy"], e.sentence.0, "sentence acc");
        assert_eq!(r["sentence"]["overall"]["num"], e.sentence.1);
        close(&r["selective"]["overall"]["accuracy"], e.selective.0, "selective acc");
        assert_eq!(r["selective"]["overall"]["num"], e.selective.1);
        for (ty, (ok, valid)) in &e.selective_by_type {
            close(
                &r["selective"]["by_type"][ty]["accuracy"],
                *ok as f64 / *valid as f64,
                "selective by type",
            );
        }
        let g = &r["generative"];
        close(&g["overall"]["avg_bleu4"], e.generative.0, "bleu paper");
        close(&g["avg_bleu4_paper"], e.generative.0, "bleu paper");
        close(&g["avg_bleu4_v2"], e.generative.1, "bleu v2");
        close(&g["overall"]["avg_rouge_l"], e.generative.2, "rouge-l");
        close(&g["overall"]["avg_kw_prec"], e.generative.3, "kwPrec");
        close(&g["overall"]["avg_length"], e.generative.4, "length");
        assert_eq!(g["overall"]["num"], e.generative.5);
        assert_eq!(g["bert_score"]["avg"], Value::Null);
        assert_eq!(g["bert_score"]["note"], "not computed (no embedding model configured)");
        // Each form exercised both valid and invalid answers.
        assert!(
            e.kw.2 > 0 && e.sentence.1 < 20 && e.selective.1 < 20 && e.generative.5 < 20,
            "{e:?}"
        );

        let (u, n, efm, esl, errors) =
            expected_hvi_counts(if s == 0 { "fake-a" } else { "fake-b" });
        let h = entry(&report, 1, model);
        assert_eq!(h["pipeline"], "hvi");
        assert_eq!(h["counts"]["sentences"], u);
        assert_eq!(h["counts"]["hallucinated"], n);
        assert_eq!(h["counts"]["efm"], efm);
        assert_eq!(h["counts"]["esl"], esl);
        assert_eq!(h["judge_errors"], errors);
        let (pe, ps) = (efm as f64 / u as f64, esl as f64 / u as f64);
        close(&h["hvi_initial"], hvi_formula(u, n, efm, esl, pe, ps, 0.0, 0.0), "hvi initial");
        close(&h["hvi"], hvi_formula(u, n, efm, esl, pe, ps, 0.1, 0.0), "hvi adjusted");
        assert!(errors > 0 && efm + esl > 0, "rules exercise judge errors and extrinsic labels");
        let ci = &h["hvi_ci95"];
        assert_eq!((&ci["method"], &ci["n"]), (&Value::from("bootstrap"), &Value::from(u)));
        let hv = h["hvi"].as_f64().unwrap();
        assert!(ci["low"].as_f64().unwrap() <= hv && hv <= ci["high"].as_f64().unwrap(), "{ci}");
    }
    let l = entry(&report, 2, "annotated-llm");
    close(&l["hvi_initial"], 24.5, "labelled initial HVI");
    close(&l["hvi"], 26.875, "labelled adjusted HVI");

    // The paper's selective order: seeded draws in dataset order (spec §5.2).
    let labels = std::fs::read_to_string(out.join("mixed/labels.jsonl")).unwrap();
    let orders: Vec<String> = labels
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["model"] == "model-a" && v.get("selective").is_some())
        .take(6)
        .map(|v| v["selective"]["order"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        orders,
        [
            "real_first",
            "hallucinated_first",
            "hallucinated_first",
            "real_first",
            "hallucinated_first",
            "hallucinated_first"
        ]
    );
    assert_eq!(report["jobs"]["dead_letters"], 0);
    assert_eq!(report["jobs"]["model_calls"].as_u64().unwrap(), fake.call_count() as u64);
    // Every uhgeval call used UHGEval's lengths: 24 tokens, 128 for generative ones.
    let uhgeval_calls: Vec<ChatCall> = fake
        .calls()
        .into_iter()
        .filter(|c| c.messages[0].1.contains("新华社") || c.messages[0].1.contains("续写评测器"))
        .collect();
    assert!(uhgeval_calls.len() > 100);
    for c in &uhgeval_calls {
        let generative =
            c.messages[0].1.contains("续写的文本") || c.messages[0].1.contains("<keywords>");
        let head: String = c.messages[0].1.chars().take(40).collect();
        assert_eq!(c.max_tokens, Some(if generative { 128 } else { 24 }), "{head}");
    }
    let md = std::fs::read_to_string(out.join("mixed/report.md")).unwrap();
    for needle in [
        "## Benchmark 0: uhgeval",
        "## Benchmark 1: hvi",
        "## Benchmark 2: hvi from labelled",
        "### Leaderboard",
        "| `model-b` |",
    ] {
        assert!(md.contains(needle), "{needle:?} not in report.md:\n{md}");
    }
    // Issue 29: faults leave UHGEval's and HVI's figures and labels as they were.
    rerun_with_faults(&fake, &faults, &sweep, "mixed", &out, dir.path());
}

/// Bad uhgeval/hvi benchmark keys fail before anything starts, naming file and key.
#[test]
fn bad_uhgeval_and_hvi_sweeps_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = write_sweep(dir.path(), "http://127.0.0.1:9/v1", "paper");
    let text = std::fs::read_to_string(&good).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (text.replace("variant = \"paper\"", "variant = \"v3\""), "benchmark[0].variant"),
        (
            text.replace("variant = \"paper\"", "forms = [\"keyword\", \"poem\"]"),
            "benchmark[0].forms[1]",
        ),
        (text.replace("variant = \"paper\"", "judge = \"judge-a\""), "benchmark[0].judge"),
        (text.replace("judge = \"judge-a\"\ndelta1 = 0.1", "delta1 = 0.1"), "benchmark[1].judge"),
        (text.replace("p_efm = 0.3", "p_efm = 1.5"), "benchmark[2].p_efm"),
        (text.replace("p_esl = 0.2", "p_esl = \"often\""), "benchmark[2].p_esl"),
        (
            text.replace("models = [\"annotated-llm\"]", "models = [\"nobody\"]"),
            "benchmark[2].models[0]",
        ),
        (text.replace("uhgeval_concise_sample_20.jsonl", "missing.jsonl"), "benchmark[0].dataset"),
        // BERTScore needs an embedding model, and the generative form it scores.
        (
            text.replace("variant = \"paper\"", "bert_embedder = \"judge-a\""),
            "benchmark[0].bert_embedder",
        ),
        (
            text.replace("variant = \"paper\"", "bert_embedder = \"nobody\""),
            "benchmark[0].bert_embedder",
        ),
        (
            text.replace(
                "delta1 = 0.1\n\n[[benchmark]]",
                "delta1 = 0.1\nbert_embedder = \"judge-a\"\n\n[[benchmark]]",
            ),
            "benchmark[1].bert_embedder",
        ),
    ];
    for (i, (body, needle)) in cases.into_iter().enumerate() {
        assert_sweep_rejected(dir.path(), &format!("bad{i}"), &body, needle);
    }
    // A broken dataset line is reported with its file and line.
    let ds = dir.path().join("broken.jsonl");
    let first =
        std::fs::read_to_string(uhgeval_dataset()).unwrap().lines().next().unwrap().to_string();
    std::fs::write(
        &ds,
        format!("{first}\n{}\n", first.replace("\"type\": \"doc\"", "\"type\": \"sport\"")),
    )
    .unwrap();
    let body = text.replace(&uhgeval_dataset().display().to_string(), ds.to_str().unwrap());
    assert_sweep_rejected(dir.path(), "badds", &body, "broken.jsonl:2: field `type`");
}

const UNRELATED: &str = "小猫在阳光下睡觉，窗外的花开了。";

/// The fake's generative continuations for the BERTScore test: the news remainder's first
/// sentence on even items, an unrelated sentence on odd ones.
fn bert_responder(news: &[News]) -> impl Fn(&ChatCall) -> Reply + Send + Sync + 'static {
    let by_slot: HashMap<String, (usize, String)> =
        news.iter().enumerate().map(|(i, n)| (n.slot.clone(), (i, n.real_paper.clone()))).collect();
    move |call: &ChatCall| {
        let p = call.messages.first().map(|(_, c)| c.as_str()).unwrap_or("");
        if p.contains("请你根据我已经写好的文本为我续写一段话") {
            let slot = between(p, "已经写好的文本：\n\n", "\n\n续写的文本：");
            return Reply::Text(match by_slot.get(slot) {
                Some((i, first)) if i % 2 == 0 => first.clone(),
                _ => UNRELATED.into(),
            });
        }
        responder(call)
    }
}

/// With `bert_embedder` (the real all-MiniLM-L6-v2 in the worker), each valid continuation
/// gets a `bert` job and BERTScore is the mean cosine of continuation and reference; the
/// report names the model and marks the figure not comparable with the paper's.
#[test]
fn bertscore_with_an_embedding_model() {
    let news = load_news();
    let fake = FakeOpenAi::start_blocking(bert_responder(&news));
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("bert.toml");
    std::fs::write(
        &sweep,
        format!(
            r#"name = "bert"

[[model]]
name = "model-a"
backend = "openai"
base_url = "{base}"
model = "fake-a"
max_concurrency = 8

[[model]]
name = "minilm"
backend = "embed"
model_path = "{embed}"

[[benchmark]]
pipeline = "uhgeval"
dataset = "{uhg}"
models = ["model-a"]
forms = ["generative"]
bert_embedder = "minilm"

[run]
ack_wait_s = 30
"#,
            base = fake.base_url(),
            embed = embed_model().display(),
            uhg = uhgeval_dataset().display(),
        ),
    )
    .unwrap();
    let out = dir.path().join("runs");
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let report = read_json(&out.join("bert/report.json"));
    let g = &entry(&report, 0, "model-a")["generative"];
    let b = &g["bert_score"];
    assert_eq!(b["model"], "minilm", "{b}");
    assert_eq!(b["comparable_to_paper"], false, "{b}");
    assert!(b["note"].as_str().unwrap().contains("text2vec-base-chinese"), "{b}");
    // Per item, from labels.jsonl: the copied first sentences score well above the
    // unrelated sentence, and the report's figure is their mean.
    let labels = std::fs::read_to_string(out.join("bert/labels.jsonl")).unwrap();
    let (mut copied, mut unrelated, mut all) = (Vec::new(), Vec::new(), Vec::new());
    for line in labels.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let Some(score) = v["generative"]["bert"]["score"].as_f64() else { continue };
        assert!((-1.0..=1.0 + 1e-6).contains(&score), "{v}");
        all.push(score);
        if v["generative"]["continuation"] == UNRELATED {
            unrelated.push(score)
        } else {
            copied.push(score)
        }
    }
    assert_eq!(all.len() as u64, g["overall"]["num"].as_u64().unwrap(), "one score per valid item");
    assert!(copied.len() >= 5 && unrelated.len() >= 5, "{} / {}", copied.len(), unrelated.len());
    close(&b["avg"], mean(&all), "BERTScore mean");
    assert!(
        mean(&copied) > mean(&unrelated) + 0.1,
        "copied {:.3} vs unrelated {:.3}",
        mean(&copied),
        mean(&unrelated)
    );
    let ci = &b["ci95"];
    assert!(ci["low"].as_f64().unwrap() <= b["avg"].as_f64().unwrap());
    assert_eq!(ci["n"], all.len());
    let md = std::fs::read_to_string(out.join("bert/report.md")).unwrap();
    assert!(md.contains("| BERTScore |"), "{md}");
}
