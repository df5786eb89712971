//! The embedder against `shared/golden/minilm_embeddings.json`: all 28 cases (token ids
//! exact, every embedding component within the file's tolerance, 1e-4), one at a time
//! and as one padded batch, and the file's 10 sentence-pair cosines.

use std::path::PathBuf;

use halyard_embed::{index::dot, Embedder};
use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The model folder: `HALYARD_EMBED_MODEL`, else `models/all-MiniLM-L6-v2`.
fn model_dir() -> PathBuf {
    let p = std::env::var_os("HALYARD_EMBED_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models/all-MiniLM-L6-v2"));
    assert!(
        p.join("model.safetensors").exists(),
        "{} is missing: run scripts/fetch-embedder.sh",
        p.display()
    );
    p
}

fn golden() -> Value {
    let path = repo_root().join("../shared/golden/minilm_embeddings.json");
    serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// All 28 cases: token ids exact, vectors within the tolerance, alone, batched and grouped.
#[test]
fn golden_cases_single_and_batched() {
    let g = golden();
    let tol = g["tolerance"].as_f64().unwrap() as f32;
    assert_eq!(g["max_seq_length"].as_u64(), Some(256));
    let e = Embedder::load(&model_dir()).unwrap();
    assert_eq!(e.dim(), 384);
    assert_eq!(e.max_len(), 256);
    let cases = g["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 28);
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let mut worst = 0f32;
    for (c, text) in cases.iter().zip(&texts) {
        let want_ids: Vec<u32> =
            c["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(e.token_ids(text).unwrap(), want_ids, "token ids of {text:?}");
        assert_eq!(want_ids.len() as u64, c["num_tokens"].as_u64().unwrap());
        let got = e.embed(&[text]).unwrap().remove(0);
        let d = max_diff(&got, &floats(&c["embedding"]));
        assert!(d <= tol, "{text:?}: max component difference {d} > {tol}");
        worst = worst.max(d);
    }
    // One padded batch (mixed lengths, up to the 256-token truncation) gives the same vectors.
    let batch = e.embed(&texts).unwrap();
    for ((c, text), got) in cases.iter().zip(&texts).zip(&batch) {
        let d = max_diff(got, &floats(&c["embedding"]));
        assert!(d <= tol, "batched {text:?}: max component difference {d} > {tol}");
    }
    // Grouped by length, in input order.
    let grouped = e.embed_all(&texts, 5).unwrap();
    for (a, b) in grouped.iter().zip(&batch) {
        assert!(max_diff(a, b) <= tol);
    }
    eprintln!("worst component difference over 28 cases: {worst:e}");
}

/// The 10 sentence-pair cosines of the file, within 1e-4.
#[test]
fn golden_pair_cosines() {
    let g = golden();
    let e = Embedder::load(&model_dir()).unwrap();
    let pairs = g["pairs"].as_array().unwrap();
    // Issue 16: all 10 pairs are checked (a truncated file would otherwise pass).
    assert_eq!(pairs.len(), 10);
    for p in pairs {
        let (a, b) = (p["a"].as_str().unwrap(), p["b"].as_str().unwrap());
        let v = e.embed(&[a, b]).unwrap();
        let cos = dot(&v[0], &v[1]);
        let want = p["cosine"].as_f64().unwrap() as f32;
        assert!((cos - want).abs() <= 1e-4, "{a:?} ~ {b:?}: cosine {cos}, expected {want}");
    }
}

/// A missing folder or file is a clear error naming the file and the fetch script.
#[test]
fn missing_model_is_a_clear_error() {
    let dir = tempfile_dir();
    let err = Embedder::load(&dir).unwrap_err().to_string();
    assert!(err.contains("config.json") && err.contains("fetch-embedder.sh"), "{err}");
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    std::fs::write(dir.join("model.safetensors"), "x").unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    let err = Embedder::load(&dir).unwrap_err().to_string();
    assert!(err.contains("config.json"), "{err}");
    std::fs::copy(model_dir().join("config.json"), dir.join("config.json")).unwrap();
    let err = Embedder::load(&dir).unwrap_err().to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("halyard-embed-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
