//! `halyard view` in a real browser: Debian's Chromium, driven headless over the
//! DevTools protocol (`headless_chrome`), against the real binary serving real run
//! directories written by real runs (a fake OpenAI-compatible API answers).
//!
//! Every test records each request the browser makes (the Network domain's events) and
//! checks that none left 127.0.0.1.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::browser::chromium;
use crate::common::*;
use halyard_tests::{FakeOpenAi, Reply};
use headless_chrome::protocol::cdp::types::Event;
use headless_chrome::protocol::cdp::Network;
use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions, Tab};
use serde_json::Value;

/// The answer a model gives to one question: markup, a script, an event handler and
/// terminal escapes, all of which the view must show as text.
const HOSTILE: &str = "<img src=x onerror=\"window.__pwned=1\"><script>window.__pwned=2</script>\u{1b}[31mRED\u{1b}[0m </pre><b>bold?</b>";

/// `halyard view` on a free loopback port, killed on drop.
struct View {
    child: Child,
    base: String,
}

impl View {
    fn start(dirs: &[&Path]) -> View {
        View::start_with(dirs, &[])
    }

    fn start_with(dirs: &[&Path], extra: &[&str]) -> View {
        let mut cmd = halyard();
        cmd.arg("view").args(dirs).args(["--addr", "127.0.0.1:0"]).args(extra);
        let mut child =
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start halyard view");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let base = line
            .trim()
            .strip_prefix("halyard view at ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .trim_end_matches('/')
            .to_string();
        assert!(base.starts_with("http://127.0.0.1:"), "bound to {base}, not loopback");
        View { child, base }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless Chromium tab that records every URL it requests.
struct Page {
    _browser: Browser,
    tab: Arc<Tab>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Page {
    fn open(bin: &Path) -> Page {
        let args: Vec<&OsStr> = [
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ]
        .iter()
        .map(OsStr::new)
        .collect();
        let opts = LaunchOptions::default_builder()
            .path(Some(bin.to_path_buf()))
            .sandbox(false)
            .headless(true)
            .window_size(Some((1440, 1000)))
            .idle_browser_timeout(Duration::from_secs(600))
            .args(args)
            .build()
            .expect("launch options");
        let browser = Browser::new(opts).expect("start chromium");
        let tab = browser.new_tab().expect("a tab");
        tab.set_default_timeout(Duration::from_secs(90));
        tab.call_method(Network::Enable {
            max_total_buffer_size: None,
            max_resource_buffer_size: None,
            max_post_data_size: None,
            report_direct_socket_traffic: None,
            enable_durable_messages: None,
        })
        .expect("network events");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        tab.add_event_listener(Arc::new(move |e: &Event| {
            if let Event::NetworkRequestWillBeSent(r) = e {
                seen.lock().unwrap().push(r.params.request.url.clone());
            }
        }))
        .expect("listener");
        Page { _browser: browser, tab, requests }
    }

    fn goto(&self, url: &str) {
        self.tab.navigate_to(url).expect("navigate").wait_until_navigated().expect("navigated");
    }

    /// The value of a JavaScript expression (awaited when it is a promise), passed back
    /// as JSON (the protocol returns arrays and objects by reference otherwise).
    fn eval(&self, js: &str) -> Value {
        let wrapped = format!(
            "Promise.resolve(({js})).then(v => JSON.stringify(v === undefined ? null : v))"
        );
        let v = self.tab.evaluate(&wrapped, true).unwrap_or_else(|e| panic!("{js}: {e}")).value;
        match v {
            Some(Value::String(s)) => serde_json::from_str(&s).unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }

    /// Wait (generously: the machine may be loaded) until `js` is truthy.
    fn wait(&self, js: &str, what: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let v = self.eval(js);
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            if Instant::now() > deadline {
                let errors = self.eval("document.body.dataset.errors || ''");
                let body = self.eval("document.body.innerText.slice(0, 2000)");
                panic!("waited 120 s for {what} ({js}); script errors: {errors}; page: {body}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn text(&self, selector: &str) -> String {
        let js = format!("(document.querySelector({selector:?}) || {{}}).textContent || ''");
        self.eval(&js).as_str().unwrap_or_default().to_string()
    }

    /// Choose `value` in the `<select id=…>` and tell the page.
    fn select(&self, id: &str, value: &str) {
        let before = self.eval("Number(document.body.dataset.loads || 0)").as_f64().unwrap();
        self.eval(&format!(
            "(() => {{ const s = document.getElementById({id:?}); s.value = {value:?}; s.dispatchEvent(new Event('change')); }})()"
        ));
        self.wait(
            &format!("Number(document.body.dataset.loads || 0) > {before}"),
            "the page reloaded its rows",
        );
    }

    fn click(&self, selector: &str) {
        self.tab
            .wait_for_element(selector)
            .unwrap_or_else(|e| panic!("{selector}: {e}"))
            .click()
            .expect("click");
    }

    /// A screenshot for the book, when `HALYARD_VIEW_SCREENSHOTS` names a folder.
    fn screenshot(&self, name: &str) {
        let png = self
            .tab
            .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
            .expect("screenshot");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(png.len() > 10_000, "screenshot {name} of {} bytes looks empty", png.len());
        if let Some(dir) = std::env::var_os("HALYARD_VIEW_SCREENSHOTS") {
            std::fs::write(PathBuf::from(dir).join(format!("{name}.png")), png).unwrap();
        }
    }

    /// No request the page made left this machine's loopback server.
    fn assert_local(&self, base: &str) {
        let reqs = self.requests.lock().unwrap().clone();
        assert!(!reqs.is_empty(), "no request recorded: the listener saw nothing");
        let away: Vec<&String> = reqs
            .iter()
            .filter(|u| {
                !u.starts_with(&format!("{base}/"))
                    && !u.starts_with("data:")
                    && *u != "about:blank"
            })
            .collect();
        assert!(away.is_empty(), "requests that left {base}: {away:?}");
    }
}

/// Two models under test (model-b knows less), one judge; model-a answers one question
/// with [`HOSTILE`].
fn two_model_run(dir: &Path, name: &str, limit: usize) -> (PathBuf, i64, FakeOpenAi) {
    let qs = load_questions(limit);
    let hostile_q = qs[2].question.clone();
    let hostile_id = qs[2].id;
    let hypothetical: std::collections::HashSet<String> =
        qs.iter().flat_map(|q| q.terms.iter().filter(|t| t.1).map(|t| t.0.clone())).collect();
    let rules = responder(question_index(&qs), None);
    let fake = FakeOpenAi::start_blocking(move |c| {
        let q = c.messages.last().map(|m| m.1.clone()).unwrap_or_default();
        if c.model == "fake-model" && q.contains(&hostile_q) {
            return Reply::Text(HOSTILE.into());
        }
        if c.model == "fake-model-b" {
            if fnv(&q).is_multiple_of(3) && !q.is_empty() {
                return Reply::Text(NO_INFO.into());
            }
            return match rules(c) {
                Reply::Text(t) => {
                    Reply::Text(t.replace("Here is what I know:", "Here is what model B knows:"))
                }
                other => other,
            };
        }
        // model-b's answers get the judge's right verdicts (a hypothetical term is not
        // real, a valid one is used in its meaning), so the two models differ item by item.
        let user = c.messages.get(1).map(|m| m.1.as_str()).unwrap_or("");
        if c.model == "fake-judge" && user.contains("model B knows") {
            let start = user.rfind("{\"term\":\"").map(|i| i + 9);
            let term = start.and_then(|s| user[s..].find('"').map(|e| user[s..s + e].to_string()));
            let Some(term) = term else { return rules(c) };
            if c.messages[0].1.contains("Verify if the answer uses the term in its real meaning.") {
                return Reply::Text(format!(
                    "{{\"term\":\"{term}\",\"reasoning\":\"checked\",\"verified\":\"TRUE\"}}"
                ));
            }
            let certainty = if hypothetical.contains(&term) { "UNREAL" } else { "MENTIONED" };
            return Reply::Text(format!(
                "```json\n{{\"term\":\"{term}\",\"reasoning\":\"r\",\"certainty\":\"{certainty}\"}}\n```"
            ));
        }
        rules(c)
    });
    let p = write_sweep(dir, name, &fake.base_url(), limit, 4);
    let text = std::fs::read_to_string(&p).unwrap();
    let b = format!(
        "[[model]]\nname = \"model-b\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"fake-model-b\"\nmax_tokens = 256\n\n[[benchmark]]",
        fake.base_url()
    );
    let text = text
        .replace("[[benchmark]]", &b)
        .replace("models = [\"model-a\"]", "models = [\"model-a\", \"model-b\"]")
        .replace("max_tokens = 256", "max_tokens = 256\nprice = { input = 2.0, output = 8.0 }");
    std::fs::write(&p, text).unwrap();
    let out = dir.join("runs");
    run_to_end(&["run", p.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    (out, hostile_id, fake)
}

fn labels(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("labels.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A finished run: listed with its headline figures; its page shows its report.html
/// (the renderer's own page, its render check passing) and the item browser, whose
/// filters and pages pick exactly the rows of labels.jsonl they name; an item shows every
/// model's answer and every judge call's raw output and parsed verdict; a hostile answer
/// is shown as text and runs nothing; no request leaves 127.0.0.1.
#[test]
fn finished_run_items_filters_and_judge_outputs() {
    let Some(bin) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (out, hostile_id, _fake) = two_model_run(dir.path(), "viewed", 24);
    let run = out.join("viewed");
    let rows = labels(&run);
    let view = View::start(&[&out]);
    let page = Page::open(&bin);

    // Runs.
    page.goto(&format!("{}/", view.base));
    page.wait("document.body.dataset.ready === 'runs'", "the runs page");
    assert_eq!(page.text("tr[data-run=viewed] td.state"), "complete");
    let report = read_json(&run.join("report.json"));
    let hts = report["benchmarks"][0]["hts"].as_f64().unwrap();
    let headline = page.text("tr[data-run=viewed] pre");
    assert!(headline.contains(&format!("hts {hts:.4}")), "{headline}");
    page.screenshot("view-runs");

    // A run: its report (the renderer's page, in a frame) and the item browser.
    page.goto(&format!("{}/run/viewed", view.base));
    page.wait("document.body.dataset.ready === 'run'", "the run page");
    page.wait(
        "(() => { const d = document.getElementById('report').contentDocument; const c = d && d.getElementById('render-check'); return c && c.dataset.ok; })()",
        "report.html's render check",
    );
    let ok = page.eval("document.getElementById('report').contentDocument.getElementById('render-check').dataset.ok");
    assert_eq!(ok, "1", "report.html rendered with errors in the view");
    let total = |p: &Page| {
        p.eval("Number(document.getElementById('page-info').dataset.total)").as_u64().unwrap()
    };
    assert_eq!(total(&page) as usize, rows.len());
    assert_eq!(page.eval("document.querySelectorAll('#items tr').length").as_u64(), Some(25));
    page.screenshot("view-run");

    // Filters: model-b's valid answers, counted from labels.jsonl here.
    page.select("filter-model", "model-b");
    let want_b = rows.iter().filter(|r| r["model"] == "model-b").count();
    assert_eq!(total(&page) as usize, want_b);
    // ... and one label of theirs (the first row's), counted here.
    let label = rows.iter().find(|r| r["model"] == "model-b").unwrap()["answer_label"]
        .as_str()
        .unwrap()
        .to_string();
    page.select("filter-label", &label);
    let want = rows
        .iter()
        .filter(|r| r["model"] == "model-b" && r["answer_label"] == label.as_str())
        .count();
    assert_eq!(total(&page) as usize, want);
    let labels_shown =
        page.eval("[...document.querySelectorAll('#items td.label')].map(t => t.textContent)");
    let labels_shown = labels_shown.as_array().unwrap().clone();
    assert_eq!(labels_shown.len(), want.min(25));
    assert!(labels_shown.iter().all(|l| *l == label.as_str()), "{labels_shown:?}");
    let models_shown = page
        .eval("[...document.querySelectorAll('#items tr')].map(t => t.children[3].textContent)");
    assert!(models_shown.as_array().unwrap().iter().all(|m| m == "model-b"), "{models_shown}");
    page.select("filter-label", "");
    page.select("filter-model", "");
    // Paging: the second page starts at row 26.
    let loads = page.eval("Number(document.body.dataset.loads)").as_f64().unwrap();
    page.click("#next");
    page.wait(&format!("Number(document.body.dataset.loads) > {loads}"), "the next page");
    assert_eq!(page.eval("document.querySelector('#items tr').dataset.row"), "25");

    // The hostile item, opened by its id: every model's answer, shown as text.
    page.goto(&format!("{}/run/viewed?item={hostile_id}", view.base));
    page.wait("document.body.dataset.item !== undefined", "the item opened");
    let answers = page
        .eval("[...document.querySelectorAll('#item pre.model-answer')].map(p => p.textContent)");
    let answers: Vec<String> =
        answers.as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    let item_rows: Vec<&Value> = rows.iter().filter(|r| r["question_id"] == hostile_id).collect();
    assert_eq!(answers.len(), item_rows.len(), "one answer per model");
    let shown_hostile =
        answers.iter().find(|a| a.contains("<script>")).expect("the hostile answer, as text");
    assert!(shown_hostile.contains("<img src=x onerror="), "{shown_hostile}");
    assert!(shown_hostile.contains("\u{241b}[31mRED"), "the escape shown as ␛: {shown_hostile:?}");
    assert_eq!(page.eval("window.__pwned === undefined"), true, "the answer's script ran");
    assert_eq!(
        page.eval("document.querySelectorAll('#item img, #item script, #item pre *').length")
            .as_u64(),
        Some(0),
        "markup of the answer became elements"
    );
    let jobs =
        page.eval("[...document.querySelectorAll('#item code.job')].map(p => p.textContent)");
    assert!(jobs.as_array().unwrap().iter().any(|j| *j == item_rows[0]["answer_job"]), "{jobs}");

    // An item with judge calls: their raw outputs as labels.jsonl has them, in order,
    // with the verdicts parsed from them.
    let judged = rows
        .iter()
        .find(|r| r["terms"].as_array().unwrap().iter().any(|t| !t["acceptance"].is_null()))
        .expect("a judged answer");
    let id = judged["question_id"].as_i64().unwrap();
    page.goto(&format!("{}/run/viewed?item={id}", view.base));
    page.wait("document.body.dataset.item !== undefined", "the judged item opened");
    let mut want_outputs = Vec::new();
    let mut want_parsed = Vec::new();
    for r in rows.iter().filter(|r| r["question_id"] == id) {
        for t in r["terms"].as_array().unwrap() {
            for check in ["acceptance", "meaning"] {
                let c = &t[check];
                if c.is_null() {
                    continue;
                }
                want_parsed.push(c["parsed"].as_str().unwrap_or("(unusable)").to_string());
                for a in c["attempts"].as_array().unwrap() {
                    want_outputs.push(
                        a["output"].as_str().unwrap_or("(no output: the job failed)").to_string(),
                    );
                }
            }
        }
    }
    assert!(!want_outputs.is_empty());
    let shown = page
        .eval("[...document.querySelectorAll('#item pre.judge-output')].map(p => p.textContent)");
    let shown: Vec<&str> = shown.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    assert_eq!(shown, want_outputs.iter().map(String::as_str).collect::<Vec<_>>());
    let parsed =
        page.eval("[...document.querySelectorAll('#item .parsed')].map(p => p.textContent)");
    assert_eq!(parsed, serde_json::json!(want_parsed));
    page.eval("document.getElementById('item').scrollIntoView()");
    page.screenshot("view-item");

    // Cost per correct answer: model-b's answer cost over its valid answers, counted here,
    // in report.json, report.md and the report frame's price/performance plot.
    let cpc = report["cost_per_correct"].as_array().expect("cost_per_correct in report.json");
    let b = cpc.iter().find(|c| c["model"] == "model-b").expect("model-b's row");
    let cost_b: f64 = report["costs"]["by_model_stage"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["model"] == "model-b" && c["stage"] == "answer")
        .map(|c| c["cost"].as_f64().unwrap())
        .sum();
    let valid_b =
        rows.iter().filter(|r| r["model"] == "model-b" && r["answer_label"] == "valid").count();
    assert!(valid_b > 0 && cost_b > 0.0, "{valid_b} valid, ${cost_b}");
    assert_eq!(b["correct"].as_u64(), Some(valid_b as u64));
    assert!((b["per_correct"].as_f64().unwrap() - cost_b / valid_b as f64).abs() < 1e-12, "{b}");
    let (lo, hi) = (b["low"].as_f64().unwrap(), b["high"].as_f64().unwrap());
    let per = cost_b / valid_b as f64;
    assert!(lo < per && per < hi, "{b}");
    let md = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(md.contains("## Cost per correct answer"));
    page.goto(&format!("{}/run/viewed", view.base));
    page.wait("document.body.dataset.ready === 'run'", "the run page again");
    let points = page.wait(
        "(() => { const d = document.getElementById('report').contentDocument; return d && d.querySelectorAll('circle.pp-point').length; })()",
        "the price/performance plot",
    );
    assert!(points.as_u64().unwrap() >= 1);

    // Bad requests get errors that say what is wrong.
    let status = |path: &str| {
        page.eval(&format!(
            "fetch({path:?}).then(async r => r.status + ' ' + (await r.json()).error)"
        ))
        .as_str()
        .unwrap()
        .to_string()
    };
    let s = status("/api/run/nope/items");
    assert!(s.starts_with("404 ") && s.contains("no run \"nope\""), "{s}");
    let s = status("/api/run/viewed/items?flag=bogus");
    assert!(s.starts_with("400 ") && s.contains("unknown flag"), "{s}");
    let s = status("/api/compare?runs=viewed&target=2");
    assert!(s.starts_with("400 ") && s.contains("target=2"), "{s}");
    page.assert_local(&view.base);
}

/// Compare: one run's two models, paired as `halyard report` pairs them; the McNemar row
/// shows the discordance rate assumed, the minimum detectable difference and the n
/// needed (recomputed here from Connor's formula), and its discordant items, each
/// opening in the run.
#[test]
fn comparison_with_power_figures() {
    let Some(bin) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (out, _, _fake) = two_model_run(dir.path(), "pair", 40);
    let rows = labels(&out.join("pair"));
    let view = View::start(&[&out]);
    let page = Page::open(&bin);
    page.goto(&format!("{}/compare?runs=pair&target=0.1", view.base));
    page.wait("document.body.dataset.ready === 'compare'", "the compare page");
    let i = page
        .eval("[...document.querySelectorAll('#comparison tbody tr')].findIndex(r => r.textContent.includes('McNemar'))")
        .as_i64()
        .unwrap();
    assert!(i >= 0, "no McNemar row");
    let cell = |c: &str| page.text(&format!("#comparison tbody tr[data-i='{i}'] td.{c}"));
    // Independent count of the discordant pairs: valid answers to hypothetical questions.
    let outcome = |m: &str| -> std::collections::BTreeMap<i64, bool> {
        rows.iter()
            .filter(|r| r["model"] == m && r["question_type"] == "hypothetical")
            .map(|r| (r["question_id"].as_i64().unwrap(), r["answer_label"] == "valid"))
            .collect()
    };
    let (a, b) = (outcome("model-a"), outcome("model-b"));
    let n = a.keys().filter(|k| b.contains_key(k)).count() as f64;
    let only_a = a.iter().filter(|(k, v)| **v && b.get(k) == Some(&false)).count() as f64;
    let only_b = a.iter().filter(|(k, v)| !**v && b.get(k) == Some(&true)).count() as f64;
    assert!(only_a + only_b > 0.0, "the models never disagree: nothing to compare");
    let psi = (only_a + only_b) / n;
    assert_eq!(cell("discordance"), format!("{psi:.3} ({only_a} + {only_b})"));
    // Connor (1987): n = (1.96·√ψ + 0.8416·√(ψ − δ²))² / δ².
    let connor = |d: f64| ((1.959964 * psi.sqrt() + 0.841621 * (psi - d * d).sqrt()) / d).powi(2);
    let needed = cell("n-needed");
    if psi >= 0.1 {
        assert_eq!(needed, format!("{}", connor(0.1).ceil()));
    } else {
        assert!(needed.starts_with("none"), "{needed}");
    }
    let mdd = cell("mdd");
    if mdd == "–" {
        assert!(connor(psi) > n, "a difference of ψ is detectable with {n} pairs");
    } else {
        let d: f64 = mdd.parse().unwrap();
        assert!((connor(d) - n).abs() / n < 0.02, "δ {d} needs {} pairs, not {n}", connor(d));
    }
    page.screenshot("view-compare");
    page.click(&format!("#comparison tbody tr[data-i='{i}'] button.show-discordant"));
    page.wait("document.body.dataset.discordant !== undefined", "the discordant items");
    assert_eq!(
        page.eval("Number(document.body.dataset.discordant)").as_f64(),
        Some(only_a + only_b)
    );
    page.click("#discordant-items tr[data-item] a");
    page.wait("document.body.dataset.item !== undefined", "a discordant item opened in its run");
    page.assert_local(&view.base);
}

/// A live run: the runs page, left open, shows its progress move (from the status its
/// coordinator rewrites) and then its end, without a reload; its page says how its items
/// will be shown.
#[test]
fn live_run_progress_changes_while_open() {
    let Some(bin) = chromium() else { return };
    let qs = load_questions(30);
    let rules = responder(question_index(&qs), None);
    // Answers wait behind a gate until the page is open, so the page sees the run move.
    let gate = halyard_tests::Gate::new();
    let held = gate.clone();
    let fake = FakeOpenAi::start_blocking(move |c| rules(c).behind(&held));
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "live", &fake.base_url(), 30, 2);
    let out = dir.path().join("runs");
    std::fs::create_dir_all(&out).unwrap();
    let mut run = halyard()
        .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = out.join("live/status.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !status.exists() {
        assert!(Instant::now() < deadline, "no status.json after 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let view = View::start(&[&out]);
    let page = Page::open(&bin);
    page.goto(&format!("{}/", view.base));
    page.wait("!!document.querySelector('tr[data-run=live]')", "the live run listed");
    let done = || {
        page.eval(
            "Number(document.querySelector('tr[data-run=live] td.progress').dataset.done || 0)",
        )
        .as_f64()
        .unwrap()
    };
    let first = done();
    let empty = page
        .eval(
            "document.querySelector('tr[data-run=live] .bar > span').getBoundingClientRect().width",
        )
        .as_f64()
        .unwrap();
    assert_eq!((first, empty), (0.0, 0.0), "nothing done yet, an empty bar");
    assert_eq!(page.text("tr[data-run=live] td.state"), "running");
    page.screenshot("view-live");
    // The run's own page while it runs: progress, and how its items will be shown.
    let tab2 = Page::open(&bin);
    tab2.goto(&format!("{}/run/live", view.base));
    tab2.wait("!!document.getElementById('live-note')", "the live note");
    assert!(tab2.text("#live-note").contains("browsable once it finishes"));
    gate.open();
    page.wait(&format!("Number(document.querySelector('tr[data-run=live] td.progress').dataset.done || 0) > {first}"), "progress to move");
    let refreshes = page.eval("Number(document.body.dataset.refreshes)").as_f64().unwrap();
    assert!(refreshes > 1.0, "the page did not refresh itself");
    // Its end, on the page left open.
    page.wait(
        "document.querySelector('tr[data-run=live] td.state').textContent === 'complete'",
        "the run's end",
    );
    let code = run.wait().unwrap();
    assert!(code.success(), "halyard run: {code}");
    assert_eq!(done(), 30.0);
    // The bar drawn to scale (its width set through the CSSOM, which the policy allows).
    let bar = |p: &str| {
        page.eval(&format!(
            "document.querySelector('tr[data-run=live] .bar{p}').getBoundingClientRect().width"
        ))
        .as_f64()
        .unwrap()
    };
    assert!(
        bar("") > 0.0 && (bar(" > span") - bar("")).abs() < 1.0,
        "a complete run's bar is full"
    );
    page.assert_local(&view.base);
    tab2.assert_local(&view.base);
}

/// With `--nats`, a run on another machine (its status on the broker's bucket, no
/// directory here) is listed, its progress moving on the open page until its end.
#[test]
fn a_run_elsewhere_is_listed_from_the_broker() {
    let Some(bin) = chromium() else { return };
    let nats = halyard_tests::NatsServer::start();
    let qs = load_questions(20);
    let rules = responder(question_index(&qs), None);
    let gate = halyard_tests::Gate::new();
    let held = gate.clone();
    let fake = FakeOpenAi::start_blocking(move |c| rules(c).behind(&held));
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "elsewhere", &fake.base_url(), 20, 2);
    // The run's directory is not given to the view: only the broker links the two.
    let out = dir.path().join("runs");
    let mut run = halyard()
        .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .args(["--nats", &nats.url()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let here = tempfile::tempdir().unwrap();
    let view = View::start_with(&[here.path()], &["--nats", &nats.url()]);
    let page = Page::open(&bin);
    page.goto(&format!("{}/", view.base));
    let row = "tr[data-run=nats-elsewhere]";
    page.wait(&format!("!!document.querySelector('{row}')"), "the broker's run listed");
    assert_eq!(page.text(&format!("{row} td.state")), "running");
    let done = format!("Number(document.querySelector('{row} td.progress').dataset.done || 0)");
    let first = page.eval(&done).as_f64().unwrap();
    gate.open();
    page.wait(&format!("{done} > {first}"), "its progress to move");
    page.wait(
        &format!("document.querySelector('{row} td.state').textContent === 'complete'"),
        "its end",
    );
    assert!(run.wait().unwrap().success());
    assert_eq!(page.eval(&done).as_f64(), Some(20.0));
    page.assert_local(&view.base);
}

/// A panel of two judges (judge-b, whose acceptance verdicts differ from judge-a's on
/// some terms, decides: `panel = "primary:judge-b"`), one answer job that becomes a dead
/// letter, and human labels imported with `halyard labels import`: the judge- and
/// human-disagreement filters pick exactly the rows labels.jsonl and the imported file
/// say; an item shows the panel's verdict (from the run's panel file, the report's own
/// function) next to each judge's label, and the human labels; a job that became a dead
/// letter links to its dead letter.
#[test]
fn panel_verdicts_human_disagreement_and_dead_letters() {
    let Some(bin) = chromium() else { return };
    let qs = load_questions(16);
    let poison = qs[5].id;
    let rules = responder(question_index(&qs), Some(poison));
    let fake = FakeOpenAi::start_blocking(move |c| {
        let r = rules(c);
        match r {
            // judge-b says the opposite of judge-a on the terms whose reply hashes odd.
            Reply::Text(t) if c.model == "fake-judge-b" && !fnv(&t).is_multiple_of(2) => {
                Reply::Text(
                    t.replace("UNREAL", "\u{0}")
                        .replace("MENTIONED", "UNREAL")
                        .replace('\u{0}', "MENTIONED"),
                )
            }
            other => other,
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let p = write_sweep(dir.path(), "paneled", &fake.base_url(), qs.len(), 4);
    let b = format!(
        "[[model]]\nname = \"judge-b\"\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"fake-judge-b\"\nmax_concurrency = 4\n\n[[benchmark]]",
        fake.base_url()
    );
    let text = std::fs::read_to_string(&p).unwrap().replace("[[benchmark]]", &b).replace(
        "judge = \"judge-a\"",
        "judges = [\"judge-a\", \"judge-b\"]\npanel = \"primary:judge-b\"",
    );
    std::fs::write(&p, text).unwrap();
    let out = dir.path().join("runs");
    run_to_end_with(&["run", p.to_str().unwrap(), "--out", out.to_str().unwrap()], 1);
    let run = out.join("paneled");
    let rows = labels(&run);

    // Human labels, imported as a user would: "valid" on even question ids, else
    // "hallucination", for model-a's answered questions.
    let answered: Vec<i64> = rows
        .iter()
        .filter(|r| r["judge"] == "judge-a" && r["answer_label"] != "unanswered")
        .map(|r| r["question_id"].as_i64().unwrap())
        .collect();
    let human = |q: i64| if q % 2 == 0 { "valid" } else { "hallucination" };
    let file = dir.path().join("human.jsonl");
    let lines: String = answered
        .iter()
        .map(|q| format!("{{\"item\": {q}, \"model\": \"model-a\", \"label\": \"{}\", \"annotator\": \"ann-1\"}}\n", human(*q)))
        .collect();
    std::fs::write(&file, lines).unwrap();
    let o = halyard()
        .args(["labels", "import", run.to_str().unwrap(), file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // What the filters must find, counted here from labels.jsonl and the imported file.
    let label_of = |q: i64, judge: &str| {
        rows.iter()
            .find(|r| r["question_id"] == q && r["judge"] == judge)
            .map(|r| r["answer_label"].as_str().unwrap().to_string())
            .unwrap()
    };
    let disagree: Vec<i64> = answered
        .iter()
        .copied()
        .filter(|q| label_of(*q, "judge-a") != label_of(*q, "judge-b"))
        .collect();
    assert!(!disagree.is_empty(), "judge-b never differed: nothing to filter");
    let human_rows = rows
        .iter()
        .filter(|r| {
            let q = r["question_id"].as_i64().unwrap();
            answered.contains(&q) && r["answer_label"] != human(q)
        })
        .count();
    assert!(human_rows > 0);

    let view = View::start(&[&out]);
    let page = Page::open(&bin);
    let total = |p: &Page| {
        p.eval("Number(document.getElementById('page-info').dataset.total)").as_u64().unwrap()
    };
    page.goto(&format!("{}/run/paneled", view.base));
    page.wait("document.body.dataset.ready === 'run'", "the run page");
    page.select("filter-flag", "judge_disagreement");
    assert_eq!(total(&page) as usize, 2 * disagree.len(), "both judges' rows of each");
    page.select("filter-flag", "human_disagreement");
    assert_eq!(total(&page) as usize, human_rows);
    let flags = page
        .eval("[...document.querySelectorAll('#items tr')].map(t => t.children[6].textContent)");
    assert!(
        flags
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f.as_str().unwrap().contains("human disagreement")),
        "{flags}"
    );

    // An item the judges disagree on: each judge's label, the panel's verdict (judge-b's,
    // the rule named) beside them and on each row, the human label.
    let cats = ["valid", "hallucination", "irrelevant"];
    let q = *disagree
        .iter()
        .find(|q| {
            cats.contains(&label_of(**q, "judge-a").as_str())
                && cats.contains(&label_of(**q, "judge-b").as_str())
        })
        .expect("a disagreement between two labels (no judge error)");
    page.goto(&format!("{}/run/paneled?item={q}", view.base));
    page.wait("document.body.dataset.item !== undefined", "the item opened");
    let (a, b) = (label_of(q, "judge-a"), label_of(q, "judge-b"));
    let votes = page.eval("[...document.querySelectorAll('#panel tr[data-model=model-a] td.vote')].map(t => t.textContent)");
    assert_eq!(votes, serde_json::json!([a, b]));
    assert_eq!(page.text("#panel tr[data-model=model-a] td.panel-verdict"), b);
    assert!(page.text("#panel tr[data-model=model-a]").contains("primary:judge-b"));
    let on_rows =
        page.eval("[...document.querySelectorAll('#item .row-panel')].map(t => t.textContent)");
    assert_eq!(on_rows, serde_json::json!([b, b]), "the verdict beside each judge's row");
    let file = std::fs::read_to_string(run.join("panel/benchmark-0.jsonl")).unwrap();
    let unit: Value = file
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["item"] == q.to_string().as_str() && v["model"] == "model-a")
        .expect("the unit in the panel file");
    assert_eq!(unit["verdict"], b.as_str());
    assert_eq!(page.text("#human td:nth-child(2)"), human(q));
    page.eval("document.getElementById('panel').scrollIntoView()");
    page.screenshot("view-panel");

    // The poisoned answer: its job links to its dead letter.
    let job =
        rows.iter().find(|r| r["question_id"] == poison).expect("the poisoned question's row")
            ["answer_job"]
            .as_str()
            .unwrap()
            .to_string();
    page.goto(&format!("{}/run/paneled?item={poison}", view.base));
    page.wait("document.body.dataset.item !== undefined", "the poisoned item opened");
    let report = read_json(&run.join("report.json"));
    let d = report["dead_letters"].as_array().unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["job"], job.as_str());
    assert_eq!(page.eval("document.querySelectorAll('#dead tr.dead-letter').length"), 1);
    assert_eq!(page.text("#dead tr.dead-letter code"), job);
    let href = page.eval(
        "[...document.querySelectorAll('#item a.dead-link')].map(a => a.getAttribute('href'))",
    );
    assert!(
        href.as_array().unwrap().iter().all(|h| *h == format!("#dead-{job}").as_str())
            && !href.as_array().unwrap().is_empty(),
        "{href}"
    );
    page.click("#item a.dead-link");
    page.wait(
        &format!("decodeURIComponent(location.hash) === '#dead-{job}'"),
        "the dead letter's anchor",
    );
    assert_eq!(page.eval("document.querySelector('#dead tr.dead-letter:target') !== null"), true);
    page.assert_local(&view.base);
}

/// `halyard view` refuses a directory that is not there, naming it.
#[test]
fn view_refuses_a_missing_directory() {
    let o =
        halyard().args(["view", "/nonexistent/runs", "--addr", "127.0.0.1:0"]).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/nonexistent/runs is not a directory"), "{err}");
}
