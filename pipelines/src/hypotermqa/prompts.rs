//! Prompts: the answer request and the authors' judge templates (spec E.3), verbatim.
//!
//! The judge templates are byte-for-byte those of `prompts/templates.py` with its CRLF
//! line endings read as `\n`: note the trailing space after `"UNKNOWN".`, the two spaces
//! before `in the following`, the space in `term ,`, and the blank lines of the user
//! prompts. `str.format` substitutes in a single pass, so braces inside a term, question
//! or answer are left alone, as here.

use halyard_proto::ChatMessage;

use super::judge::JudgeKind;

/// `certainty_reflection_system`.
pub const ACCEPTANCE_SYSTEM: &str = concat!(
    "You are a linguistic expert.\n",
    "You will be given a TERM and QUESTION - ANSWER couple.\n",
    "The QUESTION is composed with the TERM.\n",
    "If the answer claims that the term is unreal, hypothetical, speculative or do not exist, label the certainty of the term as \"UNREAL\".\n",
    "If the answer mentioned the term in any context even without any further information, definition, description or explanation, label the certainty of the term as \"MENTIONED\".\n",
    "If the answer states that it does not have information about the term , label the certainty of the term as \"UNKNOWN\". \n",
    "Analyse the certainty of the term only by itself. Do not consider its relation with other terms or the context of the answer.\n",
    "First reason step by step then label certainty of the term as \"UNREAL\", \"MENTIONED\" or \"UNKNOWN\"  in the following json format.\n",
    "{\"term\":\"\",\n",
    "\"reasoning\":\"\",\n",
    "\"certainty\":\"\"}",
);

/// `meaning_reflection_system`.
pub const MEANING_SYSTEM: &str = concat!(
    "You are a linguistic expert.\n",
    "You will be given a TERM and QUESTION - ANSWER couple.\n",
    "The QUESTION is composed with the TERM.\n",
    "Verify if the answer uses the term in its real meaning.\n",
    "First reason step by step then label verified attribute as TRUE or FALSE.\n",
    "{\"term\":\"\",\n",
    "\"reasoning\":\"\",\n",
    "\"verified\":\"\"}",
);

/// `certainty_reflection_user.format(term=..., question=..., answer=...)`.
pub fn acceptance_user(term: &str, question: &str, answer: &str) -> String {
    format!(
        "TERM => {term}\n\nQUESTION => {question}\nANSWER => {answer}\n\n\
         INSTRUCTION => Output should be in the following json format:\n\
         {{\"term\":\"{term}\",\n\"reasoning\":\"\",\n\"certainty\":\"\"}}"
    )
}

/// `meaning_reflection_user.format(term=..., term_definition=..., question=..., answer=...)`.
pub fn meaning_user(term: &str, term_definition: &str, question: &str, answer: &str) -> String {
    format!(
        "TERM => {term}: {term_definition}\n\nQUESTION => {question}\nANSWER => {answer}\n\n\
         INSTRUCTION => Output should be in the following json format:\n\
         {{\"term\":\"{term}\",\n\"reasoning\":\"\",\n\"verified\":\"\"}}"
    )
}

/// The model under test sees an optional system prompt and the question verbatim.
pub fn answer_messages(system_prompt: Option<&str>, question: &str) -> Vec<ChatMessage> {
    let mut m = Vec::with_capacity(2);
    if let Some(s) = system_prompt {
        m.push(ChatMessage::system(s));
    }
    m.push(ChatMessage::user(question));
    m
}

/// `[system, user]` for an acceptance check.
pub fn acceptance_messages(term: &str, question: &str, answer: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::system(ACCEPTANCE_SYSTEM),
        ChatMessage::user(acceptance_user(term, question, answer)),
    ]
}

/// `[system, user]` for a meaning check (`definition` is the term's stored explanation).
pub fn meaning_messages(
    term: &str,
    definition: &str,
    question: &str,
    answer: &str,
) -> Vec<ChatMessage> {
    vec![
        ChatMessage::system(MEANING_SYSTEM),
        ChatMessage::user(meaning_user(term, definition, question, answer)),
    ]
}

/// Halyard's paper-mode repair request (not from the paper or the authors' code).
pub fn repair_instruction(kind: JudgeKind) -> String {
    format!(
        "Your reply could not be read. Reply with only the JSON object, with no other text: \
         {{\"term\":\"...\", \"reasoning\":\"...\", \"{key}\":\"...\"}}, where \"{key}\" is {allowed}.",
        key = kind.key(),
        allowed = kind.allowed()
    )
}

/// The third paper-mode attempt: the original messages, the judge's last unusable
/// output, and [`repair_instruction`].
pub fn repair_messages(
    base: &[ChatMessage],
    bad_output: &str,
    kind: JudgeKind,
) -> Vec<ChatMessage> {
    let mut m = base.to_vec();
    m.push(ChatMessage::assistant(bad_output));
    m.push(ChatMessage::user(repair_instruction(kind)));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The distinctive bytes of the authors' templates survive exactly.
    #[test]
    fn templates_are_verbatim() {
        assert!(ACCEPTANCE_SYSTEM.contains(
            "about the term , label the certainty of the term as \"UNKNOWN\". \nAnalyse"
        ));
        assert!(ACCEPTANCE_SYSTEM.contains(
            "\"UNKNOWN\"  in the following json format.\n{\"term\":\"\",\n\"reasoning\":\"\",\n\"certainty\":\"\"}"
        ));
        assert!(ACCEPTANCE_SYSTEM
            .starts_with("You are a linguistic expert.\nYou will be given a TERM and QUESTION - ANSWER couple.\n"));
        assert!(!ACCEPTANCE_SYSTEM.ends_with('\n'));
        assert_eq!(ACCEPTANCE_SYSTEM.lines().count(), 11);
        assert!(MEANING_SYSTEM.ends_with(
            "label verified attribute as TRUE or FALSE.\n{\"term\":\"\",\n\"reasoning\":\"\",\n\"verified\":\"\"}"
        ));
        assert_eq!(
            acceptance_user("T {x}", "Q?", "A."),
            "TERM => T {x}\n\nQUESTION => Q?\nANSWER => A.\n\nINSTRUCTION => Output should be in the following json format:\n{\"term\":\"T {x}\",\n\"reasoning\":\"\",\n\"certainty\":\"\"}"
        );
        assert_eq!(
            meaning_user("T", "Def.\n", "Q?", "A."),
            "TERM => T: Def.\n\n\nQUESTION => Q?\nANSWER => A.\n\nINSTRUCTION => Output should be in the following json format:\n{\"term\":\"T\",\n\"reasoning\":\"\",\n\"verified\":\"\"}"
        );
    }

    /// The repair attempt extends the original conversation by the bad output and one instruction.
    #[test]
    fn repair_extends_the_conversation() {
        let base = acceptance_messages("T", "Q", "A");
        let m = repair_messages(&base, "garbage", JudgeKind::Acceptance);
        assert_eq!(m.len(), 4);
        assert_eq!(&m[..2], &base[..]);
        assert_eq!(m[2], ChatMessage::assistant("garbage"));
        assert!(m[3].content.contains("\"certainty\" is \"UNREAL\", \"MENTIONED\" or \"UNKNOWN\""));
        assert_eq!(answer_messages(None, "Q?"), vec![ChatMessage::user("Q?")]);
        assert_eq!(answer_messages(Some("S"), "Q?").len(), 2);
    }
}
