//! The terminal report of `fsprof compare`.

use std::fmt::Write as _;

use super::table::table;
use crate::analysis::compare::{CompareOptions, Comparison, Row, Verdict};
use crate::units::{bytes, duration_ns};

fn value(r: &Row, v: f64) -> String {
    match r.unit {
        "B/s" => format!("{}/s", bytes(v as u64)),
        _ => duration_ns(v as u64),
    }
}

fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Regression => "REGRESSION",
        Verdict::Improvement => "improvement",
        Verdict::Noise => "noise",
        Verdict::Unchanged => "",
        Verdict::Untested => "untested (1 pass)",
    }
}

pub fn render(c: &Comparison, opts: &CompareOptions, all: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "fsprof compare: {} figures of {} cells; flagged when |change| ≥ {:.1} % and Welch's t-test p < {} over the passes",
        c.rows.len(),
        {
            let mut cells: Vec<(&str, &str)> = c
                .rows
                .iter()
                .map(|r| (r.fs.as_str(), r.step.as_str()))
                .collect();
            cells.dedup();
            cells.len()
        },
        100.0 * opts.threshold,
        opts.alpha
    );
    for n in &c.notes {
        let _ = writeln!(o, "note: {n}");
    }
    let rows: Vec<Vec<String>> = c
        .rows
        .iter()
        .filter(|r| all || matches!(r.verdict, Verdict::Regression | Verdict::Improvement))
        .map(|r| {
            vec![
                format!("{} {}", r.fs, r.step),
                r.metric.clone(),
                value(r, r.base),
                value(r, r.new),
                format!("{:+.1}%", r.change_pct),
                r.ci_pct
                    .map(|(a, b)| format!("[{a:+.1}, {b:+.1}]%"))
                    .unwrap_or_else(|| "-".into()),
                r.p.map(|p| format!("{p:.3}")).unwrap_or_else(|| "-".into()),
                format!("{}/{}", r.n_base, r.n_new),
                verdict(r.verdict).to_string(),
            ]
        })
        .collect();
    if rows.is_empty() {
        let _ = writeln!(o, "no significant change");
    } else {
        o.push_str(&table(
            &[
                "cell", "figure", "base", "new", "change", "95% CI", "p", "passes", "verdict",
            ],
            &rows,
        ));
    }
    let reg = c
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Regression)
        .count();
    let imp = c
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Improvement)
        .count();
    let untested = c
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Untested)
        .count();
    let _ = writeln!(o, "{reg} regressions, {imp} improvements");
    if untested > 0 {
        let _ = writeln!(
            o,
            "{untested} large changes untested: a side has one pass (use --passes 3 for significance)"
        );
    }
    o
}
