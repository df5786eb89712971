//! `halyard report RUN_DIR...`: real runs merged into a leaderboard, ranked by HTS, with
//! a warning when their semantics (or judges) differ; the HTML renders in Chromium.

use std::path::Path;

use crate::common::browser::{chromium, render_check};
use crate::common::*;
use halyard_tests::FakeOpenAi;

fn report(args: &[&str]) -> (bool, String, String) {
    let out = halyard().arg("report").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn hts(run: &Path) -> f64 {
    read_json(&run.join("report.json"))["benchmarks"][0]["hts"].as_f64().unwrap()
}

#[test]
fn leaderboard_merges_runs_and_warns_on_mixed_semantics() {
    let qs = load_questions(15);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let o = out.to_str().unwrap();
    let paper = write_sweep(dir.path(), "lb-paper", &fake.base_url(), 15, 2);
    let reference = write_sweep(dir.path(), "lb-ref", &fake.base_url(), 15, 2);
    let text = std::fs::read_to_string(&reference)
        .unwrap()
        .replace("semantics = \"paper\"", "semantics = \"reference\"");
    std::fs::write(&reference, text).unwrap();
    // Another model under test (it answers with the same fake, fewer questions).
    let other = write_sweep(dir.path(), "lb-other", &fake.base_url(), 10, 2);
    let text = std::fs::read_to_string(&other).unwrap().replace("model-a", "model-b");
    std::fs::write(&other, text).unwrap();
    for s in [&paper, &reference, &other] {
        run_to_end(&["run", s.to_str().unwrap(), "--out", o]);
    }
    let (a, b, c) = (out.join("lb-paper"), out.join("lb-ref"), out.join("lb-other"));

    // Same judge and semantics, different question sets: warned about that only.
    let lb1 = dir.path().join("lb1");
    let (ok, md, err) =
        report(&[a.to_str().unwrap(), b.to_str().unwrap(), "--out", lb1.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(md.contains("different semantics (paper, reference)"), "{md}");
    assert!(err.contains("different semantics"), "warning not logged: {err}");
    assert!(!md.contains("different judges"), "{md}");

    // Three runs: ranked by the HTS each report holds.
    let lb2 = dir.path().join("lb2");
    let (ok, md, err) = report(&[
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        c.to_str().unwrap(),
        "--out",
        lb2.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    // Best HTS first; ties by model, then run.
    let mut want: Vec<(f64, &str, &str)> = vec![
        (hts(&a), "model-a", "lb-paper"),
        (hts(&b), "model-a", "lb-ref"),
        (hts(&c), "model-b", "lb-other"),
    ];
    want.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(y.1)).then(x.2.cmp(y.2)));
    // The ranking table (the adjacent rows' table follows it).
    let table = md.split("## Adjacent rows").next().unwrap();
    let rows: Vec<&str> =
        table.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| rank")).collect();
    assert_eq!(rows.len(), 3, "{md}");
    for (i, (h, model, run)) in want.iter().enumerate() {
        let cells: Vec<&str> = rows[i].split('|').map(str::trim).collect();
        assert_eq!(cells[1], (i + 1).to_string());
        assert_eq!(cells[2], *model, "row {i}: {}", rows[i]);
        assert_eq!(cells[3], format!("{h:.2}"), "row {i}: {}", rows[i]);
        // Column 13: the run (after the "empty / refused" column of issue 29).
        assert_eq!(cells[13], *run, "row {i}: {}", rows[i]);
    }
    assert!(md.contains("different question sets"), "{md}");
    assert_eq!(std::fs::read_to_string(lb2.join("leaderboard.md")).unwrap(), md);
    let html = std::fs::read_to_string(lb2.join("leaderboard.html")).unwrap();
    assert!(html.contains("Warning:") && html.contains("model-b"));

    // The same questions, judge and semantics with another model name: compared on the
    // shared hypothetical questions (the fake answers both alike: not significant).
    let twin = write_sweep(dir.path(), "lb-twin", &fake.base_url(), 15, 2);
    let text = std::fs::read_to_string(&twin).unwrap().replace("model-a", "model-c");
    std::fs::write(&twin, text).unwrap();
    run_to_end(&["run", twin.to_str().unwrap(), "--out", o]);
    let d = out.join("lb-twin");
    let lb3 = dir.path().join("lb3");
    let (ok, md, err) =
        report(&[a.to_str().unwrap(), d.to_str().unwrap(), "--out", lb3.to_str().unwrap()]);
    assert!(ok, "{err}");
    let hyp = read_json(&a.join("report.json"))["benchmarks"][0]["hypothetical_questions"]
        .as_u64()
        .unwrap();
    assert!(hyp > 0);
    assert!(md.contains("## Adjacent rows"), "{md}");
    assert!(md.contains("not significant (p = 1.000)"), "{md}");
    assert!(md.contains(&format!(" | {hyp} | 0 | 0 | +0.00 |")), "{md}");
    // Different semantics (a, b above): not compared, with the reason.
    let (_, md, _) =
        report(&[a.to_str().unwrap(), b.to_str().unwrap(), "--out", lb1.to_str().unwrap()]);
    assert!(md.contains("not compared: different questions, judge or semantics"), "{md}");

    // A run that has not finished is named.
    let (ok, _, err) = report(&[dir.path().join("nope").to_str().unwrap()]);
    assert!(!ok && err.contains("nope"), "{err}");

    let Some(bin) = chromium() else { return };
    let attr = render_check(&bin, &lb2.join("leaderboard.html"));
    assert_eq!(attr("data-errors"), "");
    assert_eq!(attr("data-ok"), "1");
    assert_eq!(attr("data-charts"), "1");
    assert_eq!(attr("data-drawn"), "3");
    assert_eq!(attr("data-whiskers"), "3", "HTS's interval on every bar");
}

/// Cost per correct answer beyond HypoTermQA (issue 53): a priced AutoHall run's row in
/// report.json, report.md and the leaderboard, its correct claims counted by the test's
/// own reading of the fake's rules (classified and not hallucinated), its cost the
/// model's `reference` and `classify` stages only (the detection's samples and pair
/// checks left out).
#[test]
fn leaderboard_gives_autohall_cost_per_correct() {
    use crate::common::autohall::*;
    let file = repo_root().join("datasets/autohall/climate_sample.jsonl");
    let fake = FakeOpenAi::start_blocking(autohall_responder);
    let dir = tempfile::tempdir().unwrap();
    let models = fake_models(&fake.base_url()).replace(
        "temperature = 0.3\n",
        "temperature = 0.3\nprice = { input = 2.0, output = 8.0 }\n",
    );
    let sweep = autohall_sweep(
        dir.path(),
        "lb-autohall",
        &models,
        &["fake-a"],
        std::slice::from_ref(&file),
        1000,
    );
    let out = dir.path().join("runs");
    run_complete(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let run = out.join("lb-autohall");
    let rj = read_json(&run.join("report.json"));
    let cs = claims(&file);
    let e = expected("fake-a", &cs);
    let factual = e.classified - e.hallucinated;
    let stages = rj["costs"]["by_model_stage"].as_array().unwrap();
    let of = |pick: &dyn Fn(&str) -> bool| -> f64 {
        stages
            .iter()
            .filter(|c| c["model"] == "fake-a" && pick(c["stage"].as_str().unwrap()))
            .map(|c| c["cost"].as_f64().unwrap())
            .sum()
    };
    let cost = of(&|s| s == "reference" || s == "classify");
    let all = of(&|_| true);
    assert!(cost > 0.0 && all > cost, "the detection's calls cost something too: {cost} of {all}");
    let rows = rj["cost_per_correct"].as_array().expect("cost_per_correct");
    let r = rows.iter().find(|r| r["pipeline"] == "autohall").expect("the AutoHall row");
    assert_eq!((r["model"].as_str(), r["unit"].as_str()), (Some("fake-a"), Some("claim")));
    assert_eq!(r["correct"].as_u64(), Some(factual), "{r}");
    assert_eq!(r["answers"].as_u64(), Some(cs.len() as u64), "{r}");
    assert!((r["cost"].as_f64().unwrap() - cost).abs() < 1e-12, "{r}");
    let per = cost / factual as f64;
    assert!((r["per_correct"].as_f64().unwrap() - per).abs() < 1e-12, "{r}");
    assert!(r["low"].as_f64().unwrap() < per && per < r["high"].as_f64().unwrap(), "{r}");
    let line = format!(
        "| fake-a | (itself, against gold) | ${cost:.6} | {factual} / {} | ${per:.6} |",
        cs.len()
    );
    let md = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(md.contains(&line), "{line} not in report.md");
    let lb = dir.path().join("lb");
    let (ok, md, err) = report(&[run.to_str().unwrap(), "--out", lb.to_str().unwrap()]);
    assert!(ok, "{err}");
    let row = format!(
        "| lb-autohall | 0 | fake-a | (itself, against gold) | {factual} / {} | ${cost:.6} | ${per:.6} |",
        cs.len()
    );
    assert!(md.contains(&row) && md.contains("autohall (claim) |"), "{row} not in {md}");
}
