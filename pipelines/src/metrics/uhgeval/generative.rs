//! Generative evaluation (spec §1.6): the continuation, its validity, the per-item metrics
//! and the overall averages. "BERTScore" (text2vec cosine similarity) needs model weights
//! and is not computed here (spec §6.2).

use serde::{Deserialize, Serialize};

use super::parse::{first_sentence, strip_echo};
use super::UhgVariant;
use crate::metrics::bleu::{bleu4_paper, bleu4_v2};
use crate::metrics::kwprec::kw_prec;
use crate::metrics::pystr::{py_len, py_strip};
use crate::metrics::rouge::rouge_l;
use crate::metrics::tokenize::jieba_cut;

/// The continuation of a raw answer to `continue_writing` (spec §1.6 step 2): its first
/// sentence (§1.2 rule); \[v2\] first drops an echoed `query` prefix, \[paper\] does not.
pub fn continuation_from_answer<'a>(answer: &'a str, query: &str, variant: UhgVariant) -> &'a str {
    match variant {
        UhgVariant::Paper => first_sentence(answer),
        UhgVariant::V2 => first_sentence(strip_echo(answer, query, UhgVariant::V2)),
    }
}

/// Validity (spec §1.6 step 3): \[paper\] `continuation.strip() != ""`, \[v2\]
/// `continuation != ""`.
pub fn generative_valid(continuation: &str, variant: UhgVariant) -> bool {
    match variant {
        UhgVariant::Paper => !py_strip(continuation).is_empty(),
        UhgVariant::V2 => !continuation.is_empty(),
    }
}

/// One item's generative metrics (spec §1.6 step 5).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerativeItem {
    /// BLEU-4 of the variant: \[paper\] [`bleu4_paper`]`.score`, \[v2\] [`bleu4_v2`]`.score`.
    pub bleu4: f64,
    /// ROUGE-L F-measure.
    pub rouge_l: f64,
    /// kwPrec of the extracted keywords against the reference.
    pub kw_prec: f64,
    /// `len(continuation)` in code points ("avg. len.").
    pub length: usize,
    /// [`generative_valid`] for the variant.
    pub valid: bool,
}

/// Scores one continuation against `reference` = the **whole** `newsRemainder` (spec §1.6
/// step 4, §6.4), with `keywords` already parsed by
/// [`crate::metrics::kwprec::parse_extracted_keywords`]. Both texts are tokenised with
/// [`jieba_cut`]. Never fails (the paper's exception fallbacks give 0.0, see the BLEU doc).
pub fn generative_item<S: AsRef<str>>(
    continuation: &str,
    reference: &str,
    keywords: &[S],
    variant: UhgVariant,
) -> GenerativeItem {
    let c = jieba_cut(continuation);
    let r = jieba_cut(reference);
    let bleu4 = match variant {
        UhgVariant::Paper => bleu4_paper(&c, &r).score,
        UhgVariant::V2 => bleu4_v2(&c, &r).score,
    };
    GenerativeItem {
        bleu4,
        rouge_l: rouge_l(&c, &r).f,
        kw_prec: kw_prec(keywords, reference),
        length: py_len(continuation),
        valid: generative_valid(continuation, variant),
    }
}

/// The generative overall (spec §1.6 step 6): each metric's mean over valid items
/// (`None` without valid items) and `num` = #valid.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerativeOverall {
    pub avg_bleu4: Option<f64>,
    pub avg_rouge_l: Option<f64>,
    pub avg_kw_prec: Option<f64>,
    pub avg_length: Option<f64>,
    pub num: usize,
}

/// Averages over the valid items (spec §1.6 step 6).
pub fn generative_overall(items: &[GenerativeItem]) -> GenerativeOverall {
    let valid: Vec<&GenerativeItem> = items.iter().filter(|i| i.valid).collect();
    let num = valid.len();
    let avg = |f: fn(&GenerativeItem) -> f64| {
        (num > 0).then(|| valid.iter().map(|i| f(i)).sum::<f64>() / num as f64)
    };
    GenerativeOverall {
        avg_bleu4: avg(|i| i.bleu4),
        avg_rouge_l: avg(|i| i.rouge_l),
        avg_kw_prec: avg(|i| i.kw_prec),
        avg_length: avg(|i| i.length as f64),
        num,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whitespace-only continuations are invalid in paper but valid in v2.
    #[test]
    fn whitespace_validity() {
        assert!(!generative_valid(" \n", UhgVariant::Paper));
        assert!(generative_valid(" \n", UhgVariant::V2));
        assert!(!generative_valid("", UhgVariant::V2));
    }

    /// v2 drops an echoed prompt before taking the first sentence; paper does not.
    #[test]
    fn continuation_echo() {
        assert_eq!(continuation_from_answer("Q。续写。", "Q。", UhgVariant::V2), "续写。");
        assert_eq!(continuation_from_answer("Q。续写。", "Q。", UhgVariant::Paper), "Q。");
    }

    /// An empty continuation scores 0 everywhere without panicking, and invalid items are not averaged.
    #[test]
    fn empty_continuation() {
        let i = generative_item("", "参考文本。", &[] as &[&str], UhgVariant::Paper);
        assert_eq!(
            i,
            GenerativeItem { bleu4: 0.0, rouge_l: 0.0, kw_prec: 0.0, length: 0, valid: false }
        );
        let o = generative_overall(&[i]);
        assert_eq!((o.num, o.avg_bleu4), (0, None));
    }
}
