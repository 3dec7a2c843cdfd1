//! What `fsprof check` reads, told apart by content: a results file (trace, run or crash
//! study, with the graphs, profiles and timeline it names), a directory of outputs, a
//! folded file, a pprof profile, a Perfetto trace, a history store (an SQLite file or a
//! postgres:// URL).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use super::{
    Checks,
    stacks::{FoldedSet, check_folded, check_pprof},
    stores::{check_history, check_run, check_study},
    timeline::{check_timeline, is_timeline},
    trace::check_trace,
};
use crate::{
    aggregate::{
        folded::{self, Folded},
        pprof::PPROF_EXT,
        stacks::{BackgroundSummary, StackSummary},
    },
    history::Location,
    results::{RunResult, crash::CrashStudy},
    trace::{TIMELINE_EXT, TraceResult},
};

const SQLITE_MAGIC: &[u8] = b"SQLite format 3\0";

/// Checks every output at `paths` (files, directories, history URLs).
pub fn check_paths(paths: &[String]) -> Checks {
    let mut c = Checks::default();
    for p in paths {
        if p.starts_with("postgres://") || p.starts_with("postgresql://") {
            if let Err(e) = check_history(&mut c, Location::parse(p)) {
                c.unreadable
                    .push((PathBuf::from(crate::history::redact(p)), format!("{e:#}")));
            }
            continue;
        }
        let path = PathBuf::from(p);
        if let Err(e) = check_path(&mut c, &path) {
            c.unreadable.push((path, format!("{e:#}")));
        }
    }
    c
}

fn check_path(c: &mut Checks, path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_dir() {
        return check_dir(c, path);
    }
    let name = path.to_string_lossy();
    if name.ends_with(".json") {
        return check_json(c, path);
    }
    if name.ends_with(".folded") {
        return check_folded_files(c, &[path.to_path_buf()]);
    }
    if name.ends_with(PPROF_EXT) {
        check_pprof(c, path, sibling_folded(path).as_ref(), None);
        return Ok(());
    }
    if name.ends_with(TIMELINE_EXT) {
        check_timeline(c, path, None);
        return Ok(());
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.starts_with(SQLITE_MAGIC) {
        return check_history(c, Location::Sqlite(path.to_path_buf()));
    }
    // `--timeline` takes any name (Perfetto's own tools write .pftrace).
    if is_timeline(&bytes) {
        check_timeline(c, path, None);
        return Ok(());
    }
    bail!(
        "not an output of fsprof (results .json, .folded, .{PPROF_EXT}, .{TIMELINE_EXT}, a history store)"
    )
}

/// Every output below `dir`: results files first (they check what they name), then the
/// folded files, profiles and timelines no results file named.
fn check_dir(c: &mut Checks, dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            match p.is_dir() {
                true => todo.push(p),
                false => files.push(p),
            }
        }
    }
    files.sort();
    let has = |p: &Path, ext: &str| p.to_string_lossy().ends_with(ext);
    let folded: Vec<PathBuf> = files
        .iter()
        .filter(|p| has(p, ".folded"))
        .cloned()
        .collect();
    check_folded_files(c, &folded)?;
    for p in files.iter().filter(|p| has(p, ".json")) {
        if let Err(e) = check_json(c, p) {
            c.unreadable.push((p.clone(), format!("{e:#}")));
        }
    }
    for p in files.iter().filter(|p| has(p, PPROF_EXT)) {
        check_pprof(c, p, sibling_folded(p).as_ref(), None);
    }
    for p in files.iter().filter(|p| has(p, TIMELINE_EXT)) {
        check_timeline(c, p, None);
    }
    Ok(())
}

/// Folded files grouped by stem (`dd.on-cpu.folded` → `dd`), each group checked as a set.
fn check_folded_files(c: &mut Checks, paths: &[PathBuf]) -> Result<()> {
    let mut sets: BTreeMap<String, BTreeMap<String, Folded>> = BTreeMap::new();
    for p in paths {
        let (stem, kind) = stem_and_kind(p);
        sets.entry(stem)
            .or_default()
            .insert(kind, folded::read_folded(p)?);
    }
    for (item, files) in sets {
        check_folded(
            c,
            &FoldedSet {
                item,
                files,
                totals: None,
                kernel: None,
            },
        );
    }
    Ok(())
}

/// `dir/dd.on-cpu.folded` → ("dir/dd", "on-cpu").
fn stem_and_kind(p: &Path) -> (String, String) {
    let s = p.to_string_lossy();
    let s = s.strip_suffix(".folded").unwrap_or(&s);
    match s.rsplit_once('.') {
        Some((stem, kind)) => (stem.to_string(), kind.to_string()),
        None => (s.to_string(), String::new()),
    }
}

/// The folded file a profile was exported beside (`x.on-cpu.pb.gz` → `x.on-cpu.folded`,
/// in the same directory or the flames directory of the same trace).
fn sibling_folded(pprof: &Path) -> Option<Folded> {
    let s = pprof.to_string_lossy();
    let base = s.strip_suffix(&format!(".{PPROF_EXT}"))?;
    folded::read_folded(Path::new(&format!("{base}.folded"))).ok()
}

/// A path a results file names (relative to where fsprof ran): from the results file's
/// directory `dir` where it is there, else as written.
fn named(dir: &Path, p: &str) -> PathBuf {
    let beside = dir.join(p);
    match beside.exists() {
        true => beside,
        false => PathBuf::from(p),
    }
}

fn check_json(c: &mut Checks, path: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).context("not JSON")?;
    let item = path.display().to_string();
    if v.get("filesystems").is_some() {
        let r: RunResult = serde_json::from_value(v).context("not a results file of fsprof run")?;
        check_run(c, &item, &r);
        return check_run_flames(c, path, &r);
    }
    if v.get("cells").is_some() {
        let s: CrashStudy = serde_json::from_value(v).context("not a crash study of fsprof")?;
        check_study(c, &item, &s);
        return Ok(());
    }
    if v.get("profile").is_some() {
        let t: TraceResult =
            serde_json::from_value(v).context("not a results file of fsprof trace")?;
        let dir = path.parent().unwrap_or(Path::new("."));
        return check_trace_result(c, &item, &t, dir);
    }
    bail!("JSON that is no results file of fsprof (trace, run or crash)")
}

/// A trace's figures and the outputs it wrote (paths relative to `dir`, or as written).
pub fn check_trace_result(c: &mut Checks, item: &str, t: &TraceResult, dir: &Path) -> Result<()> {
    check_trace(c, item, t);
    check_trace_outputs(c, dir, item, t)
}

/// The graphs, profiles and timeline a trace wrote, against its figures.
fn check_trace_outputs(c: &mut Checks, dir: &Path, item: &str, t: &TraceResult) -> Result<()> {
    let mut files = BTreeMap::new();
    let mut pprofs = Vec::new();
    for (kind, p) in &t.flames {
        if let Some(kind) = kind.strip_suffix(".folded") {
            files.insert(kind.to_string(), folded::read_folded(&named(dir, p))?);
        } else if kind.ends_with(PPROF_EXT) {
            pprofs.push(named(dir, p));
        }
    }
    let background = t.background.as_ref();
    let stacks = |s| rounding_us(s + background.map_or(0, |b| b.samples));
    let totals = t
        .stacks
        .as_ref()
        .map(|s| (s, background, stacks(s.weighted_stacks)));
    check_folded(
        c,
        &FoldedSet {
            item: item.to_string(),
            files,
            totals,
            kernel: Some(&t.kernel),
        },
    );
    for p in pprofs {
        let folded = sibling_folded_in(&t.flames, &p, dir);
        check_pprof(c, &p, folded.as_ref(), Some(&t.kernel));
    }
    if let Some(tl) = &t.timeline {
        check_timeline(c, &named(dir, &tl.path), Some(t));
    }
    Ok(())
}

/// Each stack rounded to µs (at most ½ µs each), and one more for the sum.
fn rounding_us(stacks: u64) -> u64 {
    stacks.div_ceil(2) + 1
}

/// The folded file of a profile's kind among a trace's outputs.
fn sibling_folded_in(
    flames: &BTreeMap<String, String>,
    pprof: &Path,
    dir: &Path,
) -> Option<Folded> {
    let s = pprof.to_string_lossy();
    let kind = s
        .strip_suffix(&format!(".{PPROF_EXT}"))?
        .rsplit_once('.')?
        .1;
    let p = flames.get(&format!("{kind}.folded"))?;
    folded::read_folded(&named(dir, p)).ok()
}

/// A run's graphs: each cell's folded files (its passes summed) against its passes'
/// stack totals.
fn check_run_flames(c: &mut Checks, path: &Path, r: &RunResult) -> Result<()> {
    let base = path.parent().unwrap_or(Path::new("."));
    for (step, cells) in &r.flames.cells {
        for (column, kinds) in cells {
            let mut files = BTreeMap::new();
            for (kind, p) in kinds {
                if let Some(kind) = kind.strip_suffix(".folded") {
                    files.insert(kind.to_string(), folded::read_folded(&base.join(p))?);
                }
            }
            let item = format!("{} {step} {column}", path.display());
            let summed = summed_stacks(r, step, column);
            let totals = (summed.as_ref())
                .map(|(s, b)| (s, Some(b), rounding_us(s.weighted_stacks + b.samples)));
            check_folded(
                c,
                &FoldedSet {
                    item,
                    files,
                    totals,
                    kernel: Some(&r.kernel),
                },
            );
        }
    }
    Ok(())
}

/// A run cell's stack totals summed over its passes, as its graphs sum their folded files
/// (every pass that has stacks, a failed one too).
fn summed_stacks(
    r: &RunResult,
    step: &str,
    column: &str,
) -> Option<(StackSummary, BackgroundSummary)> {
    let f = r.filesystems.iter().find(|f| f.column() == column)?;
    let (mut s, mut b) = (StackSummary::default(), BackgroundSummary::default());
    let mut any = false;
    for st in f
        .passes
        .iter()
        .flat_map(|p| &p.steps)
        .filter(|st| st.step == step)
    {
        let (Some(ss), Some(bg)) = (&st.trace.stacks, &st.trace.background) else {
            continue;
        };
        any = true;
        s.on_cpu_sampled_ns += ss.on_cpu_sampled_ns;
        s.off_cpu_ns += ss.off_cpu_ns;
        s.weighted_stacks += ss.weighted_stacks;
        b.ns += bg.ns;
        b.samples += bg.samples;
    }
    any.then_some((s, b))
}
