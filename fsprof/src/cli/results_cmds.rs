//! Commands that read saved results: report, compare, explain, flame-diff.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use super::history_cmd::{HistoryFilter, HistoryLocation};
use crate::{
    aggregate::folded,
    analysis::{compare, explain},
    history::{self, Filter},
    report,
    report::html::utc,
    results::{self, RunResult},
};

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// The terminal report.
    Table,
    Csv,
    /// Normalised JSON.
    Json,
    /// Markdown for a post; with -o its pictures (charts, flame graphs) go into a folder
    /// beside it, else the charts go into RESULTS.charts/.
    Markdown,
}

pub fn write_html(r: &RunResult, results: &Path, path: &Path) -> Result<()> {
    std::fs::write(path, report::html::render(r, results, path))
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("fsprof: HTML report in {}", path.display());
    Ok(())
}

#[derive(Args)]
pub struct ReportArgs {
    results: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Write the HTML report here (one file; flame graphs load from the run's
    /// .flames directory).
    #[arg(long)]
    html: Option<PathBuf>,
    /// The table with every pass and time class, not just the summary.
    #[arg(long, short)]
    verbose: bool,
    /// Write the report to this file, not to standard output (a markdown post: with its
    /// pictures in POST-pictures/ beside it).
    #[arg(long, short)]
    output: Option<PathBuf>,
}

/// `text` to the report's output file, or to standard output.
fn emit(a: &ReportArgs, text: &str) -> Result<()> {
    match &a.output {
        Some(path) => {
            std::fs::create_dir_all(results::dir_of(path))?;
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("fsprof: report in {}", path.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}

pub fn report_cmd(a: ReportArgs) -> Result<ExitCode> {
    let r = match results::Saved::load(&a.results)? {
        results::Saved::Run(r) => *r,
        results::Saved::Crash(study) => return crash_report(&study, &a),
    };
    if let Some(path) = &a.html {
        write_html(&r, &a.results, path)?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = match a.format {
        Format::Table => report::run_table::render(&r, a.verbose),
        Format::Csv => r.to_csv(),
        Format::Json => serde_json::to_string_pretty(&r)? + "\n",
        Format::Markdown => report::markdown::render(&r, &a.results, a.output.as_deref())
            .context("writing the post's pictures")?,
    };
    emit(&a, &text)?;
    Ok(ExitCode::SUCCESS)
}

/// `report` of a crash study: its tables, CSV, JSON, markdown or HTML page.
fn crash_report(study: &results::crash::CrashStudy, a: &ReportArgs) -> Result<ExitCode> {
    if let Some(path) = &a.html {
        std::fs::write(path, report::crash::html(study))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("fsprof: HTML report in {}", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let text = match a.format {
        Format::Table => report::crash::render(study),
        Format::Csv => report::crash::to_csv(study),
        Format::Json => serde_json::to_string_pretty(study)? + "\n",
        Format::Markdown => report::crash::markdown(study),
    };
    emit(a, &text)?;
    Ok(ExitCode::SUCCESS)
}

/// An axis of one run to compare along.
#[derive(Clone, Copy, ValueEnum)]
pub enum By {
    /// The run's kernels (`fsprof run --kernel A --kernel B`): each against the first.
    Kernel,
}

#[derive(Args)]
pub struct CompareArgs {
    /// Base results, e.g. old-kernel.json or a.json,b.json (with --by or --past: the one
    /// run).
    base: String,
    /// New results (not with --by or --past).
    #[arg(required_unless_present_any = ["by", "past"], conflicts_with_all = ["by", "past"])]
    new: Option<String>,
    /// Take the base from the history: the last N complete runs of the same configuration
    /// as the one results file given (suite, scale, steps, filesystems and options, host),
    /// narrowed by the filters below; for a crash study, the last N crash studies of its
    /// configuration, their trials pooled.
    #[arg(long, value_name = "N", conflicts_with = "by")]
    past: Option<usize>,
    #[command(flatten)]
    past_filter: HistoryFilter,
    #[command(flatten)]
    history: HistoryLocation,
    /// Compare along an axis of one run instead of two sets of runs.
    #[arg(long, value_enum)]
    by: Option<By>,
    /// Relative change that counts, in %.
    #[arg(long, default_value_t = 5.0)]
    threshold: f64,
    /// False discovery rate: the expected share of false flags among all flags (and, when
    /// nothing changed, the chance of any flag). 0.01 held identical runs here to at most one
    /// false flag in ~1,500 figures (docs/design.md, "Verdicts").
    #[arg(long, default_value_t = 0.01)]
    alpha: f64,
    /// Exit with status 1 when a regression is flagged (for CI); inconclusive changes do not
    /// fail; 3 when nothing regressed but flags were set aside because the machine differed
    /// between the sides (the gate cannot say: run again on a quiet machine).
    #[arg(long)]
    fail_on_regression: bool,
    /// Show every figure, not only the flagged ones.
    #[arg(long)]
    all: bool,
    /// Also write the comparison as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write an HTML page with differential flame graphs of the flagged cells.
    #[arg(long)]
    html: Option<PathBuf>,
}

pub fn compare_cmd(a: CompareArgs) -> Result<ExitCode> {
    if let Some(code) = compare_crash_studies(&a)? {
        return Ok(code);
    }
    let load = |list: &str| -> Result<Vec<(PathBuf, RunResult)>> {
        list.split(',')
            .map(|p| Ok((PathBuf::from(p), RunResult::load(Path::new(p))?)))
            .collect()
    };
    let opts = compare::CompareOptions {
        threshold: a.threshold / 100.0,
        alpha: a.alpha,
    };
    // (base, new) pairs: two sets of files, or the first kernel against each other one.
    let pairs = match (&a.new, a.by) {
        (None, None) if a.past.is_some() => vec![past_pair(&a)?],
        (Some(new), _) => vec![(load(&a.base)?, load(new)?)],
        (None, Some(By::Kernel)) => {
            let path = PathBuf::from(&a.base);
            let parts = RunResult::load(&path)?.split_by_kernel();
            if parts.len() < 2 {
                bail!(
                    "{} has no kernel axis (it ran on one kernel); give two results files, or run with several --kernel",
                    path.display()
                );
            }
            let (first, rest) = parts.split_first().expect("two parts");
            rest.iter()
                .map(|other| {
                    (
                        vec![(path.clone(), first.1.clone())],
                        vec![(path.clone(), other.1.clone())],
                    )
                })
                .collect()
        }
        (None, None) => bail!("compare needs NEW results or --by kernel"),
    };
    let results = |set: &[(PathBuf, RunResult)]| -> Vec<RunResult> {
        set.iter().map(|(_, r)| r.clone()).collect()
    };
    // Files first, the terminal last: a reader that stops reading ends fsprof quietly
    // (SIGPIPE), and the files are written by then.
    let mut all = Vec::new();
    for (i, (base, new)) in pairs.iter().enumerate() {
        let c = compare::compare(&results(base), &results(new), &opts)?;
        if let Some(path) = &a.html {
            let path = numbered(path, i, pairs.len());
            report::compare_html::write(&c, base, new, &path)?;
            eprintln!("fsprof: wrote {}", path.display());
        }
        all.push(c);
    }
    if let Some(path) = &a.json {
        let json = match &all[..] {
            [one] => serde_json::to_string_pretty(one)?,
            many => serde_json::to_string_pretty(many)?,
        };
        std::fs::write(path, json + "\n")?;
        eprintln!("fsprof: wrote {}", path.display());
    }
    for ((base, new), c) in pairs.iter().zip(&all) {
        if a.by.is_some() {
            println!("kernel {} vs {} (base):", new[0].1.kernel, base[0].1.kernel);
        }
        print!("{}", report::compare_table::render(c, a.all));
    }
    let regressed = all.iter().any(|c| c.regressions().next().is_some());
    // Flags set aside because the machine differed: the gate cannot say (run it again).
    let unjudged = all
        .iter()
        .any(|c| c.machine.as_ref().is_some_and(|m| m.set_aside > 0));
    Ok(match (a.fail_on_regression, regressed, unjudged) {
        (true, true, _) => ExitCode::from(1),
        (true, false, true) => ExitCode::from(3),
        _ => ExitCode::SUCCESS,
    })
}

/// `compare` of two crash studies, or of one against its past in the history; None when
/// the files are runs' results.
fn compare_crash_studies(a: &CompareArgs) -> Result<Option<ExitCode>> {
    if a.base.contains(',') {
        return Ok(None);
    }
    let results::Saved::Crash(first) = results::Saved::load(Path::new(&a.base))? else {
        return Ok(None);
    };
    let (base, new, names) = match (&a.new, a.past) {
        (Some(new_path), _) => {
            let results::Saved::Crash(new) = results::Saved::load(Path::new(new_path))? else {
                bail!(
                    "{} is a crash study and {new_path} a run's results: compare two of a kind",
                    a.base
                );
            };
            (*first, *new, [a.base.clone(), new_path.clone()])
        }
        (None, Some(n)) => (
            crash_past(a, &first, n)?,
            *first,
            [
                format!("the history's last {n} of its kind"),
                a.base.clone(),
            ],
        ),
        (None, None) => bail!(
            "{} is a crash study: it has no kernel axis to compare along",
            a.base
        ),
    };
    if a.json.is_some() || a.all {
        bail!("a comparison of crash studies prints its table and --html page: no --json or --all");
    }
    let c = crate::analysis::crash::compare(&base, &new, a.alpha)?;
    if let Some(path) = &a.html {
        let page = report::crash_compare::html(&c, [(&names[0], &base), (&names[1], &new)]);
        std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("fsprof: wrote {}", path.display());
    }
    print!("{}", report::crash::compare_table(&c));
    let less_safe = c
        .rows
        .iter()
        .any(|r| r.verdict == crate::analysis::crash::CrashVerdict::LessSafe);
    Ok(Some(ExitCode::from(u8::from(
        a.fail_on_regression && less_safe,
    ))))
}

/// The last `n` complete crash studies of `new`'s configuration before it, pooled.
fn crash_past(
    a: &CompareArgs,
    new: &results::crash::CrashStudy,
    n: usize,
) -> Result<results::crash::CrashStudy> {
    let mut h = a.history.open()?;
    let row = history::crash::CrashRow::of(new);
    let filter = Filter {
        before: Some(h.crash_place_of(&row)?),
        except_uid: Some(row.uid),
        config: Some(row.config),
        complete_only: true,
        last: Some(n),
        ..a.past_filter.filter()
    };
    let rows = h.crash_studies(&filter)?;
    if rows.is_empty() {
        bail!(
            "the history {} has no complete crash study of the same configuration as {} ({}) to compare with",
            h.location.describe(),
            a.base,
            filter.config.unwrap_or_default()
        );
    }
    let picked: Vec<(String, i64, &str)> = rows
        .iter()
        .map(|r| (format!("c{}", r.id), r.started, r.kernel.as_str()))
        .collect();
    say_base(&h, ("crash study", "crash studies"), &picked);
    let studies = rows
        .iter()
        .map(|r| h.crash_study(r.id))
        .collect::<Result<Vec<_>>>()?;
    Ok(results::crash::CrashStudy::pool(&studies).expect("at least one study"))
}

/// Results and where they came from (a path, or `history#ID`).
type Files = Vec<(PathBuf, RunResult)>;

/// The results file given, and as its base the runs `--past` picks from the history.
fn past_pair(a: &CompareArgs) -> Result<(Files, Files)> {
    let path = PathBuf::from(&a.base);
    let new = RunResult::load(&path)?;
    let mut h = a.history.open()?;
    let row = history::RunRow::of(&new);
    let filter = Filter {
        before: Some(h.place_of(&row)?),
        except_uid: Some(row.uid),
        config: Some(row.config),
        complete_only: true,
        last: a.past,
        ..a.past_filter.filter()
    };
    let rows = h.runs(&filter)?;
    if rows.is_empty() {
        bail!(
            "the history {} has no complete run of the same configuration as {} ({}) to compare with",
            h.location.describe(),
            path.display(),
            filter.config.unwrap_or_default()
        );
    }
    let picked: Vec<(String, i64, &str)> = rows
        .iter()
        .map(|r| (format!("#{}", r.id), r.started, r.kernel.as_str()))
        .collect();
    say_base(&h, ("run", "runs"), &picked);
    let base = rows
        .iter()
        .map(|r| Ok((PathBuf::from(format!("history#{}", r.id)), h.results(r.id)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok((base, vec![(path, new)]))
}

/// One line on stderr: which recorded (id, started, kernel) `--past` took as the base.
fn say_base(h: &history::History, (one, many): (&str, &str), picked: &[(String, i64, &str)]) {
    let ids: Vec<&str> = picked.iter().map(|p| p.0.as_str()).collect();
    eprintln!(
        "fsprof: base from the history {}: {} {} ({}), {} to {}, kernel {}",
        h.location.describe(),
        picked.len(),
        if picked.len() == 1 { one } else { many },
        ids.join(" "),
        utc(picked[0].1 as u64),
        utc(picked[picked.len() - 1].1 as u64),
        distinct(picked.iter().map(|p| p.2)).join(", ")
    );
}

fn distinct<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// `cmp.html` → `cmp.2.html` for the second of several comparisons.
fn numbered(path: &Path, i: usize, of: usize) -> PathBuf {
    if of == 1 {
        return path.to_path_buf();
    }
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
    path.with_extension(match ext {
        Some(e) => format!("{}.{e}", i + 1),
        None => (i + 1).to_string(),
    })
}

#[derive(Args)]
pub struct ExplainArgs {
    results: PathBuf,
    #[arg(long)]
    step: String,
    #[arg(long)]
    fs: String,
    #[arg(long)]
    vs: Option<String>,
}

pub fn explain_cmd(a: ExplainArgs) -> Result<ExitCode> {
    let r = RunResult::load(&a.results)?;
    for line in explain::explain(&r, &a.results, &a.step, &a.fs, a.vs.as_deref())? {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct FlameDiffArgs {
    base: PathBuf,
    new: PathBuf,
    /// The SVG to write.
    #[arg(short, long, default_value = "diff.svg")]
    output: PathBuf,
    #[arg(long)]
    title: Option<String>,
}

pub fn flame_diff_cmd(a: FlameDiffArgs) -> Result<ExitCode> {
    let (base, new) = (&a.base, &a.new);
    let (b, n) = (folded::read_folded(base)?, folded::read_folded(new)?);
    let title = a
        .title
        .unwrap_or_else(|| format!("{} vs {}", new.display(), base.display()));
    let sub = format!(
        "widths: {} ({} µs); red: more time than in {} ({} µs), blue: less",
        new.display(),
        folded::total_us(&n),
        base.display(),
        folded::total_us(&b)
    );
    if !report::flame::render_diff(&b, &n, &title, &sub, &a.output)? {
        bail!(
            "{} has no time to draw: a differential graph takes its shapes from the new file",
            new.display()
        );
    }
    eprintln!("fsprof: wrote {}", a.output.display());
    Ok(ExitCode::SUCCESS)
}
