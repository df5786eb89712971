//! A strict parser of the Prometheus text exposition format (0.0.4), for tests that
//! scrape `/metrics`: every line must be a comment, a `# HELP`/`# TYPE` line or a sample
//! with valid names, correctly escaped label values and a float value; a family's
//! `# TYPE` must precede its samples; histograms must have cumulative buckets ending in
//! `le="+Inf"` equal to `_count`.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::time::Duration;

/// GET http://127.0.0.1:port/metrics: (content type, body), or None if nobody answers.
pub fn scrape(port: u16) -> Option<(String, String)> {
    let (head, body) = request(port, "/metrics")?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let ctype = head.lines().find_map(|l| {
        l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_string())
    })?;
    Some((ctype, body))
}

/// GET http://127.0.0.1:port{path}: (status code, body), or None if nobody answers.
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let (head, body) = request(port, path)?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body))
}

/// One HTTP/1.1 GET: (status line and headers, body). Axum sends these small bodies in
/// one piece with a content-length, so the body is what follows the headers.
fn request(port: u16, path: &str) -> Option<(String, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((head.to_string(), body.to_string()))
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Debug, Default)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    /// Family name → type (`counter`, `gauge`, `histogram`, `summary`, `untyped`).
    pub types: HashMap<String, String>,
}

impl Scrape {
    /// Samples named `name` whose labels include every pair of `labels`.
    pub fn find<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// Sum of the values of [`Scrape::find`].
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).map(|s| s.value).sum()
    }
}

fn valid_metric_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_' || ch == ':')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':')
}

fn valid_label_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

fn parse_value(v: &str) -> Result<f64, String> {
    match v {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => v.parse::<f64>().map_err(|e| format!("value {v:?}: {e}")),
    }
}

/// The family a sample belongs to (histogram/summary suffixes removed when declared so).
fn family_of<'a>(name: &'a str, types: &HashMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if matches!(types.get(base).map(String::as_str), Some("histogram" | "summary")) {
                return base;
            }
        }
    }
    name
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if !valid_metric_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(r) = rest.strip_prefix('{') {
        let bytes = r.as_bytes();
        let mut i = 0;
        loop {
            if bytes.get(i) == Some(&b'}') {
                rest = &r[i + 1..];
                break;
            }
            let eq = r[i..].find('=').ok_or("label without '='")? + i;
            let lname = &r[i..eq];
            if !valid_label_name(lname) {
                return Err(format!("bad label name {lname:?}"));
            }
            if bytes.get(eq + 1) != Some(&b'"') {
                return Err(format!("label {lname}: value not quoted"));
            }
            let mut value = String::new();
            i = eq + 2;
            loop {
                let ch = r[i..].chars().next().ok_or("unterminated label value")?;
                match ch {
                    '\\' => {
                        match bytes.get(i + 1) {
                            Some(b'\\') => value.push('\\'),
                            Some(b'"') => value.push('"'),
                            Some(b'n') => value.push('\n'),
                            _ => return Err(format!("label {lname}: bad escape")),
                        }
                        i += 2;
                    }
                    '"' => {
                        i += 1;
                        break;
                    }
                    c => {
                        value.push(c);
                        i += c.len_utf8();
                    }
                }
            }
            if labels.insert(lname.to_string(), value).is_some() {
                return Err(format!("label {lname} repeated"));
            }
            match bytes.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {}
                _ => return Err("expected ',' or '}' after a label".into()),
            }
        }
    }
    let mut parts = rest.split_whitespace();
    let value = parse_value(parts.next().ok_or("no value")?)?;
    if let Some(ts) = parts.next() {
        ts.parse::<i64>().map_err(|e| format!("timestamp {ts:?}: {e}"))?;
    }
    if parts.next().is_some() {
        return Err("trailing fields".into());
    }
    if !rest.starts_with(' ') {
        return Err("no space before the value".into());
    }
    Ok(Sample { name: name.to_string(), labels, value })
}

/// Parse a scrape, or say which line is wrong and why.
pub fn parse(text: &str) -> Result<Scrape, String> {
    let mut s = Scrape::default();
    let mut help: HashMap<String, ()> = HashMap::new();
    let mut seen_samples: HashMap<String, ()> = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let err = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            let mut f = c.trim_start().splitn(3, ' ');
            match f.next() {
                Some("TYPE") => {
                    let name = f.next().ok_or_else(|| err("TYPE without a name".into()))?;
                    let kind = f.next().ok_or_else(|| err("TYPE without a type".into()))?.trim();
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(err(format!("unknown type {kind:?}")));
                    }
                    if seen_samples.contains_key(name) {
                        return Err(err(format!("TYPE of {name} after its samples")));
                    }
                    if s.types.insert(name.to_string(), kind.to_string()).is_some() {
                        return Err(err(format!("second TYPE for {name}")));
                    }
                }
                Some("HELP") => {
                    let name = f.next().ok_or_else(|| err("HELP without a name".into()))?;
                    if help.insert(name.to_string(), ()).is_some() {
                        return Err(err(format!("second HELP for {name}")));
                    }
                }
                _ => {}
            }
            continue;
        }
        let sample = parse_sample(line).map_err(err)?;
        let fam = family_of(&sample.name, &s.types).to_string();
        if !s.types.contains_key(&fam) {
            return Err(err(format!("sample of {fam} before (or without) its TYPE")));
        }
        if s.types[&fam] == "counter" && (sample.value.is_nan() || sample.value < 0.0) {
            return Err(err("negative or NaN counter".into()));
        }
        seen_samples.insert(fam, ());
        s.samples.push(sample);
    }
    check_histograms(&s)?;
    Ok(s)
}

/// A series' labels without `le`, sorted.
type Labels = Vec<(String, String)>;

fn check_histograms(s: &Scrape) -> Result<(), String> {
    for (fam, kind) in &s.types {
        if kind != "histogram" {
            continue;
        }
        // Series by their labels without `le`.
        let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
        for b in s.samples.iter().filter(|x| x.name == format!("{fam}_bucket")) {
            let le = b.labels.get("le").ok_or_else(|| format!("{fam}_bucket without le"))?;
            let key: Vec<(String, String)> = b
                .labels
                .iter()
                .filter(|(k, _)| *k != "le")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            series.entry(key).or_default().push((parse_value(le)?, b.value));
        }
        for (key, buckets) in series {
            let mut last = (f64::NEG_INFINITY, 0.0);
            for &(le, v) in &buckets {
                if le <= last.0 || v < last.1 {
                    return Err(format!(
                        "{fam}{key:?}: buckets not increasing/cumulative at le={le}"
                    ));
                }
                last = (le, v);
            }
            if last.0 != f64::INFINITY {
                return Err(format!("{fam}{key:?}: no le=\"+Inf\" bucket"));
            }
            let labels: Vec<(&str, &str)> =
                key.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let count_name = format!("{fam}_count");
            let count = s
                .find(&count_name, &labels)
                .next()
                .ok_or_else(|| format!("{fam}{key:?}: no _count"))?
                .value;
            if count != last.1 {
                return Err(format!("{fam}{key:?}: +Inf bucket {} != _count {count}", last.1));
            }
            s.find(&format!("{fam}_sum"), &labels)
                .next()
                .ok_or_else(|| format!("{fam}{key:?}: no _sum"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_valid_exposition() {
        let t = "# HELP a_total things\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\\\\\\n\"} 3\n\n# TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.7\nh_count 2\n";
        let s = parse(t).unwrap();
        assert_eq!(s.samples.len(), 5);
        assert_eq!(s.samples[0].labels["y"], "q\"\\\n");
        assert_eq!(s.sum("a_total", &[("x", "1")]), 3.0);
    }

    #[test]
    fn rejects_broken_exposition() {
        for bad in [
            "a 1\n",                                                     // no TYPE
            "# TYPE a counter\na{x=1} 1\n",                              // unquoted
            "# TYPE a counter\na{x=\"1\"} one\n",                        // not a number
            "# TYPE a counter\na -1\n",                                  // negative counter
            "# TYPE 1a gauge\n1a 1\n",                                   // bad name
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n", // not cumulative
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n", // count mismatch
            "# TYPE a gauge\na{x=\"\\q\"} 1\n",                          // bad escape
        ] {
            assert!(parse(bad).is_err(), "accepted: {bad:?}");
        }
    }
}
