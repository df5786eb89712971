//! The pluggable sentence-embedding model behind UHGEval's "BERTScore".
//!
//! UHGEval's "BERTScore" is not Zhang et al.'s token-matching BERTScore: both code
//! versions call `text2vec.Similarity().get_score(continuation, reference)`, the cosine
//! similarity of two mean-pooled sentence embeddings from `shibing624/text2vec-base-chinese`
//! (spec §1.6, §6.2). Those weights cannot be installed here, so the model is a parameter:
//! anything that implements [`Embedder`]. With none configured the report says
//! "BERTScore: not computed (no embedding model configured)". A different model gives
//! different values from the paper's: the report names the model used.

/// A sentence-embedding model.
pub trait Embedder: Send + Sync {
    /// The model's name, shown in the report.
    fn name(&self) -> &str;
    /// One vector for `text` (the model's own truncation applies).
    fn embed(&self, text: &str) -> Result<Vec<f32>, String>;
}

/// text2vec's `get_score` with `embedder`: both texts stripped; `0.0` if either is empty;
/// otherwise the cosine similarity of their embeddings (`0.0` if a vector is all zeros).
/// An error names which text failed.
pub fn similarity(embedder: &dyn Embedder, a: &str, b: &str) -> Result<f64, String> {
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() || b.is_empty() {
        return Ok(0.0);
    }
    let va = embedder.embed(a).map_err(|e| format!("embedding the continuation: {e}"))?;
    let vb = embedder.embed(b).map_err(|e| format!("embedding the reference: {e}"))?;
    if va.len() != vb.len() {
        return Err(format!("embedding sizes differ ({} vs {})", va.len(), vb.len()));
    }
    let dot: f64 = va.iter().zip(&vb).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let (na, nb) = (norm(&va), norm(&vb));
    Ok(if na == 0.0 || nb == 0.0 { 0.0 } else { dot / (na * nb) })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A toy model for tests: counts of a few characters.
    pub(crate) struct CharCounts;

    impl Embedder for CharCounts {
        fn name(&self) -> &str {
            "char-counts"
        }
        fn embed(&self, text: &str) -> Result<Vec<f32>, String> {
            if text.contains('✗') {
                return Err("cannot embed ✗".into());
            }
            Ok(['的', '是', '在', '。'].iter().map(|c| text.chars().filter(|x| x == c).count() as f32).collect())
        }
    }

    /// Identical texts give 1, empty ones 0, orthogonal ones 0; errors say which side.
    #[test]
    fn cosine_rules() {
        assert!((similarity(&CharCounts, "的是。", "的是。").unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(similarity(&CharCounts, "  ", "的").unwrap(), 0.0);
        assert_eq!(similarity(&CharCounts, "的", "是").unwrap(), 0.0);
        assert_eq!(similarity(&CharCounts, "xyz", "的").unwrap(), 0.0);
        let v = similarity(&CharCounts, "的的", "的是").unwrap();
        assert!((v - 1.0 / 2f64.sqrt()).abs() < 1e-12);
        assert!(similarity(&CharCounts, "的", "✗").unwrap_err().contains("reference"));
    }
}
