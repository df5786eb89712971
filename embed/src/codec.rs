//! Embeddings on the wire: an `embed` job's result text carries its vectors as
//! `v1 <count> <dim> <base64 of little-endian f32, row after row>`. Compact (about
//! 2 KB per 384-dim vector, a third of JSON's size) and exact (bit-for-bit floats).

use base64::Engine as _;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Encode vectors that all have `dim` components.
pub fn encode(vectors: &[Vec<f32>], dim: usize) -> String {
    let mut bytes = Vec::with_capacity(vectors.len() * dim * 4);
    for v in vectors {
        debug_assert_eq!(v.len(), dim);
        for x in v {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    format!("v1 {} {dim} {}", vectors.len(), B64.encode(bytes))
}

/// Decode what [`encode`] wrote; `expect` is the number of vectors the job asked for.
pub fn decode(text: &str, expect: usize) -> Result<Vec<Vec<f32>>, String> {
    let mut parts = text.splitn(4, ' ');
    let (Some("v1"), Some(n), Some(dim), Some(data)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!(
            "not an embedding result (expected `v1 <count> <dim> <base64>`): {:?}",
            preview(text)
        ));
    };
    let n: usize = n.parse().map_err(|_| format!("bad vector count {n:?}"))?;
    let dim: usize = dim.parse().map_err(|_| format!("bad dimension {dim:?}"))?;
    if n != expect {
        return Err(format!("{n} vectors, expected {expect}"));
    }
    let bytes = B64.decode(data.trim()).map_err(|e| format!("bad base64: {e}"))?;
    if bytes.len() != n * dim * 4 {
        return Err(format!(
            "{} bytes of vectors, expected {} ({n} × {dim} × 4)",
            bytes.len(),
            n * dim * 4
        ));
    }
    let floats: Vec<f32> =
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    if floats.iter().any(|x| !x.is_finite()) {
        return Err("a vector has a non-finite component".into());
    }
    Ok(floats.chunks(dim.max(1)).take(n).map(<[f32]>::to_vec).collect())
}

fn preview(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let v = vec![vec![0.5f32, -1.25, 3.0e-8], vec![0.0, 1.0, f32::MIN_POSITIVE]];
        let s = encode(&v, 3);
        assert!(s.starts_with("v1 2 3 "));
        assert_eq!(decode(&s, 2).unwrap(), v);
        assert!(decode(&s, 3).unwrap_err().contains("expected 3"));
        assert!(decode("hello", 1).unwrap_err().contains("not an embedding"));
        assert!(decode("v1 1 3 AAAA", 1).unwrap_err().contains("bytes"));
        assert!(decode("v1 1 3 !!", 1).unwrap_err().contains("base64"));
        assert_eq!(decode(&encode(&[], 384), 0).unwrap(), Vec::<Vec<f32>>::new());
        let nan = encode(&[vec![f32::NAN]], 1);
        assert!(decode(&nan, 1).unwrap_err().contains("non-finite"));
    }
}
