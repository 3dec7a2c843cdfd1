//! Flame graphs of a run: per cell (filesystem × step) the passes' folded stacks summed and
//! drawn, and per step differential graphs of every filesystem against the first one, and
//! of the slowest against the fastest (the pair the reports explain).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use crate::{
    aggregate::folded::{self, Folded, Kind},
    report::{flame, run_summary},
    results::{FlameDiff, RunFlames, RunResult},
};
use anyhow::Result;

/// Kinds that get differential graphs.
const DIFF_KINDS: [Kind; 3] = [Kind::OffCpu, Kind::OnCpu, Kind::Combined];

fn rel(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Folded stacks by kind ("off-cpu", …) of one cell, passes summed.
type CellFolded = BTreeMap<&'static str, Folded>;
/// A column drawn against a base: its name and stacks.
type Column<'c> = (&'c str, &'c CellFolded);
/// Steps in run order, each with its filesystems in run order.
type Cells = Vec<(String, Vec<(String, CellFolded)>)>;

/// Sums the passes' folded files of each cell, draws them, and draws the diffs.
pub fn draw(result: &RunResult, dir: &Path, results_dir: &Path) -> Result<RunFlames> {
    let mut out = RunFlames::default();
    let out_dirs = Dirs {
        graphs: dir,
        results: results_dir,
    };
    let rows = run_summary::rows(result);
    for (step, cells) in &merge(result)? {
        std::fs::create_dir_all(dir.join(step))?;
        for (fs, kinds) in cells {
            let entry = out
                .cells
                .entry(step.clone())
                .or_default()
                .entry(fs.clone())
                .or_default();
            draw_cell(result, &out_dirs, step, fs, kinds, entry)?;
        }
        for (i, (fs, kinds)) in cells.iter().enumerate() {
            if let Some(base) = diff_base(cells, i) {
                draw_diffs(result, &out_dirs, step, (fs, kinds), base, &mut out.diffs)?;
            }
        }
        if let Some((slow, fast)) = explained_pair(&rows, step, cells, &out.diffs) {
            draw_diffs(result, &out_dirs, step, slow, fast, &mut out.diffs)?;
        }
    }
    Ok(out)
}

/// Where the graphs go, and what their paths in the results are relative to.
struct Dirs<'a> {
    graphs: &'a Path,
    results: &'a Path,
}

/// step → fs → kind → folded (passes summed); in run order.
fn merge(result: &RunResult) -> Result<Cells> {
    let mut merged: Cells = Vec::new();
    for f in &result.filesystems {
        for p in &f.passes {
            for s in &p.steps {
                let si = match merged.iter().position(|(n, _)| n == &s.step) {
                    Some(i) => i,
                    None => {
                        merged.push((s.step.clone(), Vec::new()));
                        merged.len() - 1
                    }
                };
                let cells = &mut merged[si].1;
                let column = f.column();
                let fi = match cells.iter().position(|(n, _)| n == &column) {
                    Some(i) => i,
                    None => {
                        cells.push((column, BTreeMap::new()));
                        cells.len() - 1
                    }
                };
                for kind in Kind::ALL {
                    let key = format!("{}.folded", kind.file_stem());
                    if let Some(path) = s.trace.flames.get(&key) {
                        let folded = folded::read_folded(Path::new(path))?;
                        folded::merge(cells[fi].1.entry(kind.file_stem()).or_default(), &folded);
                    }
                }
            }
        }
    }
    Ok(merged)
}

/// One cell's summed folded stacks and flame graphs, recorded in `entry`.
fn draw_cell(
    result: &RunResult,
    dirs: &Dirs,
    step: &str,
    fs: &str,
    kinds: &CellFolded,
    entry: &mut BTreeMap<String, String>,
) -> Result<()> {
    let n: usize = result
        .filesystems
        .iter()
        .filter(|f| f.column() == fs)
        .map(|f| f.passes.len())
        .sum();
    let title = format!(
        "{fs} · {step} · {n} pass{} summed · kernel {}",
        if n == 1 { "" } else { "es" },
        result.kernel
    );
    let step_dir = dirs.graphs.join(step);
    for kind in Kind::ALL {
        let Some(f) = kinds.get(kind.file_stem()) else {
            continue;
        };
        let folded = step_dir.join(format!("{fs}.{}.folded", kind.file_stem()));
        folded::write_folded(f, &folded)?;
        entry.insert(
            format!("{}.folded", kind.file_stem()),
            rel(&folded, dirs.results),
        );
        let svg = step_dir.join(format!("{fs}.{}.svg", kind.file_stem()));
        let t = format!("{title} · {}", folded::kind_title(kind));
        if flame::render(f, kind, &t, &svg)? {
            entry.insert(format!("{}.svg", kind.file_stem()), rel(&svg, dirs.results));
        }
    }
    Ok(())
}

/// The differential graphs of one column against its base.
fn draw_diffs(
    result: &RunResult,
    dirs: &Dirs,
    step: &str,
    (fs, kinds): Column,
    (base, base_kinds): &(String, CellFolded),
    diffs: &mut Vec<FlameDiff>,
) -> Result<()> {
    let step_dir = dirs.graphs.join(step);
    for kind in DIFF_KINDS {
        let empty = Folded::new();
        let before = base_kinds.get(kind.file_stem()).unwrap_or(&empty);
        let after = kinds.get(kind.file_stem()).unwrap_or(&empty);
        let svg = step_dir.join(format!("{fs}-vs-{base}.{}.diff.svg", kind.file_stem()));
        let title = format!(
            "{step}: {fs} vs {base} · {} · kernel {}",
            folded::kind_title(kind),
            result.kernel
        );
        let sub = format!(
            "shapes and widths: {fs} ({} µs); red: more time on {fs} than on {base} ({} µs), blue: less",
            folded::total_us(after),
            folded::total_us(before)
        );
        if flame::render_diff(before, after, &title, &sub, &svg)? {
            diffs.push(FlameDiff {
                step: step.to_string(),
                base: base.clone(),
                fs: fs.to_string(),
                kind: kind.file_stem().to_string(),
                path: rel(&svg, dirs.results),
            });
        }
    }
    Ok(())
}

/// What column `i` of a step is drawn against: on a kernel axis the same filesystem on the
/// first kernel (`jfs@B` vs `jfs@A`), else the step's first column; None for the base itself.
fn diff_base(cells: &[(String, CellFolded)], i: usize) -> Option<&(String, CellFolded)> {
    let fs = |column: &str| column.split('@').next().unwrap_or_default().to_string();
    let me = fs(&cells[i].0);
    let same_fs = cells.iter().position(|(c, _)| fs(c) == me)?;
    let base = if same_fs < i { same_fs } else { 0 };
    (base != i).then(|| &cells[base])
}

/// The step's slowest and fastest columns, unless that diff is drawn already (the fastest
/// is the base).
fn explained_pair<'c>(
    rows: &[run_summary::SummaryRow],
    step: &str,
    cells: &'c [(String, CellFolded)],
    drawn: &[FlameDiff],
) -> Option<(Column<'c>, &'c (String, CellFolded))> {
    let (slow, fast) = run_summary::slowest_and_fastest(rows, step)?;
    let done = (drawn.iter()).any(|d| d.step == step && d.fs == slow && d.base == fast);
    let find = |fs: &str| cells.iter().find(|(c, _)| c == fs);
    let (s, f) = (find(slow)?, find(fast)?);
    (!done).then_some(((s.0.as_str(), &s.1), f))
}

/// `fsprof-results.json` → `fsprof-results.flames`.
pub fn default_dir(results: &Path) -> PathBuf {
    results.with_extension("flames")
}
