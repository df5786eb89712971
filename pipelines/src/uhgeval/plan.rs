//! The planner: one news item → the jobs its forms need → its [`ItemLabel`].
//!
//! Every configured form runs on every item, in parallel (stage names in brackets,
//! pipeline `uhgeval`, stage version [`STAGE_VERSION`]):
//! - keyword level (`keyword`): one call per kept keyword (spec §1.3);
//! - sentence level (`sentence`): two calls, on the hallucinated and the real continuation
//!   (§1.4);
//! - selective (`selective`): one call with the two continuations as options A and B
//!   (§1.5);
//! - generative (`continue`, then `extract_kws`): the continuation, then keyword extraction
//!   from it **by the model under evaluation**, as both reference codes do (§1.6, §6.3).
//!   An invalid continuation is not sent to extraction (its metrics are not averaged).
//!
//! Generation length is UHGEval's `max_new_tokens` (24 for discriminative and selective
//! calls, 128 for generative ones), whatever the model's `max_tokens` in the sweep; the
//! temperature and seed are the model's (the paper used 0.1 and 22). UHGEval's `top_p`
//! 0.9 and `top_k` 5 ([`Generation`]) go into every request where the backend supports
//! them (issue 16): both for local models, `top_p` only for OpenAI-compatible APIs (they
//! have no `top_k`; UHGEval's own v2 OpenAI wrapper drops it too); the report says which
//! were applied.
//!
//! With a BERTScore embedder (a model with `backend = "embed"`), each valid continuation
//! gets a `bert` job embedding it and the reference ([`super::embed::bert_step`]).
//!
//! A job that became a dead letter makes its item **invalid** in its form (issue 29), and
//! its error is kept in the label. UHGEval's `safe_request` returns `""` on any failure
//! (§1.2), which its rules then read as an answer: with `v2` a failed keyword call counted
//! as "hallucinated" (a model whose every call failed scored 0.50), and a failed
//! `extract_kws` call gave kwPrec 0 inside a valid item. Halyard does not read a failure as
//! an answer. An empty answer or a refusal that the model did give is read by UHGEval's
//! rules, marked with its kind, and counted in the report.

// `Err` carries the job still needed (not an error path); boxing it would allocate per
// call for nothing.
#![allow(clippy::result_large_err)]

use halyard_proto::ChatMessage;
use serde::{Deserialize, Serialize};

use super::dataset::{NewsItem, NewsType};
use super::embed::{bert_step, BertLabel};
pub use super::generation::{AppliedGeneration, Generation};
use super::prompts;
use halyard_proto::AnswerKind;

use crate::common::{odd_kind, JobOutcome, JobRequest, ModelSpec, Plan, ResultLookup};
use crate::metrics::bleu::bleu4_v2;
use crate::metrics::kwprec::parse_extracted_keywords;
use crate::metrics::tokenize::jieba_cut;
use crate::metrics::uhgeval::{
    continuation_from_answer, first_sentence, generative_item, generative_valid, keyword_item,
    option_order_v2, paper_option_orders, parse_keyword_judgement, parse_selective_choice,
    parse_sentence_judgement, select_keywords_paper, select_keywords_v2, selective_item,
    sentence_item, strip_echo, Choice, Judgement, OptionOrder, UhgVariant,
};

/// The pipeline name in job keys.
pub const PIPELINE: &str = "uhgeval";
/// Bumped whenever a prompt or a rule that feeds a job changes.
pub const STAGE_VERSION: u32 = 1;
/// UHGEval's `max_new_tokens` for discriminative and selective calls (spec §1.2).
pub const SHORT_MAX_TOKENS: u32 = 24;
/// UHGEval's `max_new_tokens` for generative calls (continuation and keyword extraction).
pub const LONG_MAX_TOKENS: u32 = 128;
/// The seed of the paper's selective option swaps (`random.seed(22)`).
pub const PAPER_SWAP_SEED: u64 = 22;

/// One of UHGEval's four evaluators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// Discriminative, keyword level (`UHGDiscKeywordEvaluator`).
    Keyword,
    /// Discriminative, sentence level (`UHGDiscSentenceEvaluator`).
    Sentence,
    /// Selective (`UHGSelectiveEvaluator`).
    Selective,
    /// Generative (`UHGGenerativeEvaluator`).
    Generative,
}

impl Form {
    pub const ALL: [Form; 4] = [Form::Keyword, Form::Sentence, Form::Selective, Form::Generative];

    pub fn as_str(self) -> &'static str {
        match self {
            Form::Keyword => "keyword",
            Form::Sentence => "sentence",
            Form::Selective => "selective",
            Form::Generative => "generative",
        }
    }

    pub fn parse(s: &str) -> Option<Form> {
        Form::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

/// How one model is evaluated on UHGEval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Which code's rules: \[paper\] (default) or \[v2\].
    #[serde(default)]
    pub variant: UhgVariant,
    /// The forms to run, each at most once.
    pub forms: Vec<Form>,
    /// The model under test (also the kwPrec keyword extractor).
    pub model: ModelSpec,
    /// UHGEval's `top_p` / `top_k`, applied where the backend supports them.
    #[serde(default)]
    pub generation: Generation,
    /// The sentence-embedding model of "BERTScore" (`backend = "embed"`); `None`: not
    /// computed (unless the scorer is given an in-process embedder).
    #[serde(default)]
    pub bert_embedder: Option<ModelSpec>,
}

/// A dataset item ready for planning: the item, its position, and its \[paper\] selective
/// option order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    pub item: NewsItem,
    /// The `i`-th draw after `random.seed(22)`, `i` = position in the dataset (see
    /// [`prepare`]).
    pub paper_order: OptionOrder,
}

/// Prepares the dataset for planning. \[paper\] swaps options when the next
/// `random.random()` after `random.seed(22)` exceeds 0.5; the paper's own runs re-seeded per
/// block of 30 in spawned worker processes, which cannot be reproduced (spec §6.7), so
/// Halyard draws once per item in dataset order: item `i` gets draw `i`. The order then
/// depends only on the item's position, not on which worker or run scores it.
pub fn prepare(items: Vec<NewsItem>) -> Vec<Case> {
    items
        .into_iter()
        .zip(paper_option_orders(PAPER_SWAP_SEED))
        .map(|(item, paper_order)| Case { item, paper_order })
        .collect()
}

/// One model answer as the label keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub job: String,
    /// The raw answer; `None` if the job became a dead letter.
    pub text: Option<String>,
    /// The dead letter's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The answer was empty or a refusal (issue 29).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<AnswerKind>,
}

impl Answer {
    /// The job became a dead letter: its item is invalid in its form.
    pub fn failed(&self) -> bool {
        self.text.is_none()
    }

    /// The text the parsers see: the answer, or `""` for a failed call.
    pub fn as_str(&self) -> &str {
        self.text.as_deref().unwrap_or("")
    }
}

/// One keyword judged at keyword level.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeywordVerdict {
    pub keyword: String,
    /// Label: the annotation starts with `不合理`.
    pub hallucinated: bool,
    pub answer: Answer,
    pub verdict: Judgement,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeywordLabel {
    pub keywords: Vec<KeywordVerdict>,
    pub accuracy: f64,
    pub num_kws: usize,
    pub valid: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SentenceLabel {
    pub on_hallucinated: Answer,
    pub verdict_hallucinated: Judgement,
    pub on_real: Answer,
    pub verdict_real: Judgement,
    pub accuracy: f64,
    pub valid: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelectiveLabel {
    pub order: OptionOrder,
    pub answer: Answer,
    pub choice: Choice,
    pub correct: bool,
    pub valid: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerativeLabel {
    pub answer: Answer,
    /// First sentence of the answer (spec §1.6 step 2).
    pub continuation: String,
    pub valid: bool,
    /// The keyword extraction call (not made for an invalid continuation).
    pub extraction: Option<Answer>,
    /// Extracted keywords that occur in the continuation.
    pub keywords: Vec<String>,
    /// BLEU-4 \[paper\]: geometric mean of 1–4-gram precisions, no brevity penalty.
    pub bleu4_paper: f64,
    /// BLEU-4 \[v2\]: nltk `sentence_bleu`, with brevity penalty, no smoothing.
    pub bleu4_v2: f64,
    pub rouge_l: f64,
    pub kw_prec: f64,
    /// Code points of the continuation.
    pub length: usize,
    /// "BERTScore" from the `bert` job (valid continuations, with an embedder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bert: Option<BertLabel>,
}

/// The final label of one (item, model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemLabel {
    pub id: String,
    #[serde(rename = "type")]
    pub news_type: NewsType,
    pub model: String,
    pub variant: UhgVariant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyword: Option<KeywordLabel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentence: Option<SentenceLabel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selective: Option<SelectiveLabel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generative: Option<GenerativeLabel>,
}

/// A step is finished, or waits for these jobs.
type Step<T> = Result<T, Vec<JobRequest>>;

impl Config {
    fn spec(&self, max_tokens: u32) -> ModelSpec {
        ModelSpec { max_tokens: Some(max_tokens), ..self.model.clone() }
    }

    /// The request for `prompt` at `stage` (a user message holding the whole query), with
    /// the generation parameters the model's backend supports.
    pub fn request(&self, stage: &str, prompt: String, max_tokens: u32) -> JobRequest {
        let mut req = self.spec(max_tokens).request(
            PIPELINE,
            stage,
            STAGE_VERSION,
            vec![ChatMessage::user(prompt)],
            0,
        );
        let g = self.generation.applied_to(&self.model.model_ref.backend).applied;
        (req.key.sampling.top_p, req.key.sampling.top_k) = (g.top_p, g.top_k);
        req
    }

    /// Runs one call: its answer, or the job still needed.
    fn call(
        &self,
        stage: &str,
        prompt: String,
        max_tokens: u32,
        results: &dyn ResultLookup,
    ) -> Result<Answer, JobRequest> {
        let req = self.request(stage, prompt, max_tokens);
        let job = req.id().to_string();
        match results.get(&req.id()) {
            None => Err(req),
            Some(JobOutcome::Done(c)) => {
                Ok(Answer { job, text: Some(c.text.clone()), error: None, kind: odd_kind(c) })
            }
            Some(JobOutcome::Failed(e)) => {
                Ok(Answer { job, text: None, error: Some(e.to_string()), kind: None })
            }
        }
    }

    /// The hallucinated and the real continuation (spec §1.4): \[paper\] R = first sentence
    /// of `newsRemainder`, \[v2\] `realContinuation`.
    fn real_continuation<'a>(&self, item: &'a NewsItem) -> &'a str {
        match self.variant {
            UhgVariant::Paper => first_sentence(&item.news_remainder),
            UhgVariant::V2 => &item.real_continuation,
        }
    }
}

/// Advances one item as far as the known results allow.
pub fn evaluate(cfg: &Config, case: &Case, results: &dyn ResultLookup) -> Plan<ItemLabel> {
    let item = &case.item;
    let mut label = ItemLabel {
        id: item.id.clone(),
        news_type: item.news_type,
        model: cfg.model.name.clone(),
        variant: cfg.variant,
        keyword: None,
        sentence: None,
        selective: None,
        generative: None,
    };
    let mut waiting: Vec<JobRequest> = Vec::new();
    for form in &cfg.forms {
        match form {
            Form::Keyword => settle(keyword(cfg, item, results), &mut label.keyword, &mut waiting),
            Form::Sentence => {
                settle(sentence(cfg, item, results), &mut label.sentence, &mut waiting)
            }
            Form::Selective => {
                settle(selective(cfg, case, results), &mut label.selective, &mut waiting)
            }
            Form::Generative => {
                settle(generative(cfg, item, results), &mut label.generative, &mut waiting)
            }
        }
    }
    if waiting.is_empty() {
        Plan::Done(label)
    } else {
        Plan::Waiting(waiting)
    }
}

/// A finished form goes into its slot of the label; an unfinished one adds the jobs it
/// waits for (each once).
fn settle<T>(step: Step<T>, slot: &mut Option<T>, waiting: &mut Vec<JobRequest>) {
    match step {
        Ok(l) => *slot = Some(l),
        Err(jobs) => {
            for j in jobs {
                if !waiting.iter().any(|w| w.key == j.key) {
                    waiting.push(j);
                }
            }
        }
    }
}

/// Echo removal before a discriminative or selective parse (spec §1.2): \[paper\] keeps
/// the text after the last echo of the query, \[v2\] drops a leading one.
fn unechoed<'a>(answer: &'a Answer, query: &str, variant: UhgVariant) -> &'a str {
    strip_echo(answer.as_str(), query, variant)
}

fn keyword(cfg: &Config, item: &NewsItem, results: &dyn ResultLookup) -> Step<KeywordLabel> {
    let cases = match cfg.variant {
        UhgVariant::Paper => {
            select_keywords_paper(&item.keyword_annotations(), &item.appeared_keywords())
        }
        // Annotations were checked when the dataset was read.
        UhgVariant::V2 => select_keywords_v2(&item.annotations).unwrap_or_default(),
    };
    let mut waiting = Vec::new();
    let mut judged = Vec::new();
    for c in &cases {
        let query = prompts::is_kw_hallucinated(item, &c.keyword, cfg.variant);
        match cfg.call(Form::Keyword.as_str(), query.clone(), SHORT_MAX_TOKENS, results) {
            Err(req) => waiting.push(req),
            Ok(answer) => {
                let verdict =
                    parse_keyword_judgement(unechoed(&answer, &query, cfg.variant), cfg.variant);
                judged.push(KeywordVerdict {
                    keyword: c.keyword.clone(),
                    hallucinated: c.hallucinated,
                    answer,
                    verdict,
                });
            }
        }
    }
    if !waiting.is_empty() {
        return Err(waiting);
    }
    let verdicts: Vec<Judgement> = judged.iter().map(|k| k.verdict).collect();
    // Same lengths by construction.
    let r = keyword_item(&cases, &verdicts, cfg.variant).unwrap_or(
        crate::metrics::uhgeval::KeywordItem { accuracy: 0.0, num_kws: 0, valid: false },
    );
    // A failed call is no verdict: the item is invalid (see the module doc).
    let valid = r.valid && !judged.iter().any(|k| k.answer.failed());
    Ok(KeywordLabel { keywords: judged, accuracy: r.accuracy, num_kws: r.num_kws, valid })
}

fn sentence(cfg: &Config, item: &NewsItem, results: &dyn ResultLookup) -> Step<SentenceLabel> {
    let stage = Form::Sentence.as_str();
    let judge = |continuation: &str| {
        let query = prompts::is_continuation_hallucinated(item, continuation, cfg.variant);
        cfg.call(stage, query.clone(), SHORT_MAX_TOKENS, results).map(|a| {
            let v = parse_sentence_judgement(unechoed(&a, &query, cfg.variant), cfg.variant);
            (a, v)
        })
    };
    match (judge(&item.hallucinated_continuation), judge(cfg.real_continuation(item))) {
        (Ok((on_hallucinated, vh)), Ok((on_real, vr))) => {
            let r = sentence_item(vh, vr);
            let valid = r.valid && !on_hallucinated.failed() && !on_real.failed();
            Ok(SentenceLabel {
                on_hallucinated,
                verdict_hallucinated: vh,
                on_real,
                verdict_real: vr,
                accuracy: r.accuracy,
                valid,
            })
        }
        (a, b) => Err([a.err(), b.err()].into_iter().flatten().collect()),
    }
}

fn selective(cfg: &Config, case: &Case, results: &dyn ResultLookup) -> Step<SelectiveLabel> {
    let item = &case.item;
    let order = match cfg.variant {
        UhgVariant::Paper => case.paper_order,
        UhgVariant::V2 => option_order_v2(&item.hallucinated_continuation),
    };
    let (h, r) = (item.hallucinated_continuation.as_str(), cfg.real_continuation(item));
    let (a, b) = match order {
        OptionOrder::HallucinatedFirst => (h, r),
        OptionOrder::RealFirst => (r, h),
    };
    let query = prompts::compare_two_continuation(item, a, b, cfg.variant);
    let answer = cfg
        .call(Form::Selective.as_str(), query.clone(), SHORT_MAX_TOKENS, results)
        .map_err(|r| vec![r])?;
    let choice = parse_selective_choice(unechoed(&answer, &query, cfg.variant), cfg.variant);
    let s = selective_item(choice, order);
    let valid = s.valid && !answer.failed();
    Ok(SelectiveLabel { order, answer, choice, correct: s.correct, valid })
}

fn generative(cfg: &Config, item: &NewsItem, results: &dyn ResultLookup) -> Step<GenerativeLabel> {
    let query = prompts::continue_writing(item, cfg.variant);
    let answer =
        cfg.call("continue", query.clone(), LONG_MAX_TOKENS, results).map_err(|r| vec![r])?;
    let continuation = continuation_from_answer(answer.as_str(), &query, cfg.variant).to_string();
    let valid = generative_valid(&continuation, cfg.variant) && !answer.failed();
    let reference = &item.news_remainder;
    // Keyword extraction and the BERTScore embedding run in parallel.
    let kq = prompts::extract_kws(&continuation, cfg.variant);
    let extraction = valid.then(|| cfg.call("extract_kws", kq.clone(), LONG_MAX_TOKENS, results));
    let bert = match (&cfg.bert_embedder, valid) {
        (Some(e), true) => Some(bert_step(e, &continuation, reference, results)),
        _ => None,
    };
    let waiting: Vec<JobRequest> = [
        extraction.as_ref().and_then(|r| r.as_ref().err().cloned()),
        bert.as_ref().and_then(|r| r.as_ref().err().cloned()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !waiting.is_empty() {
        return Err(waiting);
    }
    let extraction = extraction.and_then(Result::ok);
    let bert = bert.and_then(Result::ok);
    let keywords = extraction.as_ref().map_or_else(Vec::new, |a| {
        // \[v2\] drops an echoed query from every answer; \[paper\] reads it as is.
        let text = match cfg.variant {
            UhgVariant::Paper => a.as_str(),
            UhgVariant::V2 => strip_echo(a.as_str(), &kq, UhgVariant::V2),
        };
        parse_extracted_keywords(text, &continuation)
    });
    let m = generative_item(&continuation, reference, &keywords, UhgVariant::Paper);
    let v2 = bleu4_v2(&jieba_cut(&continuation), &jieba_cut(reference)).score;
    // A failed extraction leaves no keywords to score: kwPrec would read 0, so the item
    // is invalid (its metrics are not averaged) instead.
    let valid = valid && !extraction.as_ref().is_some_and(Answer::failed);
    Ok(GenerativeLabel {
        answer,
        continuation,
        valid,
        extraction,
        keywords,
        bleu4_paper: m.bleu4,
        bleu4_v2: v2,
        rouge_l: m.rouge_l,
        kw_prec: m.kw_prec,
        length: m.length,
        bert,
    })
}

#[cfg(test)]
mod tests;
