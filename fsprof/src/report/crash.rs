//! The crash study as people read and cite it: a table per filesystem and crash method
//! (pattern × crash point: what the application found in how many trials, recovery and
//! fsck times), and the same cells as CSV.

use std::fmt::Write;

use crate::{
    analysis::stats,
    results::crash::{CrashCell, CrashCost, CrashStudy},
    units::{bytes, duration_ns},
    workload::crash::Outcome,
};

/// Median of a cell's per-trial times; None when there are none.
fn median(v: &[u64]) -> Option<u64> {
    (!v.is_empty()).then(|| stats::median(v.to_vec()))
}

fn outcome_columns(c: &CrashCell) -> String {
    Outcome::ALL
        .iter()
        .map(|o| format!("{:>8}", c.outcomes.get(o).copied().unwrap_or(0)))
        .collect()
}

fn fsck_column(c: &CrashCell) -> String {
    match median(&c.fsck_ns) {
        None => "-".into(),
        Some(ns) if c.fsck_unclean == 0 => format!("{} clean", duration_ns(ns)),
        Some(ns) => format!("{} {} UNCLEAN", duration_ns(ns), c.fsck_unclean),
    }
}

/// The study as text tables, one per (filesystem, options, method).
pub fn render(study: &CrashStudy) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "fsprof crash: kernel {}, {} trials per cell, each on a fresh filesystem{}",
        study.kernel,
        study.trials,
        if study.complete {
            ""
        } else {
            " (INTERRUPTED: partial)"
        }
    );
    if let Some(vm) = &study.vm {
        let _ = writeln!(o, "{}", vm.describe());
    }
    let mut groups: Vec<(&str, &str, &str, &str)> = Vec::new();
    for c in &study.cells {
        let key = (
            c.fs.as_str(),
            c.mkfs_opts.as_str(),
            c.mount_opts.as_str(),
            c.method.as_str(),
        );
        if !groups.contains(&key) {
            groups.push(key);
        }
    }
    for (fs, mkfs, mount, method) in groups {
        let opts = |s: &str| {
            if s.is_empty() {
                "default".to_string()
            } else {
                s.to_string()
            }
        };
        let _ = writeln!(
            o,
            "\n{fs}  (crashed by {method}; mkfs {}, mount {})",
            opts(mkfs),
            opts(mount)
        );
        let names: String = Outcome::ALL
            .iter()
            .map(|x| format!("{:>8}", x.name()))
            .collect();
        let _ = writeln!(
            o,
            "  {:<18} {:<24}{names}  {:>9}  fsck (read-only)",
            "pattern", "crash point", "recovery"
        );
        for c in study.cells.iter().filter(|c| {
            (
                c.fs.as_str(),
                c.mkfs_opts.as_str(),
                c.mount_opts.as_str(),
                c.method.as_str(),
            ) == (fs, mkfs, mount, method)
        }) {
            let point = format!("{} (+{})", c.point.name(), duration_ns(c.wait_ns));
            let mark = if c.broken_promise() {
                "  ← DURABLE PATTERN LOST DATA"
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "  {:<18} {:<24}{}  {:>9}  {}{mark}",
                format!("{}{}", c.pattern.name(), if c.durable { "*" } else { "" }),
                point,
                outcome_columns(c),
                median(&c.recovery_ns).map_or("-".into(), duration_ns),
                fsck_column(c),
            );
        }
    }
    let _ = writeln!(
        o,
        "\n* durable: POSIX promises the new content once the pattern returns. recovery: the \
         mount after the crash (journal replay), median; fsck: the checker's read-only pass \
         after it, median."
    );
    render_costs(&mut o, &study.costs);
    let broken: Vec<String> = study
        .cells
        .iter()
        .filter(|c| c.broken_promise())
        .map(|c| format!("{} {} {}", c.fs, c.pattern.name(), c.point.name()))
        .collect();
    if !broken.is_empty() {
        let _ = writeln!(
            o,
            "DATA LOST AFTER A DURABLE PATTERN (a filesystem bug, or fsprof's): {}",
            broken.join(", ")
        );
    }
    o
}

/// What each pattern costs the application, per filesystem and options.
fn render_costs(o: &mut String, costs: &[CrashCost]) {
    let mut groups: Vec<(&str, &str, &str)> = Vec::new();
    for c in costs {
        let key = (c.fs.as_str(), c.mkfs_opts.as_str(), c.mount_opts.as_str());
        if !groups.contains(&key) {
            groups.push(key);
        }
    }
    for key in groups {
        let rows: Vec<&CrashCost> = costs
            .iter()
            .filter(|c| (c.fs.as_str(), c.mkfs_opts.as_str(), c.mount_opts.as_str()) == key)
            .collect();
        let _ = writeln!(
            o,
            "\n{}: what each pattern costs ({} updates traced, no crash; writeback left for \
             later not included)",
            key.0, rows[0].updates
        );
        let _ = writeln!(
            o,
            "  {:<18} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8}",
            "pattern", "per update", "sync p50", "sync p99", "commits", "written", "flushes"
        );
        for c in rows {
            let sync = c.sync_latency();
            let (written, flushes) = c.written_and_flushes();
            let _ = writeln!(
                o,
                "  {:<18} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8}",
                c.pattern.name(),
                duration_ns(c.per_update_ns()),
                sync.map_or("-".into(), |s| duration_ns(s.p50)),
                sync.map_or("-".into(), |s| duration_ns(s.p99)),
                c.commits(),
                bytes(written),
                flushes
            );
        }
    }
}

/// One row per cell: its keys, outcome counts, median recovery and fsck times.
pub fn to_csv(study: &CrashStudy) -> String {
    let mut o =
        String::from("fs,mkfs_opts,mount_opts,method,pattern,durable,crash_point,wait_ns,trials");
    for x in Outcome::ALL {
        let _ = write!(o, ",{}", x.name());
    }
    o.push_str(",recovery_median_ns,fsck_median_ns,fsck_unclean\n");
    for c in &study.cells {
        let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let _ = write!(
            o,
            "{},{},{},{},{},{},{},{},{}",
            c.fs,
            q(&c.mkfs_opts),
            q(&c.mount_opts),
            c.method,
            c.pattern.name(),
            c.durable,
            c.point.name(),
            c.wait_ns,
            c.trials()
        );
        for x in Outcome::ALL {
            let _ = write!(o, ",{}", c.outcomes.get(x).copied().unwrap_or(0));
        }
        let opt = |v: Option<u64>| v.map_or(String::new(), |n| n.to_string());
        let _ = writeln!(
            o,
            ",{},{},{}",
            opt(median(&c.recovery_ns)),
            opt(median(&c.fsck_ns)),
            c.fsck_unclean
        );
    }
    o
}
