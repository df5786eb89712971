use super::*;

fn certainty(s: &str) -> Result<String, String> {
    reference_certainty(s).value
}

fn verified(s: &str) -> Result<String, String> {
    reference_verified(s).value
}

/// E.1: a fenced ```json block parses (via the `{`..`}` slice of step 2).
#[test]
fn reference_fenced_block_parses() {
    assert_eq!(
        certainty(
            "```json\n{\"term\":\"X\",\n\"reasoning\":\"r\",\n\"certainty\":\"UNREAL\"}\n```"
        ),
        Ok("unreal".into())
    );
}

/// E.1: prose before the JSON object does not prevent parsing.
#[test]
fn reference_prose_before_json_parses() {
    let r = reference_certainty(
        "Let me think step by step. {\"reasoning\": \"used\", \"certainty\": \"MENTIONED\"}",
    );
    assert_eq!(r.value, Ok("mentioned".into()));
    assert_eq!(r.reasoning.as_deref(), Some("used"));
    assert!(!r.reflection.starts_with(PARSE_FAILURE_PREFIX));
}

/// E.1: single quotes, a trailing comma, plain prose and "" are parse failures.
#[test]
fn reference_failures() {
    for s in [
        "{'certainty': 'UNREAL'}",
        "{\"certainty\": \"UNREAL\",}",
        "The term is unreal.",
        "",
        "WARNING! Timeout.",
        MODEL_FAILURE_OUTPUT,
    ] {
        let r = reference_certainty(s);
        assert!(r.value.is_err(), "{s:?} should fail, got {:?}", r.value);
        assert_eq!(r.reflection, format!("{PARSE_FAILURE_PREFIX}{s}"));
    }
}

/// E.1: `"UNREAL"` alone parses as a JSON string, then the caller's subscript raises TypeError.
#[test]
fn reference_bare_string_is_a_type_error() {
    let e = certainty("\"UNREAL\"").unwrap_err();
    assert!(e.starts_with("TypeError"), "{e}");
    assert_eq!(parse_response("\"UNREAL\""), Ok(PyValue::Str("UNREAL".into())));
}

/// E.1: with two JSON objects, the first one is used.
#[test]
fn reference_two_objects_first_wins() {
    assert_eq!(
        certainty("{\"certainty\":\"UNREAL\"}\n{\"certainty\":\"MENTIONED\"}"),
        Ok("unreal".into())
    );
}

/// E.1 step 3: bare TRUE/FALSE (and capitalised keys, when nothing parsed before) are rescued by lowercasing.
#[test]
fn reference_lowercasing_rescues_bare_booleans() {
    assert_eq!(verified("{\"verified\": FALSE}"), Ok("false".into()));
    assert_eq!(verified("x {\"verified\":TRUE}"), Ok("true".into()));
    assert_eq!(certainty("{\"Certainty\": \"UNREAL\", \"sure\": TRUE}"), Ok("unreal".into()));
    // A well-formed capitalised key parses in step 1 and then misses the key.
    assert_eq!(verified("{\"Verified\":\"FALSE\"}"), Err("KeyError: 'verified'".into()));
}

/// E.1 step 4: missing commas between lines are inserted.
#[test]
fn reference_missing_comma_lines_repaired() {
    let s = "{\"term\":\"X\"\n\"reasoning\":\"r\"\n\"certainty\":\"UNKNOWN\"}";
    assert_eq!(certainty(s), Ok("unknown".into()));
}

/// E.1 step 5: unescaped inner quotes become apostrophes; missing commas elsewhere are inserted.
#[test]
fn reference_inner_quotes_repaired() {
    let s = "{\"term\":\"X\", \"reasoning\":\"He said \"X is real\" twice\", \"certainty\":\"MENTIONED\"}";
    let r = reference_certainty(s);
    assert_eq!(r.value, Ok("mentioned".into()));
    assert_eq!(r.reasoning.as_deref(), Some("He said 'X is real' twice"));
    assert_eq!(certainty("{\"term\":\"X\" \"certainty\":\"UNREAL\"}"), Ok("unreal".into()));
}

/// B.2: `str(verified).lower()` as Python computes it, for every JSON type.
#[test]
fn reference_verified_uses_python_str() {
    assert_eq!(verified("{\"verified\": false}"), Ok("false".into()));
    assert_eq!(verified("{\"verified\": null}"), Ok("none".into()));
    assert_eq!(verified("{\"verified\": 0}"), Ok("0".into()));
    assert_eq!(verified("{\"verified\": \"false.\"}"), Ok("false.".into()));
    assert_eq!(verified("{\"verified\": [false]}"), Ok("[false]".into()));
    assert!(verified("[{\"verified\": false}]").is_err());
}

/// B.2: a non-string certainty is a parse failure (AttributeError on `.lower()`).
#[test]
fn reference_non_string_certainty_fails() {
    assert!(certainty("{\"certainty\": 1}").unwrap_err().starts_with("AttributeError"));
    assert!(certainty("{\"certainty\": null}").unwrap_err().starts_with("AttributeError"));
    assert_eq!(certainty("{\"certainty\": \"Mentioned.\"}"), Ok("mentioned.".into()));
}

/// Paper mode: fences, prose, case and surrounding spaces are all fine.
#[test]
fn paper_accepts_json_anywhere() {
    let ok = |s: &str| parse_paper_certainty(s).map(|v| v.value);
    assert_eq!(ok("```json\n{\"certainty\": \" mentioned \"}\n```"), Ok(Certainty::Mentioned));
    assert_eq!(
        ok("Reasoning first.\n{\"term\":\"X\",\n\"reasoning\":\"line1\nline2\",\n\"certainty\":\"Unreal\"}"),
        Ok(Certainty::Unreal)
    );
    assert_eq!(ok("{\"CERTAINTY\": \"unknown\"}"), Ok(Certainty::Unknown));
    // The echoed empty template is ignored when a real verdict follows.
    assert_eq!(
        ok("{\"term\":\"\",\"reasoning\":\"\",\"certainty\":\"\"} then {\"certainty\":\"UNREAL\"}"),
        Ok(Certainty::Unreal)
    );
    let v = parse_paper_verified("{\"reasoning\": \"fine\", \"verified\": false}").unwrap();
    assert_eq!((v.value, v.reasoning.as_deref()), (false, Some("fine")));
    assert_eq!(parse_paper_verified("{\"verified\": \"TRUE\"}").map(|v| v.value), Ok(true));
}

/// Paper mode: every unusable output is an error that says why.
#[test]
fn paper_rejects_with_reasons() {
    assert_eq!(parse_paper_certainty("UNREAL"), Err(JudgeParseError::NoJsonObject));
    assert_eq!(
        parse_paper_certainty("{'certainty': 'UNREAL'}"),
        Err(JudgeParseError::NoJsonObject)
    );
    assert_eq!(
        parse_paper_certainty("{\"verified\": \"TRUE\"}"),
        Err(JudgeParseError::MissingKey { key: "certainty" })
    );
    let e = parse_paper_certainty("{\"certainty\": \"HYPOTHETICAL\"}").unwrap_err();
    assert_eq!(
        e.to_string(),
        "`certainty` is 'HYPOTHETICAL', expected \"UNREAL\", \"MENTIONED\" or \"UNKNOWN\""
    );
    assert!(matches!(
        parse_paper_certainty("{\"certainty\": \"Mentioned.\"}"),
        Err(JudgeParseError::BadValue { .. })
    ));
    assert!(matches!(
        parse_paper_certainty("{\"certainty\": \"UNREAL\"} {\"certainty\": \"MENTIONED\"}"),
        Err(JudgeParseError::Conflicting { .. })
    ));
    assert!(matches!(
        parse_paper_verified("{\"verified\": \"PARTIALLY\"}"),
        Err(JudgeParseError::BadValue { .. })
    ));
}

/// Paper-mode rule 3 (issue 16): keys match case-insensitively after trimming; a key
/// repeated in one object reads as its last value.
#[test]
fn paper_rule_keys() {
    let ok = |s: &str| parse_paper_certainty(s).map(|v| v.value);
    assert_eq!(ok("{\" Certainty \": \"UNREAL\"}"), Ok(Certainty::Unreal));
    assert_eq!(ok("{\"CERTAINTY\": \"unknown\"}"), Ok(Certainty::Unknown));
    assert_eq!(
        ok("{\"certainty\": \"UNREAL\", \"certainty\": \"MENTIONED\"}"),
        Ok(Certainty::Mentioned)
    );
    assert_eq!(parse_paper_verified("{\"Verified\": \"FALSE\"}").map(|v| v.value), Ok(false));
}

/// Paper-mode rule 4 (issue 16): `verified` may be a JSON boolean; a certainty must be a
/// string; numbers and null are rejected with the value named.
#[test]
fn paper_rule_value_types() {
    assert_eq!(parse_paper_verified("{\"verified\": true}").map(|v| v.value), Ok(true));
    assert_eq!(parse_paper_verified("{\"verified\": \" false \"}").map(|v| v.value), Ok(false));
    assert!(matches!(
        parse_paper_verified("{\"verified\": 1}"),
        Err(JudgeParseError::BadValue { .. })
    ));
    assert!(matches!(
        parse_paper_certainty("{\"certainty\": true}"),
        Err(JudgeParseError::BadValue { .. })
    ));
    assert!(matches!(
        parse_paper_certainty("{\"certainty\": null}"),
        Err(JudgeParseError::BadValue { .. })
    ));
}

/// Paper-mode rule 5 (issue 16): of several objects, agreeing verdicts are one verdict
/// with the first one's reasoning; objects without the key are skipped.
#[test]
fn paper_rule_several_objects() {
    let v = parse_paper_certainty(
        "{\"note\": 1} {\"reasoning\": \"a\", \"certainty\": \"UNREAL\"} {\"reasoning\": \"b\", \"certainty\": \"unreal\"}",
    )
    .unwrap();
    assert_eq!((v.value, v.reasoning.as_deref()), (Certainty::Unreal, Some("a")));
    assert!(matches!(
        parse_paper_verified("{\"verified\": true} {\"verified\": \"FALSE\"}"),
        Err(JudgeParseError::Conflicting { .. })
    ));
}

/// Issue 45: the structured-output schema of each judge check describes the object its
/// prompt template shows (`term` as filled in, `reasoning`, then the verdict key, in that
/// order, all required, nothing else), and every object it allows is read as a verdict by
/// both semantics' parsers: a constrained judge cannot produce a `judge_error` by its form.
#[test]
fn output_schema_objects_parse_as_verdicts() {
    let term = "Nano-Sync \"Fusion\" Technology";
    for kind in [JudgeKind::Acceptance, JudgeKind::Meaning] {
        let s = kind.output_schema(term);
        assert_eq!(s.name, format!("hypotermqa_{}", kind.stage()));
        let v: serde_json::Value = serde_json::from_str(&s.schema).unwrap();
        assert_eq!(v["type"], "object");
        assert_eq!(v["additionalProperties"], false);
        assert_eq!(v["required"], serde_json::json!(["term", "reasoning", kind.key()]));
        let props = v["properties"].as_object().unwrap();
        assert_eq!(props.len(), 3);
        assert_eq!(props["term"]["enum"], serde_json::json!([term]));
        assert_eq!(props["reasoning"]["maxLength"], REASONING_MAX_CHARS);
        let (t, r, k) = (
            s.schema.find("\"term\"").unwrap(),
            s.schema.find("\"reasoning\"").unwrap(),
            s.schema.find(&format!("\"{}\"", kind.key())).unwrap(),
        );
        assert!(t < r && r < k, "{}", s.schema);
        let values: Vec<&str> = props[kind.key()]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(values, kind.values());
        let reasoning = "x".repeat(REASONING_MAX_CHARS as usize);
        for x in values {
            let out = serde_json::json!({"term": term, "reasoning": reasoning, kind.key(): x})
                .to_string();
            match kind {
                JudgeKind::Acceptance => {
                    assert_eq!(parse_paper_certainty(&out).unwrap().value.as_str(), x);
                    assert_eq!(certainty(&out), Ok(x.to_lowercase()));
                }
                JudgeKind::Meaning => {
                    assert_eq!(parse_paper_verified(&out).unwrap().value, x == "TRUE");
                    assert_eq!(verified(&out), Ok(x.to_lowercase()));
                }
            }
        }
    }
}
