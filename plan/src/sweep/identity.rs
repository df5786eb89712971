//! Location-independent identities of local model files and folders: job ids use them,
//! so workers that keep the same model under another path share checkpoints and
//! de-duplication, and a sweep can name a model file a coordinator cannot open.

use std::path::Path;

/// A location-independent identity of a model file: name, size and a hash of its first
/// MiB (the GGUF header, metadata and vocabulary). Job ids use it, so workers that keep
/// the same file under another path share checkpoints and de-duplication.
pub fn gguf_identity(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let size = f.metadata()?.len();
    let mut head = Vec::with_capacity(1 << 20);
    (&mut f).take(1 << 20).read_to_end(&mut head)?;
    if head.len() < 4 || &head[..4] != b"GGUF" {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a GGUF file (no GGUF magic)",
        ));
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let h = blake3::hash(&head);
    let hex: String = h.as_bytes()[..8].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("gguf:{name}:{size}:{hex}"))
}

/// Whether `id` has the form [`gguf_identity`] gives: `gguf:<name>:<size>:<16 hex digits>`.
pub(super) fn check_identity_form(id: &str) -> Result<(), String> {
    let bad = || {
        format!(
            "{id:?} is not a model file identity (gguf:<file name>:<size>:<16 hex digits>, as \
             `halyard identity FILE` prints it)"
        )
    };
    let rest = id.strip_prefix("gguf:").ok_or_else(bad)?;
    let mut parts = rest.rsplitn(3, ':');
    let (hex, size, name) = (parts.next(), parts.next(), parts.next());
    match (hex, size, name) {
        (Some(h), Some(n), Some(name))
            if h.len() == 16
                && h.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                && n.parse::<u64>().is_ok()
                && !name.is_empty() =>
        {
            Ok(())
        }
        _ => Err(bad()),
    }
}

/// Check that the file at `path` is the model `identity` names (a worker about to load it):
/// an error naming both when it is another file, or when it cannot be read.
pub fn check_identity(path: &Path, identity: &str) -> Result<(), String> {
    match gguf_identity(path) {
        Ok(id) if id == identity => Ok(()),
        Ok(id) => Err(format!(
            "{} is {id}, but the sweep names {identity}: another file (or version) than the \
             one the sweep was written for; its results would not be the sweep's",
            path.display()
        )),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// A location-independent identity of an embedding-model folder: name, the size of its
/// weights and a hash of its config and tokenizer.
pub fn embed_identity(dir: &Path) -> std::io::Result<String> {
    let weights = std::fs::metadata(dir.join("model.safetensors"))?.len();
    let mut h = blake3::Hasher::new();
    h.update(&std::fs::read(dir.join("config.json"))?);
    h.update(&std::fs::read(dir.join("tokenizer.json"))?);
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let hex: String = h.finalize().as_bytes()[..8].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("embed:{name}:{weights}:{hex}"))
}
