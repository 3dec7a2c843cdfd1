//! The compare page's forest plots: per cell, every figure tested as its change (a dot) and
//! the 95 % interval of it (a whisker) on an axis of ratios, the ± threshold shaded, each
//! coloured by its verdict, with the verdict (and for an inconclusive one the passes that
//! would settle it) at the right.

use std::fmt::Write as _;

use super::{charts::open, compare_table::verdict, escape as esc};
use crate::analysis::compare::{Row, Verdict};

const ROW_H: f64 = 18.0;
const LEFT: f64 = 170.0;
const PLOT_W: f64 = 420.0;
const RIGHT_W: f64 = 300.0;
/// The axis reaches at most this many doublings (and halvings) from no change.
const MOST_DOUBLINGS: f64 = 5.0;

/// A verdict's colour; a flag set aside for the machine is inconclusive.
pub fn colour(r: &Row) -> &'static str {
    match r.verdict {
        _ if r.machine_differed => "#e69f00",
        Verdict::Regression => "#c0392b",
        Verdict::Improvement => "#2e8b57",
        Verdict::Inconclusive => "#e69f00",
        Verdict::Unchanged => "#888888",
    }
}

/// A change in % as doublings (log2 of new over base); a fall of 100 % or more is as far
/// left as the axis goes.
fn doublings(pct: f64) -> f64 {
    let ratio = 1.0 + pct / 100.0;
    match ratio > 0.0 {
        true => ratio.log2().max(-MOST_DOUBLINGS),
        false => -MOST_DOUBLINGS,
    }
}

/// An axis label: the change in % at `d` doublings.
fn label(d: f64) -> String {
    format!("{:+.0}%", 100.0 * (d.exp2() - 1.0))
}

/// The plot of one cell's figures on an axis of ratios (a doubling and a halving equally
/// far from no change); a figure from 0 sits at the end of the axis. None for no figures.
pub fn cell(title: &str, rows: &[&Row], threshold_pct: f64) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let reach = (rows.iter())
        .filter_map(|r| r.change_pct.map(|c| (r, c)))
        .flat_map(|(r, c)| {
            let ci = r.ci_pct.map_or((c, c), |ci| ci);
            [c, ci.0, ci.1].map(|p| doublings(p).abs())
        })
        .fold(2.0 * doublings(threshold_pct), f64::max);
    let half = reach.ceil().clamp(1.0, MOST_DOUBLINGS);
    let x = |d: f64| LEFT + PLOT_W * (d.clamp(-half, half) + half) / (2.0 * half);
    let top = 40.0;
    let h = top + ROW_H * rows.len() as f64 + 8.0;
    let mut o = open(LEFT + PLOT_W + RIGHT_W, h, 4.0, 12, title);
    // The band where a change is too small to flag, then the axis.
    let (b0, b1) = (x(doublings(-threshold_pct)), x(doublings(threshold_pct)));
    let _ = write!(
        o,
        r##"<rect x="{b0:.1}" y="{top}" width="{:.1}" height="{:.1}" fill="#dde8f0"/>"##,
        b1 - b0,
        h - top - 8.0
    );
    for k in -(half as i32)..=half as i32 {
        let _ = write!(
            o,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{y2:.1}" stroke="{c}"/><text x="{xx:.1}" y="{ty}" text-anchor="middle" fill="#555">{l}</text>"##,
            xx = x(k as f64),
            y2 = h - 8.0,
            c = if k == 0 { "#999" } else { "#e4e4e4" },
            ty = top - 4.0,
            // Every other doubling labelled on a wide axis, so the labels do not touch.
            l = match half > 3.0 && k % 2 != 0 {
                true => String::new(),
                false => label(k as f64),
            }
        );
    }
    for (i, r) in rows.iter().enumerate() {
        row(&mut o, top + ROW_H * (i as f64 + 0.5), r, (&x, half));
    }
    o.push_str("</svg>");
    Some(o)
}

/// One figure: its name, whisker, dot (a triangle where it is off the axis) and verdict.
fn row(o: &mut String, y: f64, r: &Row, (x, half): (&dyn Fn(f64) -> f64, f64)) {
    let c = colour(r);
    let change = r.change_pct.map(doublings);
    let _ = write!(
        o,
        r#"<g class="figure"><title>{t}</title><text x="{lx}" y="{ty:.1}" text-anchor="end">{m}</text>"#,
        t = esc(&format!(
            "{} {} {}: {}{}",
            r.fs,
            r.step,
            r.metric,
            r.change_pct
                .map_or_else(|| "from 0".into(), |p| format!("{p:+.1} %")),
            r.ci_pct
                .map(|(a, b)| format!(", 95 % interval [{a:+.1}, {b:+.1}] %"))
                .unwrap_or_default()
        )),
        lx = LEFT - 8.0,
        ty = y + 4.0,
        m = esc(&r.metric)
    );
    if let Some((a, b)) = r.ci_pct {
        let _ = write!(
            o,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{c}" stroke-width="2"/>"#,
            x(doublings(a)),
            x(doublings(b))
        );
    }
    // Off the axis (or from 0): a triangle at its end, pointing on.
    let d = change.unwrap_or(if r.new > r.base {
        half + 1.0
    } else {
        -half - 1.0
    });
    let cx = x(d);
    let _ = match d.abs() > half {
        true => {
            let tip = if d > 0.0 { cx + 6.0 } else { cx - 6.0 };
            write!(
                o,
                r#"<path class="dot" d="M{cx:.1} {:.1} L{tip:.1} {y:.1} L{cx:.1} {:.1} Z" fill="{c}"/>"#,
                y - 5.0,
                y + 5.0
            )
        }
        false => write!(
            o,
            r#"<circle class="dot" cx="{cx:.1}" cy="{y:.1}" r="4" fill="{c}"/>"#
        ),
    };
    let _ = write!(
        o,
        r#"<text x="{rx}" y="{ty:.1}" fill="{c}">{v}</text></g>"#,
        rx = LEFT + PLOT_W + 12.0,
        ty = y + 4.0,
        v = esc(&match verdict(r) {
            v if v.is_empty() => "unchanged (under the threshold or floor)".into(),
            v => v,
        })
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doubling_and_a_halving_are_equally_far() {
        assert_eq!(doublings(100.0), 1.0);
        assert_eq!(doublings(-50.0), -1.0);
        assert_eq!(doublings(0.0), 0.0);
        assert_eq!(doublings(-100.0), -MOST_DOUBLINGS);
        assert_eq!(label(1.0), "+100%");
        assert_eq!(label(-1.0), "-50%");
    }
}
