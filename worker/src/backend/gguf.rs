//! The `gguf` backend: a GGUF model run in-process by llama.cpp (`llama-cpp-2`).
//!
//! ## Why llama.cpp
//! On this project's 2-core reference machine, llama.cpp (through `llama-cpp-2`) runs
//! SmolLM2-135M-Instruct Q4_1 at ~150–190 generated tokens/s and ~510 prompt tokens/s,
//! deterministic under greedy decoding, in ~180 MB; it reads the tokenizer and the ChatML
//! chat template from the file. candle was 4–5× slower on Q4_1 and its GGUF tokenizer
//! mis-tokenized this model. llama.cpp also batches parallel sequences and offloads to
//! CUDA GPUs, which pinning needs.
//!
//! ## The actor
//! [`GgufModel::load`] starts one OS thread that owns the model and its context (llama.cpp
//! calls block for milliseconds to seconds, so they stay off the async runtime). Jobs are
//! sent to it over a bounded channel with a oneshot for the answer. The thread serves up
//! to `slots` jobs at once as parallel sequences of one batch: each step decodes one new
//! token for every generating sequence plus a chunk of any prompt still being read
//! (chunked prefill), so a long prompt never stalls the others for long. Decoding is
//! greedy at temperature 0 and seeded sampling otherwise (seed from the request, or from
//! the job id, so a sample is reproducible); a sequence ends at an end-of-generation
//! token, at a stop sequence of the job's (cut off the answer, finish reason `stop`), at
//! `max_tokens`, or at the slot's context size. A caller that gave up (worker
//! shutdown) frees its slot at the next step.
//!
//! ## Sampling options and log-probabilities (issue 16)
//! `top_k` and `top_p` apply after the temperature (the order of Hugging Face's
//! `generate`, which UHGEval used); greedy decoding ignores them. A job that asks for
//! log-probabilities gets, for each generated token, the log-softmax of the raw logits at
//! its position (before temperature and truncation: the model's own distribution) and the
//! most likely alternatives ([`super::logits`]). A job that asks to *score* its last
//! (assistant) message feeds that text after the rendered chat and returns the
//! log-probability of each of its tokens (teacher forcing), generating nothing: a local
//! model can serve as ChainPoll's "probability model".
//!
//! ## Structured output (issue 45)
//! A job carrying a JSON schema (a judge of a model with `structured_output = true`) is
//! decoded under a llama.cpp grammar made from it ([`super::grammar`]): each token is the
//! request's own sampler's choice among the tokens the grammar allows (see
//! [`constrained`]); the output is the JSON the pipeline reads, or is cut by `max_tokens`.
//!
//! ## GPU pinning
//! With the cargo feature `cuda`, a model placed on GPU N is loaded with all (or
//! `gpu_layers`) layers on device N and no split across devices. Without the feature,
//! asking for a GPU is an error at load time.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;

use halyard_proto::{
    ChatMessage, Completion, LogprobsRequest, Role, Sampling, TokenLogprob, Usage,
};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::{mpsc, oneshot};

use super::logits::{logprob_of, sampler_for};
use crate::call_error::CallError;
pub use halyard_proto::pool::GgufSpec;

/// True when this build can place models on CUDA GPUs.
pub const GPU_SUPPORT: bool = cfg!(feature = "cuda");

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("model file {path}: {reason}")]
    File { path: String, reason: String },
    #[error(
        "model {path} is placed on GPU {gpu}, but this halyard was built without the `cuda` feature \
         (rebuild with `cargo build --release --features cuda`, which needs the CUDA toolkit, or remove `gpu`)"
    )]
    NoGpuSupport { path: String, gpu: u32 },
    #[error("llama.cpp: {0}")]
    Engine(String),
}

/// A generation request.
pub struct Request {
    pub messages: Vec<ChatMessage>,
    pub sampling: Sampling,
    pub seed: u32,
    pub reply: oneshot::Sender<Result<Completion, CallError>>,
}

/// Handle to a loaded model; cheap to clone.
#[derive(Clone)]
pub struct GgufModel {
    tx: mpsc::Sender<Request>,
    pub spec: GgufSpec,
}

/// The process-wide llama.cpp backend (initialised once; llama.cpp allows one).
pub fn backend() -> Result<&'static LlamaBackend, GgufError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| GgufError::Engine(e.clone()))
}

/// Check that `path` exists and starts with the GGUF magic, naming the file otherwise.
pub fn check_file(path: &Path) -> Result<(), GgufError> {
    use std::io::Read;
    let err = |reason: String| GgufError::File { path: path.display().to_string(), reason };
    let mut f = std::fs::File::open(path).map_err(|e| {
        err(format!("cannot open: {e} (fetch the default model with scripts/fetch-model.sh)"))
    })?;
    let mut magic = [0u8; 4];
    f.read_exact(&mut magic).map_err(|_| err("too short to be a GGUF file".into()))?;
    if &magic != b"GGUF" {
        return Err(err(format!("not a GGUF file (starts with {magic:02x?}, expected \"GGUF\")")));
    }
    Ok(())
}

impl GgufModel {
    /// Load the model (on its own thread) and return once it is ready, or the load error.
    pub fn load(spec: GgufSpec) -> Result<GgufModel, GgufError> {
        check_file(&spec.path)?;
        if let Some(gpu) = spec.gpu {
            if !GPU_SUPPORT {
                return Err(GgufError::NoGpuSupport { path: spec.path.display().to_string(), gpu });
            }
        }
        let (tx, rx) = mpsc::channel(spec.slots.max(1) * 4);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let s = spec.clone();
        std::thread::Builder::new()
            .name(format!(
                "gguf:{}",
                spec.path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
            ))
            .spawn(move || engine_thread(s, rx, ready_tx))
            .map_err(|e| GgufError::Engine(format!("cannot start engine thread: {e}")))?;
        ready_rx
            .recv()
            .map_err(|_| GgufError::Engine("engine thread died while loading".into()))??;
        Ok(GgufModel { tx, spec })
    }

    /// Generate a completion.
    pub async fn generate(
        &self,
        messages: Vec<ChatMessage>,
        temperature: f32,
        max_tokens: Option<u32>,
        seed: u32,
    ) -> Result<Completion, CallError> {
        let sampling = Sampling { temperature, max_tokens, ..Sampling::default() };
        self.generate_with(messages, sampling, seed).await
    }

    /// Generate (or score, see the module doc) with every sampling option of a job.
    pub async fn generate_with(
        &self,
        messages: Vec<ChatMessage>,
        sampling: Sampling,
        seed: u32,
    ) -> Result<Completion, CallError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request { messages, sampling, seed, reply })
            .await
            .map_err(|_| CallError::transient("local model engine has stopped"))?;
        rx.await.map_err(|_| CallError::transient("local model engine dropped the request"))?
    }
}

/// One sequence being served.
struct Seq {
    id: i32,
    req: Request,
    prompt: Vec<LlamaToken>,
    /// Prompt tokens already in the KV cache.
    fed: usize,
    /// Next position in the sequence.
    pos: i32,
    sampler: LlamaSampler,
    /// Structured output: the grammar the tokens must follow.
    grammar: Option<LlamaSampler>,
    out: Vec<u8>,
    generated: u32,
    max_tokens: u32,
    /// Index in the current batch of the token whose logits we sample from.
    logits_at: Option<i32>,
    /// The last sampled token, to feed in the next step.
    pending: Option<LlamaToken>,
    started: Instant,
    /// Log-probabilities wanted, and those gathered so far.
    want: Option<LogprobsRequest>,
    logprobs: Vec<TokenLogprob>,
    /// Scoring: the prompt index of the first scored token (the given text's).
    score_from: Option<usize>,
    /// Scoring: (batch index, prompt index) of the positions in the current batch whose
    /// logits predict a scored token.
    scored_at: Vec<(i32, usize)>,
}

fn engine_thread(
    spec: GgufSpec,
    mut rx: mpsc::Receiver<Request>,
    ready: std::sync::mpsc::Sender<Result<(), GgufError>>,
) {
    let file_err =
        |reason: String| GgufError::File { path: spec.path.display().to_string(), reason };
    let backend = match backend() {
        Ok(b) => b,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut mp = LlamaModelParams::default();
    if let Some(gpu) = spec.gpu {
        mp = mp.with_n_gpu_layers(spec.gpu_layers).with_main_gpu(gpu as i32);
        mp = mp.with_split_mode(llama_cpp_2::model::params::LlamaSplitMode::None);
    }
    let model = match LlamaModel::load_from_file(backend, &spec.path, &mp) {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(file_err(format!(
                "llama.cpp could not load it ({e}); is it a complete GGUF model?"
            ))));
            return;
        }
    };
    let template = model.chat_template(None).ok();
    let slots = spec.slots.max(1);
    let threads = if spec.threads == 0 {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
    } else {
        spec.threads
    } as i32;
    let n_batch: u32 = 2048;
    let cp = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(spec.ctx_size.saturating_mul(slots as u32)))
        .with_n_seq_max(slots as u32)
        .with_n_batch(n_batch)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = match model.new_context(backend, cp) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(GgufError::Engine(format!("cannot create context: {e}"))));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let vocab = model.vocab();
    let mut active: Vec<Seq> = Vec::with_capacity(slots);
    let mut batch = LlamaBatch::new(n_batch as usize, slots as i32);
    let mut free_ids: Vec<i32> = (0..slots as i32).rev().collect();
    loop {
        // Take new requests: block when idle, otherwise only what is already waiting.
        while !free_ids.is_empty() {
            let req = if active.is_empty() {
                match rx.blocking_recv() {
                    Some(r) => r,
                    None => return, // every handle dropped: the model is no longer needed
                }
            } else {
                match rx.try_recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            };
            let want = req.sampling.logprobs;
            let (prompt, score_from) = match tokenize_request(&model, template.as_ref(), &req) {
                Ok(p) => p,
                Err(e) => {
                    let _ = req.reply.send(Err(CallError::permanent(e)));
                    continue;
                }
            };
            if prompt.is_empty() || prompt.len() as u32 + 1 >= spec.ctx_size {
                let _ = req.reply.send(Err(CallError::permanent(format!(
                    "prompt of {} tokens does not fit the model's context of {} tokens per slot (ctx_size)",
                    prompt.len(),
                    spec.ctx_size
                ))));
                continue;
            }
            if score_from == Some(prompt.len()) {
                // Nothing to score: an empty text.
                let c = completion(
                    String::new(),
                    prompt.len(),
                    0,
                    Instant::now(),
                    "stop",
                    Some(Vec::new()),
                );
                let _ = req.reply.send(Ok(c));
                continue;
            }
            let grammar = match structured_output(&model, &req.sampling) {
                Ok(g) => g,
                Err(e) => {
                    let _ = req.reply.send(Err(CallError::permanent(e)));
                    continue;
                }
            };
            let sampler = sampler_for(&req.sampling, req.seed);
            let max_tokens =
                if score_from.is_some() { 0 } else { req.sampling.max_tokens.unwrap_or(u32::MAX) };
            // The smallest free id (see the batch order below).
            free_ids.sort_unstable_by(|a, b| b.cmp(a));
            let id = free_ids.pop().unwrap_or(0); // non-empty: checked by the loop condition
            active.push(Seq {
                id,
                req,
                prompt,
                fed: 0,
                pos: 0,
                sampler,
                grammar,
                out: Vec::new(),
                generated: 0,
                max_tokens,
                logits_at: None,
                pending: None,
                started: Instant::now(),
                want,
                logprobs: Vec::new(),
                score_from,
                scored_at: Vec::new(),
            });
        }
        // Drop sequences whose caller gave up.
        active.retain(|s| {
            if s.req.reply.is_closed() {
                let _ = ctx.clear_kv_cache_seq(Some(s.id as u32), None, None);
                free_ids.push(s.id);
                false
            } else {
                true
            }
        });
        if active.is_empty() {
            continue;
        }
        // Sequences in the batch in order of their ids, and ids given smallest first: with
        // a KV cache per sequence, llama.cpp puts a sequence into the current micro-batch
        // only if its id is the previous one's plus one (`split_equal`), so ids out of
        // order cost one graph computation per run of consecutive ids. Measured: batched
        // generation 0.80 of llama.cpp direct with ids in the order slots were freed,
        // 1.02 in order.
        active.sort_unstable_by_key(|s| s.id);
        // Build one batch: one token per generating sequence, then prompt chunks.
        batch.clear();
        let mut room = n_batch as usize;
        for s in active.iter_mut() {
            s.logits_at = None;
            if let Some(t) = s.pending.take() {
                if batch.add(t, s.pos, &[s.id], true).is_ok() {
                    s.logits_at = Some(batch.n_tokens() - 1);
                    s.pos += 1;
                    room -= 1;
                }
            }
        }
        for s in active.iter_mut() {
            s.scored_at.clear();
            if s.fed < s.prompt.len() && room > 0 {
                let take = (s.prompt.len() - s.fed).min(room);
                for k in 0..take {
                    let p = s.fed + k;
                    let last = p + 1 == s.prompt.len();
                    // Scoring: position p's logits predict the scored token p + 1.
                    let scores = s.score_from.is_some_and(|f| p + 1 >= f && !last);
                    let sample = last && s.score_from.is_none();
                    if batch.add(s.prompt[p], s.pos, &[s.id], sample || scores).is_err() {
                        break;
                    }
                    s.pos += 1;
                    if sample {
                        s.logits_at = Some(batch.n_tokens() - 1);
                    }
                    if scores {
                        s.scored_at.push((batch.n_tokens() - 1, p + 1));
                    }
                }
                s.fed += take;
                room -= take;
            }
        }
        if let Err(e) = ctx.decode(&mut batch) {
            // Fail everything in this batch; the worker retries the jobs.
            for s in active.drain(..) {
                let _ = ctx.clear_kv_cache_seq(Some(s.id as u32), None, None);
                free_ids.push(s.id);
                let _ = s
                    .req
                    .reply
                    .send(Err(CallError::transient(format!("llama.cpp decode failed: {e}"))));
            }
            continue;
        }
        // Sample for every sequence that asked for logits; finish the ones that are done.
        let mut i = 0;
        while i < active.len() {
            let s = &mut active[i];
            if let Some(want) = s.want {
                for &(at, p) in &s.scored_at {
                    let lp = logprob_of(&vocab, ctx.get_logits_ith(at), s.prompt[p], want.top);
                    s.logprobs.extend(lp);
                }
            }
            if s.score_from.is_some() && s.fed == s.prompt.len() {
                let s = active.swap_remove(i);
                let _ = ctx.clear_kv_cache_seq(Some(s.id as u32), None, None);
                free_ids.push(s.id);
                let scored = s.prompt.len() - s.score_from.unwrap_or(0);
                let c = completion(
                    String::new(),
                    s.prompt.len() - scored,
                    0,
                    s.started,
                    "stop",
                    Some(s.logprobs),
                );
                let _ = s.req.reply.send(Ok(c));
                continue;
            }
            let Some(at) = s.logits_at else {
                i += 1;
                continue;
            };
            let token = match s.grammar.as_mut() {
                None => s.sampler.sample(&ctx, at),
                Some(g) => constrained(ctx.get_logits_ith(at), &mut s.sampler, g),
            };
            let eog = vocab.is_eog(token);
            let mut stopped = false;
            if !eog {
                let piece = vocab.token_to_piece(token, false, None);
                s.out.extend_from_slice(&piece);
                s.generated += 1;
                if let Some(want) = s.want {
                    s.logprobs.extend(logprob_of(&vocab, ctx.get_logits_ith(at), token, want.top));
                }
                stopped = cut_at_stop(&mut s.out, piece.len(), &s.req.sampling.stop);
            }
            let full = s.pos as u32 + 1 >= spec.ctx_size;
            let done = eog || stopped || s.generated >= s.max_tokens || full;
            if done {
                let s = active.swap_remove(i);
                let _ = ctx.clear_kv_cache_seq(Some(s.id as u32), None, None);
                free_ids.push(s.id);
                let finish = if eog || stopped { "stop" } else { "length" };
                let text = String::from_utf8_lossy(&s.out).into_owned();
                let logprobs = s.want.map(|_| s.logprobs);
                let c = completion(text, s.prompt.len(), s.generated, s.started, finish, logprobs);
                let _ = s.req.reply.send(Ok(c));
            } else {
                s.pending = Some(token);
                i += 1;
            }
        }
    }
}

/// The next token under a grammar, as llama.cpp's own `common_sampler_sample` chooses it:
/// the request's sampler picks from every token; if the grammar allows that token it is
/// the one (the common case, checked on that token alone), else the sampler picks again
/// among the tokens the grammar allows. The grammar then advances by it. Checking the
/// grammar against the whole vocabulary at every step made a judge call several times
/// slower.
fn constrained(
    logits: &[f32],
    sampler: &mut LlamaSampler,
    grammar: &mut LlamaSampler,
) -> LlamaToken {
    let all = || {
        LlamaTokenDataArray::from_iter(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| LlamaTokenData::new(LlamaToken(i as i32), l, 0.0)),
            false,
        )
    };
    let mut free = all();
    free.apply_sampler(sampler);
    let allowed = free.selected_token().filter(|&t| {
        let mut one = LlamaTokenDataArray::new(
            vec![LlamaTokenData::new(t, logits[t.0 as usize], 0.0)],
            false,
        );
        one.apply_sampler(grammar);
        one.data.first().is_some_and(|d| d.logit().is_finite())
    });
    let token = match allowed {
        Some(t) => t,
        None => {
            let mut within = all();
            within.apply_sampler(grammar);
            within.apply_sampler(sampler);
            // The grammar allows at least the end of its text or one more character.
            within.selected_token().unwrap_or_else(|| {
                within.data.iter().find(|d| d.logit().is_finite()).map_or(LlamaToken(0), |d| d.id())
            })
        }
    };
    grammar.accept(token);
    token
}

/// The grammar sampler of a structured-output request (issue 45): its JSON schema as a
/// GBNF grammar ([`super::grammar`]); `None` for free text. An error names what is wrong.
fn structured_output(
    model: &LlamaModel,
    sampling: &Sampling,
) -> Result<Option<LlamaSampler>, String> {
    let Some(schema) = &sampling.json_schema else { return Ok(None) };
    let gbnf = super::grammar::schema_to_gbnf(&schema.schema)
        .map_err(|e| format!("structured output {:?}: {e}", schema.name))?;
    LlamaSampler::grammar(model, &gbnf, "root").map(Some).map_err(|e| {
        format!("structured output {:?}: llama.cpp refused its grammar ({e}): {gbnf}", schema.name)
    })
}

/// A stop sequence ended in the `added` bytes just appended to `out`: `out` is cut
/// before the earliest one (it is not part of the answer) and true is returned. Only
/// occurrences that end in the new bytes are looked for; earlier ones were seen before.
fn cut_at_stop(out: &mut Vec<u8>, added: usize, stops: &[String]) -> bool {
    let mut cut: Option<usize> = None;
    for stop in stops.iter().map(String::as_bytes).filter(|s| !s.is_empty()) {
        // The first position at which an occurrence ending in the new bytes can start.
        let from = out.len().saturating_sub(added + stop.len() - 1);
        if let Some(p) = out[from..].windows(stop.len()).position(|w| w == stop) {
            let at = from + p;
            cut = Some(cut.map_or(at, |c| c.min(at)));
        }
    }
    match cut {
        Some(at) => {
            out.truncate(at);
            true
        }
        None => false,
    }
}

fn completion(
    text: String,
    prompt_tokens: usize,
    generated: u32,
    started: Instant,
    finish: &str,
    logprobs: Option<Vec<TokenLogprob>>,
) -> Completion {
    Completion {
        text,
        usage: Usage {
            prompt_tokens: prompt_tokens as u64,
            completion_tokens: generated as u64,
            cache: None,
        },
        latency_ms: started.elapsed().as_millis() as u64,
        finish_reason: Some(finish.into()),
        calls: 1,
        logprobs,
        refusal: false,
        source: Default::default(),
    }
}

/// The request's prompt tokens, and for a scoring request the index where the scored text
/// (its last, assistant, message, appended after the rendered chat) begins.
fn tokenize_request(
    model: &LlamaModel,
    template: Option<&LlamaChatTemplate>,
    req: &Request,
) -> Result<(Vec<LlamaToken>, Option<usize>), String> {
    let vocab = model.vocab();
    let scoring = req.sampling.logprobs.is_some_and(|l| l.score_last);
    if !scoring {
        let text = render_prompt(model, template, &req.messages)?;
        return Ok((vocab.tokenize(text.as_bytes(), true, true), None));
    }
    let Some((last, chat)) = req.messages.split_last().filter(|(m, _)| m.role == Role::Assistant)
    else {
        return Err("a scoring request must end with the assistant message to score".into());
    };
    let text = render_prompt(model, template, chat)?;
    let mut tokens = vocab.tokenize(text.as_bytes(), true, true);
    let from = tokens.len();
    tokens.extend(vocab.tokenize(last.content.as_bytes(), false, false));
    Ok((tokens, Some(from)))
}

/// The prompt as the model's own chat template renders it (ChatML for SmolLM2), or a
/// plain ChatML rendering when the file carries no template.
fn render_prompt(
    model: &LlamaModel,
    template: Option<&LlamaChatTemplate>,
    messages: &[ChatMessage],
) -> Result<String, String> {
    if let Some(t) = template {
        let chat: Result<Vec<LlamaChatMessage>, _> = messages
            .iter()
            .map(|m| LlamaChatMessage::new(m.role.as_str().to_string(), m.content.clone()))
            .collect();
        let chat = chat.map_err(|e| format!("message contains a NUL byte: {e}"))?;
        return model
            .apply_chat_template(t, &chat, true)
            .map_err(|e| format!("chat template failed: {e}"));
    }
    let mut s = String::new();
    for m in messages {
        s.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", m.role.as_str(), m.content));
    }
    s.push_str("<|im_start|>assistant\n");
    Ok(s)
}

/// `backend = "gguf"`: the plan's local GGUF models, by endpoint, each loaded once.
pub const KIND: super::BackendKind = super::BackendKind {
    name: "gguf",
    http: false,
    load: |l| {
        let mut local = std::collections::HashMap::new();
        for (_, m) in l.models("gguf") {
            if let halyard_proto::pool::WorkerModel::Gguf(spec) = m {
                if !local.contains_key(&spec.endpoint) {
                    let m = GgufModel::load(spec.clone()).map_err(|e| e.to_string())?;
                    local.insert(spec.endpoint.clone(), m);
                }
            }
        }
        Ok(Box::new(GgufBackend { local }))
    },
};

/// The `gguf` backend: its models by endpoint.
struct GgufBackend {
    local: std::collections::HashMap<String, GgufModel>,
}

impl super::Backend for GgufBackend {
    fn call<'a>(
        &'a self,
        job: &'a halyard_proto::Job,
    ) -> futures::future::BoxFuture<'a, Result<Completion, CallError>> {
        Box::pin(async move {
            let key = &job.key;
            let Some(model) = self.local.get(&key.model.endpoint) else {
                return Err(CallError::permanent(format!(
                    "this worker does not hold local model {} (pool {}); start a worker with that model",
                    key.model.endpoint, job.pool
                )));
            };
            // Reproducible sampling: the request's seed, else one derived from the job id.
            let seed = key.sampling.seed.map(|s| s as u32).unwrap_or_else(|| {
                let b = job.id.as_bytes();
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            });
            model.generate_with(key.messages.clone(), key.sampling.clone(), seed).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::cut_at_stop;

    /// A stop sequence is cut off, wherever it began (in earlier pieces too), only once
    /// it ended in the newest piece, at the earliest of several; none, nothing cut.
    #[test]
    fn stop_sequences_cut_the_answer() {
        let stops = vec!["\n\nQ:".to_string(), "END".to_string()];
        let mut out = b"The answer.\n".to_vec();
        assert!(!cut_at_stop(&mut out, 1, &stops));
        out.extend_from_slice(b"\nQ");
        assert!(!cut_at_stop(&mut out, 2, &stops));
        out.extend_from_slice(b": next");
        assert!(cut_at_stop(&mut out, 6, &stops));
        assert_eq!(out, b"The answer.");
        let mut out = b"xx ENDQ and END".to_vec();
        assert!(cut_at_stop(&mut out, 15, &stops));
        assert_eq!(out, b"xx ");
        let mut out = b"no stop here".to_vec();
        assert!(!cut_at_stop(&mut out, 12, &stops));
        assert!(!cut_at_stop(&mut out, 4, &[String::new()]));
        assert_eq!(out, b"no stop here");
    }
}
