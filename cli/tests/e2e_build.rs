//! End-to-end: `halyard run` builds a HypoTermQA benchmark (pipeline `hypotermqa-build`)
//! from a tenth of the shipped sample knowledge base with a fake generator (real HTTP)
//! and the real all-MiniLM-L6-v2 embedder in the worker, then evaluates a fake model on
//! it, in one sweep (two phases, one run).

use std::collections::HashMap;

use crate::common::*;
use halyard_pipelines::hypotermqa::{read_dataset, ReplacementType};
use halyard_pipelines::hypotermqa_build::text::replace_term;
use halyard_tests::{ChatCall, FakeOpenAi, Reply};

/// Hypothetical terms the fake invents, two per topic; the second of "Sports" is never
/// put in its question (the inclusion gate must drop it).
const INVENTED: [&str; 4] =
    ["Nano-Sync Fusion Gizmo", "Holo-Lattice Phone", "Gravity-Flip Dunk", "Aqua-Sprint Relay"];
const LEFT_OUT: &str = "Aqua-Sprint Relay";

/// Titles of the shipped knowledge base that the fake generator names.
const KB_TITLES: [&str; 3] = ["3D printing", "Nanorobotics", "Virtual reality"];

/// A tenth of the shipped sample knowledge base (every tenth passage, and the passages
/// the fake names), written to `path`: the same real data for the real embedder, which
/// spends about 8 s on 70 passages here and 80 s on all 645 (debug build, 2 cores).
fn sample_kb(path: &std::path::Path) {
    let shipped = repo_root().join("datasets/hypotermqa-build/sample_kb.jsonl");
    let text = std::fs::read_to_string(&shipped).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .enumerate()
        .filter(|(i, l)| {
            let title = serde_json::from_str::<serde_json::Value>(l).unwrap()["title"].clone();
            i % 10 == 0 || KB_TITLES.iter().any(|t| title == *t)
        })
        .map(|(_, l)| l)
        .collect();
    std::fs::write(path, kept.join("\n") + "\n").unwrap();
}

fn field<'a>(prompt: &'a str, name: &str) -> &'a str {
    prompt.lines().find_map(|l| l.strip_prefix(name)).unwrap_or("").trim()
}

fn generator(call: &ChatCall) -> Reply {
    let prompt = call.messages.last().map(|(_, c)| c.as_str()).unwrap_or("");
    let text = if prompt.starts_with("Invent ") {
        let (a, b) = if prompt.contains("\"Technology") {
            (INVENTED[0], INVENTED[1])
        } else {
            (INVENTED[2], INVENTED[3])
        };
        // Two invented terms, one real title (rejected by the existence check), one line
        // without an explanation (dropped by the parser).
        format!("1. {a}: a device that fuses nano machines\n2. {b}: a phone made of holograms\n3. 3D printing: printing things\n4. Just a line\n")
    } else if prompt.starts_with("Here is a hypothetical term") {
        // Two knowledge-base titles and one that is not in it.
        "Nanorobotics: tiny robots\nVirtual reality: simulated worlds\nHolographic gadgetry: not a title\n".into()
    } else if prompt.starts_with("Write one question") {
        let (a, b) = (field(prompt, "Term 1:"), field(prompt, "Term 2:"));
        if b.trim_matches('"') == LEFT_OUT {
            format!("How does {a} change relay races?")
        } else {
            format!("How does {a} relate to the recent popularity of {b}?")
        }
    } else if call
        .messages
        .first()
        .is_some_and(|(r, c)| r == "system" && c.starts_with("You are a linguistic expert."))
    {
        // Judge: the invented terms are unreal, the others real and used in their meaning.
        let user = &call.messages[1].1;
        let unreal = INVENTED.iter().any(|t| user.contains(t));
        if call.messages[0].1.contains("Verify if the answer uses the term in its real meaning.") {
            "{\"term\":\"t\",\"reasoning\":\"ok\",\"verified\":\"TRUE\"}".into()
        } else {
            let c = if unreal { "UNREAL" } else { "MENTIONED" };
            format!("{{\"term\":\"t\",\"reasoning\":\"r\",\"certainty\":\"{c}\"}}")
        }
    } else {
        // The model under test repeats the question.
        format!("Here is what I know: {prompt}")
    };
    Reply::Text(text)
}

#[test]
fn build_then_evaluate_in_one_sweep() {
    let fake = FakeOpenAi::start_blocking(generator);
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("build.toml");
    let kb = dir.path().join("kb.jsonl");
    sample_kb(&kb);
    std::fs::write(
        &sweep,
        format!(
            r#"name = "build"

[[model]]
name = "gen"
backend = "openai"
base_url = "{url}"
model = "fake-gen"
max_concurrency = 8

[[model]]
name = "minilm"
backend = "embed"
model_path = "{embed}"

[[benchmark]]
pipeline = "hypotermqa-build"
models = ["gen"]

[benchmark.build]
embedder = "minilm"
knowledge_base = "{kb}"
topics = ["Technology and gadgets", "Sports"]
terms_per_topic = 3
suggestions = 3
top_k = 5
embed_batch = 128

[[benchmark]]
pipeline = "hypotermqa"
dataset_from = 0
models = ["gen"]
judge = "gen"

[run]
ack_wait_s = 60
"#,
            url = fake.base_url(),
            embed = embed_model().display(),
            kb = kb.display(),
        ),
    )
    .unwrap();
    let out = dir.path().join("runs");
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let report = read_json(&out.join("build/report.json"));
    let b = &report["benchmarks"][0];
    assert_eq!(b["pipeline"], "hypotermqa-build");
    let c: HashMap<String, u64> = b["counts"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    let n = |k: &str| c.get(k).copied().unwrap_or(0);
    eprintln!("build counts: {c:?}");
    // Per topic: 4 lines, 3 kept (one without explanation), 1 in the knowledge base.
    assert_eq!((n("terms.lines"), n("terms.kept"), n("terms.dropped_format")), (8, 6, 2));
    assert_eq!((n("exists.in_kb"), n("exists.hypothetical")), (2, 4));
    // Per hypothetical term: 2 of 3 suggestions are titles; 3 sets planned.
    assert_eq!((n("suggest.in_kb"), n("suggest.not_in_kb")), (8, 4));
    assert_eq!(n("pairs.planned"), 12);
    // The left-out term fails the inclusion gate in each of its 3 sets.
    assert_eq!((n("hypothetical.dropped_inclusion"), n("hypothetical.passed")), (3, 9));
    assert_eq!((n("fresh.passed"), n("triples.kept")), (9, 9));
    let triples = n("output.triples");
    assert_eq!(triples + n("output.dropped_duplicate"), 9);
    assert!(triples >= 3, "{c:?}");
    assert_eq!(b["questions"].as_u64().unwrap(), 3 * triples);

    // The dataset passes the evaluation pipeline's reader.
    let built = out.join("build/built-0.jsonl");
    let qs = read_dataset(&built).unwrap();
    assert_eq!(qs.len() as u64, 3 * triples);
    for t in qs.chunks(3) {
        assert_eq!(
            t.iter().map(|q| q.replacement).collect::<Vec<_>>(),
            [ReplacementType::None, ReplacementType::Programmatic, ReplacementType::Fresh]
        );
        let hyp = t[0].terms.iter().find(|x| x.is_hypothetical).unwrap();
        assert!(INVENTED.contains(&hyp.term.as_str()) && hyp.term != LEFT_OUT);
        let secondary = t[0].terms.iter().find(|x| !x.is_hypothetical).unwrap();
        let replacement = t[1].terms.iter().find(|x| x.term != secondary.term).unwrap();
        // The generator quoted the terms (as the prompt asks); the built questions do not.
        assert!(t.iter().all(|q| !q.question.contains('"')), "{:?}", t[0].question);
        // The replaced question is the programmatic substitution of the hypothetical one.
        assert_eq!(t[1].question, replace_term(&t[0].question, &hyp.term, &replacement.term).0);
        // Both valid terms of a triple come from one set, the secondary's.
        assert!(t[1].terms.iter().chain(&t[2].terms).all(|x| x.term_set == secondary.term_set));
    }
    // The existence check rejected the real title: it is never a hypothetical term.
    assert!(qs
        .iter()
        .flat_map(|q| &q.terms)
        .all(|t| !(t.is_hypothetical && t.term == "3D printing")));

    // Phase 2 evaluated the model on the built dataset.
    let e = &report["benchmarks"][1];
    assert_eq!(e["pipeline"], "hypotermqa");
    assert_eq!(e["hypothetical_questions"].as_u64().unwrap(), triples);
    assert_eq!(e["dataset"].as_str().unwrap(), built.display().to_string());
    assert_eq!(report["jobs"]["dead_letters"], 0);
    let labels = std::fs::read_to_string(out.join("build/labels.jsonl")).unwrap();
    assert_eq!(labels.lines().count() as u64, 2 + 3 * triples);
}
