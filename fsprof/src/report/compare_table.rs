//! The terminal report of `fsprof compare`.

use std::fmt::Write as _;

use super::table::table;
use crate::analysis::compare::{Comparison, Row, Verdict};
use crate::units::{bytes, duration_ns};

fn value(r: &Row, v: f64) -> String {
    match r.unit {
        "B/s" => format!("{}/s", bytes(v as u64)),
        "/s" => format!("{v:.1}/s"),
        _ => duration_ns(v as u64),
    }
}

pub fn verdict(r: &Row) -> String {
    match (r.verdict, r.passes_needed) {
        _ if r.machine_differed => "inconclusive: machine differed".into(),
        (Verdict::Regression, _) => "REGRESSION".into(),
        (Verdict::Improvement, _) => "improvement".into(),
        (Verdict::Inconclusive, Some(n)) => format!("inconclusive: {n} passes a side"),
        (Verdict::Inconclusive, None) => "inconclusive: > 50 passes a side".into(),
        (Verdict::Unchanged, _) => String::new(),
    }
}

/// The change in %, or "from 0".
pub fn change(r: &Row) -> String {
    r.change_pct
        .map_or_else(|| "from 0".into(), |c| format!("{c:+.1}%"))
}

/// The header: what was tested, the rule and the error it allows.
pub fn header(c: &Comparison) -> String {
    let mut cells: Vec<(&str, &str)> = c
        .rows
        .iter()
        .map(|r| (r.fs.as_str(), r.step.as_str()))
        .collect();
    cells.dedup();
    let r = &c.rule;
    let spread: Vec<String> = r
        .spread
        .iter()
        .filter(|k| k.prior_df != Some(0.0))
        .map(|k| format!("{} ±{:.0} %", k.kind, k.typical_pct))
        .collect();
    let mut o = format!(
        "fsprof compare: {} figures of {} cells tested, each once ({} aliases merged); flagged when \
         |change| ≥ {:.1} % and Benjamini–Hochberg q ≤ {} over all {}: if nothing changed, ~{} \
         false flags expected (a flag at all in ≤ {:.0} % of comparisons), else ≤ {:.0} % of the flags \
         (runs whose machine drifted beyond what their passes show can add more: docs/design.md)\n\
         each figure's spread moderated toward its kind's typical spread a pass: {}\n",
        r.figures,
        cells.len(),
        r.aliases,
        r.threshold_pct,
        r.fdr,
        r.figures,
        r.fdr,
        100.0 * r.fdr,
        100.0 * r.fdr,
        if spread.is_empty() {
            "none (too few figures of a kind)".into()
        } else {
            spread.join(", ")
        }
    );
    // A machine that differed is a note, with what it set aside.
    if let Some(m) = c.machine.as_ref().filter(|m| !m.differed) {
        let _ = writeln!(
            o,
            "the machine was alike: other processes, kernel threads and the hypervisor took {:.2} CPUs during base, {:.2} during new{}",
            m.base_cpus,
            m.new_cpus,
            m.disks()
        );
    }
    o
}

pub fn cells_of(r: &Row) -> Vec<String> {
    let name = std::iter::once(r.metric.clone())
        .chain(r.aliases.iter().cloned())
        .collect::<Vec<_>>()
        .join(" = ");
    vec![
        format!("{} {}", r.fs, r.step),
        name,
        value(r, r.base),
        value(r, r.new),
        change(r),
        r.ci_pct
            .map(|(a, b)| format!("[{a:+.1}, {b:+.1}]%"))
            .unwrap_or_else(|| "-".into()),
        r.q.map(crate::analysis::verdict::show_q)
            .unwrap_or_else(|| "-".into()),
        format!("{}/{}", r.n_base, r.n_new),
        verdict(r),
    ]
}

pub fn render(c: &Comparison, all: bool) -> String {
    let mut o = header(c);
    for n in &c.notes {
        let _ = writeln!(o, "note: {n}");
    }
    let rows: Vec<Vec<String>> = c
        .rows
        .iter()
        .filter(|r| all || matches!(r.verdict, Verdict::Regression | Verdict::Improvement))
        .map(cells_of)
        .collect();
    if rows.is_empty() {
        let _ = writeln!(o, "no clear change");
    } else {
        o.push_str(&table(
            &[
                "cell", "figure", "base", "new", "change", "95% CI", "q", "passes", "verdict",
            ],
            &rows,
        ));
    }
    o.push_str(&tally(c, all));
    o
}

/// The count of each verdict, and what would settle the inconclusive ones.
pub fn tally(c: &Comparison, all: bool) -> String {
    let mut o = format!(
        "{} regressions, {} improvements\n",
        c.count(Verdict::Regression),
        c.count(Verdict::Improvement)
    );
    let unclear = c.count(Verdict::Inconclusive);
    if unclear > 0 {
        let settle = c
            .rows
            .iter()
            .filter(|r| r.verdict == Verdict::Inconclusive && r.passes_needed.is_some())
            .count();
        let _ = writeln!(
            o,
            "{unclear} changes of ≥ {:.1} % inconclusive{}: up to 50 passes a side would settle {settle} \
             of them if they are what they seem",
            c.rule.threshold_pct,
            if all { "" } else { " (--all lists them)" },
        );
    }
    o
}
