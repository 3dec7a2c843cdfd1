//! The HTML page of `fsprof compare`: notes, the flagged figures, and for every flagged cell
//! differential flame graphs of new against base (from the runs' folded files).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::Result;

use super::{compare_table, escape as esc, flame};
use crate::{
    aggregate::folded::{self, Folded, Kind},
    analysis::compare::{Comparison, Verdict},
    results::{RunResult, dir_of},
};

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
         body{font-family:sans-serif;margin:24px}table{border-collapse:collapse}\
         td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}td:first-child{text-align:left}\
         .regression{color:#b00}.improvement{color:#070}object{width:100%;height:560px;border:1px solid #ccc}\
         </style></head><body><h1>fsprof compare</h1>",
    );
    for line in compare_table::header(c).lines() {
        let _ = write!(o, "<p>{}</p>", esc(line));
    }
    for n in &c.notes {
        let _ = write!(o, "<p>note: {}</p>", esc(n));
    }
    o.push_str("<table><tr><th>cell</th><th>figure</th><th>base</th><th>new</th><th>change</th><th>95% CI</th><th>q</th><th>passes</th><th>verdict</th></tr>");
    let mut cells: Vec<(String, String)> = Vec::new();
    for r in c.flagged() {
        let class = if r.verdict == Verdict::Regression {
            "regression"
        } else {
            "improvement"
        };
        o.push_str(&format!("<tr class=\"{class}\">"));
        for v in compare_table::cells_of(r) {
            let _ = write!(o, "<td>{}</td>", esc(&v));
        }
        o.push_str("</tr>");
        let cell = (r.fs.clone(), r.step.clone());
        if !cells.contains(&cell) {
            cells.push(cell);
        }
    }
    o.push_str("</table>");
    let _ = write!(o, "<p>{}</p>", esc(&compare_table::tally(c, true)));
    if cells.is_empty() {
        o.push_str("<p>No clear change.</p>");
    }
    for (fs, step) in &cells {
        let _ = write!(o, "<h2>{} {}: new against base</h2>", esc(fs), esc(step));
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
    }
    o.push_str("</body></html>\n");
    std::fs::write(html, o)?;
    Ok(())
}
