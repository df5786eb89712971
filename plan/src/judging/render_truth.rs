//! The human-truth parts of the "Judges" section (issue 45): the judges and the panel
//! against human truth with coverage, HypoTermQA §4.4 over every answer, pairwise
//! disagreement, and agreement with label sources that are not people.

use super::figures::{Figure, JudgeReport, VsHuman};
use super::truth::{HumanTruth, PairDisagreement};

fn fig(f: &Figure, factor: f64, decimals: usize) -> String {
    match f {
        Figure::Value(i) => {
            format!("{:.d$}{}", i.estimate * factor, i.bracket(factor, decimals), d = decimals)
        }
        Figure::Undefined { undefined } => format!("undefined ({undefined})"),
    }
}

/// A difference in percentage points with its bracket.
fn signed(f: &Figure) -> String {
    match f {
        Figure::Value(i) => format!("{:+.1}{}", i.estimate * 100.0, i.bracket(100.0, 1)),
        Figure::Undefined { undefined } => format!("undefined ({undefined})"),
    }
}

/// What a truth rule means, for the report.
fn truth_words(t: HumanTruth) -> &'static str {
    match t {
        HumanTruth::Majority => {
            "the annotators' majority; a unit whose annotators tie has no truth and is left out"
        }
        HumanTruth::Mace => {
            "MACE over the annotators (variational Bayes, the MACE tool's default), every labelled unit"
        }
        HumanTruth::MaceEm => "MACE over the annotators (EM), every labelled unit",
    }
}

const VS_HEAD: &str = "| judge | units with truth | with a verdict (coverage %) | accuracy %, verdicts only | error rate %, verdicts only | accuracy %, all units | error rate %, all units | Cohen's κ, verdicts only |\n|---|---|---|---|---|---|---|---|\n";

fn vs_row(name: &str, v: &VsHuman) -> String {
    format!(
        "| {name} | {} | {} ({}) | {} | {} | {} | {} | {} |\n",
        v.units,
        v.n,
        fig(&v.coverage, 100.0, 1),
        fig(&v.accuracy, 100.0, 1),
        fig(&v.error_rate, 100.0, 1),
        fig(&v.accuracy_all, 100.0, 1),
        fig(&v.error_rate_all, 100.0, 1),
        fig(&v.kappa, 1.0, 3),
    )
}

/// The confusion matrix of `name` (rows the truth, columns the labeller).
fn confusion(out: &mut String, name: &str, categories: &[String], v: &VsHuman) {
    out.push_str(&format!(
        "Confusion matrix of {name} (rows: truth `{}`, columns: {name}; units with a verdict):\n\n| truth \\ {name} |",
        v.truth
    ));
    for c in categories {
        out.push_str(&format!(" {c} |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(categories.len()));
    out.push('\n');
    for (r, c) in categories.iter().enumerate() {
        out.push_str(&format!("| {c} |"));
        for n in &v.confusion.counts[r] {
            out.push_str(&format!(" {n} |"));
        }
        out.push('\n');
    }
    out.push('\n');
}

fn pair_row(p: &PairDisagreement) -> String {
    format!("| {} · {} | {} | {} | {} |\n", p.a, p.b, p.n, p.disagree, fig(&p.rate, 100.0, 1))
}

/// "### Against human labels": truth, coverage, §4.4, pairwise disagreement.
pub(super) fn human(md: &mut String, r: &JudgeReport) {
    let Some(h) = &r.human else { return };
    let u = &r.unit;
    md.push_str(&format!(
        "### Against human labels\n\n{} human label(s) from {} annotator(s) in {}; {} {u}s of this run have one (rule-labelled ones included). **Human truth: `{}`** — {}: {} {u}s have a truth.",
        h.labels,
        h.annotators,
        h.files.join(", "),
        h.labelled_units,
        h.truth.describe(),
        truth_words(h.truth),
        h.units_with_truth,
    ));
    if h.annotator_ties > 0 {
        md.push_str(&format!(
            " {} {u}(s) where annotators tie have none and are in no figure below (`human_truth = \"mace\"` resolves them).",
            h.annotator_ties
        ));
    }
    md.push_str("\n\n");
    if let Some(m) = &h.mace {
        let comp: Vec<String> = m.competence.iter().map(|(a, c)| format!("{a} {c:.3}")).collect();
        md.push_str(&format!(
            "MACE over the annotators: {} after {} iterations (best of {} restarts, seed {}); competence: {}.\n\n",
            if m.fit.converged { "converged" } else { "did NOT converge" },
            m.fit.iterations,
            m.fit.restarts,
            m.fit.config.seed,
            comp.join(", ")
        ));
    }
    if h.unknown > 0 {
        md.push_str(&format!(
            "**{} label(s) name a {u} this run did not label** (first: {}).\n\n",
            h.unknown,
            h.unknown_listed
                .iter()
                .take(5)
                .map(|x| format!("{} at {}", x.key, x.source))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if let Some(a) = &h.inter_annotator_alpha {
        md.push_str(&format!(
            "Human inter-annotator agreement (Krippendorff's α, nominal, over the {} {u}s with several human labels; labels of other provenance are not in it): {}.\n\n",
            h.multiply_annotated,
            fig(a, 1.0, 3)
        ));
    }
    let p = &r.panel;
    let any = r.per_judge.iter().any(|j| j.vs_human.is_some()) || p.vs_human.is_some();
    if any {
        md.push_str(&format!(
            "The judged {u}s with a human truth (`{}`). *Verdicts only*: over the {u}s the labeller gave a verdict, with its coverage beside; *all units*: over every {u} with a truth, where no verdict (a judge error, a panel tie) is an outcome of its own that is never right — the figure on which a panel and a single judge compare. Intervals: Wilson 95% for rates and coverage (a percentile bootstrap over questions where a question holds several {u}s), percentile bootstrap over questions for κ.\n\n",
            h.truth.describe()
        ));
        md.push_str(VS_HEAD);
        for j in &r.per_judge {
            if let Some(v) = &j.vs_human {
                md.push_str(&vs_row(&j.judge, v));
            }
        }
        if let Some(v) = &p.vs_human {
            md.push_str(&vs_row(&format!("**panel ({})**", p.verdict.describe()), v));
        }
        md.push('\n');
        for j in &r.per_judge {
            if let Some(v) = &j.vs_human {
                confusion(md, &j.judge, &r.categories, v);
            }
        }
        if let Some(v) = &p.vs_human {
            confusion(md, "panel", &r.categories, v);
        }
    }
    score_vs_human(md, r);
    pairwise(md, r);
}

/// HypoTermQA §4.4: every unit with a human truth, rule-labelled ones included.
fn score_vs_human(md: &mut String, r: &JudgeReport) {
    let Some(first) = r.score_vs_human.first() else { return };
    let u = &r.unit;
    let groups: Vec<&str> = first.groups.iter().map(|g| g.group.as_str()).collect();
    let fav = &first.favourable;
    md.push_str(&format!(
        "#### Every {u} with a human truth{}\n\nTruth `{}`. Over every {u} with a human truth, those labelled by rule included (there every judge's label is the rule's); no verdict (`judge_error`, a panel tie) is wrong. Error rate: Wilson 95% (a percentile bootstrap over questions where a question holds several {u}s). Per group, the share labelled `{fav}` by the judge and by the human truth on the same {u}s (HypoTermQA: on hypothetical questions this is HTS), and judge − human in percentage points with a 95% percentile interval from a paired bootstrap over items (a question's {u}s resampled together).\n\n| labeller | {u}s | by rule | no verdict | wrong | error rate % |",
        if r.pipeline == "hypotermqa" { " (HypoTermQA §4.4, Figure 4)" } else { "" },
        first.truth.describe()
    ));
    for g in &groups {
        md.push_str(&format!(" {g}: judge % vs human %, difference (pp) |"));
    }
    md.push_str("\n|---|---|---|---|---|---|");
    md.push_str(&"---|".repeat(groups.len()));
    md.push('\n');
    for s in &r.score_vs_human {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |",
            s.labeller,
            s.units,
            s.ruled,
            s.no_verdict,
            s.wrong,
            fig(&s.error_rate, 100.0, 2)
        ));
        for g in &s.groups {
            let pct = |x: u64| 100.0 * x as f64 / g.units.max(1) as f64;
            md.push_str(&format!(
                " {:.2} vs {:.2}: {} ({} {u}s) |",
                pct(g.labeller),
                pct(g.human),
                signed(&g.difference),
                g.units
            ));
        }
        md.push('\n');
    }
    md.push('\n');
}

/// ChainPoll's comparison: each judge against each annotator beside the annotators.
fn pairwise(md: &mut String, r: &JudgeReport) {
    let Some(p) = r.human.as_ref().and_then(|h| h.pairwise.as_ref()) else { return };
    let u = &r.unit;
    md.push_str(&format!(
        "#### Pairwise disagreement (ChainPoll's comparison)\n\nHow often two labellers differ on the judged {u}s both labelled (human labels only; truth plays no part). Pooled: all pairs' disagreements over all their comparisons. Intervals: 95% percentile bootstrap over items (a question's {u}s resampled together). A judge whose pooled rate minus the annotators' is at most 0 (or whose interval holds 0) disagrees with the annotators no more than they do with each other.\n\n| pair | {u}s | disagree | rate % |\n|---|---|---|---|\n"
    ));
    for x in &p.annotator_pairs {
        md.push_str(&pair_row(x));
    }
    for j in &p.judges {
        for x in &j.pairs {
            md.push_str(&pair_row(x));
        }
    }
    md.push_str(&format!(
        "\n| who | pooled disagreement % | minus the annotators' (pp) |\n|---|---|---|\n| annotators among themselves | {} | - |\n",
        fig(&p.annotators_pooled, 100.0, 1)
    ));
    for j in &p.judges {
        md.push_str(&format!(
            "| {} against the annotators | {} | {} |\n",
            j.judge,
            fig(&j.pooled, 100.0, 1),
            signed(&j.minus_annotators)
        ));
    }
    md.push('\n');
}

/// Agreement with label sources that are not people, each under its provenance.
pub(super) fn sources(md: &mut String, r: &JudgeReport) {
    for s in &r.sources {
        let name = s.provenance.describe();
        let why = if name == "unstated" {
            " The dataset's provenance is not known to Halyard: state it with `dataset_labels = \"human\" | \"llm:<model>\" | \"rule\"` in the benchmark."
        } else {
            ""
        };
        md.push_str(&format!(
            "### Agreement with dataset labels ({name})\n\n{} label(s) on {} {}s, not given by people: they are not human truth and in no human figure (a judge of the same model agreeing with them is circular).{why} Columns as against human labels, with these labels as the truth.\n\n",
            s.labels, s.units, r.unit
        ));
        if s.unknown > 0 {
            md.push_str(&format!(
                "**{} of them name a {} this run did not judge.**\n\n",
                s.unknown, r.unit
            ));
        }
        md.push_str(VS_HEAD);
        for (j, v) in r.judges.iter().zip(&s.per_judge) {
            md.push_str(&vs_row(j, v));
        }
        if let Some(v) = &s.panel {
            md.push_str(&vs_row(&format!("**panel ({})**", r.panel.verdict.describe()), v));
        }
        md.push('\n');
    }
}
