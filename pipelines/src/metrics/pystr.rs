//! The few Python `str` semantics the reference implementations rely on.

/// Python `str.isspace()` for one character: `char::is_whitespace` plus U+001C..U+001F
/// (the information separators, which Python counts as whitespace and Rust does not).
pub(crate) fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1C}'..='\u{1F}').contains(&c)
}

/// Python `str.strip()` with no argument.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(py_isspace)
}

/// Python `len(s)`: the number of Unicode code points.
pub(crate) fn py_len(s: &str) -> usize {
    s.chars().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `py_strip` removes the separators U+001C..U+001F and ideographic spaces like Python.
    #[test]
    fn strip_matches_python_whitespace() {
        assert_eq!(py_strip("\u{1C}\u{3000} a b\u{85}\n"), "a b");
        assert_eq!(
            py_strip("\u{200B}x"),
            "\u{200B}x",
            "zero-width space is not whitespace in Python"
        );
    }
}
