//! What is wrong with a sweep file, naming the file and the key.

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("cannot read sweep file {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("{file}: {reason}")]
    Syntax { file: String, reason: String },
    #[error("{file}: key `{key}`: {reason}")]
    Key { file: String, key: String, reason: String },
    #[error("{file}: key `{key}`: dataset {dataset}: {reason}")]
    Dataset { file: String, key: String, dataset: String, reason: String },
}

/// An error about key `key` of sweep file `file`.
pub fn key_err(file: &str, key: impl Into<String>, reason: impl Into<String>) -> SweepError {
    SweepError::Key { file: file.to_string(), key: key.into(), reason: reason.into() }
}
