//! `backend = "embed"`: sentence embeddings with a model run in the worker
//! (all-MiniLM-L6-v2 on candle, [`halyard_embed::Embedder`]).
//!
//! A job's messages are its sentences (one per message, any role); the completion text
//! carries their unit vectors in the codec of [`halyard_embed::codec`]. The model runs
//! on blocking threads, one job at a time per model (its matrix products already use
//! every core); jobs of up to [`SUB_BATCH`] sentences are computed as one padded batch.

use std::sync::Arc;
use std::time::Instant;

use halyard_embed::Embedder;
use halyard_proto::{Completion, Job, Usage};

use crate::call_error::CallError;

/// Sentences computed together (sorted by length, so padding stays small).
pub const SUB_BATCH: usize = 32;

pub use halyard_proto::pool::EmbedSpec;

pub struct EmbedModel {
    model: Arc<Embedder>,
    one_at_a_time: tokio::sync::Semaphore,
}

impl EmbedModel {
    pub fn load(spec: &EmbedSpec) -> Result<EmbedModel, String> {
        let model = Embedder::load(&spec.path).map_err(|e| e.to_string())?;
        Ok(EmbedModel { model: Arc::new(model), one_at_a_time: tokio::sync::Semaphore::new(1) })
    }

    pub async fn call(&self, job: &Job) -> Result<Completion, CallError> {
        let _turn = self
            .one_at_a_time
            .acquire()
            .await
            .map_err(|_| CallError::transient("embedding model closed"))?;
        let texts: Vec<String> = job.key.messages.iter().map(|m| m.content.clone()).collect();
        let model = self.model.clone();
        let start = Instant::now();
        let out = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let tokens: u64 =
                refs.iter().map(|t| model.token_ids(t).map_or(0, |ids| ids.len() as u64)).sum();
            model
                .embed_all(&refs, SUB_BATCH)
                .map(|v| (halyard_embed::codec::encode(&v, model.dim()), tokens))
        })
        .await
        .map_err(|e| CallError::transient(format!("embedding task panicked: {e}")))?;
        // A model that loaded but cannot embed this input will not do better next time.
        let (text, tokens) = out.map_err(|e| CallError::permanent(e.to_string()))?;
        Ok(Completion {
            text,
            usage: Usage { prompt_tokens: tokens, completion_tokens: 0, cache: None },
            latency_ms: start.elapsed().as_millis() as u64,
            finish_reason: Some("stop".into()),
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        })
    }
}

/// `backend = "embed"`: the plan's embedding models, by endpoint, each loaded once.
pub const KIND: super::BackendKind = super::BackendKind {
    name: "embed",
    http: false,
    load: |l| {
        let mut models = std::collections::HashMap::new();
        for (_, m) in l.models("embed") {
            if let halyard_proto::pool::WorkerModel::Embed(spec) = m {
                if !models.contains_key(&spec.endpoint) {
                    let m = EmbedModel::load(spec)
                        .map_err(|e| format!("embedding model {}: {e}", spec.path.display()))?;
                    models.insert(spec.endpoint.clone(), m);
                }
            }
        }
        Ok(Box::new(EmbedBackend { models }))
    },
};

/// The `embed` backend: its models by endpoint.
struct EmbedBackend {
    models: std::collections::HashMap<String, EmbedModel>,
}

impl super::Backend for EmbedBackend {
    fn call<'a>(
        &'a self,
        job: &'a Job,
    ) -> futures::future::BoxFuture<'a, Result<Completion, CallError>> {
        Box::pin(async move {
            match self.models.get(&job.key.model.endpoint) {
                Some(m) => m.call(job).await,
                None => Err(CallError::permanent(format!(
                    "this worker does not hold embedding model {} (pool {}); start a worker with that model",
                    job.key.model.endpoint, job.pool
                ))),
            }
        })
    }
}
