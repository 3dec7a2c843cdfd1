//! The HTML page of `fsprof compare` of two crash studies: the test and its error rate,
//! the studies on each side, and per cell the share of trials that found the new content on
//! each side with its 95 % (Wilson) interval, coloured by the verdict; then the terminal's
//! table with every count and each pattern's cost.

use std::fmt::Write as _;

use super::{charts::open, crash, escape as esc};
use crate::{
    analysis::crash::{CrashComparison, CrashRow, CrashVerdict},
    results::crash::{CrashCell, CrashStudy},
    workload::crash::Outcome,
};

const ROW_H: f64 = 22.0;
const LEFT: f64 = 300.0;
const PLOT_W: f64 = 400.0;
const RIGHT_W: f64 = 160.0;

/// The Wilson score interval of k successes in n trials at 95 %, as shares.
fn wilson(k: u32, n: u32) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (n, p, z) = (n as f64, k as f64 / n as f64, 1.96f64);
    let d = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / d;
    let half = z / d * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

fn found_new(c: &CrashCell) -> u32 {
    c.outcomes.get(&Outcome::New).copied().unwrap_or(0)
}

fn colour(v: CrashVerdict) -> &'static str {
    match v {
        CrashVerdict::LessSafe => "#c0392b",
        CrashVerdict::Safer => "#2e8b57",
        CrashVerdict::Inconclusive => "#e69f00",
        CrashVerdict::Same => "#888888",
    }
}

/// The page; `sides` names the base and the new study (file or history entry).
pub fn html(c: &CrashComparison, sides: [(&str, &CrashStudy); 2]) -> String {
    let mut o = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>fsprof compare: crash \
         studies</title><style>{}pre{{white-space:pre-wrap}}</style></head><body><h1>fsprof compare: crash studies</h1>",
        super::html::STYLE
    );
    for (side, (name, s)) in ["base", "new"].iter().zip(sides) {
        let _ = write!(
            o,
            "<p class=\"waits\">{side}: {} (kernel {}, started {}, {} trials a cell{})</p>",
            esc(name),
            esc(&s.kernel),
            super::html::utc(s.started),
            s.trials,
            s.label
                .as_ref()
                .map(|l| format!(", label {}", esc(l)))
                .unwrap_or_default()
        );
    }
    let table = crash::compare_table(c);
    if let Some(svg) = plot(c) {
        o.push_str(&svg);
    }
    let _ = writeln!(o, "<pre>{}</pre></body></html>", esc(&table));
    o
}

/// Per cell, the share of trials that found the new content, base (grey) above new
/// (coloured by the verdict), each with its interval; None for no cells.
fn plot(c: &CrashComparison) -> Option<String> {
    if c.rows.is_empty() {
        return None;
    }
    let top = 40.0;
    let h = top + ROW_H * c.rows.len() as f64 + 8.0;
    let title = "trials that found the new content: base (grey) and new, with 95 % intervals";
    let mut o = open(LEFT + PLOT_W + RIGHT_W, h, 4.0, 12, title);
    let x = |share: f64| LEFT + PLOT_W * share;
    for k in 0..=4 {
        let xx = x(k as f64 / 4.0);
        let _ = write!(
            o,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#e4e4e4"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}%</text>"##,
            h - 8.0,
            top - 4.0,
            25 * k
        );
    }
    for (i, r) in c.rows.iter().enumerate() {
        row(&mut o, top + ROW_H * i as f64, r, &x);
    }
    o.push_str("</svg>");
    Some(o)
}

/// One cell: its name, the two sides' shares, the verdict.
fn row(o: &mut String, y: f64, r: &CrashRow, x: &dyn Fn(f64) -> f64) {
    let b = r.base;
    let _ = write!(
        o,
        r#"<g class="cell"><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
        LEFT - 8.0,
        y + ROW_H / 2.0 + 4.0,
        esc(&format!("{} {} {}", b.fs, b.pattern.name(), b.point.name()))
    );
    for (dy, cell, c) in [
        (ROW_H * 0.3, r.base, "#888888"),
        (ROW_H * 0.7, r.new, colour(r.verdict)),
    ] {
        let (k, n) = (found_new(cell), cell.trials());
        let (lo, hi) = wilson(k, n);
        let share = if n == 0 { 0.0 } else { k as f64 / n as f64 };
        let yy = y + dy;
        let _ = write!(
            o,
            r#"<line x1="{:.1}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="{c}" stroke-width="2"/><circle class="dot" cx="{:.1}" cy="{yy:.1}" r="3.5" fill="{c}"><title>{k} of {n}</title></circle>"#,
            x(lo),
            x(hi),
            x(share)
        );
    }
    let _ = write!(
        o,
        r#"<text x="{:.1}" y="{:.1}" fill="{}">{} (p = {:.3})</text></g>"#,
        LEFT + PLOT_W + 10.0,
        y + ROW_H / 2.0 + 4.0,
        colour(r.verdict),
        r.verdict.name(),
        r.p
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn wilson_intervals_stay_in_bounds_and_hold_the_share() {
        let (lo, hi) = super::wilson(0, 3);
        assert_eq!(lo, 0.0);
        assert!((hi - 0.5615).abs() < 1e-3, "{hi}");
        let (lo, hi) = super::wilson(3, 3);
        assert!((lo - 0.4385).abs() < 1e-3 && hi == 1.0, "{lo}");
        let (lo, hi) = super::wilson(5, 10);
        assert!(lo < 0.5 && hi > 0.5 && (0.5 - lo - (hi - 0.5)).abs() < 1e-9);
    }
}
