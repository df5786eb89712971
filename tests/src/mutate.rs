//! Mutations of valid inputs for property tests: the kinds of damage a real file or
//! response gets (truncation, a lost or doubled character, a stray token such as a bare
//! `NaN`, a broken quote or bracket, a NUL, a non-ASCII letter).
//!
//! Each operation is `(kind, position, token)`, plain integers, so that any generator
//! (proptest's `any::<Vec<(u8, usize, u32)>>()`, say) can drive it.

/// Tokens inserted or substituted by [`mutate`].
pub const TOKENS: &[&str] = &[
    "NaN",
    "Infinity",
    "-",
    "\"",
    "'",
    "{",
    "}",
    "[",
    "]",
    "[[",
    ",",
    ":",
    "=",
    "\n",
    "\r\n",
    "\0",
    "\\",
    "\\u",
    "é",
    "💥",
    "null",
    "true",
    "-1",
    "0",
    "1e999",
    "99999999999999999999",
    "\"\"",
    "{}",
    "[]",
    "#",
    "```",
    "\t",
];

/// Apply `ops` to `text` in order; positions wrap around the current length and snap to
/// character boundaries.
pub fn mutate(text: &str, ops: &[(u8, usize, u32)]) -> String {
    let mut s = text.to_string();
    for &(kind, pos, tok) in ops {
        let chars: Vec<(usize, char)> = s.char_indices().collect();
        let at = if chars.is_empty() { 0 } else { chars[pos % chars.len()].0 };
        let token = TOKENS[tok as usize % TOKENS.len()];
        match kind % 6 {
            0 => s.truncate(at),
            1 => {
                if let Some(c) = s[at..].chars().next() {
                    s.replace_range(at..at + c.len_utf8(), "");
                }
            }
            2 => s.insert_str(at, token),
            3 => {
                let end = s[at..].chars().next().map_or(at, |c| at + c.len_utf8());
                s.replace_range(at..end, token);
            }
            4 => {
                // Double a stretch of up to 16 characters.
                let stretch: String = s[at..].chars().take(1 + tok as usize % 16).collect();
                s.insert_str(at, &stretch);
            }
            _ => {
                // Swap the rest of a line with a random token (a line cut mid-way).
                let end = s[at..].find('\n').map_or(s.len(), |i| at + i);
                s.replace_range(at..end, token);
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_stay_on_char_boundaries() {
        let text = "héllo 💥 wörld\nline two";
        for kind in 0..6u8 {
            for pos in 0..40usize {
                for tok in 0..TOKENS.len() as u32 {
                    let _ =
                        mutate(text, &[(kind, pos, tok), (kind.wrapping_add(1), pos * 7, tok + 3)]);
                }
            }
        }
        assert_eq!(mutate("abc", &[(0, 1, 0)]), "a");
        assert_eq!(mutate("abc", &[(2, 0, 0)]), "NaNabc");
        assert_eq!(mutate("ab\ncd", &[(5, 1, 10)]), "a,\ncd");
    }
}
