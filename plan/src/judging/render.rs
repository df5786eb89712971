//! A [`JudgeReport`] as the report's Markdown section "Judges".

use super::figures::{Excess, Figure, JudgeReport};

fn fig(f: &Figure, factor: f64, decimals: usize) -> String {
    match f {
        Figure::Value(i) => {
            format!("{:.d$}{}", i.estimate * factor, i.bracket(factor, decimals), d = decimals)
        }
        Figure::Undefined { undefined } => format!("undefined ({undefined})"),
    }
}

/// "judge % vs others % → excess [interval] pp" of one side of a comparison.
fn excess_cell(e: Option<&Excess>, unit: &str) -> String {
    match e {
        None => "-".into(),
        Some(e) => format!(
            "{:.1} vs {:.1}: {} ({} {unit}{})",
            e.judge_rate * 100.0,
            e.others_rate * 100.0,
            signed(&e.excess),
            e.units,
            if e.units == 1 { "" } else { "s" }
        ),
    }
}

/// A difference in percentage points with its bracket.
fn signed(f: &Figure) -> String {
    match f {
        Figure::Value(i) => format!("{:+.1}{}", i.estimate * 100.0, i.bracket(100.0, 1)),
        Figure::Undefined { undefined } => format!("undefined ({undefined})"),
    }
}

/// What a unit key's `item` is in `pipeline`: the cluster every interval resamples.
fn cluster_name(pipeline: &str) -> &'static str {
    match pipeline {
        "hvi" => "passage",
        "hypotermqa" => "question",
        _ => "item",
    }
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or(String::new(), |f| f.to_uppercase().chain(c).collect())
}

/// The leniency and self-preference tables (issue 45).
fn preference(md: &mut String, r: &JudgeReport) {
    if let Some(first) = r.leniency.first() {
        md.push_str(&format!(
            "### Leniency\n\nEach judge's share of `{}` against each other judge's on the same {u}s (every {u} both labelled, all models), pooled over the other judges: its excess in percentage points, with a 95% percentile bootstrap interval over questions (a question's {u}s resampled together). Positive: more lenient than the others. It is relative to this panel.\n\n| judge | {u}s | questions | comparisons | its % vs others' %: excess (pp) |\n|---|---|---|---|---|\n",
            first.favourable,
            u = r.unit
        ));
        for l in &r.leniency {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {:.1} vs {:.1}: {} |\n",
                l.judge,
                l.excess.units,
                l.excess.questions,
                l.excess.pairs,
                l.excess.judge_rate * 100.0,
                l.excess.others_rate * 100.0,
                signed(&l.excess.excess)
            ));
        }
        md.push('\n');
    }
    if r.self_preference.is_empty() {
        return;
    }
    md.push_str(&format!(
        "### Self-preference\n\nA judge that is also a model under test (HypoTermQA §4.3): its excess over the judges of other models on its own model's {u}s, minus its excess on the {u}s of models it is not — the interaction, so a judge that is lenient on every {u} shows none. Both sides over the same questions (paired by question) where there are such; interval: 95% percentile bootstrap over questions; p: permutation test within questions (which {u} of a question is the judge's own, shuffled {} times). Each side reads \"its % vs the others' %: excess (pp)\".\n\n| judge | own model | questions paired | own model's {u}s | other models' {u}s | self-preference (pp) | p |\n|---|---|---|---|---|---|---|\n",
        super::preference::PERMUTATIONS,
        u = r.unit
    ));
    for s in &r.self_preference {
        let p = s.p_value.map_or("-".into(), |p| {
            format!("{p:.4}{}", if s.significant { " (significant)" } else { "" })
        });
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {p} |\n",
            s.judge,
            s.model,
            s.questions_paired,
            excess_cell(s.own.as_ref(), &r.unit),
            excess_cell(s.elsewhere.as_ref(), &r.unit),
            signed(&s.difference)
        ));
    }
    md.push('\n');
}

/// The "Judges" section of benchmark `r.benchmark`.
pub fn markdown(r: &JudgeReport) -> String {
    let mut md = format!(
        "## Benchmark {}: judges ({}, {} {}s, verdict `{}`)\n\n",
        r.benchmark,
        r.pipeline,
        r.units,
        r.unit,
        r.panel.verdict.describe()
    );
    md.push_str(&format!("Labels: {}.\n\n", r.categories.join(", ")));
    md.push_str("| judge | labelled | no verdict |");
    for c in &r.categories {
        md.push_str(&format!(" {c} |"));
    }
    md.push_str(" MACE competence |\n|---|---|---|");
    md.push_str(&"---|".repeat(r.categories.len()));
    md.push_str("---|\n");
    for j in &r.per_judge {
        md.push_str(&format!("| {} | {} | {} |", j.judge, j.labelled, j.missing));
        for d in &j.distribution {
            md.push_str(&format!(" {d} |"));
        }
        let comp = j.mace_competence.map_or("-".into(), |c| format!("{c:.3}"));
        md.push_str(&format!(" {comp} |\n"));
    }
    let p = &r.panel;
    md.push_str(&format!(
        "| **panel ({})** | {} | {} |",
        p.verdict.describe(),
        p.decided,
        p.unjudged
    ));
    for d in &p.distribution {
        md.push_str(&format!(" {d} |"));
    }
    md.push_str(" - |\n\n");
    if p.ties > 0 {
        md.push_str(&format!(
            "{} {}(s) tie between the judges' labels and have no majority verdict.\n\n",
            p.ties, r.unit
        ));
    }
    if let Some(m) = &p.mace {
        md.push_str(&format!(
            "MACE: {} after {} iterations (best of {} restarts, seed {}), log-likelihood {:.3}.\n\n",
            if m.converged { "converged" } else { "did NOT converge" },
            m.iterations,
            m.restarts,
            m.config.seed,
            m.log_likelihood
        ));
    }
    super::render_truth::human(&mut md, r);
    super::render_truth::sources(&mut md, r);
    if let Some(b) = &r.between {
        md.push_str("### Between judges\n\n| judges | n | Cohen's κ |\n|---|---|---|\n");
        for k in &b.pairwise_kappa {
            md.push_str(&format!("| {} · {} | {} | {} |\n", k.a, k.b, k.n, fig(&k.kappa, 1.0, 3)));
        }
        md.push_str(&format!(
            "\nFleiss' κ: {}. Krippendorff's α (nominal): {}.\n\n",
            fig(&b.fleiss_kappa, 1.0, 3),
            fig(&b.krippendorff_alpha, 1.0, 3)
        ));
        if let Some(c) = &b.error_correlation {
            md.push_str("Correlation of the judges' errors against human labels (phi):\n\n| |");
            for j in &r.judges {
                md.push_str(&format!(" {j} |"));
            }
            md.push_str("\n|---|");
            md.push_str(&"---|".repeat(r.judges.len()));
            md.push('\n');
            for (a, row) in c.iter().enumerate() {
                md.push_str(&format!("| {} |", r.judges[a]));
                for v in row {
                    md.push_str(&v.map_or(" - |".into(), |v| format!(" {v:.3} |")));
                }
                md.push('\n');
            }
            if let Some(p) = &b.panel_vs_independence {
                md.push_str(&format!(
                    "\nThe judges' majority against the same truth, over its {} {}s: right (%) {} (a verdict on {:.1}%); judges erring independently with the same per-judge confusion rows would be right on {:.1}% (a verdict on {:.1}%). Observed − independent: {} pp (95% percentile bootstrap over questions; negative: the judges err together).\n",
                    p.units,
                    r.unit,
                    fig(&p.observed, 100.0, 1),
                    p.observed_coverage * 100.0,
                    p.independent * 100.0,
                    p.independent_coverage * 100.0,
                    signed(&p.difference)
                ));
            }
            md.push('\n');
        }
    }
    preference(&mut md, r);
    if cluster_name(&r.pipeline) != "item" {
        let c = cluster_name(&r.pipeline);
        md.push_str(&format!(
            "{}s of one {c} are not independent: every interval above resamples {c}s with all their {}s (a percentile bootstrap; Wilson's where each {c} holds one {}).\n\n",
            capitalised(&r.unit),
            r.unit,
            r.unit
        ));
    }
    if r.disagreements_total > 0 {
        md.push_str(&format!(
            "{} {}(s) where judges, or a judge and the human label, disagree: listed in report.html.\n\n",
            r.disagreements_total, r.unit
        ));
    }
    md
}
