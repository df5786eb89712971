//! A re-implementation of CPython's `json.loads` (the C scanner of `_json.c`, Python
//! 3.10/3.11), for the reference-mode judge parser (spec E.1).
//!
//! The authors' parser drives its repair loop by the *message and position* of the
//! `JSONDecodeError` ("Expecting ',' delimiter" at char N), so both must match CPython
//! exactly: messages, character (not byte) positions, `strict` vs `strict=False`
//! (raw control characters inside strings), `NaN`/`Infinity`, duplicate keys (the last
//! value wins, the first position is kept, as in `dict`).
//!
//! Known departures, none of which can change a label:
//! - a lone surrogate escape (`"\ud800"`) becomes U+FFFD (Rust strings cannot hold one);
//! - nesting deeper than [`MAX_DEPTH`] fails with a `RecursionError`-like error (CPython's
//!   limit depends on the caller's stack depth, about 1,000);
//! - integers keep their digits as text, with no 4,300-digit limit (Python 3.10.5, which
//!   the authors used, has none).

/// Nesting limit standing in for CPython's recursion limit; also keeps our stack bounded.
pub const MAX_DEPTH: usize = 900;

/// A Python value as `json.loads` builds it.
#[derive(Clone, Debug, PartialEq)]
pub enum PyValue {
    /// `dict`, in insertion order (a repeated key keeps its first position, last value).
    Dict(Vec<(String, PyValue)>),
    List(Vec<PyValue>),
    Str(String),
    /// `int`, as its canonical decimal digits (`-0` is `0`).
    Int(String),
    Float(f64),
    Bool(bool),
    None,
}

impl PyValue {
    /// `d[key]` for a dict: `None` when this is not a dict or the key is absent.
    pub fn get(&self, key: &str) -> Option<&PyValue> {
        match self {
            PyValue::Dict(items) => items.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Python's type name, for error messages (`'str' object ...`).
    pub fn type_name(&self) -> &'static str {
        match self {
            PyValue::Dict(_) => "dict",
            PyValue::List(_) => "list",
            PyValue::Str(_) => "str",
            PyValue::Int(_) => "int",
            PyValue::Float(_) => "float",
            PyValue::Bool(_) => "bool",
            PyValue::None => "NoneType",
        }
    }

    /// Python `str(v)`. Exact for str, bool, None, int and float; containers use a
    /// close approximation of `repr` (only non-ASCII non-printables may differ).
    pub fn py_str(&self) -> String {
        match self {
            PyValue::Str(s) => s.clone(),
            other => other.py_repr(),
        }
    }

    /// Python `repr(v)` (see [`PyValue::py_str`] for its precision).
    pub fn py_repr(&self) -> String {
        match self {
            PyValue::Str(s) => repr_str(s),
            PyValue::Int(d) => d.clone(),
            PyValue::Float(f) => repr_float(*f),
            PyValue::Bool(true) => "True".into(),
            PyValue::Bool(false) => "False".into(),
            PyValue::None => "None".into(),
            PyValue::List(items) => {
                format!("[{}]", items.iter().map(PyValue::py_repr).collect::<Vec<_>>().join(", "))
            }
            PyValue::Dict(items) => format!(
                "{{{}}}",
                items
                    .iter()
                    .map(|(k, v)| format!("{}: {}", repr_str(k), v.py_repr()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python `repr(float)`: shortest round-trip digits, scientific notation when the
/// decimal exponent is below -4 or at least 16.
fn repr_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "d.ddde<exp>".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    let body = if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let m = if rest.is_empty() { first.to_string() } else { format!("{first}.{rest}") };
        format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    } else if exp < 0 {
        format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
    } else {
        let point = exp as usize + 1;
        if digits.len() <= point {
            format!("{digits}{}.0", "0".repeat(point - digits.len()))
        } else {
            format!("{}.{}", &digits[..point], &digits[point..])
        }
    };
    format!("{sign}{body}")
}

/// What `json.loads` can raise.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PyJsonError {
    /// `json.JSONDecodeError`, displayed as Python's `str(e)`.
    #[error("{msg}: line {lineno} column {colno} (char {pos})")]
    Decode { msg: String, pos: usize, lineno: usize, colno: usize },
    /// `RecursionError` from nesting deeper than [`MAX_DEPTH`].
    #[error("maximum recursion depth exceeded while decoding a JSON document")]
    Recursion,
}

impl PyJsonError {
    fn decode(doc: &[char], msg: &str, pos: usize) -> PyJsonError {
        let before = &doc[..pos.min(doc.len())];
        let lineno = before.iter().filter(|&&c| c == '\n').count() + 1;
        let colno = match before.iter().rposition(|&c| c == '\n') {
            Some(nl) => pos - nl,
            None => pos + 1,
        };
        PyJsonError::Decode { msg: msg.to_string(), pos, lineno, colno }
    }

    /// The bare message (`e.msg`), e.g. `Expecting ',' delimiter`.
    pub fn msg(&self) -> &str {
        match self {
            PyJsonError::Decode { msg, .. } => msg,
            PyJsonError::Recursion => "maximum recursion depth exceeded",
        }
    }

    /// The character position (`e.pos`), for decode errors.
    pub fn pos(&self) -> Option<usize> {
        match self {
            PyJsonError::Decode { pos, .. } => Some(*pos),
            PyJsonError::Recursion => None,
        }
    }
}

/// Python `json.loads(s)` (`strict=True`) or `json.loads(s, strict=False)`.
pub fn loads(s: &str, strict: bool) -> Result<PyValue, PyJsonError> {
    let doc: Vec<char> = s.chars().collect();
    if doc.first() == Some(&'\u{feff}') {
        return Err(PyJsonError::decode(&doc, "Unexpected UTF-8 BOM (decode using utf-8-sig)", 0));
    }
    let start = skip_ws(&doc, 0);
    let (value, end) = raw_decode(&doc, start, strict)?;
    let end = skip_ws(&doc, end);
    if end != doc.len() {
        return Err(PyJsonError::decode(&doc, "Extra data", end));
    }
    Ok(value)
}

/// `JSONDecoder.raw_decode(s, idx)` on a char slice: one value starting exactly at
/// `idx`, returning it and the index after it.
pub fn raw_decode(doc: &[char], idx: usize, strict: bool) -> Result<(PyValue, usize), PyJsonError> {
    let scanner = Scanner { doc, strict };
    scanner.scan_once(idx, 0).map_err(|e| match e {
        Scan::Stop(pos) => PyJsonError::decode(doc, "Expecting value", pos),
        Scan::Err(e) => e,
    })
}

/// The JSON whitespace of Python's decoder: only space, tab, LF and CR.
fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

fn skip_ws(doc: &[char], mut i: usize) -> usize {
    while i < doc.len() && is_ws(doc[i]) {
        i += 1;
    }
    i
}

/// The scanner's two ways to fail: `StopIteration(idx)` ("no value here") and a raised error.
enum Scan {
    Stop(usize),
    Err(PyJsonError),
}

struct Scanner<'a> {
    doc: &'a [char],
    strict: bool,
}

impl Scanner<'_> {
    fn err(&self, msg: &str, pos: usize) -> Scan {
        Scan::Err(PyJsonError::decode(self.doc, msg, pos))
    }

    fn at(&self, i: usize) -> Option<char> {
        self.doc.get(i).copied()
    }

    fn starts_with(&self, i: usize, lit: &str) -> bool {
        lit.chars().enumerate().all(|(k, c)| self.at(i + k) == Some(c))
    }

    /// `scan_once_unicode`.
    fn scan_once(&self, idx: usize, depth: usize) -> Result<(PyValue, usize), Scan> {
        let len = self.doc.len();
        let Some(c) = self.at(idx) else { return Err(Scan::Stop(idx)) };
        match c {
            '"' => {
                let (s, end) = self.scan_string(idx + 1)?;
                return Ok((PyValue::Str(s), end));
            }
            '{' | '[' => {
                if depth >= MAX_DEPTH {
                    return Err(Scan::Err(PyJsonError::Recursion));
                }
                return if c == '{' {
                    self.parse_object(idx + 1, depth + 1)
                } else {
                    self.parse_array(idx + 1, depth + 1)
                };
            }
            // CPython checks `idx + n < length` before comparing the literal's tail.
            'n' if idx + 3 < len && self.starts_with(idx, "null") => {
                return Ok((PyValue::None, idx + 4))
            }
            't' if idx + 3 < len && self.starts_with(idx, "true") => {
                return Ok((PyValue::Bool(true), idx + 4))
            }
            'f' if idx + 4 < len && self.starts_with(idx, "false") => {
                return Ok((PyValue::Bool(false), idx + 5))
            }
            'N' if idx + 2 < len && self.starts_with(idx, "NaN") => {
                return Ok((PyValue::Float(f64::NAN), idx + 3))
            }
            'I' if idx + 7 < len && self.starts_with(idx, "Infinity") => {
                return Ok((PyValue::Float(f64::INFINITY), idx + 8))
            }
            '-' if idx + 8 < len && self.starts_with(idx, "-Infinity") => {
                return Ok((PyValue::Float(f64::NEG_INFINITY), idx + 9))
            }
            _ => {}
        }
        self.match_number(idx)
    }

    /// `_match_number_unicode`.
    fn match_number(&self, start: usize) -> Result<(PyValue, usize), Scan> {
        let digit = |i: usize| self.at(i).is_some_and(|c| c.is_ascii_digit());
        let len = self.doc.len();
        let mut idx = start;
        if self.at(idx) == Some('-') {
            idx += 1;
            if idx >= len {
                return Err(Scan::Stop(start));
            }
        }
        match self.at(idx) {
            Some('1'..='9') => {
                idx += 1;
                while digit(idx) {
                    idx += 1;
                }
            }
            Some('0') => idx += 1,
            _ => return Err(Scan::Stop(start)),
        }
        let mut is_float = false;
        if idx + 1 < len && self.at(idx) == Some('.') && digit(idx + 1) {
            is_float = true;
            idx += 2;
            while digit(idx) {
                idx += 1;
            }
        }
        if idx + 1 < len && matches!(self.at(idx), Some('e' | 'E')) {
            let e_start = idx;
            idx += 1;
            if idx + 1 < len && matches!(self.at(idx), Some('-' | '+')) {
                idx += 1;
            }
            while digit(idx) {
                idx += 1;
            }
            if digit(idx - 1) {
                is_float = true;
            } else {
                idx = e_start;
            }
        }
        let text: String = self.doc[start..idx].iter().collect();
        let value = if is_float {
            // The digits matched above always form a valid float literal.
            PyValue::Float(text.parse().unwrap_or(f64::NAN))
        } else {
            let (neg, digits) = match text.strip_prefix('-') {
                Some(d) => (true, d),
                None => (false, text.as_str()),
            };
            PyValue::Int(if neg && digits != "0" {
                format!("-{digits}")
            } else {
                digits.to_string()
            })
        };
        Ok((value, idx))
    }

    /// `scanstring_unicode`: `end` is the index just after the opening quote.
    fn scan_string(&self, mut end: usize) -> Result<(String, usize), Scan> {
        let doc = self.doc;
        let len = doc.len();
        let begin = end - 1;
        let mut out = String::new();
        loop {
            let mut next = end;
            let mut c = None;
            while next < len {
                let d = doc[next];
                if d == '"' || d == '\\' {
                    c = Some(d);
                    break;
                }
                if (d as u32) <= 0x1f && self.strict {
                    return Err(self.err("Invalid control character at", next));
                }
                next += 1;
            }
            let Some(c) = c else { return Err(self.err("Unterminated string starting at", begin)) };
            out.extend(&doc[end..next]);
            next += 1;
            if c == '"' {
                return Ok((out, next));
            }
            if next == len {
                return Err(self.err("Unterminated string starting at", begin));
            }
            let esc = doc[next];
            if esc != 'u' {
                end = next + 1;
                let ch = match esc {
                    '"' => '"',
                    '\\' => '\\',
                    '/' => '/',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    _ => return Err(self.err("Invalid \\escape", end - 2)),
                };
                out.push(ch);
                continue;
            }
            next += 1;
            end = next + 4;
            if end >= len {
                return Err(self.err("Invalid \\uXXXX escape", next - 1));
            }
            let Some(mut cp) = hex4(&doc[next..end]) else {
                return Err(self.err("Invalid \\uXXXX escape", end - 5));
            };
            if (0xD800..=0xDBFF).contains(&cp)
                && end + 6 < len
                && doc[end] == '\\'
                && doc[end + 1] == 'u'
            {
                let second_end = end + 6;
                let Some(low) = hex4(&doc[end + 2..second_end]) else {
                    return Err(self.err("Invalid \\uXXXX escape", second_end - 5));
                };
                if (0xDC00..=0xDFFF).contains(&low) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                    end = second_end;
                }
            }
            out.push(char::from_u32(cp).unwrap_or('\u{FFFD}'));
        }
    }

    /// `_parse_object_unicode`: `idx` is just after `{`.
    fn parse_object(&self, mut idx: usize, depth: usize) -> Result<(PyValue, usize), Scan> {
        let mut items: Vec<(String, PyValue)> = Vec::new();
        idx = skip_ws(self.doc, idx);
        if self.at(idx) != Some('}') {
            loop {
                if self.at(idx) != Some('"') {
                    return Err(self.err("Expecting property name enclosed in double quotes", idx));
                }
                let (key, next) = self.scan_string(idx + 1)?;
                idx = skip_ws(self.doc, next);
                if self.at(idx) != Some(':') {
                    return Err(self.err("Expecting ':' delimiter", idx));
                }
                idx = skip_ws(self.doc, idx + 1);
                let (value, next) = self.scan_once(idx, depth)?;
                match items.iter_mut().find(|(k, _)| *k == key) {
                    Some(slot) => slot.1 = value,
                    None => items.push((key, value)),
                }
                idx = skip_ws(self.doc, next);
                if self.at(idx) == Some('}') {
                    break;
                }
                if self.at(idx) != Some(',') {
                    return Err(self.err("Expecting ',' delimiter", idx));
                }
                idx = skip_ws(self.doc, idx + 1);
            }
        }
        Ok((PyValue::Dict(items), idx + 1))
    }

    /// `_parse_array_unicode`: `idx` is just after `[`.
    fn parse_array(&self, mut idx: usize, depth: usize) -> Result<(PyValue, usize), Scan> {
        let mut items = Vec::new();
        idx = skip_ws(self.doc, idx);
        if self.at(idx) != Some(']') {
            loop {
                let (value, next) = self.scan_once(idx, depth)?;
                items.push(value);
                idx = skip_ws(self.doc, next);
                if self.at(idx) == Some(']') {
                    break;
                }
                if self.at(idx) != Some(',') {
                    return Err(self.err("Expecting ',' delimiter", idx));
                }
                idx = skip_ws(self.doc, idx + 1);
            }
        }
        Ok((PyValue::List(items), idx + 1))
    }
}

fn hex4(digits: &[char]) -> Option<u32> {
    digits.iter().try_fold(0u32, |acc, c| c.to_digit(16).map(|d| (acc << 4) | d))
}

#[cfg(test)]
mod tests;
