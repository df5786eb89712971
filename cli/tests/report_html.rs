//! The operator's view of a finished run: token and cost accounting per model and stage,
//! `--max-cost`, and `report.html` rendered in a real headless browser (Debian's
//! `chromium`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::browser::{chromium, render_check};
use crate::common::*;
use halyard_tests::FakeOpenAi;

/// The e2e sweep with prices: model-a $2/$8 per 1M tokens, judge-a $1/$1; with
/// `second`, a second model under test, model-b, priced as model-a.
fn priced_sweep(dir: &Path, name: &str, base_url: &str, limit: usize, second: bool) -> PathBuf {
    let p = write_sweep(dir, name, base_url, limit, 4);
    let text = std::fs::read_to_string(&p).unwrap();
    let mut text = text
        .replace("max_tokens = 256", "max_tokens = 256\nprice = { input = 2.0, output = 8.0 }")
        .replace(
            "model = \"fake-judge\"",
            "model = \"fake-judge\"\nprice = { input = 1.0, output = 1.0 }",
        );
    if second {
        let b = format!(
            "[[model]]\nname = \"model-b\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"fake-model-b\"\nmax_tokens = 256\nprice = {{ input = 2.0, output = 8.0 }}\n\n[[benchmark]]"
        );
        text = text
            .replace("[[benchmark]]", &b)
            .replace("models = [\"model-a\"]", "models = [\"model-a\", \"model-b\"]");
    }
    std::fs::write(&p, text).unwrap();
    p
}

/// Tokens and cost per model and stage add up to the run's totals and its prices; the
/// page renders in Chromium without script errors, every bar segment drawn, segments
/// linking to rows of labels.jsonl; a screenshot is taken.
#[test]
fn report_html_renders_in_chromium_with_costs() {
    let qs = load_questions(30);
    let poison = qs[7].id;
    let rules = responder(question_index(&qs), Some(poison));
    // model-b knows less: it has no answer to every third question it is asked.
    let fake = FakeOpenAi::start_blocking(move |c| {
        let q = c.messages.last().map(|m| m.1.clone()).unwrap_or_default();
        if c.model == "fake-model-b" && fnv(&q).is_multiple_of(3) && !q.is_empty() {
            return halyard_tests::Reply::Text(NO_INFO.into());
        }
        rules(c)
    });
    let dir = tempfile::tempdir().unwrap();
    let sweep = priced_sweep(dir.path(), "html", &fake.base_url(), 30, true);
    let out = dir.path().join("runs");
    let (_, stated) =
        run_complete(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let run = out.join("html");
    let report = read_json(&run.join("report.json"));
    // The poison question's jobs are dead letters: the run says how many (exit 4).
    let listed = report["dead_letters"].as_array().map_or(0, |d| d.len()) as u64;
    assert!(listed > 0 && stated == listed, "{stated} stated, {listed} listed");

    // Cost accounting: per (model, stage), against the totals computed from stored results.
    let costs = &report["costs"];
    let stages: Vec<(String, String)> = costs["by_model_stage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (c["model"].as_str().unwrap().to_string(), c["stage"].as_str().unwrap().to_string())
        })
        .collect();
    assert!(stages.contains(&("model-a".into(), "answer".into())), "{stages:?}");
    assert!(stages.iter().any(|(m, s)| m == "judge-a" && s != "answer"), "{stages:?}");
    assert!(stages.contains(&("model-b".into(), "answer".into())), "{stages:?}");
    assert!(
        stages.iter().all(|(m, _)| ["model-a", "model-b", "judge-a"].contains(&m.as_str())),
        "unattributed jobs: {stages:?}"
    );
    let sum = |k: &str| {
        costs["by_model"].as_array().unwrap().iter().map(|c| c[k].as_u64().unwrap()).sum::<u64>()
    };
    assert_eq!(sum("prompt_tokens"), report["jobs"]["prompt_tokens"].as_u64().unwrap());
    assert_eq!(sum("completion_tokens"), report["jobs"]["completion_tokens"].as_u64().unwrap());
    // Every request the fake saw, but the poison ones (one call each: HTTP 400 is not
    // retried): a dead letter carries no call count.
    let dead = sum("dead_letters");
    assert!(dead >= 1);
    assert_eq!(sum("calls") + dead, fake.call_count() as u64);
    let mut expected_total = 0.0;
    for c in costs["by_model"].as_array().unwrap() {
        let (pi, po) = if c["model"] == "judge-a" { (1.0, 1.0) } else { (2.0, 8.0) };
        let want = (c["prompt_tokens"].as_f64().unwrap() * pi
            + c["completion_tokens"].as_f64().unwrap() * po)
            / 1e6;
        assert!((c["cost"].as_f64().unwrap() - want).abs() < 1e-9, "{c}");
        assert!(want > 0.0);
        expected_total += want;
    }
    assert!((costs["total"].as_f64().unwrap() - expected_total).abs() < 1e-9);
    let md = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(md.contains("## Tokens and cost"), "{md}");

    // The page itself: self-contained, with the five HypoTermQA charts (HTS with its
    // interval, then the four label charts) and their links.
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    for needle in ["src=\"http", "href=\"http", "url(", "<link", "@import", "<iframe", "fetch("] {
        assert!(!html.contains(needle), "report.html may reach the network: {needle}");
    }
    let segments = html.matches("<rect class=\"seg ").count();
    assert!(segments >= 8, "{segments} segments");
    assert!(
        html.contains("Answers to hypothetical questions")
            && html.contains("Answers to valid questions")
    );
    assert!(html.contains(&format!("Dead letters ({dead})")));
    // A segment links to its rows: the anchor exists and lists real labels.jsonl lines.
    let labels: Vec<serde_json::Value> = std::fs::read_to_string(run.join("labels.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let unanswered =
        labels.iter().position(|l| l["answer_label"] == "unanswered").expect("the poison question");
    let group = if labels[unanswered]["question_type"] == "hypothetical" {
        "hypothetical"
    } else {
        "valid"
    };
    let anchor = format!("s-0-{group}-unanswered");
    assert!(html.contains(&format!("href=\"#{anchor}\"")), "no link to {anchor}");
    let details = &html[html.find(&format!("id=\"{anchor}\"")).expect("anchor target")..];
    assert!(
        details[..details.find("</details>").unwrap()]
            .contains(&format!(">{}</a>", unanswered + 1)),
        "line {} not listed",
        unanswered + 1
    );

    let Some(bin) = chromium() else { return };
    let attr = render_check(&bin, &run.join("report.html"));
    assert_eq!(attr("data-errors"), "", "script errors in the page");
    assert_eq!(attr("data-ok"), "1", "render check failed");
    assert_eq!(attr("data-charts"), "5");
    // HTS's Wilson interval, one whisker per model under test, drawn with a real width.
    let models = report["benchmarks"].as_array().unwrap().len();
    assert_eq!(html.matches("<line class=\"ci\"").count(), models);
    assert_eq!(attr("data-whiskers"), models.to_string());
    assert_eq!(attr("data-segments"), segments.to_string());
    assert_eq!(attr("data-drawn"), segments.to_string());
    assert!(attr("data-links").parse::<usize>().unwrap() > 0);

    // The screenshot step a person uses (scripts/report-screenshot) works too.
    let png = dir.path().join("report.png");
    let shot = Command::new(repo_root().join("scripts/report-screenshot"))
        .env("CHROMIUM", &bin)
        .arg(run.join("report.html"))
        .arg(&png)
        .output()
        .unwrap();
    assert!(shot.status.success(), "{}", String::from_utf8_lossy(&shot.stderr));
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert!(bytes.len() > 20_000, "screenshot of {} bytes looks empty", bytes.len());
    if let Ok(keep) = std::env::var("HALYARD_KEEP_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
}

/// `--max-cost`: the run stops (exit 3) before finishing once it has spent the limit, and
/// a later run with no limit completes it, calling each job once overall.
#[test]
fn max_cost_stops_and_resumes() {
    let qs = load_questions(30);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let sweep = priced_sweep(dir.path(), "capped", &fake.base_url(), 30, false);
    let out = dir.path().join("runs");
    let limit = "0.0005";
    let first = halyard()
        .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap(), "--max-cost", limit])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(3), "{err}");
    assert!(err.contains("cost limit reached"), "{err}");
    assert!(!out.join("capped/report.json").exists());
    let calls_first = fake.call_count();
    assert!(calls_first > 0);
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let report = read_json(&out.join("capped/report.json"));
    let calls_total = fake.call_count();
    assert!(
        calls_first < calls_total,
        "the capped run did everything: {calls_first} of {calls_total} calls"
    );
    let calls: u64 = report["costs"]["by_model"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(calls, calls_total as u64, "the cost totals carried over from the capped run");
    assert!(report["costs"]["total"].as_f64().unwrap() >= 0.0005);
    assert_eq!(
        std::fs::read_to_string(out.join("capped/labels.jsonl")).unwrap().lines().count(),
        30
    );
}
