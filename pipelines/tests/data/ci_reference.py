#!/usr/bin/env python3
"""Reference values for Halyard's 95% intervals and paired tests (issue 16).

Writes `ci_reference.json` next to this file; `pipelines/tests/ci_reference.rs` reads it
and checks `halyard_pipelines::metrics::{interval, paired}` against it.

Each method is computed here without Halyard's code:
- Wilson intervals and the exact binomial p-value of McNemar's test: scipy
  (`binomtest(...).proportion_ci(method="wilson")`, `binomtest(...).pvalue`);
- AUROC: scipy's Mann-Whitney U / (n1 n0); DeLong's variance: the structural components
  computed directly from their definition (every positive against every negative, O(mn)),
  not from mid-ranks as Halyard does;
- Newcombe's paired interval (his method 10) is not recomputed here: a second coding of
  the same formula is no check (before issue 45 both codings used the raw phi where
  Newcombe corrects it by N/2). It is checked against the published worked example of
  Altman et al. (2000), Table 6.2, in `pipelines/src/metrics/paired.rs`;
- the bootstrap: a seeded percentile bootstrap needs the same random draws to be checked
  exactly, so the generator (SplitMix64, index = (draw * n) >> 64) is re-implemented here,
  and the quantiles are numpy's default (linear, type 7).

The inputs are drawn here from Python's `random` with fixed seeds and written to the JSON,
so the Rust test reads inputs and expected values from one file.

Regenerate (needs numpy and scipy from PyPI, e.g. in a virtual environment):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy scipy
    /tmp/venv/bin/python pipelines/tests/data/ci_reference.py
"""

import json
import math
import random
from pathlib import Path

import numpy as np
from scipy import stats

LEVEL = 0.95
Z = float(stats.norm.ppf(0.975))
RESAMPLES = 2000
SEED = 0x48414C59
MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next_u64() * n) >> 64


def wilson(k, n):
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=LEVEL, method="wilson")
    return {"estimate": k / n, "low": float(ci.low), "high": float(ci.high)}


def loop_mean(values):
    s = 0.0
    for v in values:
        s += v
    return s / len(values)


def resample(n, seed, stat):
    rng = SplitMix64(seed)
    out = []
    for _ in range(RESAMPLES):
        idx = [rng.below(n) for _ in range(n)]
        v = stat(idx)
        if v is not None and not math.isnan(v):
            out.append(v)
    return out


def percentile_interval(reps):
    a = np.array(sorted(reps))
    return float(np.percentile(a, 2.5)), float(np.percentile(a, 97.5))


def bootstrap_mean(values, seed):
    reps = resample(len(values), seed, lambda idx: loop_mean([values[i] for i in idx]))
    low, high = percentile_interval(reps)
    return {"estimate": loop_mean(values), "low": low, "high": high, "resamples": len(reps)}


def f1(tp, fp, fn):
    d = 2 * tp + fp + fn
    return None if d == 0 else 2 * tp / d


def f1_bootstrap(tp, fp, tn, fn, seed):
    kinds = [0] * tp + [1] * fp + [2] * tn + [3] * fn

    def stat(idx):
        c = [0, 0, 0, 0]
        for i in idx:
            c[kinds[i]] += 1
        return f1(c[0], c[1], c[3])

    reps = resample(len(kinds), seed, stat)
    low, high = percentile_interval(reps)
    return {"estimate": f1(tp, fp, fn), "low": low, "high": high, "resamples": len(reps)}


def psi(x, y):
    return 1.0 if x > y else 0.5 if x == y else 0.0


def delong(labels, scores):
    pos = [s for l, s in zip(labels, scores) if l]
    neg = [s for l, s in zip(labels, scores) if not l]
    m, n = len(pos), len(neg)
    u = stats.mannwhitneyu(pos, neg, alternative="two-sided").statistic
    auc = float(u) / (m * n)
    v10 = [sum(psi(x, y) for y in neg) / n for x in pos]
    v01 = [sum(psi(x, y) for x in pos) / m for y in neg]
    var = float(np.var(v10, ddof=1)) / m + float(np.var(v01, ddof=1)) / n
    half = Z * math.sqrt(var)
    return {
        "auroc": auc,
        "variance": var,
        "low": max(0.0, auc - half),
        "high": min(1.0, auc + half),
    }


def mcnemar(a, b):
    both = sum(1 for x, y in zip(a, b) if x and y)
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    neither = len(a) - both - only_a - only_b
    n = len(a)
    disc = only_a + only_b
    p = 1.0 if disc == 0 else float(stats.binomtest(only_a, disc, 0.5).pvalue)
    return {
        "estimate": (both + only_a) / n - (both + only_b) / n,
        "p_value": p,
        "only_a": only_a,
        "only_b": only_b,
    }


def paired_bootstrap(a, b, seed):
    d = [x - y for x, y in zip(a, b)]
    reps = resample(len(d), seed, lambda idx: loop_mean([d[i] for i in idx]))
    low, high = percentile_interval(reps)
    le = sum(1 for r in reps if r <= 0.0)
    ge = sum(1 for r in reps if r >= 0.0)
    return {
        "estimate": loop_mean(d),
        "low": low,
        "high": high,
        "p_value": min(1.0, 2 * min(le, ge) / len(reps)),
        "resamples": len(reps),
    }


def main():
    rnd = random.Random(16)
    out = {"level": LEVEL, "z": Z, "resamples": RESAMPLES, "seed": SEED}

    out["wilson"] = [
        {"k": k, "n": n, **wilson(k, n)}
        for k, n in [(0, 1), (1, 1), (0, 10), (3, 10), (5, 10), (10, 10), (57, 60), (1, 180),
                     (90, 180), (999, 1000), (12345, 54321)]
    ]

    means = []
    for n, seed in [(5, SEED), (40, SEED), (40, 7), (300, SEED)]:
        values = [round(rnd.random(), 6) for _ in range(n)]
        means.append({"values": values, "seed": seed, **bootstrap_mean(values, seed)})
    # Per-item accuracies of UHGEval's sentence level take the values 0, 0.5 and 1.
    values = [rnd.choice([0.0, 0.5, 1.0]) for _ in range(60)]
    means.append({"values": values, "seed": SEED, **bootstrap_mean(values, SEED)})
    out["bootstrap_mean"] = means

    out["f1_bootstrap"] = [
        {"tp": tp, "fp": fp, "tn": tn, "fn": fn, "seed": SEED, **f1_bootstrap(tp, fp, tn, fn, SEED)}
        for tp, fp, tn, fn in [(98, 64, 119, 85), (3, 1, 3, 1), (1, 0, 6, 2), (40, 10, 30, 20)]
    ]

    delongs = []
    for n1, n0, levels in [(2, 2, None), (10, 12, None), (30, 25, 6), (60, 60, 11), (7, 3, 3)]:
        labels = [True] * n1 + [False] * n0
        rnd.shuffle(labels)
        if levels is None:
            scores = [round(rnd.gauss(1.0 if l else 0.0, 1.0), 4) for l in labels]
        else:  # ChainPoll-like scores: N + 1 values, many ties
            scores = [min(levels - 1, max(0, round(rnd.gauss(4 if l else 2, 2)))) / (levels - 1)
                      for l in labels]
        delongs.append({"labels": labels, "scores": scores, **delong(labels, scores)})
    out["delong"] = delongs
    parts = delongs[1:4]
    mean = sum(p["auroc"] for p in parts) / len(parts)
    var = sum(p["variance"] for p in parts) / len(parts) ** 2
    out["delong_mean"] = {
        "of": [1, 2, 3],
        "estimate": mean,
        "low": max(0.0, mean - Z * math.sqrt(var)),
        "high": min(1.0, mean + Z * math.sqrt(var)),
    }

    pairs = []
    for n, pa, pb in [(60, 0.5, 0.5), (60, 0.7, 0.4), (180, 0.3, 0.35), (12, 0.9, 0.1), (8, 1.0, 1.0)]:
        a = [rnd.random() < pa for _ in range(n)]
        b = [x if rnd.random() < 0.6 else rnd.random() < pb for x in a]
        pairs.append({"a": a, "b": b, **mcnemar(a, b)})
    out["mcnemar"] = pairs

    paired = []
    for n, shift in [(30, 0.0), (30, 0.1), (200, 0.02)]:
        a = [round(rnd.random(), 6) for _ in range(n)]
        b = [round(min(1.0, max(0.0, x - shift + rnd.gauss(0, 0.1))), 6) for x in a]
        paired.append({"a": a, "b": b, "seed": SEED, **paired_bootstrap(a, b, SEED)})
    out["paired_bootstrap"] = paired

    path = Path(__file__).with_name("ci_reference.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
