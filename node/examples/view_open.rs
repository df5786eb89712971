//! How long `halyard view` takes to open a large run and show a page of it: a run of
//! 100,000 items (HypoTermQA-shaped `labels.jsonl` rows, each with its terms and judge
//! calls), indexed once, then pages read back. Prints numbers; asserts none.
//!
//! `cargo run --release -p halyard-node --example view_open [ITEMS]`

use std::io::Write;
use std::time::Instant;

use halyard_node::view::items::{Index, Query};

fn row(i: usize) -> serde_json::Value {
    let model = if i.is_multiple_of(2) { "model-a" } else { "model-b" };
    let label = ["valid", "hallucination", "irrelevant"][i % 3];
    let attempt = |n: usize| serde_json::json!({"job_id": format!("{:032x}", i * 7 + n), "output": format!("{{\"reasoning\": \"The term is not a known concept ({i}).\", \"certainty\": \"UNREAL\"}}"), "error": null});
    serde_json::json!({
        "question_id": i / 2, "question_type": if i % 4 < 2 { "hypothetical" } else { "valid" },
        "question": format!("What is the relationship between term {i} and the quantum flux of economics, as studied since 2019?"),
        "model": model, "judge": "judge-a", "semantics": "paper",
        "answer_job": format!("{:032x}", i), "answer": "A long answer of a few sentences. ".repeat(8),
        "answer_error": null, "answer_label": label,
        "terms": [{"term": format!("term {i}"), "term_id": i, "is_hypothetical": true, "term_set": "hypothetical",
            "included": true,
            "acceptance": {"attempts": [attempt(1)], "parsed": "UNREAL", "label": "hallucination", "reasoning": "not known", "reflection": null},
            "meaning": {"attempts": [attempt(2), attempt(3)], "parsed": "TRUE", "label": "valid", "reasoning": null, "reflection": null},
            "term_label": label, "rows": []}]
    })
}

fn main() {
    let items: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let t = Instant::now();
    let mut f =
        std::io::BufWriter::new(std::fs::File::create(dir.path().join("labels.jsonl")).unwrap());
    for i in 0..items {
        serde_json::to_writer(&mut f, &row(i)).unwrap();
        f.write_all(b"\n").unwrap();
    }
    f.flush().unwrap();
    drop(f);
    let report = serde_json::json!({"run": {"name": "big"}, "benchmarks": [
        {"benchmark": 0, "pipeline": "hypotermqa", "model": "model-a", "labels_lines": [0, items]}]});
    std::fs::write(dir.path().join("report.json"), report.to_string()).unwrap();
    let bytes = std::fs::metadata(dir.path().join("labels.jsonl")).unwrap().len();
    println!(
        "wrote {items} rows ({:.1} MB) in {:.2} s",
        bytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let ix = Index::build(dir.path()).expect("index");
    let open = t.elapsed();
    println!("open (index {} rows): {:.3} s", ix.len(), open.as_secs_f64());

    let t = Instant::now();
    let facets = ix.facets();
    println!(
        "facets (filter choices): {:.1} ms ({} labels)",
        t.elapsed().as_secs_f64() * 1e3,
        facets.labels.len()
    );

    let page = |q: Query, what: &str| {
        let t = Instant::now();
        let p = ix.page(&q).expect("page");
        println!(
            "{what}: {:.1} ms ({} of {} rows)",
            t.elapsed().as_secs_f64() * 1e3,
            p.rows.len(),
            p.total
        );
        p
    };
    page(Query { limit: Some(25), ..Default::default() }, "first page of 25");
    page(
        Query { offset: Some(items - 25), limit: Some(25), ..Default::default() },
        "last page of 25",
    );
    let p = page(
        Query {
            model: Some("model-b".into()),
            label: Some("hallucination".into()),
            offset: Some(items / 8),
            limit: Some(25),
            ..Default::default()
        },
        "a filtered page (model and label) deep in the run",
    );
    let t = Instant::now();
    let it = ix.item(p.rows[0].row, &[]).expect("item");
    println!(
        "one item with all its rows ({}): {:.1} ms",
        it.rows.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
}
