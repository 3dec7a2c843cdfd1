//! Commands that read saved results: report, compare, explain, flame-diff.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use crate::{
    aggregate::folded,
    analysis::{compare, explain},
    report,
    results::{self, RunResult},
};

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// The terminal report.
    Table,
    Csv,
    /// Normalised JSON.
    Json,
    /// Markdown, charts as SVG files in RESULTS.charts/.
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
}

pub fn report_cmd(a: ReportArgs) -> Result<ExitCode> {
    let r = RunResult::load(&a.results)?;
    if let Some(path) = &a.html {
        write_html(&r, &a.results, path)?;
        return Ok(ExitCode::SUCCESS);
    }
    match a.format {
        Format::Table => print!("{}", report::run_table::render(&r, a.verbose)),
        Format::Csv => print!("{}", r.to_csv()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&r)?),
        Format::Markdown => {
            let dir = results::dir_of(&a.results);
            print!(
                "{}",
                report::html::markdown(&r, &a.results.with_extension("charts"), dir)?
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct CompareArgs {
    /// Base results, e.g. old-kernel.json or a.json,b.json.
    base: String,
    /// New results.
    new: String,
    /// Relative change that counts, in %.
    #[arg(long, default_value_t = 5.0)]
    threshold: f64,
    /// Significance level of the t-test.
    #[arg(long, default_value_t = 0.05)]
    alpha: f64,
    /// Exit with status 1 when a regression is flagged (for CI).
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
    let load = |list: &str| -> Result<Vec<(PathBuf, RunResult)>> {
        list.split(',')
            .map(|p| Ok((PathBuf::from(p), RunResult::load(Path::new(p))?)))
            .collect()
    };
    let (base, new) = (load(&a.base)?, load(&a.new)?);
    let results = |set: &[(PathBuf, RunResult)]| -> Vec<RunResult> {
        set.iter().map(|(_, r)| r.clone()).collect()
    };
    let opts = compare::CompareOptions {
        threshold: a.threshold / 100.0,
        alpha: a.alpha,
    };
    let c = compare::compare(&results(&base), &results(&new), &opts)?;
    print!("{}", report::compare_table::render(&c, &opts, a.all));
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&c)? + "\n")?;
        eprintln!("fsprof: wrote {}", path.display());
    }
    if let Some(path) = &a.html {
        report::compare_html::write(&c, &base, &new, path)?;
        eprintln!("fsprof: wrote {}", path.display());
    }
    let regressed = c.regressions().next().is_some();
    Ok(if a.fail_on_regression && regressed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
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
