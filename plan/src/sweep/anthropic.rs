//! The sweep keys of `backend = "anthropic"` (issue 52): Anthropic's Messages API
//! requires `max_tokens` and takes `temperature` in 0..=1; `prompt_cache` (`"5m"` or
//! `"1h"`) marks the shared prefix of its requests (the system prompt) for the provider's
//! prompt cache, with that lifetime; `structured_output = true` uses the API's structured
//! outputs (`output_config.format`), which the Claude 3 and the first Claude 4 models
//! (Sonnet 4, Opus 4) do not have: those are refused, naming the model.

use halyard_proto::pool::PromptCacheTtl;

use super::error::{key_err, SweepError};
use super::models::RawModel;

/// API model names (prefixes) without structured outputs.
const NO_STRUCTURED_OUTPUT: [&str; 5] = [
    "claude-3",
    "claude-sonnet-4-0",
    "claude-sonnet-4-2025",
    "claude-opus-4-0",
    "claude-opus-4-2025",
];

/// Check model `i`'s Anthropic keys (`max_tokens` and `structured_output` as already
/// checked); returns its prompt cache lifetime.
pub(super) fn check(
    f: &str,
    i: usize,
    m: &RawModel,
    api_model: &str,
    max_tokens: Option<u32>,
    structured_output: bool,
) -> Result<Option<PromptCacheTtl>, SweepError> {
    let k = |field: &str| format!("model[{i}].{field}");
    if m.backend != "anthropic" {
        if m.prompt_cache.is_some() {
            return Err(key_err(f, k("prompt_cache"), "only applies to backend \"anthropic\""));
        }
        return Ok(None);
    }
    if max_tokens.is_none() {
        return Err(key_err(
            f,
            k("max_tokens"),
            "required for backend \"anthropic\" (the Messages API requires it)",
        ));
    }
    if let Some(t) = m.temperature.filter(|t| *t > 1.0) {
        return Err(key_err(
            f,
            k("temperature"),
            format!("{t} is outside 0..=1 (Anthropic's range)"),
        ));
    }
    if structured_output && NO_STRUCTURED_OUTPUT.iter().any(|p| api_model.starts_with(p)) {
        return Err(key_err(
            f,
            k("structured_output"),
            format!(
                "model {api_model:?} has no structured outputs (Anthropic's `output_config.format`); \
                 use a Claude model that has them (Sonnet 4.5, Haiku 4.5, Opus 4.1 or later) or \
                 leave structured_output off"
            ),
        ));
    }
    match m.prompt_cache.as_deref() {
        None => Ok(None),
        Some("5m") => Ok(Some(PromptCacheTtl::FiveMinutes)),
        Some("1h") => Ok(Some(PromptCacheTtl::OneHour)),
        Some(other) => Err(key_err(
            f,
            k("prompt_cache"),
            format!("{other:?} is not a cache lifetime (\"5m\" or \"1h\")"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{parse, Sweep, SweepError};
    use super::*;

    fn sweep(keys: &str) -> Result<Sweep, SweepError> {
        let text = format!(
            "name = \"a\"\n[[model]]\nname = \"c\"\nbackend = \"anthropic\"\nbase_url = \"https://api.anthropic.com/v1\"\nmodel = \"claude-sonnet-4-5\"\n{keys}\n\n\
             [[model]]\nname = \"free\"\nbackend = \"noop\"\n\n[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"free\"]\n"
        );
        parse(Path::new("a.toml"), &text)
    }

    fn key_error(r: Result<Sweep, SweepError>) -> (String, String) {
        match r {
            Err(SweepError::Key { key, reason, .. }) => (key, reason),
            other => panic!("expected a key error, got {other:?}"),
        }
    }

    /// An Anthropic model needs max_tokens, a temperature of at most 1, a known cache
    /// lifetime, and structured output only where the model has it; its quota may give
    /// input and output tokens per minute apart; prices take cache rates.
    #[test]
    fn anthropic_models_are_checked() {
        let s = sweep(
            "max_tokens = 64\nprompt_cache = \"1h\"\nstructured_output = true\nrpm = 50\nitpm = 30000\notpm = 8000\n\
             price = { input = 3.0, output = 15.0, cache_read = 0.3 }",
        )
        .unwrap();
        let m = &s.models[0];
        assert_eq!(m.prompt_cache, Some(PromptCacheTtl::OneHour));
        let q = m.quota.unwrap();
        assert_eq!((q.rpm, q.itpm, q.otpm), (Some(50), Some(30000), Some(8000)));
        assert_eq!(m.price.unwrap().cache_rates(), [3.75, 6.0, 0.3]);
        let plan = crate::worker_plan::worker_plan(&s);
        let pool = plan.pool(&m.spec.pool).unwrap();
        assert!(matches!(&pool.models[0],
            halyard_proto::pool::WorkerModel::Http(h) if h.prompt_cache == Some(PromptCacheTtl::OneHour) && h.backend == "anthropic"));
        let (k, r) = key_error(sweep(""));
        assert_eq!(k, "model[0].max_tokens");
        assert!(r.contains("required"), "{r}");
        let (k, _) = key_error(sweep("max_tokens = 5\ntemperature = 1.2"));
        assert_eq!(k, "model[0].temperature");
        let (k, r) = key_error(sweep("max_tokens = 5\nprompt_cache = \"10m\""));
        assert_eq!(k, "model[0].prompt_cache");
        assert!(r.contains("\"10m\""), "{r}");
        let (k, r) = key_error(sweep("max_tokens = 5\nitpm = 0"));
        assert_eq!(k, "model[0].itpm");
        assert!(r.contains("outside"), "{r}");
        let old = "name = \"a\"\n[[model]]\nname = \"c\"\nbackend = \"anthropic\"\nbase_url = \"https://x/v1\"\nmodel = \"claude-3-5-haiku-latest\"\nmax_tokens = 5\nstructured_output = true\n\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n\n[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"free\"]\n";
        let (k, r) = key_error(parse(Path::new("a.toml"), old));
        assert_eq!(k, "model[0].structured_output");
        assert!(r.contains("claude-3-5-haiku-latest"), "{r}");
        // prompt_cache is Anthropic's.
        let openai = "name = \"a\"\n[[model]]\nname = \"c\"\nbackend = \"openai\"\nbase_url = \"https://x/v1\"\nmodel = \"m\"\nprompt_cache = \"5m\"\n\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n\n[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"free\"]\n";
        let (k, r) = key_error(parse(Path::new("a.toml"), openai));
        assert_eq!(
            (k.as_str(), r.as_str()),
            ("model[0].prompt_cache", "only applies to backend \"anthropic\"")
        );
    }
}
