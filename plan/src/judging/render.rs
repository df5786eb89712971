//! A [`JudgeReport`] as the report's Markdown section "Judges".

use super::figures::{Figure, JudgeReport, VsHuman};

fn fig(f: &Figure, factor: f64, decimals: usize) -> String {
    match f {
        Figure::Value(i) => {
            format!("{:.d$}{}", i.estimate * factor, i.bracket(factor, decimals), d = decimals)
        }
        Figure::Undefined { undefined } => format!("undefined ({undefined})"),
    }
}

fn vs_row(name: &str, v: &VsHuman) -> String {
    format!(
        "| {name} | {} | {} | {} | {} | {} |\n",
        v.n,
        fig(&v.error_rate, 100.0, 1),
        fig(&v.accuracy, 100.0, 1),
        fig(&v.kappa, 1.0, 3),
        v.unlabelled
    )
}

/// The confusion matrix of `name` (rows human, columns the labeller).
fn confusion(out: &mut String, name: &str, categories: &[String], v: &VsHuman) {
    out.push_str(&format!(
        "Confusion matrix of {name} (rows: human, columns: {name}):\n\n| human \\ {name} |"
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
    if let Some(h) = &r.human {
        md.push_str(&format!(
            "### Against human labels\n\n{} labels from {} annotator(s) in {}; {} {}s have a human label",
            h.labels,
            h.annotators,
            h.files.join(", "),
            h.units_with_truth,
            r.unit
        ));
        if h.annotator_ties > 0 {
            md.push_str(&format!(" ({} more where annotators tie)", h.annotator_ties));
        }
        md.push_str(".\n\n");
        if h.unknown > 0 {
            md.push_str(&format!(
                "**{} human label(s) name a {} this run did not judge** (first: {}).\n\n",
                h.unknown,
                r.unit,
                h.unknown_listed
                    .iter()
                    .take(5)
                    .map(|u| format!("{} at {}", u.key, u.source))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        if let Some(a) = &h.inter_annotator_alpha {
            md.push_str(&format!(
                "Human inter-annotator agreement (Krippendorff's α over {} {}s with several labels): {}.\n\n",
                h.multiply_annotated,
                r.unit,
                fig(a, 1.0, 3)
            ));
        }
        md.push_str("| judge | n | error rate % | accuracy % | Cohen's κ | no verdict |\n|---|---|---|---|---|---|\n");
        for j in &r.per_judge {
            if let Some(v) = &j.vs_human {
                md.push_str(&vs_row(&j.judge, v));
            }
        }
        if let Some(v) = &p.vs_human {
            md.push_str(&vs_row(&format!("**panel ({})**", p.verdict.describe()), v));
        }
        md.push_str(
            "\nIntervals: Wilson 95% for rates, percentile bootstrap over units for κ.\n\n",
        );
        for j in &r.per_judge {
            if let Some(v) = &j.vs_human {
                confusion(&mut md, &j.judge, &r.categories, v);
            }
        }
        if let Some(v) = &p.vs_human {
            confusion(&mut md, "panel", &r.categories, v);
        }
    }
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
            if let Some(e) = b.effective_judges {
                md.push_str(&format!(
                    "\nEffective number of independent judges: {e:.2} of {}.\n",
                    r.judges.len()
                ));
            }
            md.push('\n');
        }
    }
    if !r.self_preference.is_empty() {
        md.push_str("### Self-preference\n\nA judge that is also a model under test, on its own model's answers: how often it gives the favourable label, against the majority of the judges of other models on the same answers (McNemar's exact test; difference with Newcombe's 95% interval). The last column is the same difference on the other models' answers: a judge that is merely lenient leads there too.\n\n| judge | own model | n | own % | others % | difference (pp) | p | difference elsewhere (pp) |\n|---|---|---|---|---|---|---|---|\n");
        for s in &r.self_preference {
            let d = &s.test.difference;
            let elsewhere = s.elsewhere.as_ref().map_or("-".to_string(), |e| {
                let d = &e.difference;
                format!("{:+.1}{} (n {})", d.estimate * 100.0, d.bracket(100.0, 1), d.n)
            });
            md.push_str(&format!(
                "| {} | {} | {} | {:.1} | {:.1} | {:+.1}{} | {:.4}{} | {elsewhere} |\n",
                s.judge,
                s.model,
                s.n,
                s.own_rate * 100.0,
                s.others_rate * 100.0,
                d.estimate * 100.0,
                d.bracket(100.0, 1),
                s.test.p_value,
                if s.test.significant { " (significant)" } else { "" }
            ));
        }
        md.push('\n');
    }
    if r.unit == "sentence" {
        md.push_str("Units are sentences, and sentences of one passage are not independent: the intervals above are narrower than they should be.\n\n");
    }
    if r.disagreements_total > 0 {
        md.push_str(&format!(
            "{} {}(s) where judges, or a judge and the human label, disagree: listed in report.html.\n\n",
            r.disagreements_total, r.unit
        ));
    }
    md
}
