//! The embedding model (feature `model`).

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::bert;
pub use crate::bert::BertConfig;
use crate::MAX_SEQ_LENGTH;

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("embedding model: {0}")]
    Model(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("embedding computation: {0}")]
    Tensor(#[from] candle_core::Error),
}

/// A loaded sentence-embedding model.
pub struct Embedder {
    bert: bert::Bert,
    tokenizer: Tokenizer,
    device: Device,
    max_len: usize,
    dir: PathBuf,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("dir", &self.dir).field("dim", &self.dim()).finish()
    }
}

/// Python's `str.strip()` with no argument: Unicode whitespace plus the four ASCII
/// separators (U+001C..U+001F) Python also counts as whitespace.
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

impl Embedder {
    /// Load `config.json`, `model.safetensors` and `tokenizer.json` from `dir` (CPU).
    pub fn load(dir: &Path) -> Result<Embedder, EmbedError> {
        let file = |name: &str| -> Result<PathBuf, EmbedError> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(EmbedError::Model(format!(
                    "{} is missing (fetch the model with scripts/fetch-embedder.sh)",
                    p.display()
                )))
            }
        };
        let cfg_path = file("config.json")?;
        let cfg_text = std::fs::read_to_string(&cfg_path)
            .map_err(|e| EmbedError::Model(format!("{}: {e}", cfg_path.display())))?;
        let cfg: BertConfig = serde_json::from_str(&cfg_text)
            .map_err(|e| EmbedError::Model(format!("{}: {e}", cfg_path.display())))?;
        let device = Device::Cpu;
        let bert = bert::Bert::load(&cfg, &file("model.safetensors")?, &device)?;
        let tok_path = file("tokenizer.json")?;
        let mut tokenizer = Tokenizer::from_file(&tok_path)
            .map_err(|e| EmbedError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
        let max_len = MAX_SEQ_LENGTH.min(bert.max_positions);
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        tokenizer.with_padding(None);
        Ok(Embedder { bert, tokenizer, device, max_len, dir: dir.to_path_buf() })
    }

    /// Embedding dimension (384).
    pub fn dim(&self) -> usize {
        self.bert.hidden
    }

    /// Longest input in word pieces, `[CLS]` and `[SEP]` included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The word-piece ids of `text` as the model sees it (stripped, truncated, with
    /// `[CLS]` and `[SEP]`).
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let enc = self
            .tokenizer
            .encode(py_strip(text), true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Unit-length embeddings of `texts`, in order, computed as one padded batch.
    /// Callers bound the batch (memory grows with batch × longest input).
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Vec<u32>> =
            texts.iter().map(|t| self.token_ids(t)).collect::<Result<_, _>>()?;
        let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
        let (b, l) = (ids.len(), longest);
        let mut flat = Vec::with_capacity(b * l);
        let mut mask = Vec::with_capacity(b * l);
        for row in &ids {
            flat.extend_from_slice(row);
            flat.extend(std::iter::repeat_n(0u32, l - row.len()));
            mask.extend(std::iter::repeat_n(1f32, row.len()));
            mask.extend(std::iter::repeat_n(0f32, l - row.len()));
        }
        let ids_t = Tensor::from_vec(flat, (b, l), &self.device)?;
        let mask_t = Tensor::from_vec(mask, (b, l), &self.device)?;
        let hidden = self.bert.forward(&ids_t, &mask_t)?;
        let pooled = bert::mean_pool_normalize(&hidden, &mask_t)?;
        Ok(pooled.to_vec2::<f32>()?)
    }

    /// Embeddings of many texts, `batch` at a time; texts of similar length are batched
    /// together (less padding), and results come back in input order.
    pub fn embed_all(&self, texts: &[&str], batch: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let batch = batch.max(1);
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(batch) {
            let group: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
            for (&i, v) in chunk.iter().zip(self.embed(&group)?) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}
