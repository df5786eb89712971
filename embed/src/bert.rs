//! The BERT encoder of all-MiniLM-L6-v2 (`BertModel`, post-LayerNorm, absolute
//! positions), written out on candle's tensor operations.
//!
//! Only what a sentence embedding needs: token, position and token-type embeddings,
//! then `num_hidden_layers` blocks of self-attention and a feed-forward layer with the
//! exact (erf) GELU, as in HuggingFace `transformers` for `hidden_act = "gelu"`. The
//! tanh approximation is measurably off (1e-4 on the normalised embedding), so it is
//! not used. Dropout is absent (inference).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{LayerNorm, Linear, Module};
use serde::Deserialize;

use crate::model::EmbedError;

/// The fields of `config.json` the encoder uses.
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    #[serde(default = "absolute")]
    pub position_embedding_type: String,
}

fn absolute() -> String {
    "absolute".into()
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    out_norm: LayerNorm,
}

pub struct Bert {
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    pub hidden: usize,
    pub max_positions: usize,
}

/// The weights by name, taken out one at a time with a clear error for a missing one.
struct Weights {
    map: HashMap<String, Tensor>,
    file: String,
}

impl Weights {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, EmbedError> {
        // Checkpoints saved from `BertForX` carry a `bert.` prefix; sentence-transformers' do not.
        let t =
            self.map.remove(name).or_else(|| self.map.remove(&format!("bert.{name}"))).ok_or_else(
                || EmbedError::Model(format!("{}: tensor {name} is missing", self.file)),
            )?;
        if t.dims() != shape {
            return Err(EmbedError::Model(format!(
                "{}: tensor {name} has shape {:?}, expected {shape:?}",
                self.file,
                t.dims()
            )));
        }
        Ok(t.to_dtype(DType::F32)?)
    }

    fn linear(
        &mut self,
        prefix: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Linear, EmbedError> {
        let w = self.take(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let b = self.take(&format!("{prefix}.bias"), &[out_dim])?;
        Ok(Linear::new(w, Some(b)))
    }

    fn norm(&mut self, prefix: &str, dim: usize, eps: f64) -> Result<LayerNorm, EmbedError> {
        let w = self.take(&format!("{prefix}.weight"), &[dim])?;
        let b = self.take(&format!("{prefix}.bias"), &[dim])?;
        Ok(LayerNorm::new(w, b, eps))
    }
}

impl Bert {
    pub fn load(
        cfg: &BertConfig,
        safetensors: &std::path::Path,
        device: &Device,
    ) -> Result<Bert, EmbedError> {
        if cfg.hidden_act != "gelu" {
            return Err(EmbedError::Model(format!(
                "hidden_act {:?} is not supported (only \"gelu\")",
                cfg.hidden_act
            )));
        }
        if cfg.position_embedding_type != "absolute" {
            return Err(EmbedError::Model(format!(
                "position_embedding_type {:?} is not supported (only \"absolute\")",
                cfg.position_embedding_type
            )));
        }
        if cfg.num_attention_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads)
        {
            return Err(EmbedError::Model(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                cfg.hidden_size, cfg.num_attention_heads
            )));
        }
        let file = safetensors.display().to_string();
        let map = candle_core::safetensors::load(safetensors, device)
            .map_err(|e| EmbedError::Model(format!("{file}: cannot read safetensors: {e}")))?;
        let mut w = Weights { map, file };
        let (h, eps) = (cfg.hidden_size, cfg.layer_norm_eps);
        let word = w.take("embeddings.word_embeddings.weight", &[cfg.vocab_size, h])?;
        let position =
            w.take("embeddings.position_embeddings.weight", &[cfg.max_position_embeddings, h])?;
        let token_type =
            w.take("embeddings.token_type_embeddings.weight", &[cfg.type_vocab_size, h])?;
        let emb_norm = w.norm("embeddings.LayerNorm", h, eps)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Layer {
                query: w.linear(&format!("{p}.attention.self.query"), h, h)?,
                key: w.linear(&format!("{p}.attention.self.key"), h, h)?,
                value: w.linear(&format!("{p}.attention.self.value"), h, h)?,
                attn_out: w.linear(&format!("{p}.attention.output.dense"), h, h)?,
                attn_norm: w.norm(&format!("{p}.attention.output.LayerNorm"), h, eps)?,
                intermediate: w.linear(
                    &format!("{p}.intermediate.dense"),
                    cfg.intermediate_size,
                    h,
                )?,
                output: w.linear(&format!("{p}.output.dense"), h, cfg.intermediate_size)?,
                out_norm: w.norm(&format!("{p}.output.LayerNorm"), h, eps)?,
            });
        }
        Ok(Bert {
            word,
            position,
            token_type,
            emb_norm,
            layers,
            heads: cfg.num_attention_heads,
            head_dim: h / cfg.num_attention_heads,
            hidden: h,
            max_positions: cfg.max_position_embeddings,
        })
    }

    /// Last hidden states `(batch, seq, hidden)` of `ids` (`(batch, seq)`, u32), with
    /// `mask` (`(batch, seq)`, f32: 1 for tokens, 0 for padding). Token types are all 0.
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor, EmbedError> {
        let (b, l) = ids.dims2()?;
        let words = self.word.index_select(&ids.flatten_all()?, 0)?.reshape((b, l, self.hidden))?;
        let pos = self.position.narrow(0, 0, l)?;
        let tt = self.token_type.narrow(0, 0, 1)?;
        let x = words.broadcast_add(&pos)?.broadcast_add(&tt)?;
        let mut x = self.emb_norm.forward(&x)?;
        // Additive attention bias: 0 for tokens, a large negative number for padding.
        let bias = ((mask - 1.0)? * 1e30)?.reshape((b, 1, 1, l))?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        for layer in &self.layers {
            let split = |t: Tensor| -> candle_core::Result<Tensor> {
                t.reshape((b, l, self.heads, self.head_dim))?.transpose(1, 2)?.contiguous()
            };
            let q = split(layer.query.forward(&x)?)?;
            let k = split(layer.key.forward(&x)?)?;
            let v = split(layer.value.forward(&x)?)?;
            let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(&bias)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let ctx =
                probs.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((b, l, self.hidden))?;
            let attn = layer.attn_norm.forward(&(layer.attn_out.forward(&ctx)? + &x)?)?;
            let ff = layer.output.forward(&layer.intermediate.forward(&attn)?.gelu_erf()?)?;
            x = layer.out_norm.forward(&(ff + &attn)?)?;
        }
        Ok(x)
    }
}

/// Mean of the token states under `mask`, then L2-normalised: `(batch, hidden)`.
pub fn mean_pool_normalize(hidden: &Tensor, mask: &Tensor) -> Result<Tensor, EmbedError> {
    let m = mask.unsqueeze(D::Minus1)?;
    let sum = hidden.broadcast_mul(&m)?.sum(1)?;
    let count = m.sum(1)?.clamp(1e-9, f64::MAX)?;
    let mean = sum.broadcast_div(&count)?;
    let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
    Ok(mean.broadcast_div(&norm)?)
}
