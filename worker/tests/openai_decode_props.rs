//! Property tests of the OpenAI-compatible response decoder: any body, damaged or random,
//! gives a completion or an error that says what was wrong and shows the body's start;
//! never a panic. `Retry-After` parsing likewise.

use halyard_tests::mutate::mutate;
use halyard_worker::backend::openai::{decode_body, parse_retry_after};
use proptest::prelude::*;

const BODIES: &[&str] = &[
    r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#,
    r#"{"choices":[{"message":{"content":null},"finish_reason":"length"}]}"#,
    r#"{"choices":[]}"#,
    r#"{"error":{"message":"bad","type":"invalid_request_error"}}"#,
];

fn check(body: &[u8]) -> Result<(), TestCaseError> {
    if let Err(e) = decode_body(body) {
        let msg = e.to_string();
        prop_assert!(msg.contains("response"), "the error does not say what was wrong: {msg}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn damaged_bodies(ops in prop::collection::vec(any::<(u8, usize, u32)>(), 1..6), which in 0usize..4) {
        check(mutate(BODIES[which % BODIES.len()], &ops).as_bytes())?;
    }

    #[test]
    fn random_bytes(body in prop::collection::vec(any::<u8>(), 0..400)) {
        check(&body)?;
    }

    #[test]
    fn retry_after_any_text(v in "\\PC{0,40}") {
        let _ = parse_retry_after(&v);
    }
}

#[test]
fn empty_and_wrong_shapes_are_named() {
    for (body, needle) in [
        (&b""[..], "not a chat completion"),
        (br#"{"choices":[]}"#, "no choices"),
        (b"[1,2]", "not a chat completion"),
    ] {
        let e = decode_body(body).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
}
