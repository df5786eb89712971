//! `backend = "replay"`: a model that answers from recorded results (a JSONL file of
//! request/response pairs, or a Halyard worker checkpoint).

use std::path::Path;

use halyard_proto::pool::{ReplaySource, ReplaySpec};

use super::error::{key_err, SweepError};
use super::identity::gguf_identity;

/// The keys of a `[[model]]` that [`replay_model`] reads.
pub(super) struct ReplayKeys<'a> {
    pub backend: &'a str,
    pub base_url: Option<&'a str>,
    pub recordings: Option<&'a String>,
    pub recorded_backend: Option<&'a String>,
    pub recorded_endpoint: Option<&'a String>,
}

/// `backend = "replay"`: `recordings` (a `.jsonl` file, or a checkpoint directory with
/// `recorded_endpoint` and optional `recorded_backend`); these keys on another backend
/// are errors.
pub(super) fn replay_model(
    f: &str,
    base: &Path,
    i: usize,
    m: ReplayKeys<'_>,
) -> Result<Option<ReplaySpec>, SweepError> {
    let k = |field: &str| format!("model[{i}].{field}");
    if m.backend != "replay" {
        for (key, set) in [
            ("recordings", m.recordings.is_some()),
            ("recorded_backend", m.recorded_backend.is_some()),
            ("recorded_endpoint", m.recorded_endpoint.is_some()),
        ] {
            if set {
                return Err(key_err(f, k(key), "only applies to backend \"replay\""));
            }
        }
        return Ok(None);
    }
    if m.base_url.is_some() {
        return Err(key_err(
            f,
            k("base_url"),
            "does not apply to backend \"replay\" (it calls nothing)",
        ));
    }
    let rel = m.recordings.ok_or_else(|| {
        key_err(f, k("recordings"), "required for backend \"replay\": a JSONL file of request/response pairs or a Halyard checkpoint directory")
    })?;
    let path = base.join(rel);
    let source = if path.is_dir() {
        let backend = m.recorded_backend.cloned().unwrap_or_else(|| "openai".into());
        let given = m.recorded_endpoint.cloned().ok_or_else(|| {
            key_err(f, k("recorded_endpoint"), "required when `recordings` is a checkpoint: the base_url (or model_path for gguf) of the recorded model")
        })?;
        let endpoint = match backend.as_str() {
            "openai" => given.trim_end_matches('/').to_string(),
            "gguf" => gguf_identity(&base.join(&given))
                .map_err(|e| key_err(f, k("recorded_endpoint"), format!("{given}: {e}")))?,
            other => {
                return Err(key_err(
                    f,
                    k("recorded_backend"),
                    format!("{other:?} is not \"openai\" or \"gguf\""),
                ))
            }
        };
        ReplaySource::Checkpoint { dir: path.clone(), backend, endpoint }
    } else if path.is_file() {
        for (key, set) in [
            ("recorded_backend", m.recorded_backend.is_some()),
            ("recorded_endpoint", m.recorded_endpoint.is_some()),
        ] {
            if set {
                return Err(key_err(
                    f,
                    k(key),
                    "only applies when `recordings` is a checkpoint directory",
                ));
            }
        }
        ReplaySource::Jsonl(path.clone())
    } else {
        return Err(key_err(
            f,
            k("recordings"),
            format!("{}: no such file or directory", path.display()),
        ));
    };
    // The absolute path, so that the job ids do not depend on the working directory.
    let identity = std::fs::canonicalize(&path).unwrap_or(path);
    Ok(Some(ReplaySpec { endpoint: format!("replay:{}", identity.display()), source }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::sweep::{parse, Sweep};

    fn sweep(extra_model: &str) -> Result<Sweep, SweepError> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let text = format!(
            "name = \"t\"\n[[model]]\nname = \"m\"\nbackend = \"noop\"\n{extra_model}\n[[benchmark]]\n{}\n",
            AH.replace("ROOT", &root.display().to_string())
        );
        parse(&root.join("s.toml"), &text)
    }

    const AH: &str = "pipeline = \"autohall\"\ndataset = \"ROOT/datasets/autohall/pubhealth_sample.jsonl\"\nmodels = [\"m\"]";

    /// Replay models: a JSONL file or a checkpoint directory (which needs the recorded
    /// endpoint); replay keys on other backends and missing recordings are errors.
    #[test]
    fn replay_models() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").display().to_string();
        let r = |extra: &str| format!("[[model]]\nname = \"r\"\nbackend = \"replay\"\n{extra}");
        let s =
            sweep(&r(&format!("recordings = \"{root}/datasets/autohall/climate_sample.jsonl\"")))
                .unwrap();
        assert!(matches!(s.models[1].replay.as_ref().unwrap().source, ReplaySource::Jsonl(_)));
        assert!(s.models[1].spec.model_ref.endpoint.starts_with("replay:"));
        let s = sweep(&r(&format!(
            "recordings = \"{root}/datasets\"\nrecorded_endpoint = \"http://x/v1/\""
        )))
        .unwrap();
        let ReplaySource::Checkpoint { endpoint, backend, .. } =
            &s.models[1].replay.as_ref().unwrap().source
        else {
            panic!()
        };
        assert_eq!((backend.as_str(), endpoint.as_str()), ("openai", "http://x/v1"));
        for (extra, needle) in [
            (r(""), "model[1].recordings`: required"),
            (r("recordings = \"nope.jsonl\""), "no such file"),
            (
                r(&format!("recordings = \"{root}/datasets\"")),
                "model[1].recorded_endpoint`: required",
            ),
            (
                r(&format!("recordings = \"{root}/README.md\"\nrecorded_endpoint = \"x\"")),
                "only applies when `recordings` is a checkpoint",
            ),
            (
                "[[model]]\nname = \"r\"\nbackend = \"noop\"\nrecordings = \"x\"".to_string(),
                "model[1].recordings`: only applies to backend \"replay\"",
            ),
        ] {
            let e = sweep(&extra).expect_err("must be rejected").to_string();
            assert!(e.contains(needle), "{needle:?} not in {e:?}");
        }
    }
}
