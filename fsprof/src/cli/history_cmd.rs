//! `fsprof history`: the recorded runs, a figure's trend over them, import and export.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Result, bail};
use clap::{Args, Subcommand};

use crate::{
    analysis::compare::CompareOptions,
    history::{self, Filter, History, Location, Recorded, RunRow, crash::CrashRow, trend},
    report::{html::utc, table::table},
};

/// Where the history is (`--history`), shared by every command that reads or records it.
#[derive(Args, Clone, Default)]
pub struct HistoryLocation {
    /// The history: an SQLite file, or postgres://user@host/db for a shared one; default
    /// $FSPROF_HISTORY, else ~/.local/share/fsprof/history.sqlite.
    #[arg(long, value_name = "PATH|URL", global = true)]
    pub history: Option<String>,
}

impl HistoryLocation {
    pub fn open(&self) -> Result<History> {
        History::open(Location::resolve(self.history.as_deref())?)
    }
}

/// Whether and where a run or a crash study is recorded, and its name there.
#[derive(Args, Clone, Default)]
pub struct RecordArgs {
    #[command(flatten)]
    pub history: HistoryLocation,
    /// Do not record it in the history.
    #[arg(long, conflicts_with = "history")]
    pub no_history: bool,
    /// A name for it in the history and the results (a branch, a patch, a setting).
    #[arg(long)]
    pub label: Option<String>,
}

impl RecordArgs {
    /// Where to record, None with --no-history.
    pub fn location(&self) -> Option<Option<&str>> {
        (!self.no_history).then_some(self.history.history.as_deref())
    }
}

/// Which recorded runs.
#[derive(Args, Clone, Default)]
pub struct HistoryFilter {
    #[arg(long)]
    suite: Option<String>,
    /// Runs that tested this filesystem.
    #[arg(long = "fs")]
    fs: Option<String>,
    /// Kernel release (`uname -r`).
    #[arg(long)]
    kernel: Option<String>,
    #[arg(long)]
    label: Option<String>,
    #[arg(long)]
    host: Option<String>,
    /// Runs started since: YYYY-MM-DD (UTC), or an age such as 7d or 12h.
    #[arg(long, value_parser = parse_since)]
    since: Option<i64>,
    /// Only the newest N.
    #[arg(long)]
    last: Option<usize>,
}

impl HistoryFilter {
    pub fn filter(&self) -> Filter {
        Filter {
            suite: self.suite.clone(),
            fs: self.fs.clone(),
            kernel: self.kernel.clone(),
            label: self.label.clone(),
            host: self.host.clone(),
            since: self.since,
            last: self.last,
            ..Filter::default()
        }
    }
}

/// `YYYY-MM-DD` (UTC midnight) or an age (`7d`, `12h`, `30m`) → Unix time.
fn parse_since(s: &str) -> Result<i64, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let age = |n: &str, unit: i64| n.parse::<i64>().ok().map(|n| now - n * unit);
    let parsed = match s.char_indices().last() {
        Some((i, 'd')) => age(&s[..i], 86_400),
        Some((i, 'h')) => age(&s[..i], 3600),
        Some((i, 'm')) => age(&s[..i], 60),
        _ => days_from_civil(s).map(|d| d * 86_400),
    };
    parsed.ok_or_else(|| format!("'{s}' is not a date (YYYY-MM-DD) or an age (7d, 12h, 30m)"))
}

/// Days since 1970-01-01 of `YYYY-MM-DD` (proleptic Gregorian).
fn days_from_civil(s: &str) -> Option<i64> {
    let mut it = s.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, d) = (it.next()??, it.next()??, it.next()??);
    if it.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

#[derive(Args)]
pub struct HistoryArgs {
    #[command(subcommand)]
    cmd: HistoryCmd,
    #[command(flatten)]
    location: HistoryLocation,
}

#[derive(Subcommand)]
enum HistoryCmd {
    /// The recorded runs and crash studies, oldest first.
    List {
        #[command(flatten)]
        filter: HistoryFilter,
    },
    /// A figure over the recorded runs, per filesystem, each run judged by compare against
    /// the runs of its configuration before it.
    Trend {
        /// The step (default: every step of the runs).
        #[arg(long)]
        step: Option<String>,
        /// The figure, as compare names it: wall, user, sys, I/O wait, syncfs, throughput,
        /// fsync p99, …
        #[arg(long, default_value = "wall")]
        metric: String,
        /// Judge each run against this many runs before it.
        #[arg(long, default_value_t = 5)]
        base_runs: usize,
        /// Also write an HTML page with a trend chart per step.
        #[arg(long)]
        html: Option<PathBuf>,
        #[command(flatten)]
        filter: HistoryFilter,
    },
    /// Add results files or crash studies (e.g. from another machine); one already there
    /// is not added twice.
    Import { files: Vec<PathBuf> },
    /// Write a recorded run (`#3` or `3`) or crash study (`c3`) back out as its file.
    Export {
        #[arg(value_parser = parse_id)]
        id: RecordedId,
        #[arg(short, long, default_value = "fsprof-results.json")]
        output: PathBuf,
    },
}

pub fn history_cmd(a: HistoryArgs) -> Result<ExitCode> {
    let mut h = a.location.open()?;
    match a.cmd {
        HistoryCmd::List { filter } => {
            let runs = h.runs(&filter.filter())?;
            let studies = h.crash_studies(&filter.filter())?;
            // A history of crash studies only does not list "0 runs".
            if !runs.is_empty() || studies.is_empty() {
                print!("{}", list(&runs));
            }
            if !studies.is_empty() {
                let gap = if runs.is_empty() { "" } else { "\n" };
                print!("{gap}{}", list_crash(&studies));
            }
        }
        HistoryCmd::Trend {
            step,
            metric,
            base_runs,
            html,
            filter,
        } => trend_cmd(&mut h, step, &metric, base_runs, html, &filter)?,
        HistoryCmd::Import { files } => {
            for (path, done, kind) in history::import(&mut h, &files)? {
                let name = |id| match kind {
                    history::Kind::Run => format!("run #{id}"),
                    history::Kind::Crash => format!("crash study c{id}"),
                };
                match done {
                    Recorded::New(id) => println!("{}: recorded as {}", path.display(), name(id)),
                    Recorded::Already(id) => {
                        println!("{}: already recorded as {}", path.display(), name(id))
                    }
                }
            }
        }
        HistoryCmd::Export { id, output } => {
            match id {
                RecordedId::Run(id) => history::export(&mut h, id, &output)?,
                RecordedId::Crash(id) => h.crash_study(id)?.save(&output)?,
            }
            eprintln!("fsprof: {id} written to {}", output.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A recorded run or crash study, as `list` shows it.
#[derive(Clone, Copy)]
enum RecordedId {
    Run(i64),
    Crash(i64),
}

impl std::fmt::Display for RecordedId {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            RecordedId::Run(id) => write!(f, "run #{id}"),
            RecordedId::Crash(id) => write!(f, "crash study c{id}"),
        }
    }
}

/// `#3` or `3`: run 3; `c3`: crash study 3.
fn parse_id(s: &str) -> Result<RecordedId, String> {
    let number = |t: &str| t.parse::<i64>().ok();
    match s.strip_prefix('c') {
        Some(t) => number(t).map(RecordedId::Crash),
        None => number(s.strip_prefix('#').unwrap_or(s)).map(RecordedId::Run),
    }
    .ok_or_else(|| format!("'{s}' is not a run (#3) or a crash study (c3)"))
}

fn list_crash(studies: &[CrashRow]) -> String {
    let rows: Vec<Vec<String>> = studies
        .iter()
        .map(|r| {
            vec![
                format!("c{}", r.id),
                utc(r.started as u64),
                r.kernel.clone(),
                r.label.clone(),
                short_list(&r.patterns, "patterns"),
                r.filesystems.clone(),
                r.trials.to_string(),
                r.accel.clone(),
                r.host.clone(),
                if r.complete { "" } else { "partial" }.to_string(),
            ]
        })
        .collect();
    let header = [
        "study",
        "started",
        "kernel",
        "label",
        "patterns",
        "filesystems",
        "trials",
        "on",
        "host",
        "",
    ];
    format!(
        "{} crash stud{}\n{}",
        studies.len(),
        if studies.len() == 1 { "y" } else { "ies" },
        table(&header, &rows)
    )
}

/// A comma-separated list as a column: itself up to three items, else their count.
fn short_list(items: &str, what: &str) -> String {
    let n = items.split(',').filter(|s| !s.is_empty()).count();
    if n <= 3 {
        items.to_string()
    } else {
        format!("{n} {what}")
    }
}

fn list(runs: &[RunRow]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                format!("#{}", r.id),
                utc(r.started as u64),
                r.kernel.clone(),
                r.label.clone(),
                format!("{} ×{}", r.suite, r.scale),
                r.filesystems.clone(),
                r.passes.to_string(),
                r.accel.clone(),
                r.host.clone(),
                if r.complete { "" } else { "partial" }.to_string(),
            ]
        })
        .collect();
    let header = [
        "run",
        "started",
        "kernel",
        "label",
        "suite",
        "filesystems",
        "passes",
        "on",
        "host",
        "",
    ];
    format!("{} runs\n{}", runs.len(), table(&header, &rows))
}

fn trend_cmd(
    h: &mut History,
    step: Option<String>,
    metric: &str,
    base_runs: usize,
    html: Option<PathBuf>,
    filter: &HistoryFilter,
) -> Result<()> {
    let runs = h.runs(&filter.filter())?;
    if runs.is_empty() {
        bail!("no recorded run matches: `fsprof history list` shows what there is");
    }
    let steps: Vec<String> = match step {
        Some(s) => vec![s],
        None => {
            let mut all: Vec<String> = Vec::new();
            for r in &runs {
                for s in r.steps.split(',').filter(|s| !s.is_empty()) {
                    if !all.iter().any(|x| x == s) {
                        all.push(s.to_string());
                    }
                }
            }
            all
        }
    };
    let opts = trend::TrendOptions {
        base_runs,
        compare: CompareOptions::default(),
    };
    let judged = trend::verdicts(h, &runs, metric, &opts)?;
    let mut charts = Vec::new();
    for step in steps {
        let points = trend::trend(h, &runs, &step, metric, &judged)?;
        if points.iter().all(|p| p.values.is_empty()) {
            bail!("no recorded run has '{metric}' for step '{step}'");
        }
        println!("{}", trend::render(&points, &step, metric, base_runs));
        charts.push((step, metric.to_string(), points));
    }
    if let Some(path) = html {
        let title = format!("fsprof history: {metric} over {} runs", runs.len());
        std::fs::write(&path, trend::html(&charts, &title))?;
        eprintln!("fsprof: wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_ages() {
        assert_eq!(days_from_civil("1970-01-01"), Some(0));
        assert_eq!(days_from_civil("2026-12-05"), Some(20_792));
        assert_eq!(days_from_civil("2000-03-01"), Some(11_017));
        assert!(days_from_civil("2026-13-01").is_none());
        assert!(parse_since("yesterday").is_err());
        let week = parse_since("7d").unwrap();
        let day = parse_since("1d").unwrap();
        assert_eq!(day - week, 6 * 86_400);
    }

    #[test]
    fn long_lists_are_counted() {
        assert_eq!(
            short_list("append,overwrite", "patterns"),
            "append,overwrite"
        );
        assert_eq!(short_list("a,b,c,d", "patterns"), "4 patterns");
    }
}
