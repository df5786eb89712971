#!/usr/bin/env python3
"""Reference values for Halyard's inter-rater agreement statistics and MACE.

Writes `agreement_reference.json` next to this file; `pipelines/tests/agreement_reference.rs`
reads it and checks `halyard_pipelines::metrics::{agreement, mace}` against it.

Each statistic is computed here without Halyard's code:
- Cohen's kappa: scikit-learn (`sklearn.metrics.cohen_kappa_score`), and Wikipedia's
  worked example ("Cohen's kappa", Simple example: 50 grant proposals, 20 yes/yes,
  5 yes/no, 10 no/yes, 15 no/no, p_o = 0.7, p_e = 0.5, kappa = 0.4);
- Fleiss's kappa: statsmodels (`statsmodels.stats.inter_rater.fleiss_kappa` on the table
  of `aggregate_raters`), on the items rated by every rater, and Wikipedia's worked example
  ("Fleiss' kappa", Worked example: 10 subjects, 14 raters, 5 categories, kappa = 0.210);
- Krippendorff's alpha, nominal: the PyPI `krippendorff` package
  (`krippendorff.alpha(reliability_data=..., level_of_measurement="nominal")`), and the
  worked example with missing data of Krippendorff (2011), "Computing Krippendorff's
  Alpha-Reliability", section C (4 observers, 12 units, values 1-5, alpha = 0.743);
- error correlations: numpy's `corrcoef` of the 0/1 error indicators over the items both
  raters rated with a known truth (the effective number of raters from Kish's formula was
  dropped with the function in issue 45; the panel-vs-independence figure that replaced
  it is checked by hand values in `pipelines/src/metrics/agreement.rs`);
- bootstrap intervals: the seeded percentile bootstrap over items needs the same random
  draws to be checked exactly, so the generator (SplitMix64, index = (draw * n) >> 64) is
  re-implemented here as in `ci_reference.py`, the statistic of each resample is computed
  by the packages above, and the quantiles are numpy's default (linear, type 7);
- MACE (Hovy et al. 2013): one EM step derived by hand below (exact fractions), and an
  independent numpy EM (direct products over raters, not the log-space sums Halyard uses;
  spam counts as 1 - P(knew), not summed over the other labels) run from fixed starts and,
  with the initialisation re-implemented (SplitMix64 uniforms, weights 1 + 0.5u), with
  random restarts; plus a synthetic panel of 5 raters with designed competences.

Regenerate (needs numpy, scipy, scikit-learn, statsmodels and krippendorff from PyPI):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy scipy scikit-learn statsmodels krippendorff
    /tmp/venv/bin/python pipelines/tests/data/agreement_reference.py
"""

import json
import math
import random
import warnings
from fractions import Fraction
from pathlib import Path

import krippendorff
import numpy as np
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats.inter_rater import aggregate_raters, fleiss_kappa

RESAMPLES = 2000
SEED = 0x48414C59
MASK = (1 << 64) - 1

warnings.filterwarnings("ignore", category=RuntimeWarning)  # 0/0 in degenerate resamples


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

    def uniform(self):
        return (self.next_u64() >> 11) * 2.0**-53


def bootstrap(n, stat, seed=SEED):
    """Percentile bootstrap over n items: stat(idx) -> float or None (dropped)."""
    rng = SplitMix64(seed)
    reps = []
    for _ in range(RESAMPLES):
        idx = [rng.below(n) for _ in range(n)]
        v = stat(idx)
        if v is not None and not math.isnan(v):
            reps.append(v)
    a = np.array(sorted(reps))
    return {"low": float(np.percentile(a, 2.5)), "high": float(np.percentile(a, 97.5)),
            "resamples": len(reps)}


# ----------------------------------------------------------------------------- Cohen

def cohen(k, a, b):
    v = cohen_kappa_score(a, b, labels=list(range(k)))
    return None if math.isnan(v) else float(v)


def cohen_case(k, a, b, source, published=None, ci=False):
    case = {"source": source, "categories": k, "a": a, "b": b, "kappa": cohen(k, a, b)}
    if published is not None:
        case["published"] = published
    if ci:
        case["ci"] = bootstrap(len(a), lambda idx: cohen(k, [a[i] for i in idx], [b[i] for i in idx]))
    return case


# ----------------------------------------------------------------------------- Fleiss

def complete(items):
    return [row for row in items if all(v is not None for v in row)]


def fleiss(k, items):
    """statsmodels' Fleiss kappa of the items rated by every rater."""
    rows = complete(items)
    if not rows:
        return None
    table, cats = aggregate_raters(np.array(rows), n_cat=k)
    v = fleiss_kappa(table, method="fleiss")
    return None if math.isnan(v) or math.isinf(v) else float(v)


def fleiss_case(k, items, source, published=None, ci=False):
    case = {"source": source, "categories": k, "items": items, "kappa": fleiss(k, items)}
    if published is not None:
        case["published"] = published
    if ci:
        rows = complete(items)
        case["ci"] = bootstrap(len(rows), lambda idx: fleiss(k, [rows[i] for i in idx]))
        case["ci"]["n"] = len(rows)
    return case


def from_table(table):
    """Items rated by len(raters) raters from per-item category counts (raters arbitrary)."""
    return [[c for c, n in enumerate(row) for _ in range(n)] for row in table]


# ----------------------------------------------------------------------------- Krippendorff

def alpha(items):
    data = np.array([[np.nan if v is None else v for v in row] for row in items], dtype=float).T
    try:
        v = krippendorff.alpha(reliability_data=data, level_of_measurement="nominal")
    except (ValueError, ZeroDivisionError):
        return None
    return None if math.isnan(v) else float(v)


def alpha_case(k, items, source, published=None, ci=False):
    case = {"source": source, "categories": k, "items": items, "alpha": alpha(items)}
    if published is not None:
        case["published"] = published
    if ci:
        rows = [row for row in items if sum(v is not None for v in row) >= 2]
        case["ci"] = bootstrap(len(rows), lambda idx: alpha([rows[i] for i in idx]))
        case["ci"]["n"] = len(rows)
    return case


# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", C: nominal data, any
# number of observers, missing data. Observers A-D (rows), units 1-12 (columns), values
# 1-5 ("." missing); published alpha = 0.743. Values are shifted to categories 0-4.
KRIPPENDORFF_2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]

# Wikipedia, "Fleiss' kappa", Worked example: n_ij for 10 subjects (rows), 5 categories,
# 14 raters; P-bar = 0.378, P-bar_e = 0.213, kappa = 0.210.
FLEISS_WIKIPEDIA = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]


# ----------------------------------------------------------------------------- errors

def error_correlations(items, truth):
    m = len(items[0])
    err = np.full((len(items), m), np.nan)
    for i, (row, t) in enumerate(zip(items, truth)):
        for j, v in enumerate(row):
            if v is not None and t is not None:
                err[i, j] = float(v != t)
    out = [[None] * m for _ in range(m)]
    for a in range(m):
        for b in range(m):
            both = ~np.isnan(err[:, a]) & ~np.isnan(err[:, b])
            x, y = err[both, a], err[both, b]
            if len(x) == 0 or x.std() == 0 or y.std() == 0:
                continue
            out[a][b] = float(np.corrcoef(x, y)[0, 1])
    return out


# ----------------------------------------------------------------------------- majority

def majority(row):
    present = [v for v in row if v is not None]
    if not present:
        return "Unrated"
    counts = {c: present.count(c) for c in set(present)}
    best = max(counts.values())
    top = sorted(c for c, n in counts.items() if n == best)
    return {"Label": top[0]} if len(top) == 1 else {"Tie": top}


# ----------------------------------------------------------------------------- MACE

def mace_em(k, items, theta, xi, iterations, tolerance, smoothing):
    """EM for MACE from (theta, xi), numpy, direct products. Returns a dict of the fit."""
    A = np.array([[-1 if v is None else v for v in row] for row in items])
    rated_items = (A >= 0).any(axis=1)
    A = A[rated_items]
    n, m = A.shape
    mask = A >= 0
    Ac = np.where(mask, A, 0)
    s = smoothing / k
    theta, xi = np.array(theta, dtype=float), np.array(xi, dtype=float)

    def e_step(theta, xi):
        noise = (1 - theta)[None, :] * xi[np.arange(m)[None, :], Ac]  # (n, m)
        f = noise[:, :, None] + theta[None, :, None] * (Ac[:, :, None] == np.arange(k))
        f = np.where(mask[:, :, None], f, 1.0)
        like = f.prod(axis=1) / k  # (n, k)
        z = like.sum(axis=1)
        post = like / z[:, None]
        knew = np.where(mask, post[np.arange(n)[:, None], Ac] * theta[None, :] / (noise + theta[None, :]), 0.0)
        spam = np.where(mask, 1.0 - knew, 0.0)
        strat = np.zeros((m, k))
        for j in range(m):
            for c in range(k):
                strat[j, c] = spam[mask[:, j] & (A[:, j] == c), j].sum()
        return post, float(np.log(z).sum()), knew.sum(axis=0), spam.sum(axis=0), strat

    post, ll, K, S, strat = e_step(theta, xi)
    done, converged = 0, False
    for it in range(1, iterations + 1):
        theta = (K + s) / (K + S + 2 * s)
        xi = (strat + s) / (strat.sum(axis=1, keepdims=True) + k * s)
        before = ll
        post, ll, K, S, strat = e_step(theta, xi)
        done = it
        if abs(ll - before) < tolerance:
            converged = True
            break
    full_post = np.full((len(items), k), 1.0 / k)
    full_post[rated_items] = post
    labels = [int(np.argmax(p)) if r else None for p, r in zip(full_post, rated_items)]
    return {"competence": theta.tolist(), "spamming": xi.tolist(), "posteriors": full_post.tolist(),
            "labels": labels, "log_likelihood": ll, "iterations": done, "converged": converged}


def mace_restarts(k, items, cfg):
    """MACE's restarts: the tool's initialisation from SplitMix64 uniforms, best likelihood."""
    m = len(items[0])
    rng = SplitMix64(cfg["seed"])
    best = None
    for _ in range(cfg["restarts"]):
        theta = []
        for _ in range(m):
            spam, know = 1 + 0.5 * rng.uniform(), 1 + 0.5 * rng.uniform()
            theta.append(know / (spam + know))
        xi = []
        for _ in range(m):
            w = [1 + 0.5 * rng.uniform() for _ in range(k)]
            xi.append([x / sum(w) for x in w])
        fit = mace_em(k, items, theta, xi, cfg["iterations"], cfg["tolerance"], cfg["smoothing"])
        if best is None or fit["log_likelihood"] > best["log_likelihood"]:
            best = fit
    return best


# The hand-worked EM step: 3 annotators, 6 items, 2 categories (rows: items; columns:
# annotators 0-2; None = not rated):
MACE_HAND_ITEMS = [
    [0, 0, 0],
    [0, 0, 1],
    [1, 1, 1],
    [1, 0, 1],
    [0, 1, None],
    [1, 1, 0],
]
# Start: theta_j = 1/2, xi_j = (1/2, 1/2) for every annotator; smoothing 0.02, so the
# pseudo-count is s = 0.02 / k = 0.01.
#
# E-step. P(A = a | T = c) = (1 - theta) xi(a) + theta [a = c] = 1/4 + 1/2 [a = c]:
# 3/4 when the label is c, 1/4 otherwise. The prior 1/2 cancels in the posterior:
#   3 agreeing labels (items 0, 2): (3/4)^3 : (1/4)^3 = 27 : 1  -> P(majority) = 27/28;
#   2 against 1 (items 1, 3, 5):    (3/4)^2 (1/4) : (3/4) (1/4)^2 = 3 : 1 -> 3/4;
#   1 against 1 (item 4):           1 : 1 -> 1/2.
# So P(T = 0) = 27/28, 3/4, 1/28, 1/4, 1/2, 1/4 for items 0-5.
#
# Expected counts. An annotation a knew with probability
#   P(T = a) * theta / ((1 - theta) xi(a) + theta) = P(T = a) * (1/2) / (3/4) = (2/3) P(T = a),
# and spammed (with label a) with probability 1 - (2/3) P(T = a).
# Annotator 0 labels 0, 0, 1, 1, 0, 1; the posteriors of its labels are 27/28, 3/4, 27/28,
#   3/4, 1/2, 3/4, so knew = (2/3)(27/28 + 3/4 + 27/28 + 3/4 + 1/2 + 3/4) = 131/42;
#   spammed with label 0 (items 0, 1, 4): 5/14 + 1/2 + 2/3 = 64/42,
#   spammed with label 1 (items 2, 3, 5): 5/14 + 1/2 + 1/2 = 57/42  (131 + 64 + 57 = 6 * 42).
# Annotator 1 labels 0, 0, 1, 0, 1, 1; posteriors of its labels 27/28, 3/4, 27/28, 1/4,
#   1/2, 3/4: knew = (2/3)(27/28 + 3/4 + 27/28 + 1/4 + 1/2 + 3/4) = (2/3)(117/28) = 39/14
#   = 117/42; spammed 0 (items 0, 1, 3): 5/14 + 1/2 + 5/6 = 71/42;
#   spammed 1 (items 2, 4, 5): 5/14 + 2/3 + 1/2 = 64/42  (117 + 71 + 64 = 252).
# Annotator 2 labels 0, 1, 1, 1, -, 0; posteriors of its labels 27/28, 1/4, 27/28, 3/4,
#   1/4: knew = (2/3)(27/28 + 1/4 + 27/28 + 3/4 + 1/4) = (2/3)(89/28) = 89/42;
#   spammed 0 (items 0, 5): 5/14 + 5/6 = 50/42; spammed 1 (items 1, 2, 3): 5/6 + 5/14
#   + 1/2 = 71/42  (89 + 50 + 71 = 5 * 42).
# M-step with s = 1/100:
#   theta_0 = (131/42 + s) / (6 + 2s),  xi_0 = (64/42 + s, 57/42 + s) / (121/42 + 2s);
#   theta_1 = (117/42 + s) / (6 + 2s),  xi_1 = (71/42 + s, 64/42 + s) / (135/42 + 2s);
#   theta_2 = (89/42 + s) / (5 + 2s),   xi_2 = (50/42 + s, 71/42 + s) / (121/42 + 2s).
S = Fraction(1, 100)
MACE_HAND_POSTERIORS_0 = [Fraction(27, 28), Fraction(3, 4), Fraction(1, 28), Fraction(1, 4),
                          Fraction(1, 2), Fraction(1, 4)]
MACE_HAND_STEP_1 = {
    "competence": [(Fraction(131, 42) + S) / (6 + 2 * S), (Fraction(117, 42) + S) / (6 + 2 * S),
                   (Fraction(89, 42) + S) / (5 + 2 * S)],
    "spamming": [[(Fraction(a, 42) + S) / (Fraction(a + b, 42) + 2 * S),
                  (Fraction(b, 42) + S) / (Fraction(a + b, 42) + 2 * S)]
                 for a, b in [(64, 57), (71, 64), (50, 71)]],
}


def mace_hand_check():
    """The hand-derived step, recomputed from its formulas in exact arithmetic."""
    k, s = 2, S
    theta = [Fraction(1, 2)] * 3
    xi = [[Fraction(1, 2)] * 2 for _ in range(3)]
    posts = []
    knew, strat = [Fraction(0)] * 3, [[Fraction(0)] * 2 for _ in range(3)]
    for row in MACE_HAND_ITEMS:
        like = []
        for c in range(k):
            p = Fraction(1, k)
            for j, a in enumerate(row):
                if a is not None:
                    p *= (1 - theta[j]) * xi[j][a] + (theta[j] if a == c else 0)
            like.append(p)
        post = [x / sum(like) for x in like]
        posts.append(post[0])
        for j, a in enumerate(row):
            if a is None:
                continue
            kn = post[a] * theta[j] / ((1 - theta[j]) * xi[j][a] + theta[j])
            knew[j] += kn
            strat[j][a] += 1 - kn
    assert posts == MACE_HAND_POSTERIORS_0, posts
    for j in range(3):
        n_j = sum(a is not None for a in (row[j] for row in MACE_HAND_ITEMS))
        assert (knew[j] + s) / (n_j + 2 * s) == MACE_HAND_STEP_1["competence"][j], j
        total = sum(strat[j]) + k * s
        assert [(x + s) / total for x in strat[j]] == MACE_HAND_STEP_1["spamming"][j], j


def synthetic_panel(rnd, n, k, competences, spamming, missing):
    truth = [rnd.randrange(k) for _ in range(n)]
    items = []
    for t in truth:
        row = []
        for c, xi in zip(competences, spamming):
            if rnd.random() < missing:
                row.append(None)
            elif rnd.random() < c:
                row.append(t)
            else:
                row.append(rnd.choices(range(k), weights=xi)[0])
        items.append(row)
    return truth, items


def main():
    rnd = random.Random(2013)
    out = {"resamples": RESAMPLES, "seed": SEED}

    # Cohen
    wiki_a = [0] * 20 + [0] * 5 + [1] * 10 + [1] * 15  # 0 = yes, 1 = no
    wiki_b = [0] * 20 + [1] * 5 + [0] * 10 + [1] * 15
    cohen_cases = [cohen_case(2, wiki_a, wiki_b, "Wikipedia, Cohen's kappa, simple example "
                              "(20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no)", published=0.4, ci=True)]
    for n, k, agree in [(30, 2, 0.7), (60, 3, 0.5), (200, 4, 0.8), (12, 5, 0.3), (100, 3, 0.0)]:
        a = [rnd.randrange(k) for _ in range(n)]
        b = [x if rnd.random() < agree else rnd.randrange(k) for x in a]
        cohen_cases.append(cohen_case(k, a, b, "sklearn.metrics.cohen_kappa_score", ci=n >= 30))
    out["cohen"] = cohen_cases

    # Fleiss
    wiki = from_table(FLEISS_WIKIPEDIA)
    fleiss_cases = [fleiss_case(5, wiki, "Wikipedia, Fleiss' kappa, worked example "
                                "(10 subjects, 14 raters, 5 categories)", published=0.210, ci=True)]
    for n, m, k, agree, missing in [(40, 3, 2, 0.6, 0.0), (80, 5, 4, 0.5, 0.0), (100, 4, 3, 0.7, 0.1),
                                    (25, 6, 3, 0.3, 0.05)]:
        items = []
        for _ in range(n):
            t = rnd.randrange(k)
            items.append([None if rnd.random() < missing else
                          (t if rnd.random() < agree else rnd.randrange(k)) for _ in range(m)])
        fleiss_cases.append(fleiss_case(k, items, "statsmodels fleiss_kappa(aggregate_raters(items "
                                        "rated by every rater))", ci=True))
    out["fleiss"] = fleiss_cases

    # Krippendorff
    kr = [[None if v is None else v - 1 for v in row] for row in zip(*KRIPPENDORFF_2011)]
    alpha_cases = [alpha_case(5, kr, "Krippendorff (2011), Computing Krippendorff's "
                              "Alpha-Reliability, C: nominal, 4 observers, 12 units, missing "
                              "data", published=0.743, ci=True)]
    for n, m, k, agree, missing in [(50, 3, 2, 0.6, 0.2), (120, 5, 4, 0.5, 0.4), (30, 2, 3, 0.8, 0.0),
                                    (200, 4, 3, 0.7, 0.3)]:
        items = []
        for _ in range(n):
            t = rnd.randrange(k)
            items.append([None if rnd.random() < missing else
                          (t if rnd.random() < agree else rnd.randrange(k)) for _ in range(m)])
        alpha_cases.append(alpha_case(k, items, "krippendorff.alpha(level_of_measurement="
                                      "'nominal')", ci=True))
    out["krippendorff"] = alpha_cases

    # Error correlations: raters that share some mistakes (a common "hard item" flag).
    err_cases = []
    for n, m, k, missing in [(60, 3, 2, 0.0), (150, 5, 3, 0.15)]:
        truth, items = [], []
        for _ in range(n):
            t = rnd.randrange(k)
            hard = rnd.random() < 0.3
            truth.append(None if rnd.random() < 0.05 else t)
            row = []
            for j in range(m):
                wrong = rnd.random() < (0.6 if hard and j < 2 else 0.15)
                v = (t + 1 + rnd.randrange(k - 1)) % k if wrong else t
                row.append(None if rnd.random() < missing else v)
            items.append(row)
        corr = error_correlations(items, truth)
        err_cases.append({"categories": k, "items": items, "truth": truth, "correlations": corr})
    out["error_correlations"] = err_cases

    out["majority"] = [{"row": row, "majority": majority(row)} for row in
                       [[2, 1, 2, None], [2, 0, None, 1], [3, 1, 1, 3], [None, None], [], [0],
                        [4, 4, 4, 1, 1]]]

    # MACE
    mace_hand_check()
    out["mace_hand"] = {
        "categories": 2,
        "items": MACE_HAND_ITEMS,
        "smoothing": 0.02,
        "init_competence": [0.5] * 3,
        "init_spamming": [[0.5, 0.5]] * 3,
        "posteriors_0": [[float(p), float(1 - p)] for p in MACE_HAND_POSTERIORS_0],
        "competence_1": [float(x) for x in MACE_HAND_STEP_1["competence"]],
        "spamming_1": [[float(x) for x in row] for row in MACE_HAND_STEP_1["spamming"]],
    }
    fixed = []
    for k, items, theta, xi, iterations in [
        (2, MACE_HAND_ITEMS, [0.5] * 3, [[0.5, 0.5]] * 3, 1),
        (2, MACE_HAND_ITEMS, [0.5] * 3, [[0.5, 0.5]] * 3, 50),
        (2, MACE_HAND_ITEMS, [0.7, 0.4, 0.55], [[0.3, 0.7], [0.5, 0.5], [0.9, 0.1]], 50),
    ]:
        fit = mace_em(k, items, theta, xi, iterations, 0.0, 0.02)
        fixed.append({"categories": k, "items": items, "init_competence": theta, "init_spamming": xi,
                      "iterations": iterations, "smoothing": 0.02, **fit})
    out["mace_fixed"] = fixed

    # The synthetic panel: designed competences, two spammers with a favourite label.
    competences = [0.95, 0.9, 0.7, 0.4, 0.1]
    spamming = [[1, 1, 1], [1, 1, 1], [1, 2, 1], [6, 2, 2], [1, 1, 8]]
    truth, items = synthetic_panel(random.Random(4013), 400, 3, competences, spamming, 0.1)
    items[7] = [None] * 5  # an item nobody rated
    default = {"restarts": 10, "iterations": 50, "tolerance": 1e-9, "smoothing": 0.01, "seed": SEED}
    fit = mace_restarts(3, items, default)
    fit_fixed = mace_em(3, items, [0.5] * 5, [[1 / 3] * 3] * 5, 50, 0.0, 0.01)

    def accuracy(labels):
        return sum(1 for l, t in zip(labels, truth) if l == t) / len(truth)

    votes = []
    for row in items:
        mj = majority(row)
        votes.append(None if mj == "Unrated" else mj.get("Label", (mj.get("Tie") or [None])[0]))
    out["mace_synthetic"] = {
        "categories": 3,
        "items": items,
        "truth": truth,
        "designed_competence": competences,
        "designed_spamming": spamming,
        "config": default,
        "fit": fit,
        "fixed_start": {"init_competence": [0.5] * 5, "init_spamming": [[1 / 3] * 3] * 5,
                        "iterations": 50, "smoothing": 0.01, **fit_fixed},
        "mace_accuracy": accuracy(fit["labels"]),
        "majority_accuracy": accuracy(votes),
    }
    out["mace_full"] = [{"categories": 2, "items": MACE_HAND_ITEMS, "config": default,
                         **mace_restarts(2, MACE_HAND_ITEMS, default)},
                        {"categories": 2, "items": MACE_HAND_ITEMS,
                         "config": {**default, "restarts": 3, "iterations": 5, "seed": 7},
                         **mace_restarts(2, MACE_HAND_ITEMS,
                                         {**default, "restarts": 3, "iterations": 5, "seed": 7})}]

    path = Path(__file__).with_name("agreement_reference.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    for c in cohen_cases[:1] + fleiss_cases[:1] + alpha_cases[:1]:
        print(c["source"], c.get("kappa", c.get("alpha")), "published", c["published"])
    print("synthetic: competence", [round(x, 3) for x in fit["competence"]],
          "mace acc", out["mace_synthetic"]["mace_accuracy"], "majority acc",
          out["mace_synthetic"]["majority_accuracy"])


if __name__ == "__main__":
    main()
