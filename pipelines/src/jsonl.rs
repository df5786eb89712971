//! Line-oriented dataset files (JSON Lines): reading one, and walking its lines with
//! errors that name the file and the line.

use std::path::Path;

/// A dataset file that cannot be read, or a line of it that is not a valid row: every
/// line-oriented reader of this crate (AutoHall, ChainPoll, UHGEval, HVI) reports with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("{file}:{line}: {reason}")]
    Line { file: String, line: usize, reason: String },
}

/// The file's name (as errors show it) and its text.
pub fn read(path: &Path) -> Result<(String, String), DatasetError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| DatasetError::Read { file: file.clone(), reason: e.to_string() })?;
    Ok((file, text))
}

/// Calls `f(line number, line)` for every non-blank line (1-based numbers); the first
/// `Err(reason)` becomes a [`DatasetError::Line`] naming `file` and the line.
pub fn each_line(
    file: &str,
    text: &str,
    mut f: impl FnMut(usize, &str) -> Result<(), String>,
) -> Result<(), DatasetError> {
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        f(i + 1, line).map_err(|reason| DatasetError::Line {
            file: file.to_string(),
            line: i + 1,
            reason,
        })?;
    }
    Ok(())
}
