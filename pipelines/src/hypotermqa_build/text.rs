//! Prompts of the builder, and reading the generator's answers.
//!
//! The prompts follow the stages and rules of the paper's question-generation prompts
//! (arXiv 2402.16211, sections 2.1–2.4, appendices C–J): topics with explanations,
//! hypothetical terms with explanations, valid terms related to a hypothetical one,
//! a question joining a hypothetical and a valid term (terms verbatim, the hypothetical
//! term towards the end), and a "fresh" question joining two valid terms. The wording
//! is Halyard's own (the appendices' text is not reproduced), and asks for one item
//! per line as `Name: explanation` so that answers can be read without a JSON parser.
//! Each prompt shows one worked example first (see [`EXAMPLE_NAMES`]).

use halyard_proto::ChatMessage;

/// One `name: explanation` line of a list answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub explanation: String,
}

/// Why a line of a list answer was not kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineDrop {
    /// No `name: explanation` shape (or an empty name or explanation).
    Format,
    /// The name was already listed (after normalisation).
    Duplicate,
    /// A name longer than [`MAX_NAME_CHARS`] or [`MAX_NAME_WORDS`]: a sentence, not a term.
    TooLong,
    /// More entries than asked for.
    OverLimit,
    /// A name copied from the prompt's worked example ([`EXAMPLE_NAMES`]).
    Example,
}

/// What a list answer gave: the entries kept, in order, and what was dropped and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListParse {
    pub kept: Vec<Entry>,
    /// Non-empty lines seen.
    pub lines: u32,
    pub format: u32,
    pub duplicate: u32,
    pub too_long: u32,
    pub over_limit: u32,
    pub example: u32,
}

pub const MAX_NAME_CHARS: usize = 80;
pub const MAX_NAME_WORDS: usize = 8;

// Every prompt is preceded by one worked example (a user turn and the answer we want,
// in a domain of its own). Small local models follow a shown format far better than a
// described one: SmolLM2-135M wrote no `Term: explanation` line for a zero-shot terms
// prompt, and mostly well-formed lists after the example. Entries copied from the
// example are dropped (`dropped_example`).

/// Names in the worked examples; an answer that repeats one copied the example.
pub const EXAMPLE_NAMES: [&str; 9] = [
    "Astronomy",
    "Cooking",
    "Personal finance",
    "Thermo-Glaze Folding",
    "Umami Drift Reduction",
    "Crystal Brine Lattice",
    "Puff pastry",
    "Glaze (cooking technique)",
    "Lamination (pastry)",
];

fn with_example(
    example_request: String,
    example_answer: &str,
    request: String,
) -> Vec<ChatMessage> {
    vec![
        ChatMessage::user(example_request),
        ChatMessage::assistant(example_answer),
        ChatMessage::user(request),
    ]
}

fn topics_request(count: usize) -> String {
    format!(
        "List {count} distinct, broad topics of general interest (for example a field of science, \
         technology, culture or daily life), each with a one-sentence explanation.\n\
         Answer with exactly {count} lines and nothing else, each in the form\n\
         Topic name: explanation"
    )
}

pub fn topics_messages(count: usize) -> Vec<ChatMessage> {
    with_example(
        topics_request(3),
        "Astronomy: the study of stars, planets and everything else beyond the Earth's atmosphere.\n\
         Cooking: the preparation of food with heat, tools and recipes.\n\
         Personal finance: how people earn, save, borrow and invest their money.",
        topics_request(count),
    )
}

fn terms_request(about: &str, count: usize) -> String {
    format!(
        "Invent {count} hypothetical terms in the topic \"{about}\". A hypothetical term is a \
         plausible-sounding name of a concept, method, device or phenomenon that does NOT exist: \
         it must not be the name of anything real, and must not appear in any encyclopedia. \
         Each term is 2 to 5 words. Give each a short made-up explanation of what it would be.\n\
         Answer with exactly {count} lines and nothing else, each in the form\n\
         Term: explanation"
    )
}

pub fn terms_messages(topic: &str, explanation: Option<&str>, count: usize) -> Vec<ChatMessage> {
    let about = match explanation {
        Some(e) if !e.trim().is_empty() => format!("{topic} ({})", e.trim()),
        _ => topic.to_string(),
    };
    with_example(
        terms_request("Cooking", 3),
        "Thermo-Glaze Folding: a technique that folds hot sugar glaze into cold dough in thin layers.\n\
         Umami Drift Reduction: a slow simmer that moves savoury flavour from bones into vegetables.\n\
         Crystal Brine Lattice: a salt crust grown on meat in a humid cabinet before roasting.",
        terms_request(&about, count),
    )
}

fn suggest_request(term: &str, explanation: &str, count: usize) -> String {
    format!(
        "Here is a hypothetical term and its explanation.\nTerm: {term}\nExplanation: {}\n\
         List {count} real, existing concepts that are closely related to it, each the exact title \
         of an English Wikipedia article, with a one-sentence explanation.\n\
         Answer with exactly {count} lines and nothing else, each in the form\n\
         Wikipedia title: explanation",
        explanation.trim()
    )
}

pub fn suggest_messages(term: &str, explanation: &str, count: usize) -> Vec<ChatMessage> {
    with_example(
        suggest_request(
            "Thermo-Glaze Folding",
            "a technique that folds hot sugar glaze into cold dough in thin layers.",
            3,
        ),
        "Puff pastry: a light, flaky pastry made by folding butter into dough in many layers.\n\
         Glaze (cooking technique): a glossy coating of sugar, egg or stock applied to food.\n\
         Lamination (pastry): the folding of fat into dough to create thin alternating layers.",
        suggest_request(term, explanation, count),
    )
}

fn question_request(first: &str, first_expl: &str, last: &str, last_expl: &str) -> String {
    format!(
        "Write one question that a curious person could ask, about how the following two terms relate.\n\
         Term 1: \"{first}\"\nMeaning of term 1: {}\nTerm 2: \"{last}\"\nMeaning of term 2: {}\n\
         Rules: copy both terms exactly as written, in quotes; mention term 1 first and put term 2 \
         towards the end of the question; do not explain or define the terms; write a single \
         sentence ending with a question mark.\n\
         Answer with the question only.",
        first_expl.trim(),
        last_expl.trim()
    )
}

/// A question that uses `first` and `last` verbatim, `last` towards the end.
pub fn question_messages(
    first: &str,
    first_expl: &str,
    last: &str,
    last_expl: &str,
) -> Vec<ChatMessage> {
    with_example(
        question_request(
            "Puff pastry",
            "a light, flaky pastry made by folding butter into dough in many layers.",
            "Thermo-Glaze Folding",
            "a technique that folds hot sugar glaze into cold dough in thin layers.",
        ),
        "How could bakers who make \"Puff pastry\" at home benefit from \"Thermo-Glaze Folding\"?",
        question_request(first, first_expl, last, last_expl),
    )
}

fn strip_list_marker(line: &str) -> &str {
    let t = line.trim();
    let t = t.trim_start_matches(['-', '*', '•', '·']).trim_start();
    // "1." / "1)" / "(1)" numbering.
    let digits = t.trim_start_matches('(');
    let n = digits.chars().take_while(|c| c.is_ascii_digit()).count();
    if n > 0 {
        let rest = &digits[n..];
        if let Some(r) = rest.strip_prefix('.').or_else(|| rest.strip_prefix(')')) {
            return r.trim_start();
        }
    }
    t
}

/// Strip decoration a model puts around a name: `**bold**`, quotes, trailing colon.
fn clean_name(s: &str) -> String {
    s.trim()
        .trim_matches(|c: char| matches!(c, '*' | '"' | '\'' | '`' | '“' | '”' | '‘' | '’' | '_'))
        .trim()
        .to_string()
}

/// Read a `Name: explanation` list answer, keeping at most `limit` entries.
/// `norm` gives the key under which two names count as the same.
pub fn parse_list(text: &str, limit: usize, norm: impl Fn(&str) -> String) -> ListParse {
    let mut out = ListParse::default();
    let mut seen = std::collections::HashSet::new();
    for raw in text.lines() {
        if raw.trim().is_empty() {
            continue;
        }
        out.lines += 1;
        let line = strip_list_marker(raw);
        // The separator: the first ':' (or " - " / " – " when there is no colon).
        let split = line
            .find(':')
            .map(|i| (i, 1))
            .or_else(|| line.find(" - ").map(|i| (i, 3)))
            .or_else(|| line.find(" – ").map(|i| (i, " – ".len())));
        let Some((at, width)) = split else {
            out.format += 1;
            continue;
        };
        let name = clean_name(&line[..at]);
        let explanation = line[at + width..].trim().trim_matches('*').trim().to_string();
        if name.is_empty() || explanation.is_empty() {
            out.format += 1;
            continue;
        }
        if name.chars().count() > MAX_NAME_CHARS || name.split_whitespace().count() > MAX_NAME_WORDS
        {
            out.too_long += 1;
            continue;
        }
        let key = norm(&name);
        if EXAMPLE_NAMES.iter().any(|e| norm(e) == key) {
            out.example += 1;
            continue;
        }
        if !seen.insert(key) {
            out.duplicate += 1;
            continue;
        }
        if out.kept.len() >= limit {
            out.over_limit += 1;
            continue;
        }
        out.kept.push(Entry { name, explanation });
    }
    out
}

/// The question in a question answer: the first non-empty line, without a
/// `Question:` label, list marker or surrounding quotes. `None` when there is none.
pub fn parse_question(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line = strip_list_marker(line);
    let lower = line.to_lowercase();
    let line = if lower.starts_with("question:") { line["question:".len()..].trim() } else { line };
    let q = line.trim_matches(|c: char| matches!(c, '"' | '“' | '”' | '*')).trim();
    (!q.is_empty()).then(|| q.to_string())
}

/// `question` without the quote marks the prompt asked for around its terms: a quoted
/// span (`"…"` or `“…”`) whose text is one of `terms` (case-insensitively) loses its
/// quotes; any other quoted span is kept. Asking for quoted terms makes small models
/// copy them verbatim (SmolLM2-135M: 5 of 10 questions kept both terms, against 3 of 8
/// unquoted), and the built questions read like the paper's, which have no quotes.
pub fn unquote_terms(question: &str, terms: &[&str]) -> String {
    // The first quote mark in `s` of `marks`: its byte offset and length.
    let find = |s: &str, marks: [char; 2]| {
        s.char_indices().find(|(_, c)| marks.contains(c)).map(|(i, c)| (i, c.len_utf8()))
    };
    let mut out = String::with_capacity(question.len());
    let mut rest = question;
    while let Some((open, open_len)) = find(rest, ['"', '“']) {
        let body = &rest[open + open_len..];
        let Some((close, close_len)) = find(body, ['"', '”']) else { break };
        let inner = &body[..close];
        let is_term = terms
            .iter()
            .map(|t| t.trim())
            .any(|t| !t.is_empty() && inner.trim().to_lowercase() == t.to_lowercase());
        out.push_str(&rest[..open]);
        out.push_str(if is_term {
            inner
        } else {
            &rest[open..open + open_len + close + close_len]
        });
        rest = &body[close + close_len..];
    }
    out.push_str(rest);
    out
}

/// K' of spec A.6: `term` with every `(...)` span (no nested parentheses) removed, trimmed.
pub fn strip_parenthetical(term: &str) -> String {
    let mut out = String::with_capacity(term.len());
    let mut rest = term;
    while let Some(open) = rest.find('(') {
        match rest[open + 1..].find([')', '(']) {
            Some(j) if rest.as_bytes()[open + 1 + j] == b')' => {
                out.push_str(&rest[..open]);
                rest = &rest[open + 1 + j + 1..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}

/// Byte length of a case-insensitive match of `needle` at the start of `hay`.
fn match_ci(hay: &str, needle: &str) -> Option<usize> {
    let mut h = hay.char_indices();
    for n in needle.chars() {
        let (_, c) = h.next()?;
        if c != n && !c.to_lowercase().eq(n.to_lowercase()) {
            return None;
        }
    }
    Some(h.next().map_or(hay.len(), |(i, _)| i))
}

/// The programmatic replacement of spec A.6: every non-overlapping, case-insensitive
/// occurrence of `term` or of its K' (full term tried first at each position) is
/// replaced by `replacement`, verbatim. Returns the new text and the number of
/// replacements (0: unchanged).
pub fn replace_term(text: &str, term: &str, replacement: &str) -> (String, usize) {
    let short = strip_parenthetical(term);
    let mut out = String::with_capacity(text.len() + replacement.len());
    let mut count = 0;
    let mut i = 0;
    while i <= text.len() {
        let rest = &text[i..];
        let hit = match_ci(rest, term)
            .filter(|&n| n > 0)
            .or_else(|| match_ci(rest, &short).filter(|&n| n > 0));
        match hit {
            Some(n) => {
                out.push_str(replacement);
                count += 1;
                i += n;
            }
            None => match rest.chars().next() {
                Some(c) => {
                    out.push(c);
                    i += c.len_utf8();
                }
                None => break,
            },
        }
    }
    (out, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lower(s: &str) -> String {
        s.to_lowercase()
    }

    /// List answers: markers, bold and quotes go; each drop is counted by reason.
    #[test]
    fn list_parsing_counts_what_it_drops() {
        let text = "Here are the terms:\n1. **Quantum Loom**: a loom that weaves qubits\n\
                    2) \"Nano-Sync Fusion\" - syncs nano devices\n- quantum loom: again\n\
                    just a sentence without separator\n\
                    A very long name that is clearly a whole sentence and not a term at all: x\n\
                    Cryo Lattice: cold lattice\nThermo-Glaze folding: copied\nExtra Term: over the limit\n";
        let p = parse_list(text, 3, lower);
        let names: Vec<&str> = p.kept.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["Quantum Loom", "Nano-Sync Fusion", "Cryo Lattice"]);
        assert_eq!(p.kept[0].explanation, "a loom that weaves qubits");
        // "Here are the terms:" has an empty explanation.
        assert_eq!(
            (p.lines, p.format, p.duplicate, p.too_long, p.over_limit, p.example),
            (9, 2, 1, 1, 1, 1)
        );
    }

    #[test]
    fn quoted_terms_lose_their_quotes() {
        let terms = ["Puff pastry", "Thermo-Glaze Folding"];
        assert_eq!(
            unquote_terms("How could \"puff pastry\" help “Thermo-Glaze Folding”?", &terms),
            "How could puff pastry help Thermo-Glaze Folding?"
        );
        // Other quoted spans, and unbalanced quotes, stay as written.
        assert_eq!(
            unquote_terms("Is \"dough\" like \"Puff pastry\"? \"", &terms),
            "Is \"dough\" like Puff pastry? \""
        );
        assert_eq!(unquote_terms("No quotes here?", &terms), "No quotes here?");
    }

    #[test]
    fn question_parsing() {
        assert_eq!(
            parse_question("\n  Question: \"How does X relate to Y?\"\nmore"),
            Some("How does X relate to Y?".into())
        );
        assert_eq!(parse_question("1. What is Z?"), Some("What is Z?".into()));
        assert_eq!(parse_question("  \n \"\" "), None);
    }

    /// Spec A.6: case-insensitive, full term first, then the term without its
    /// parenthetical; the replacement is inserted verbatim.
    #[test]
    fn replacement_follows_a6() {
        let (q, n) = replace_term(
            "What is nano-sync FUSION technology, and Nano-Sync Fusion Technology?",
            "Nano-Sync Fusion Technology",
            "Nanoparticle",
        );
        assert_eq!((q.as_str(), n), ("What is Nanoparticle, and Nanoparticle?", 2));
        let (q, n) = replace_term("How does Mercury orbit?", "Mercury (planet)", "Venus");
        assert_eq!((q.as_str(), n), ("How does Venus orbit?", 1));
        let (q, n) = replace_term("Nothing here.", "Quantum Loom", "Loom");
        assert_eq!((q.as_str(), n), ("Nothing here.", 0));
        assert_eq!(strip_parenthetical("Alley-oop (basketball)"), "Alley-oop");
        assert_eq!(strip_parenthetical("a (b (c) d"), "a (b  d");
        let (q, _) = replace_term("Ünïcode Term here", "ünïcode term", "X");
        assert_eq!(q, "X here");
    }
}
