//! Exact nearest-neighbour search over a flat array of vectors.
//!
//! **Choice.** A flat (brute-force) index: vectors in one contiguous `Vec<f32>`, a query
//! scores every row with an 8-lane dot product (written so the compiler vectorises it
//! with SIMD) and keeps the best `k` in a bounded heap. It is exact (no recall loss, so
//! the builder's choices are reproducible and testable), has no build step and adds no
//! dependency.
//!
//! **Limits.** Memory is `n × dim × 4` bytes (1M titles × 384 dims = 1.5 GB) and one
//! query costs `n × dim` multiply-adds (1M × 384 ≈ 0.4 G, about 0.1 s on one core;
//! `halyard-embed`'s `index` benchmark prints the figure). That suits knowledge bases up
//! to a few million titles with the few thousand queries a benchmark build makes
//! ([`FlatIndex::search_many`] scans the index once per block of queries, so the rows
//! are read from memory once per block, not once per query). Beyond that, an
//! approximate index (HNSW) is the next step; the [`Metric`] and the result order
//! (best first, ties by row) are what it would have to keep.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// How two vectors are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Cosine similarity; on unit vectors, the dot product. Higher is nearer.
    Cosine,
    /// Euclidean distance. Lower is nearer (reported as the distance, not squared).
    L2,
}

impl Metric {
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::L2 => "l2",
        }
    }
}

/// A search hit: the row and its score (cosine similarity, or L2 distance).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub row: usize,
    pub score: f32,
}

/// Vectors of one dimension, row after row.
#[derive(Clone, Debug, Default)]
pub struct FlatIndex {
    dim: usize,
    data: Vec<f32>,
}

/// Dot product, 8 lanes at a time (vectorised by the compiler).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Squared Euclidean distance, 8 lanes at a time.
#[inline]
pub fn l2_sq(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| (x - y) * (x - y)).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            let d = x[i] - y[i];
            acc[i] += d * d;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Heap entry ordered so that the heap's top is the *worst* kept hit.
#[derive(PartialEq)]
struct Kept {
    /// Larger is better (cosine: similarity; L2: negated squared distance).
    goodness: f32,
    row: usize,
}

impl Eq for Kept {}

impl Ord for Kept {
    fn cmp(&self, other: &Self) -> Ordering {
        // Worse first: lower goodness, then the later row (ties go to the earlier row).
        other.goodness.total_cmp(&self.goodness).then(self.row.cmp(&other.row))
    }
}

impl PartialOrd for Kept {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Rows scanned per block in [`FlatIndex::search_many`] (256 KiB of 384-dim vectors).
const BLOCK_ROWS: usize = 170;

impl FlatIndex {
    pub fn new(dim: usize) -> FlatIndex {
        FlatIndex { dim, data: Vec::new() }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.dim).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Append a row; its index is the previous `len()`.
    pub fn add(&mut self, v: &[f32]) -> Result<usize, String> {
        if v.len() != self.dim {
            return Err(format!("vector has {} dimensions, the index {}", v.len(), self.dim));
        }
        if v.iter().any(|x| !x.is_finite()) {
            return Err("vector has a non-finite component".into());
        }
        self.data.extend_from_slice(v);
        Ok(self.len() - 1)
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// The `k` nearest rows to `query`, best first (ties: lower row first).
    pub fn search(&self, query: &[f32], k: usize, metric: Metric) -> Vec<Hit> {
        self.search_many(&[query], k, metric).pop().unwrap_or_default()
    }

    /// [`FlatIndex::search`] for several queries in one pass over the index.
    pub fn search_many(&self, queries: &[&[f32]], k: usize, metric: Metric) -> Vec<Vec<Hit>> {
        let mut heaps: Vec<BinaryHeap<Kept>> =
            queries.iter().map(|_| BinaryHeap::with_capacity(k + 1)).collect();
        if k > 0 && self.dim > 0 {
            let n = self.len();
            let mut start = 0;
            while start < n {
                let end = (start + BLOCK_ROWS).min(n);
                for (q, heap) in queries.iter().zip(heaps.iter_mut()) {
                    if q.len() != self.dim {
                        continue;
                    }
                    for row in start..end {
                        let v = self.row(row);
                        let goodness = match metric {
                            Metric::Cosine => dot(q, v),
                            Metric::L2 => -l2_sq(q, v),
                        };
                        if heap.len() < k {
                            heap.push(Kept { goodness, row });
                        } else if heap.peek().is_some_and(|w| goodness > w.goodness) {
                            heap.pop();
                            heap.push(Kept { goodness, row });
                        }
                    }
                }
                start = end;
            }
        }
        heaps
            .into_iter()
            .map(|h| {
                h.into_sorted_vec()
                    .into_iter()
                    .map(|kept| Hit {
                        row: kept.row,
                        score: match metric {
                            Metric::Cosine => kept.goodness,
                            Metric::L2 => (-kept.goodness).max(0.0).sqrt(),
                        },
                    })
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(data: &[Vec<f32>], q: &[f32], k: usize, metric: Metric) -> Vec<usize> {
        let mut scored: Vec<(f32, usize)> = data
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let s = match metric {
                    Metric::Cosine => v.iter().zip(q).map(|(a, b)| a * b).sum::<f32>(),
                    Metric::L2 => -v.iter().zip(q).map(|(a, b)| (a - b) * (a - b)).sum::<f32>(),
                };
                (s, i)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().take(k).map(|(_, i)| i).collect()
    }

    /// A small deterministic generator (no dependency) for test vectors.
    fn vectors(n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                (0..dim)
                    .map(|_| {
                        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
                    })
                    .collect()
            })
            .collect()
    }

    /// Top-k equals a sort of all scores, for both metrics, across block boundaries
    /// and with a dimension that is not a multiple of 8.
    #[test]
    fn matches_exhaustive_sort() {
        for dim in [3, 8, 37, 384] {
            let data = vectors(1000, dim, dim as u64);
            let mut idx = FlatIndex::new(dim);
            for v in &data {
                idx.add(v).unwrap();
            }
            assert_eq!(idx.len(), 1000);
            let queries = vectors(5, dim, 99);
            for metric in [Metric::Cosine, Metric::L2] {
                let qs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                let many = idx.search_many(&qs, 7, metric);
                for (q, hits) in queries.iter().zip(&many) {
                    let got: Vec<usize> = hits.iter().map(|h| h.row).collect();
                    assert_eq!(got, brute(&data, q, 7, metric), "dim {dim} {metric:?}");
                    assert_eq!(idx.search(q, 7, metric), *hits);
                }
            }
        }
    }

    /// Scores are the metric's values; L2 reports the distance; k larger than the index
    /// returns everything; k = 0 returns nothing; a wrong dimension is refused.
    #[test]
    fn scores_and_edges() {
        let mut idx = FlatIndex::new(2);
        idx.add(&[1.0, 0.0]).unwrap();
        idx.add(&[0.0, 1.0]).unwrap();
        let hits = idx.search(&[0.6, 0.8], 5, Metric::Cosine);
        assert_eq!(hits.iter().map(|h| h.row).collect::<Vec<_>>(), [1, 0]);
        assert!((hits[0].score - 0.8).abs() < 1e-6 && (hits[1].score - 0.6).abs() < 1e-6);
        let hits = idx.search(&[3.0, 4.0], 1, Metric::L2);
        assert_eq!(hits[0].row, 1);
        assert!((hits[0].score - (9.0f32 + 9.0).sqrt()).abs() < 1e-5);
        assert!(idx.search(&[1.0, 0.0], 0, Metric::Cosine).is_empty());
        assert!(idx.add(&[1.0]).is_err());
        assert!(idx.add(&[f32::NAN, 0.0]).is_err());
        // Ties go to the earlier row.
        idx.add(&[1.0, 0.0]).unwrap();
        let hits = idx.search(&[1.0, 0.0], 2, Metric::Cosine);
        assert_eq!(hits.iter().map(|h| h.row).collect::<Vec<_>>(), [0, 2]);
    }
}
