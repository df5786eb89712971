//! The rules and the request ledger of the `fake-api` binary: a stand-in for a paid
//! OpenAI-compatible API in containers (`deploy/compose`, the compose fault test, demos).
//!
//! [`HypoTermQaRules`] answers HypoTermQA's requests by their content alone, so that any
//! number of workers, in any order, with any retries, get the same answer to the same
//! request, and a run's report is a pure function of the dataset: the model under test
//! repeats the question (so every term of the question is included) or says it knows
//! nothing; the judge labels each term by a hash of its text, and answers some first
//! attempts with prose that is no JSON (so the judge-repair path runs too).
//!
//! [`Ledger`] counts requests per prompt (model and messages, [`crate::request_key`]):
//! the `/stats` endpoint of the binary reports how many calls were made, how many
//! distinct prompts they carried and which prompts were paid for more than once.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::fake_openai::{request_key, ChatCall, Reply};

/// FNV-1a, 64 bits: a stable hash, the same in every process and build.
fn fnv(text: &str) -> u64 {
    text.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// What the model under test says when it does not answer.
pub const NO_INFO: &str = "I have no information about that.";

/// Answers HypoTermQA's model-under-test and judge requests; see the module docs.
#[derive(Clone, Copy, Debug)]
pub struct HypoTermQaRules {
    /// Percent (0..=100) of terms whose first acceptance verdict is unusable prose.
    pub garbage_percent: u64,
}

impl HypoTermQaRules {
    /// The reply to one request.
    pub fn reply(&self, call: &ChatCall) -> Reply {
        // The question, or the judge's original request (a repair appends more turns).
        let Some((_, user)) = call.messages.iter().find(|(role, _)| role == "user") else {
            return Reply::Status {
                code: 400,
                body: json!({"error": {"message": "no user message", "code": "bad_request"}})
                    .to_string(),
                retry_after: None,
            };
        };
        let system = call.messages.iter().find(|(role, _)| role == "system").map(|(_, c)| c);
        match system {
            Some(s) if s.starts_with("You are a linguistic expert.") => self.judge(s, user, call),
            _ if fnv(user).is_multiple_of(5) => Reply::Text(NO_INFO.into()),
            _ => Reply::Text(format!("Here is what I know: {user}")),
        }
    }

    fn judge(&self, system: &str, user: &str, call: &ChatCall) -> Reply {
        let Some(term) = judged_term(user) else {
            return Reply::Text("I cannot find the term in this request.".into());
        };
        let h = fnv(term);
        if system.contains("Verify if the answer uses the term in its real meaning.") {
            let verified = if h.is_multiple_of(3) { "FALSE" } else { "TRUE" };
            let body = json!({"term": term, "reasoning": "checked", "verified": verified});
            return Reply::Text(body.to_string());
        }
        // A repair attempt carries the judge's earlier answer: more than system + user.
        let first_attempt = call.messages.len() <= 2;
        if first_attempt && (h >> 16) % 100 < self.garbage_percent {
            return Reply::Text("Hmm, that is hard to say.".into());
        }
        let certainty = ["MENTIONED", "UNREAL", "UNKNOWN"][((h >> 8) % 3) as usize];
        let body = json!({"term": term, "reasoning": "step by step", "certainty": certainty});
        Reply::Text(format!("Reasoning first.\n```json\n{body}\n```"))
    }
}

/// The term of a judge request: the one in its output template `{"term":"…",`.
fn judged_term(user: &str) -> Option<&str> {
    let start = user.rfind("{\"term\":\"")? + "{\"term\":\"".len();
    let len = user[start..].find("\",\n\"reasoning\"")?;
    Some(&user[start..start + len])
}

/// Requests per prompt, for `/stats`.
#[derive(Debug, Default)]
pub struct Ledger {
    counts: HashMap<String, u64>,
    calls: u64,
}

impl Ledger {
    /// Counts one request.
    pub fn record(&mut self, call: &ChatCall) {
        self.calls += 1;
        *self.counts.entry(request_key(call)).or_insert(0) += 1;
    }

    /// Requests counted.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Distinct prompts among them.
    pub fn distinct(&self) -> u64 {
        self.counts.len() as u64
    }

    /// `{"calls", "distinct", "repeated", "repeated_prompts": [{"prompt", "count"}]}`:
    /// `repeated` is `calls - distinct`, the calls that repeated an earlier prompt; each
    /// repeated prompt is given by the FNV hash of its key, with its count.
    pub fn stats(&self) -> Value {
        let mut repeated: Vec<(String, u64)> = self
            .counts
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(key, &n)| (format!("{:016x}", fnv(key)), n))
            .collect();
        repeated.sort();
        json!({
            "calls": self.calls,
            "distinct": self.distinct(),
            "repeated": self.calls - self.distinct(),
            "repeated_prompts": repeated
                .into_iter()
                .map(|(prompt, count)| json!({"prompt": prompt, "count": count}))
                .collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(messages: &[(&str, &str)]) -> ChatCall {
        ChatCall {
            model: "m".into(),
            messages: messages.iter().map(|(r, c)| (r.to_string(), c.to_string())).collect(),
            ..ChatCall::default()
        }
    }

    fn text(reply: Reply) -> String {
        match reply {
            Reply::Text(t) => t,
            other => panic!("expected text, got {other:?}"),
        }
    }

    fn acceptance(term: &str) -> ChatCall {
        let user = format!(
            "TERM => {term}\n\nQUESTION => q\nANSWER => a\n\nINSTRUCTION => Output should be in the following json format:\n{{\"term\":\"{term}\",\n\"reasoning\":\"\",\n\"certainty\":\"\"}}"
        );
        call(&[
            ("system", "You are a linguistic expert.\nYou will be given a TERM"),
            ("user", &user),
        ])
    }

    /// The same request always gets the same answer; the model under test either
    /// repeats the question or says it knows nothing.
    #[test]
    fn answers_depend_on_content_only() {
        let rules = HypoTermQaRules { garbage_percent: 20 };
        let mut seen = [0, 0];
        for i in 0..50 {
            let q = format!("What is term number {i}?");
            let a = text(rules.reply(&call(&[("user", &q)])));
            assert_eq!(a, text(rules.reply(&call(&[("user", &q)]))));
            if a == NO_INFO {
                seen[0] += 1;
            } else {
                assert_eq!(a, format!("Here is what I know: {q}"));
                seen[1] += 1;
            }
        }
        assert!(seen[0] > 0 && seen[1] > 0, "both kinds of answer occur: {seen:?}");
    }

    /// Judge verdicts name the judged term and one of the three certainties; with
    /// garbage on, some first attempts are prose and their repair is not.
    #[test]
    fn judge_verdicts_and_garbage() {
        let rules = HypoTermQaRules { garbage_percent: 30 };
        let mut garbage = 0;
        for i in 0..60 {
            let term = format!("Quantum widget {i}");
            let first = text(rules.reply(&acceptance(&term)));
            if !first.contains("certainty") {
                garbage += 1;
                let mut repair = acceptance(&term);
                repair.messages.push(("assistant".into(), first));
                repair.messages.push(("user".into(), "Reply with only the JSON object".into()));
                let repaired = text(rules.reply(&repair));
                assert!(repaired.contains(&format!("\"term\":\"{term}\"")), "{repaired}");
                continue;
            }
            assert!(first.contains(&format!("\"term\":\"{term}\"")), "{first}");
            assert!(["MENTIONED", "UNREAL", "UNKNOWN"].iter().any(|c| first.contains(c)));
        }
        assert!((5..40).contains(&garbage), "about 30% garbage, got {garbage} of 60");
        let none = HypoTermQaRules { garbage_percent: 0 };
        assert!(
            (0..60).all(|i| text(none.reply(&acceptance(&format!("t{i}")))).contains("certainty"))
        );
    }

    /// A request without a user message is a 400, not a panic.
    #[test]
    fn no_user_message_is_rejected() {
        let rules = HypoTermQaRules { garbage_percent: 0 };
        assert!(matches!(rules.reply(&call(&[])), Reply::Status { code: 400, .. }));
    }

    /// The ledger counts calls, distinct prompts and the prompts paid for twice.
    #[test]
    fn ledger_counts_repeats() {
        let mut ledger = Ledger::default();
        for q in ["a", "b", "a", "c", "a"] {
            ledger.record(&call(&[("user", q)]));
        }
        let s = ledger.stats();
        assert_eq!((s["calls"].as_u64(), s["distinct"].as_u64()), (Some(5), Some(3)));
        assert_eq!(s["repeated"].as_u64(), Some(2));
        let prompts = s["repeated_prompts"].as_array().unwrap();
        assert_eq!(prompts.len(), 1);
        assert_eq!(prompts[0]["count"].as_u64(), Some(3));
    }
}
