//! Embedding throughput (sentences/s) and flat-index query time.
//!
//! `cargo bench -p halyard-embed --bench embed` (model folder: `HALYARD_EMBED_MODEL`,
//! else `models/all-MiniLM-L6-v2`). Sentences: the valid-term titles and first
//! paragraphs of the shipped sample knowledge base, embedded in batches of 32.

use std::path::PathBuf;
use std::time::Instant;

use halyard_embed::index::{FlatIndex, Metric};
use halyard_embed::Embedder;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::var_os("HALYARD_EMBED_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("models/all-MiniLM-L6-v2"));
    let e = Embedder::load(&dir).unwrap_or_else(|err| panic!("{err}"));
    let kb = std::fs::read_to_string(root.join("datasets/hypotermqa-build/sample_kb.jsonl"))
        .expect("sample knowledge base");
    let rows: Vec<serde_json::Value> = kb
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let titles: Vec<&str> = rows.iter().map(|r| r["title"].as_str().unwrap()).collect();
    let texts: Vec<&str> = rows.iter().map(|r| r["text"].as_str().unwrap()).collect();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    for (name, set) in [("titles", &titles), ("first paragraphs", &texts)] {
        let t = Instant::now();
        let v = e.embed_all(set, 32).unwrap();
        let s = t.elapsed().as_secs_f64();
        println!("embed {name}: {} sentences in {s:.2} s = {:.1} sentences/s (batch 32, {threads} threads)", v.len(), v.len() as f64 / s);
    }
    // Index query time at a larger scale: synthetic unit vectors, 200k rows.
    let n = 200_000;
    let mut idx = FlatIndex::new(384);
    let mut seed = 1u64;
    let mut row = vec![0f32; 384];
    for _ in 0..n {
        for x in row.iter_mut() {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *x = ((seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5;
        }
        let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        row.iter_mut().for_each(|x| *x /= norm);
        idx.add(&row).unwrap();
    }
    let q: Vec<&[f32]> = (0..16).map(|i| idx.row(i * 7)).collect();
    let t = Instant::now();
    let hits = idx.search_many(&q, 10, Metric::Cosine);
    let s = t.elapsed().as_secs_f64();
    assert_eq!(hits.len(), 16);
    println!(
        "flat index: 16 queries over {n} × 384 in {:.3} s = {:.1} ms per query (one core)",
        s,
        s * 1000.0 / 16.0
    );
}
