//! The knowledge base (`{title, text}` JSONL, text = the article's first paragraph),
//! the existence check, and the vector index of the knowledge base.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use halyard_embed::index::FlatIndex;
use unicode_normalization::UnicodeNormalization;

/// A knowledge-base file that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum KbError {
    #[error("cannot read {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("{file}:{line}: {reason}")]
    Line { file: String, line: usize, reason: String },
    #[error("{file}: holds no entries")]
    Empty { file: String },
}

/// The normal form under which two titles (or a term and a title) are the same: NFKC,
/// lower case, whitespace collapsed, surrounding quotes and punctuation removed.
pub fn normalize(s: &str) -> String {
    let folded: String = s.nfkc().collect::<String>().to_lowercase();
    let words: Vec<&str> = folded.split_whitespace().collect();
    words.join(" ").trim_matches(|c: char| !c.is_alphanumeric() && c != ')' && c != '(').to_string()
}

/// The knowledge base, read once; shared by every topic of a build.
#[derive(Debug)]
pub struct Kb {
    pub file: String,
    pub titles: Vec<String>,
    pub texts: Vec<String>,
    /// Normalised title (and title without its parenthetical) → first row.
    by_title: HashMap<String, usize>,
    /// The vectors of titles and texts, built once from the `embed` results.
    pub(super) index: OnceLock<KbIndex>,
}

/// Title and first-paragraph vectors, row for row with [`Kb::titles`].
#[derive(Debug)]
pub struct KbIndex {
    pub titles: FlatIndex,
    pub texts: FlatIndex,
}

impl Kb {
    pub fn read(path: &Path) -> Result<Kb, KbError> {
        let file = path.display().to_string();
        let body = std::fs::read_to_string(path)
            .map_err(|e| KbError::Io { path: file.clone(), reason: e.to_string() })?;
        Kb::parse(&file, &body)
    }

    pub fn parse(file: &str, body: &str) -> Result<Kb, KbError> {
        let mut titles = Vec::new();
        let mut texts = Vec::new();
        let mut by_title = HashMap::new();
        for (i, line) in body.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let err =
                |reason: String| KbError::Line { file: file.to_string(), line: i + 1, reason };
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| err(format!("invalid JSON: {e}")))?;
            let obj = v
                .as_object()
                .ok_or_else(|| err("expected a JSON object {\"title\", \"text\"}".into()))?;
            let field = |k: &str| -> Result<String, KbError> {
                let s = obj.get(k).ok_or_else(|| err(format!("field `{k}`: missing")))?;
                let s = s.as_str().ok_or_else(|| err(format!("field `{k}`: expected a string")))?;
                if s.trim().is_empty() {
                    return Err(err(format!("field `{k}`: is empty")));
                }
                Ok(s.trim().to_string())
            };
            let (title, text) = (field("title")?, field("text")?);
            let row = titles.len();
            by_title.entry(normalize(&title)).or_insert(row);
            let short = normalize(&super::text::strip_parenthetical(&title));
            if !short.is_empty() {
                by_title.entry(short).or_insert(row);
            }
            titles.push(title);
            texts.push(text);
        }
        if titles.is_empty() {
            return Err(KbError::Empty { file: file.to_string() });
        }
        Ok(Kb { file: file.to_string(), titles, texts, by_title, index: OnceLock::new() })
    }

    pub fn len(&self) -> usize {
        self.titles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.titles.is_empty()
    }

    /// The row whose title matches `term` after normalisation (also without the
    /// title's `(qualifier)`).
    pub fn find_title(&self, term: &str) -> Option<usize> {
        self.by_title.get(&normalize(term)).copied()
    }
}

/// Decides whether a candidate hypothetical term is known to exist. Pluggable: the
/// paper counted web-search hits, which cannot run here; Halyard ships
/// [`KbTitles`] and [`KnownPhrases`], and a build may add any other implementation.
pub trait ExistenceCheck: std::fmt::Debug + Send + Sync {
    /// The check's name in reports (`in_kb`, `known_phrase`, ...).
    fn name(&self) -> &'static str;
    /// True when `term` exists according to this check.
    fn exists(&self, term: &str) -> bool;
}

/// A term exists when it matches a knowledge-base title after normalisation.
#[derive(Debug)]
pub struct KbTitles(pub Arc<Kb>);

impl ExistenceCheck for KbTitles {
    fn name(&self) -> &'static str {
        "in_kb"
    }
    fn exists(&self, term: &str) -> bool {
        self.0.find_title(term).is_some()
    }
}

/// A term exists when it matches a phrase of a user-supplied list (one per line),
/// after normalisation.
#[derive(Debug)]
pub struct KnownPhrases {
    phrases: HashSet<String>,
}

impl KnownPhrases {
    pub fn read(path: &Path) -> Result<KnownPhrases, KbError> {
        let file = path.display().to_string();
        let body = std::fs::read_to_string(path)
            .map_err(|e| KbError::Io { path: file.clone(), reason: e.to_string() })?;
        Ok(KnownPhrases::new(body.lines()))
    }

    pub fn new<'a>(lines: impl IntoIterator<Item = &'a str>) -> KnownPhrases {
        KnownPhrases {
            phrases: lines.into_iter().map(normalize).filter(|p| !p.is_empty()).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.phrases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.phrases.is_empty()
    }
}

impl ExistenceCheck for KnownPhrases {
    fn name(&self) -> &'static str {
        "known_phrase"
    }
    fn exists(&self, term: &str) -> bool {
        self.phrases.contains(&normalize(term))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_and_title_lookup() {
        let kb = Kb::parse("kb.jsonl", "{\"title\":\"Mercury (planet)\",\"text\":\"A planet.\"}\n\n{\"title\":\"3D printing\",\"text\":\"Additive.\"}\n").unwrap();
        assert_eq!(kb.len(), 2);
        assert_eq!(kb.find_title("  3d   PRINTING "), Some(1));
        assert_eq!(kb.find_title("Mercury"), Some(0));
        assert_eq!(kb.find_title("mercury (planet)"), Some(0));
        assert_eq!(kb.find_title("\"3D printing\"."), Some(1));
        assert_eq!(kb.find_title("4D printing"), None);
        let check = KbTitles(Arc::new(kb));
        assert!(check.exists("3D Printing") && !check.exists("Quantum Loom"));
        let known = KnownPhrases::new(["Quantum Loom", "", "  "]);
        assert_eq!(known.len(), 1);
        assert!(known.exists("quantum  loom") && !known.exists("Cryo Lattice"));
    }

    /// Bad lines name the file, the line and the field.
    #[test]
    fn bad_lines_are_located() {
        let e = Kb::parse("kb.jsonl", "{\"title\":\"A\",\"text\":\"x\"}\n{\"title\":\"B\"}\n")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "kb.jsonl:2: field `text`: missing");
        let e = Kb::parse("kb.jsonl", "[1]\n").unwrap_err().to_string();
        assert!(e.starts_with("kb.jsonl:1: expected a JSON object"), "{e}");
        let e = Kb::parse("kb.jsonl", "{\"title\": 3, \"text\": \"x\"}").unwrap_err().to_string();
        assert!(e.contains("field `title`: expected a string"), "{e}");
        let e = Kb::parse("kb.jsonl", "{oops").unwrap_err().to_string();
        assert!(e.starts_with("kb.jsonl:1: invalid JSON"), "{e}");
        assert_eq!(
            Kb::parse("kb.jsonl", "\n").unwrap_err().to_string(),
            "kb.jsonl: holds no entries"
        );
    }
}
