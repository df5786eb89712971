//! The pluggable sentence-embedding model behind UHGEval's "BERTScore".
//!
//! UHGEval's "BERTScore" is not Zhang et al.'s token-matching BERTScore: both code
//! versions call `text2vec.Similarity().get_score(continuation, reference)`, the cosine
//! similarity of two mean-pooled sentence embeddings from `shibing624/text2vec-base-chinese`
//! (spec §1.6, §6.2). Those weights cannot be installed here, so the model is a parameter:
//! anything that implements [`Embedder`]. With none configured the report says
//! "BERTScore: not computed (no embedding model configured)". A different model gives
//! different values from the paper's: the report names the model used.

use serde::{Deserialize, Serialize};

use super::plan::{PIPELINE, STAGE_VERSION};
use crate::common::{JobOutcome, JobRequest, ModelSpec, ResultLookup};

/// The model UHGEval's "BERTScore" used (spec §1.6): figures from any other model are not
/// comparable with the paper's.
pub const PAPER_BERT_MODEL: &str = "shibing624/text2vec-base-chinese";

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
    cosine(&va, &vb)
}

/// Cosine similarity of two vectors (`0.0` if one is all zeros); an error for different
/// sizes.
pub fn cosine(va: &[f32], vb: &[f32]) -> Result<f64, String> {
    if va.len() != vb.len() {
        return Err(format!("embedding sizes differ ({} vs {})", va.len(), vb.len()));
    }
    let dot: f64 = va.iter().zip(vb).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let (na, nb) = (norm(va), norm(vb));
    Ok(if na == 0.0 || nb == 0.0 { 0.0 } else { dot / (na * nb) })
}

/// The "BERTScore" of one continuation from an `embed` job (issue 16): the embedding model
/// is a sweep model with `backend = "embed"` (its vectors come back in the job's
/// completion), so BERTScore runs on the workers like every other call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BertLabel {
    /// text2vec's `get_score`: cosine of the two embeddings; `0.0` when a stripped text is
    /// empty (no job then). `None`: see `error`.
    pub score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The `bert` job embedding the stripped continuation and reference, `None` when either
/// is empty (text2vec scores that 0 without a model).
pub fn bert_request(
    embedder: &ModelSpec,
    continuation: &str,
    reference: &str,
) -> Option<JobRequest> {
    let (a, b) = (continuation.trim(), reference.trim());
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let messages = vec![halyard_proto::ChatMessage::user(a), halyard_proto::ChatMessage::user(b)];
    Some(embedder.request(PIPELINE, "bert", STAGE_VERSION, messages, 0))
}

/// The BERTScore of a continuation from its `bert` job, or the job still needed.
// `Err` carries the job still needed (not an error path), as in `plan.rs`.
#[allow(clippy::result_large_err)]
pub fn bert_step(
    embedder: &ModelSpec,
    continuation: &str,
    reference: &str,
    results: &dyn ResultLookup,
) -> Result<BertLabel, JobRequest> {
    let Some(req) = bert_request(embedder, continuation, reference) else {
        return Ok(BertLabel { score: Some(0.0), error: None });
    };
    let error = |e: String| BertLabel { score: None, error: Some(e) };
    match results.get(&req.id()) {
        None => Err(req),
        Some(JobOutcome::Failed(e)) => Ok(error(format!("embedding job failed: {e}"))),
        Some(JobOutcome::Done(c)) => Ok(match halyard_embed::codec::decode(&c.text, 2) {
            Ok(v) => match cosine(&v[0], &v[1]) {
                Ok(score) => BertLabel { score: Some(score), error: None },
                Err(e) => error(e),
            },
            Err(e) => error(format!("embedding job {}: {e}", req.id())),
        }),
    }
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
            Ok(['的', '是', '在', '。']
                .iter()
                .map(|c| text.chars().filter(|x| x == c).count() as f32)
                .collect())
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

    /// Issue 16: BERTScore from an `embed` job: the two stripped texts in one job, the cosine
    /// of the vectors it returns; an empty side is 0 with no job; a failed job is an error.
    #[test]
    fn bert_from_embed_jobs() {
        use halyard_proto::{Completion, Outcome, Usage};
        let mut m = crate::common::test_model("minilm");
        m.model_ref.backend = "embed".into();
        assert_eq!(
            bert_step(&m, " ", "ref", &std::collections::HashMap::new()),
            Ok(BertLabel { score: Some(0.0), error: None })
        );
        let req = bert_step(&m, " 续写 ", "参考", &std::collections::HashMap::new()).unwrap_err();
        let texts: Vec<&str> = req.key.messages.iter().map(|x| x.content.as_str()).collect();
        assert_eq!((texts, req.key.stage.as_str()), (vec!["续写", "参考"], "bert"));
        let vectors = vec![vec![1.0f32, 0.0], vec![1.0, 1.0]];
        let done = Outcome::Done(Completion {
            text: halyard_embed::codec::encode(&vectors, 2),
            usage: Usage::default(),
            latency_ms: 0,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        });
        let results = std::collections::HashMap::from([(req.id(), done)]);
        let got = bert_step(&m, "续写", "参考", &results).unwrap().score.unwrap();
        assert!((got - 1.0 / 2f64.sqrt()).abs() < 1e-6, "{got}");
        let failed = std::collections::HashMap::from([(
            req.id(),
            Outcome::Failed(halyard_proto::Failure {
                kind: halyard_proto::FailureKind::Permanent,
                error: "no model".into(),
                http_status: None,
            }),
        )]);
        let l = bert_step(&m, "续写", "参考", &failed).unwrap();
        assert_eq!((l.score, l.error.as_deref()), (None, Some("embedding job failed: no model")));
    }
}
