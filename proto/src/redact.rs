//! Redaction of secrets from text that goes into logs, errors and dead-letter records.
//!
//! Three functions, all pure:
//! - [`url`]: a URL with its credentials removed: the user-info part (`user:pass@`) and
//!   the values of query parameters whose name says they hold a secret (`key`, `token`,
//!   `secret`, `password`, `sig`…).
//! - [`secrets`]: any text (an error body, a message) with everything that looks like a
//!   key replaced by `[redacted]`: credentials inside URLs, `Bearer …` tokens, tokens
//!   with a known key prefix (`sk-…`, `ghp_…`, `hf_…`, `AIza…`, `xoxb-…`, `AKIA…`), and
//!   long high-entropy tokens (24 or more characters of letters, digits, `_-+`, with at
//!   least one letter, one digit and ten distinct characters).
//! - [`terminal`]: text from the broker (a worker's id, an error message) made safe to
//!   print on a terminal: control characters (escape sequences, carriage returns, line
//!   breaks that would forge lines) and bidirectional overrides become `\u{..}` escapes.
//!
//! The heuristics favour hiding too much: a request id or a hash in an error body is
//! redacted too. They cannot know every secret format (a short password in free text
//! passes); the rule that matters is upstream: keys are never put in messages, URLs or
//! results by Halyard itself.

/// `s` with every control character (C0 and C1, line and paragraph separators) and every
/// bidirectional formatting character written as a visible `\u{XX}` escape, so that text
/// another process published cannot move the cursor, recolour, clear or rewrite a
/// terminal, or forge a line of output (issue 33).
pub fn terminal(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
    };
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// What replaces a secret.
pub const REDACTED: &str = "[redacted]";

/// Query parameter names (lowercase, substring match) whose values are secrets.
const SECRET_PARAMS: &[&str] =
    &["key", "token", "secret", "password", "passwd", "pwd", "sig", "auth", "credential"];

/// Prefixes of well-known API key formats.
const KEY_PREFIXES: &[&str] =
    &["sk-", "sk_", "rk_", "pk_", "ghp_", "gho_", "hf_", "xoxb-", "xoxp-", "AIza", "AKIA"];

/// `s` with the credentials of every URL in it removed, and key-like text redacted.
pub fn url(s: &str) -> String {
    secrets(s)
}

/// `s` with everything that looks like a secret replaced by [`REDACTED`].
pub fn secrets(s: &str) -> String {
    let s = userinfo(s);
    let s = query_params(&s);
    let s = bearer(&s);
    tokens(&s)
}

/// Remove `user:pass@` after every `://`.
fn userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| {
                c == '/' || c == '?' || c == '#' || c.is_whitespace() || "\"'<>".contains(c)
            })
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str(REDACTED);
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Redact the values of secret-looking query (or form) parameters: `name=value` where
/// `name` follows `?`, `&` or `;` and contains one of [`SECRET_PARAMS`].
fn query_params(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.char_indices().peekable();
    let mut last = 0;
    while let Some((i, c)) = chars.next() {
        if !matches!(c, '?' | '&' | ';') {
            continue;
        }
        let name_start = i + 1;
        let Some(eq) = s[name_start..].find('=').map(|e| name_start + e) else { break };
        let name = &s[name_start..eq];
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            continue;
        }
        let lower = name.to_ascii_lowercase();
        if !SECRET_PARAMS.iter().any(|p| lower.contains(p)) {
            continue;
        }
        let value_end = s[eq + 1..]
            .find(|c: char| c == '&' || c == '#' || c.is_whitespace() || "\"'<>;".contains(c))
            .map_or(s.len(), |e| eq + 1 + e);
        if value_end > eq + 1 {
            out.push_str(&s[last..eq + 1]);
            out.push_str(REDACTED);
            last = value_end;
            while chars.peek().is_some_and(|(j, _)| *j < value_end) {
                chars.next();
            }
        }
    }
    out.push_str(&s[last..]);
    out
}

/// Redact the token after every `Bearer ` (any case).
fn bearer(s: &str) -> String {
    let lower = s.to_ascii_lowercase();
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    let mut from = 0;
    while let Some(i) = lower[from..].find("bearer").map(|i| from + i) {
        let after = i + "bearer".len();
        let ws = s[after..].len() - s[after..].trim_start().len();
        let start = after + ws;
        let end = s[start..]
            .find(|c: char| c.is_whitespace() || "\"',;}]".contains(c))
            .map_or(s.len(), |e| start + e);
        if ws > 0 && end > start {
            out.push_str(&s[last..start]);
            out.push_str(REDACTED);
            last = end;
        }
        from = end.max(after);
    }
    out.push_str(&s[last..]);
    out
}

fn token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+')
}

/// Whether a token (a run of [`token_char`]s) looks like a key.
fn looks_like_key(t: &str) -> bool {
    if KEY_PREFIXES.iter().any(|p| t.starts_with(p) && t.len() >= p.len() + 8) {
        return true;
    }
    if t.len() < 24 {
        return false;
    }
    let digit = t.bytes().any(|b| b.is_ascii_digit());
    let letter = t.bytes().any(|b| b.is_ascii_alphabetic());
    let mut seen = [false; 128];
    let distinct = t.bytes().filter(|b| !std::mem::replace(&mut seen[*b as usize], true)).count();
    digit && letter && distinct >= 10
}

/// Redact key-like tokens.
fn tokens(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find(token_char) {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let end = tail.find(|c: char| !token_char(c)).unwrap_or(tail.len());
        let t = &tail[..end];
        out.push_str(if looks_like_key(t) { REDACTED } else { t });
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {

    /// Issue 33: escape sequences, carriage returns, forged lines and bidi overrides from
    /// the broker print as visible escapes; ordinary text (accents, CJK) is untouched.
    #[test]
    fn terminal_text_cannot_steer_the_terminal() {
        assert!(matches!(terminal("worker-7 déjà 工作"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(terminal("\u{1b}[2J\u{1b}[31mok"), "\\u{1b}[2J\\u{1b}[31mok");
        assert_eq!(terminal("a\rb\nrun x: complete"), "a\\u{d}b\\u{a}run x: complete");
        assert_eq!(terminal("\u{202e}txt.exe"), "\\u{202e}txt.exe");
        assert_eq!(terminal("\u{9b}31m"), "\\u{9b}31m", "C1 CSI");
        assert!(!terminal("x\u{7}\u{0}\u{2028}y")
            .chars()
            .any(|c| c.is_control() || c == '\u{2028}'));
    }

    use super::*;

    /// User-info and secret query parameters leave URLs; the rest stays readable.
    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(url("https://api.x.com/v1"), "https://api.x.com/v1");
        assert_eq!(url("http://user:hunter2@host:8080/v1"), "http://[redacted]@host:8080/v1");
        assert_eq!(url("nats://tok@127.0.0.1:4222"), "nats://[redacted]@127.0.0.1:4222");
        assert_eq!(
            url("https://h/v1?api_key=abc&model=m&sig=xyz"),
            "https://h/v1?api_key=[redacted]&model=m&sig=[redacted]"
        );
        assert_eq!(url("a://x@y, b://p:q@z/w"), "a://[redacted]@y, b://[redacted]@z/w");
    }

    /// Keys in error bodies are redacted: prefixes, Bearer tokens, long random tokens;
    /// ordinary words, numbers and short ids stay.
    #[test]
    fn key_like_text_is_redacted() {
        let body = r#"{"error":{"message":"Incorrect API key provided: sk-proj-AbCdEf123456. Header was Bearer abc.def-ghi","code":"invalid_api_key"}}"#;
        let r = secrets(body);
        assert!(!r.contains("sk-proj-AbCdEf123456"), "{r}");
        assert!(!r.contains("abc.def-ghi"), "{r}");
        assert!(r.contains("Incorrect API key provided") && r.contains("invalid_api_key"), "{r}");
        let long = "token Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0 end";
        assert_eq!(secrets(long), "token [redacted] end");
        for keep in [
            "The model `gpt-4o-mini-2024-07-18` does not exist",
            "rate limit of 10000 tokens per minute exceeded; retry in 20s",
            "internationalization-localization-considerations",
            "",
        ] {
            assert_eq!(secrets(keep), keep);
        }
        assert_eq!(secrets("ghp_abcdefgh12"), REDACTED);
        assert_eq!(secrets("AUTHORIZATION: bearer  x"), "AUTHORIZATION: bearer  [redacted]");
    }

    /// Odd input never panics and multi-byte text survives.
    #[test]
    fn odd_input_is_safe() {
        for s in ["?", "&=", "?key=", "://", "bearer", "Bearer ", "ü://ä@ö?key=é", "a?b&c=d"] {
            let _ = secrets(s);
        }
        assert_eq!(secrets("naïve café ✓"), "naïve café ✓");
        assert_eq!(secrets("x://ä:ö@h"), "x://[redacted]@h");
    }
}
