//! Structured output for the `gguf` backend (issue 45): a job's JSON schema
//! ([`halyard_proto::OutputSchema`]) as a llama.cpp grammar (GBNF), which the engine's
//! grammar sampler enforces token by token, so a judge's output is the JSON object its
//! pipeline reads, whatever the model's size.
//!
//! The subset of JSON Schema converted is what a judge's answer needs: `object` with
//! `properties` (written in the schema's order, every listed property present, no other
//! key: what `"required"` with every property and `"additionalProperties": false` say,
//! the form OpenAI's strict mode asks for), `string` (with `maxLength`), `enum` and
//! `const` of strings, numbers, booleans and null, `boolean`, `integer`, `number`,
//! `null` and `array` (`items`, `maxItems`). Anything else is an error naming the
//! schema path, never a grammar that accepts more than the schema. The property order
//! is the schema text's (a JSON object read in order, not sorted): a judge asked to
//! reason before its verdict writes `reasoning` first.
//!
//! Whitespace between tokens is limited to a few characters (`[ \t\n]{0,8}`), so a
//! small model cannot spend its token budget on blank lines; the object ends at its `}`
//! (the grammar then allows only the end of generation).

use std::fmt::Write as _;

/// A JSON value with its objects' keys in the order written (serde_json's `Value` sorts
/// them).
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl<'de> serde::Deserialize<'de> for Json {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(n)
                    .map(Json::Number)
                    .ok_or_else(|| E::custom("a number that is not finite"))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::String(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::String(s))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Json::Array(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = a.next_entry::<String, Json>()? {
                    v.push((k, x));
                }
                Ok(Json::Object(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            // The last of a repeated key, as serde_json and Python read it.
            Json::Object(items) => items.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value as compact JSON text.
    fn to_json(&self) -> String {
        match self {
            Json::Null => "null".into(),
            Json::Bool(b) => b.to_string(),
            Json::Number(n) => n.to_string(),
            Json::String(s) => serde_json::Value::String(s.clone()).to_string(),
            Json::Array(v) => {
                format!("[{}]", v.iter().map(Json::to_json).collect::<Vec<_>>().join(","))
            }
            Json::Object(items) => format!(
                "{{{}}}",
                items
                    .iter()
                    .map(|(k, v)| {
                        format!("{}:{}", serde_json::Value::String(k.clone()), v.to_json())
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

/// The rules shared by every grammar (only those used are emitted).
const WS: &str = r#"ws ::= [ \t\n]{0,8}"#;
const CHAR: &str = r#"char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})"#;
const INTEGER: &str = r#"integer ::= "-"? ("0" | [1-9] [0-9]{0,17})"#;
const NUMBER: &str =
    r#"number ::= "-"? ("0" | [1-9] [0-9]{0,17}) ("." [0-9]{1,17})? ([eE] [-+]? [0-9]{1,3})?"#;

/// The GBNF grammar (root rule `root`) of the JSON values `schema` (JSON Schema text)
/// describes; an error names the schema path of what it cannot express.
pub fn schema_to_gbnf(schema: &str) -> Result<String, String> {
    let s: Json =
        serde_json::from_str(schema).map_err(|e| format!("the JSON schema is not JSON: {e}"))?;
    let mut g = Gbnf::default();
    let root = g.value(&s, "schema")?;
    let mut out = format!("root ::= {root}\n");
    for r in &g.rules {
        out.push_str(r);
        out.push('\n');
    }
    for (used, rule) in [(g.ws, WS), (g.string, CHAR), (g.integer, INTEGER), (g.number, NUMBER)] {
        if used {
            out.push_str(rule);
            out.push('\n');
        }
    }
    Ok(out)
}

#[derive(Default)]
struct Gbnf {
    rules: Vec<String>,
    ws: bool,
    string: bool,
    integer: bool,
    number: bool,
}

/// A GBNF string literal matching exactly `text`.
fn literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Gbnf {
    fn ws(&mut self) -> &'static str {
        self.ws = true;
        "ws"
    }

    /// A new rule `pN ::= body`; returns its name.
    fn rule(&mut self, body: String) -> String {
        let name = format!("p{}", self.rules.len());
        self.rules.push(format!("{name} ::= {body}"));
        name
    }

    /// The expression matching the values `s` describes (at schema path `at`).
    fn value(&mut self, s: &Json, at: &str) -> Result<String, String> {
        let Json::Object(_) = s else {
            return Err(format!("{at}: expected a schema object, found {}", s.to_json()));
        };
        for key in ["anyOf", "oneOf", "allOf", "$ref", "not", "if", "pattern", "format"] {
            if s.get(key).is_some() {
                return Err(format!("{at}: `{key}` is not supported in structured output"));
            }
        }
        if let Some(c) = s.get("const") {
            return self.enumeration(std::slice::from_ref(c), at);
        }
        if let Some(e) = s.get("enum") {
            let Json::Array(values) = e else {
                return Err(format!("{at}.enum: expected an array of values"));
            };
            if values.is_empty() {
                return Err(format!("{at}.enum: empty: no value would be allowed"));
            }
            return self.enumeration(values, at);
        }
        let ty = match s.get("type") {
            Some(Json::String(t)) => t.as_str(),
            Some(other) => {
                return Err(format!(
                "{at}.type: expected one type name, found {} (a list of types is not supported)",
                other.to_json()
            ))
            }
            None => return Err(format!("{at}: no `type`, `enum` or `const`")),
        };
        match ty {
            "object" => self.object(s, at),
            "array" => self.array(s, at),
            "string" => {
                self.string = true;
                let n = match s.get("maxLength") {
                    None => None,
                    Some(Json::Number(n)) if n.as_u64().is_some() => n.as_u64(),
                    Some(other) => {
                        return Err(format!(
                            "{at}.maxLength: expected a whole number, found {}",
                            other.to_json()
                        ))
                    }
                };
                Ok(match n {
                    None => r#""\"" char* "\"""#.to_string(),
                    Some(n) => format!(r#""\"" char{{0,{n}}} "\"""#),
                })
            }
            "boolean" => Ok(r#"("true" | "false")"#.into()),
            "null" => Ok(r#""null""#.into()),
            "integer" => {
                self.integer = true;
                Ok("integer".into())
            }
            "number" => {
                self.number = true;
                Ok("number".into())
            }
            other => Err(format!("{at}.type: unknown type {other:?}")),
        }
    }

    fn enumeration(&mut self, values: &[Json], at: &str) -> Result<String, String> {
        let mut alts = Vec::new();
        for v in values {
            if matches!(v, Json::Array(_) | Json::Object(_)) {
                return Err(format!(
                    "{at}: an enum or const of arrays or objects is not supported ({})",
                    v.to_json()
                ));
            }
            alts.push(literal(&v.to_json()));
        }
        Ok(format!("({})", alts.join(" | ")))
    }

    fn object(&mut self, s: &Json, at: &str) -> Result<String, String> {
        let props = match s.get("properties") {
            Some(Json::Object(p)) => p.clone(),
            None => Vec::new(),
            Some(other) => {
                return Err(format!(
                    "{at}.properties: expected an object, found {}",
                    other.to_json()
                ))
            }
        };
        match s.get("additionalProperties") {
            None | Some(Json::Bool(false)) => {}
            Some(_) => {
                return Err(format!(
                    "{at}.additionalProperties: only false (or absent) is supported: the grammar \
                     writes exactly the listed properties"
                ))
            }
        }
        if let Some(req) = s.get("required") {
            let Json::Array(req) = req else {
                return Err(format!("{at}.required: expected an array of property names"));
            };
            for r in req {
                let known = matches!(r, Json::String(n) if props.iter().any(|(k, _)| k == n));
                if !known {
                    return Err(format!(
                        "{at}.required: {} is not one of the properties",
                        r.to_json()
                    ));
                }
            }
        }
        let ws = self.ws();
        let mut parts = vec![format!(r#""{{" {ws}"#)];
        for (i, (name, sub)) in props.iter().enumerate() {
            let v = self.value(sub, &format!("{at}.properties.{name}"))?;
            let key = literal(&serde_json::Value::String(name.clone()).to_string());
            let comma = if i + 1 < props.len() { format!(r#" "," {ws}"#) } else { String::new() };
            parts.push(format!(r#"{key} {ws} ":" {ws} {v} {ws}{comma}"#));
        }
        parts.push(r#""}""#.into());
        Ok(self.rule(parts.join(" ")))
    }

    fn array(&mut self, s: &Json, at: &str) -> Result<String, String> {
        let Some(items) = s.get("items") else {
            return Err(format!("{at}: an array needs `items`"));
        };
        let item = self.value(items, &format!("{at}.items"))?;
        let ws = self.ws();
        let more = match s.get("maxItems") {
            None => "*".to_string(),
            Some(Json::Number(n)) if n.as_u64().is_some() => {
                let n = n.as_u64().unwrap_or(0);
                if n == 0 {
                    return Ok(self.rule(format!(r#""[" {ws} "]""#)));
                }
                format!("{{0,{}}}", n - 1)
            }
            Some(other) => {
                return Err(format!(
                    "{at}.maxItems: expected a whole number, found {}",
                    other.to_json()
                ))
            }
        };
        Ok(self.rule(format!(r#""[" {ws} ({item} {ws} ("," {ws} {item} {ws}){more})? "]""#)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys keep the schema's order, every rule a grammar names is defined, and a
    /// string enum becomes the alternatives of its JSON literals.
    #[test]
    fn object_in_schema_order() {
        let schema = r#"{"type":"object","properties":{"term":{"type":"string"},"reasoning":{"type":"string"},"certainty":{"type":"string","enum":["UNREAL","MENTIONED","UNKNOWN"]}},"required":["term","reasoning","certainty"],"additionalProperties":false}"#;
        let g = schema_to_gbnf(schema).unwrap();
        let (t, r, c) =
            (g.find("term").unwrap(), g.find("reasoning").unwrap(), g.find("certainty").unwrap());
        assert!(t < r && r < c, "{g}");
        assert!(g.contains(r#"("\"UNREAL\"" | "\"MENTIONED\"" | "\"UNKNOWN\"")"#), "{g}");
        assert!(g.starts_with("root ::= p0\n"), "{g}");
        for name in ["ws ::=", "char ::=", "p0 ::="] {
            assert!(g.contains(name), "{name} missing: {g}");
        }
        assert!(!g.contains("integer ::="));
    }

    /// What the grammar cannot express is an error naming where, never a looser grammar.
    #[test]
    fn unsupported_schema_is_named() {
        let cases = [
            ("nope", "not JSON"),
            (r#"{"anyOf":[{"type":"string"}]}"#, "schema: `anyOf`"),
            (
                r#"{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}"#,
                "schema.properties.a: `pattern`",
            ),
            (
                r#"{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":true}"#,
                "additionalProperties",
            ),
            (
                r#"{"type":"object","properties":{"a":{"type":"string"}},"required":["b"]}"#,
                "\"b\" is not one of",
            ),
            (r#"{"type":["string","null"]}"#, "schema.type"),
            (r#"{"enum":[]}"#, "empty"),
            (r#"{"type":"array"}"#, "needs `items`"),
            (r#"{"type":"date"}"#, "unknown type"),
        ];
        for (schema, want) in cases {
            let e = schema_to_gbnf(schema).unwrap_err();
            assert!(e.contains(want), "{schema}: {e}");
        }
    }

    /// Literals escape what GBNF reads as syntax.
    #[test]
    fn literals_are_escaped() {
        assert_eq!(literal(r#""a\b""#), r#""\"a\\b\"""#);
        assert_eq!(literal("x\ny"), r#""x\ny""#);
    }
}
