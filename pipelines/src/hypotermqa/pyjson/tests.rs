use super::*;

/// A repeated key keeps its first position and takes the last value, like `dict`.
#[test]
fn duplicate_keys_last_value_wins() {
    let v = loads(r#"{"a": 1, "b": 2, "a": 3}"#, true).unwrap();
    assert_eq!(v.py_repr(), "{'a': 3, 'b': 2}");
}

/// `str()` of the scalars the judge parser compares is exactly Python's.
#[test]
fn python_str_of_scalars() {
    assert_eq!(PyValue::Bool(false).py_str(), "False");
    assert_eq!(PyValue::None.py_str(), "None");
    assert_eq!(loads("-0", true).unwrap().py_str(), "0");
    for (src, want) in [
        ("1e16", "1e+16"),
        ("1.5e-5", "1.5e-05"),
        ("0.0001", "0.0001"),
        ("123.0", "123.0"),
        ("-0.0", "-0.0"),
        ("1e400", "inf"),
    ] {
        assert_eq!(loads(src, true).unwrap().py_str(), want, "{src}");
    }
}

/// Errors carry CPython's message, character position, line and column.
#[test]
fn error_positions_are_in_characters() {
    let e = loads("{\"é\": 1 \"b\": 2}", true).unwrap_err();
    assert_eq!(e.msg(), "Expecting ',' delimiter");
    assert_eq!(e.pos(), Some(8));
    assert_eq!(e.to_string(), "Expecting ',' delimiter: line 1 column 9 (char 8)");
}

/// Deep nesting is an error, never a stack overflow.
#[test]
fn deep_nesting_is_bounded() {
    let s = "[".repeat(100_000);
    assert_eq!(loads(&s, true), Err(PyJsonError::Recursion));
}
