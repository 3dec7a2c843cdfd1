//! The HTML page of `fsprof compare`, to attach to a patch discussion: the rule and its
//! error rate, the runs on each side, the notes and the machine check, the flagged figures,
//! every figure tested as a forest plot per cell, and for every flagged cell differential
//! flame graphs of new against base (from the runs' folded files).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::Result;

use super::{compare_table, escape as esc, flame, forest};
use crate::{
    aggregate::folded::{self, Folded, Kind},
    analysis::compare::{Comparison, Row, Verdict},
    results::{RunResult, dir_of},
};

/// One side's results, with where they came from (a path, or `history#ID`).
type Side = [(PathBuf, RunResult)];

/// A cell's folded stacks of `kind`, summed over a side's files. Paths in a results file
/// are relative to it.
fn side_folded(set: &[(PathBuf, RunResult)], fs: &str, step: &str, kind: Kind) -> Folded {
    let mut out = Folded::new();
    for (path, r) in set {
        let dir = dir_of(path);
        let key = format!("{}.folded", kind.file_stem());
        if let Some(p) = r
            .flames
            .cells
            .get(step)
            .and_then(|c| c.get(fs))
            .and_then(|f| f.get(&key))
            && let Ok(f) = folded::read_folded(&dir.join(p))
        {
            folded::merge(&mut out, &f);
        }
    }
    out
}

/// Writes `html` and its diff graphs into `html`'s `.diffs` directory.
pub fn write(
    c: &Comparison,
    base: &[(PathBuf, RunResult)],
    new: &[(PathBuf, RunResult)],
    html: &Path,
) -> Result<()> {
    let dir = html.with_extension("diffs");
    std::fs::create_dir_all(&dir)?;
    let mut o = String::from(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>fsprof compare</title><style>\
         body{font-family:sans-serif;margin:24px;max-width:1400px}table{border-collapse:collapse}\
         td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}td:first-child{text-align:left}\
         .regression{color:#b00}.improvement{color:#070}object{width:100%;height:560px;border:1px solid #ccc}\
         summary{cursor:pointer;font-weight:bold;margin:6px 0}p.head{font-size:14px;margin:4px 0}\
         td{white-space:nowrap}\
         </style></head><body><h1>fsprof compare</h1>",
    );
    for line in compare_table::header(c).lines() {
        let _ = write!(o, "<p class=\"head\">{}</p>", esc(line));
    }
    let _ = write!(
        o,
        "<p class=\"head\">base: {}</p><p class=\"head\">new: {}</p>",
        esc(&runs(base)),
        esc(&runs(new))
    );
    for n in &c.notes {
        let _ = write!(o, "<p class=\"head\">note: {}</p>", esc(n));
    }
    let cells = flagged_table(&mut o, c);
    let _ = write!(o, "<p>{}</p>", esc(&compare_table::tally(c, true)));
    forests(&mut o, c);
    for (i, (fs, step)) in cells.iter().enumerate() {
        let _ = write!(
            o,
            "<h2 id=\"diff{i}\">{} {}: new against base</h2>",
            esc(fs),
            esc(step)
        );
        diff_graphs(&mut o, (base, new), (fs, step), (&dir, html))?;
    }
    o.push_str("</body></html>\n");
    std::fs::write(html, o)?;
    Ok(())
}

/// A side's runs by name: file (or history entry), kernel, start, label.
fn runs(side: &[(PathBuf, RunResult)]) -> String {
    let named: Vec<String> = (side.iter())
        .map(|(p, r)| {
            format!(
                "{} (kernel {}, started {}{})",
                p.display(),
                r.kernel,
                super::html::utc(r.started),
                r.label
                    .as_ref()
                    .map(|l| format!(", label {l}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    named.join("; ")
}

/// The flagged figures' table, each row's cell linking to its diff graphs; the cells, in
/// the order of their links.
fn flagged_table(o: &mut String, c: &Comparison) -> Vec<(String, String)> {
    let mut cells: Vec<(String, String)> = Vec::new();
    if c.flagged().next().is_none() {
        o.push_str("<p>No clear change: no figure flagged.</p>");
        return cells;
    }
    o.push_str("<h2>Flagged</h2><table><tr><th>cell</th><th>figure</th><th>base</th><th>new</th><th>change</th><th>95% CI</th><th>q</th><th>passes</th><th>verdict</th></tr>");
    for r in c.flagged() {
        let class = match r.verdict {
            Verdict::Regression => "regression",
            _ => "improvement",
        };
        let cell = (r.fs.clone(), r.step.clone());
        let i = cells.iter().position(|x| *x == cell).unwrap_or_else(|| {
            cells.push(cell);
            cells.len() - 1
        });
        let _ = write!(o, "<tr class=\"{class}\">");
        for (k, v) in compare_table::cells_of(r).iter().enumerate() {
            match k {
                0 => {
                    let _ = write!(o, "<td><a href=\"#diff{i}\">{}</a></td>", esc(v));
                }
                _ => {
                    let _ = write!(o, "<td>{}</td>", esc(v));
                }
            }
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>");
    cells
}

/// Every tested figure, a forest plot per cell: cells with a flag first, then those with an
/// inconclusive figure (both open), then the rest (folded).
fn forests(o: &mut String, c: &Comparison) {
    let mut cells: Vec<(&str, &str, Vec<&Row>)> = Vec::new();
    for r in &c.rows {
        match cells
            .iter_mut()
            .find(|(f, s, _)| *f == r.fs && *s == r.step)
        {
            Some(cell) => cell.2.push(r),
            None => cells.push((&r.fs, &r.step, vec![r])),
        }
    }
    let rank = |rows: &[&Row]| {
        let has = |v: Verdict| rows.iter().any(|r| r.verdict == v && !r.machine_differed);
        match () {
            _ if has(Verdict::Regression) || has(Verdict::Improvement) => 0,
            _ if rows.iter().any(|r| r.verdict == Verdict::Inconclusive) => 1,
            _ => 2,
        }
    };
    cells.sort_by_key(|(_, _, rows)| rank(rows));
    let plots: Vec<String> = (cells.iter())
        .filter_map(|(fs, step, rows)| {
            let title = format!("{fs} {step}: change of new against base");
            let svg = forest::cell(&title, rows, c.rule.threshold_pct)?;
            let count = |v: Verdict| rows.iter().filter(|r| r.verdict == v).count();
            Some(format!(
                "<details class=\"forest\"{}><summary>{} {}: {} flagged, {} inconclusive, {} unchanged</summary>{svg}</details>",
                if rank(rows) < 2 { " open" } else { "" },
                esc(fs),
                esc(step),
                count(Verdict::Regression) + count(Verdict::Improvement),
                count(Verdict::Inconclusive),
                count(Verdict::Unchanged)
            ))
        })
        .collect();
    if plots.is_empty() {
        return;
    }
    let _ = write!(
        o,
        "<h2>Every figure tested</h2><p class=\"head\">A dot: the change of new against base; \
         a whisker: its 95 % interval; shaded: ±{:.1} %, too small to flag; the axis is of \
         ratios (a doubling as far right as a halving left), a triangle a change off it or \
         from 0. Red: regression, green: improvement, amber: inconclusive (the passes a side \
         that would settle it at the right), grey: unchanged.</p>{}",
        c.rule.threshold_pct,
        plots.join("")
    );
}

/// A flagged cell's differential flame graphs, new against base.
fn diff_graphs(
    o: &mut String,
    (base, new): (&Side, &Side),
    (fs, step): (&str, &str),
    (dir, html): (&Path, &Path),
) -> Result<()> {
    for kind in [Kind::OffCpu, Kind::OnCpu, Kind::Combined] {
        let (b, n) = (
            side_folded(base, fs, step, kind),
            side_folded(new, fs, step, kind),
        );
        let svg = dir.join(format!("{step}-{fs}.{}.diff.svg", kind.file_stem()));
        let title = format!("{fs} {step}: new vs base · {}", folded::kind_title(kind));
        let sub = format!(
            "widths: new ({} µs over its passes); red: more time than base ({} µs), blue: less",
            folded::total_us(&n),
            folded::total_us(&b)
        );
        if flame::render_diff(&b, &n, &title, &sub, &svg)? {
            let rel = svg
                .strip_prefix(html.parent().unwrap_or(Path::new("")))
                .unwrap_or(&svg);
            let _ = write!(
                o,
                "<object type=\"image/svg+xml\" data=\"{}\"></object>",
                esc(&rel.display().to_string())
            );
        }
    }
    Ok(())
}
