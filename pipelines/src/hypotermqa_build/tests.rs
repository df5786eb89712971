use std::collections::HashMap;
use std::sync::Arc;

use halyard_embed::index::Metric;
use halyard_proto::{Completion, JobId, ModelRef, Outcome, Usage};

use super::kb::{KbTitles, KnownPhrases};
use super::*;
use crate::hypotermqa::parse_dataset;

const KB: &str = r#"{"title": "3D printing", "text": "Additive manufacturing builds objects layer by layer."}
{"title": "Loom", "text": "A loom is a device used to weave cloth and tapestry."}
{"title": "Quantum computing", "text": "Quantum computing uses qubits and superposition."}
{"title": "Weaving", "text": "Weaving interlaces two sets of yarn to form cloth."}
{"title": "Cryogenics", "text": "Cryogenics studies materials at very low temperature."}
{"title": "Crystal lattice", "text": "A lattice is a regular arrangement of atoms in a crystal."}
"#;

fn spec(name: &str, backend: &str) -> ModelSpec {
    ModelSpec {
        model_ref: ModelRef {
            backend: backend.into(),
            endpoint: String::new(),
            model: name.into(),
        },
        ..crate::common::test_model(name)
    }
}

fn cfg(topics: Topics) -> Config {
    let kb = Arc::new(Kb::parse("kb.jsonl", KB).unwrap());
    Config {
        generator: spec("gen", "openai"),
        term_temperature: 1.0,
        embedder: spec("minilm", "embed"),
        topics,
        terms_per_topic: 4,
        suggestions: 3,
        top_k: 3,
        metric: Metric::Cosine,
        embed_batch: 4,
        kb: kb.clone(),
        checks: vec![Arc::new(KbTitles(kb)), Arc::new(KnownPhrases::new(["Cryo Lattice"]))],
    }
}

/// Letter counts, normalised: texts sharing letters are near (enough for a test).
fn letters(s: &str) -> Vec<f32> {
    let mut v = [0f32; 26];
    for c in s.to_lowercase().chars().filter(char::is_ascii_lowercase) {
        v[(c as u8 - b'a') as usize] += 1.0;
    }
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
    v.iter().map(|x| x / n).collect()
}

fn field<'a>(prompt: &'a str, name: &str) -> &'a str {
    prompt.lines().find_map(|l| l.strip_prefix(name)).unwrap_or("").trim()
}

/// The scripted generator and embedder.
fn answer(req: &JobRequest) -> String {
    let prompt = &req.key.messages.last().expect("a prompt").content;
    match req.key.stage.as_str() {
        "topics" => "1. Textiles: cloth and weaving\n2. Cold physics: low temperatures\n".into(),
        "terms" if prompt.contains("Textiles") => {
            "Here you go:\n1. Quantum Loom: a loom that weaves qubits\n2. 3D Printing: printing\n3. Cryo Lattice: a frozen lattice\n4. quantum loom: again\n".into()
        }
        "terms" => "Zorb Flux Weave: a weave of zorb flux\n".into(),
        "embed" => {
            let v: Vec<Vec<f32>> = req.key.messages.iter().map(|m| letters(&m.content)).collect();
            halyard_embed::codec::encode(&v, 26)
        }
        "suggest" => "Loom: a weaving device\nQuantum computing: qubits\nQuantum weaving: not a title\n".into(),
        "question" => {
            let (a, b) = (field(prompt, "Term 1:"), field(prompt, "Term 2:"));
            if b.trim_matches('"') == "Zorb Flux Weave" {
                // Leaves the hypothetical term out: the inclusion gate drops it.
                format!("Question: How is {a} made?")
            } else {
                format!("Question: \"How does {a} shape the future of {b}?\"")
            }
        }
        other => panic!("unexpected stage {other}"),
    }
}

fn done(text: String) -> Outcome {
    Outcome::Done(Completion {
        text,
        usage: Usage::default(),
        latency_ms: 0,
        finish_reason: None,
        calls: 1,
        logprobs: None,
        refusal: false,
        source: Default::default(),
    })
}

/// Drives one item to its label, answering every job; returns the label and the jobs asked.
fn run(
    c: &Config,
    item: u64,
    known: &mut HashMap<JobId, Outcome>,
) -> (TopicLabel, Vec<JobRequest>) {
    let mut asked = Vec::new();
    loop {
        match evaluate(c, item, known) {
            Plan::Done(l) => return (l, asked),
            Plan::Waiting(jobs) => {
                assert!(!jobs.is_empty());
                for j in jobs {
                    assert!(!known.contains_key(&j.id()), "asked again for a known job");
                    known.insert(j.id(), done(answer(&j)));
                    asked.push(j);
                }
            }
        }
    }
}

/// The whole build of two generated topics, gate by gate, and the dataset it gives.
#[test]
fn builds_a_dataset_with_counts_per_gate() {
    let c = cfg(Topics::Generate(2));
    let mut known = HashMap::new();
    let (a, asked) = run(&c, 0, &mut known);
    assert_eq!(a.topic.as_deref(), Some("Textiles"));
    assert_eq!(a.error, None);
    // Terms: 5 lines, one without explanation, one duplicate; 3D printing is in the KB,
    // Cryo Lattice a known phrase; Quantum Loom is the one hypothetical term.
    let statuses: Vec<(&str, &str)> =
        a.terms.iter().map(|t| (t.term.as_str(), t.status.as_str())).collect();
    assert_eq!(
        statuses,
        [
            ("Quantum Loom", "hypothetical"),
            ("3D Printing", "in_kb"),
            ("Cryo Lattice", "known_phrase")
        ]
    );
    let n = |k: &str| a.counts.get(k).copied().unwrap_or(0);
    assert_eq!(
        (
            n("terms.lines"),
            n("terms.kept"),
            n("terms.dropped_format"),
            n("terms.dropped_duplicate")
        ),
        (5, 3, 1, 1)
    );
    assert_eq!((n("exists.in_kb"), n("exists.known_phrase"), n("exists.hypothetical")), (1, 1, 1));
    assert_eq!((n("topics.lines"), n("topics.kept")), (2, 2));
    // Suggestions: two of three are KB titles.
    assert_eq!((n("suggest.in_kb"), n("suggest.not_in_kb")), (2, 1));
    // Three sets, one triple each, every gate passed.
    assert_eq!(n("pairs.planned"), 3);
    assert_eq!((n("hypothetical.passed"), n("fresh.passed"), n("triples.kept")), (3, 3, 3));
    let sets: Vec<TermSet> = a.triples.iter().map(|t| t.set).collect();
    assert_eq!(sets, [TermSet::LlmSuggestion, TermSet::TitleSimilarity, TermSet::TextSimilarity]);
    for t in &a.triples {
        // The replaced question is the programmatic substitution of the hypothetical one.
        let (want, _) = text::replace_term(
            &t.hypothetical_question,
            &t.hypothetical,
            &c.kb.titles[t.replacement],
        );
        assert_eq!(t.programmatic_question, want);
        assert!(
            t.hypothetical_question.ends_with("future of Quantum Loom?"),
            "{}",
            t.hypothetical_question
        );
        assert_ne!(t.secondary, t.replacement);
    }
    assert_eq!(c.kb.titles[a.triples[0].secondary], "Loom");
    assert_eq!(c.kb.titles[a.triples[0].replacement], "Quantum computing");
    // The KB was embedded in batches of 4: 6 titles → 2 jobs, 6 texts → 2 jobs, plus the terms' one.
    assert_eq!(asked.iter().filter(|j| j.key.stage == "embed").count(), 5);
    assert!(asked.iter().any(|j| j.key.stage == "terms" && j.key.sampling.temperature == 1.0));
    // Same results, same answer (pure).
    assert_eq!(evaluate(&c, 0, &known), Plan::Done(a.clone()));

    // Topic 2: its only term is dropped at the hypothetical question's inclusion gate.
    let (b, _) = run(&c, 1, &mut known);
    assert_eq!(b.topic.as_deref(), Some("Cold physics"));
    assert!(b.triples.is_empty());
    assert!(b.counts["hypothetical.dropped_inclusion"] >= 1, "{:?}", b.counts);

    // Output: the text-similarity triple (secondary Loom, as in the suggestion triple)
    // repeats the suggestion triple's hypothetical question, and the title triple's
    // programmatic question ("…Quantum computing … of Loom?") is the suggestion
    // triple's fresh one: both are dropped.
    let built = output::assemble(&[a, b], &c.kb);
    assert_eq!(
        (built.questions, built.hypothetical_terms, built.valid_terms, built.topics),
        (3, 1, 2, 2)
    );
    assert_eq!((built.counts["output.triples"], built.counts["output.dropped_duplicate"]), (1, 2));
    assert_eq!((built.topics_failed, built.counts["triples.kept"]), (0, 3));
    let body = built.lines.join("\n");
    let qs = parse_dataset("built.jsonl", &body).unwrap();
    assert_eq!(qs.len(), 3);
    assert_eq!(qs.iter().filter(|q| q.is_hypothetical).count(), 1);
    assert_eq!(qs[1].question, built_programmatic(&qs[0].question, &qs[1]));
    assert!(body.starts_with("{\"questionId\":1,\"isHypotheticalQuestion\":true,\"question\":"));
}

fn built_programmatic(hyp: &str, prog: &crate::hypotermqa::Question) -> String {
    // The replacement term is the programmatic question's term not in the hypothetical one.
    let rep = prog.terms.iter().find(|t| !crate::hypotermqa::paper_includes(hyp, &t.term)).unwrap();
    text::replace_term(hyp, "Quantum Loom", &rep.term).0
}

/// A failed terms job ends the topic with its error; a given topic needs no topics job.
#[test]
fn failures_and_given_topics() {
    let c = cfg(Topics::Given(vec!["Textiles".into()]));
    let first = match evaluate(&c, 0, &HashMap::<JobId, Outcome>::new()) {
        Plan::Waiting(j) => j,
        d => panic!("{d:?}"),
    };
    assert_eq!(first[0].key.stage, "terms");
    assert_eq!(first.iter().filter(|j| j.key.stage == "embed").count(), 4);
    let mut known = HashMap::new();
    known.insert(
        first[0].id(),
        Outcome::Failed(halyard_proto::Failure {
            kind: halyard_proto::FailureKind::Permanent,
            error: "boom".into(),
            http_status: None,
        }),
    );
    let l = evaluate(&c, 0, &known).done().unwrap();
    assert_eq!(l.error.as_deref(), Some("terms job failed: boom"));
    assert_eq!(l.counts["topics.failed"], 1);
    // Duplicates across topics are dropped at output.
    let (a, _) = run(&cfg(Topics::Given(vec!["Textiles".into()])), 0, &mut HashMap::new());
    let built = output::assemble(&[a.clone(), a], &c.kb);
    assert_eq!((built.questions, built.counts["output.dropped_duplicate"]), (3, 5));
}
