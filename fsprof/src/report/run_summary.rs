//! The short answer of a run, as the studies printed it: per step and filesystem the
//! median time (m:ss,cc), CPU %, where the time mostly went and how far from the fastest;
//! plus the steps that measured the page cache rather than the disk.

use std::fmt::Write as _;

use fsprof_common::TIME_CLASSES;

use crate::analysis::stats::{median, median_f64};
use crate::results::{RunResult, StepRun};
use crate::units::clock;
use crate::workload::{
    pgbench::LATENCY_MS,
    rate::{self, Unit},
};

use super::table::table;

/// Below this share of the bytes the workload read and wrote, block I/O did not carry the
/// step: it ran from (or into) the page cache.
const CACHE_SHARE: f64 = 0.10;
/// Smaller transfers say nothing either way.
const CACHE_MIN_BYTES: u64 = 16 << 20;

#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    pub step: String,
    pub fs: String,
    pub passes: usize,
    pub wall_ns: u64,
    pub cpu_percent: f64,
    /// The time class that held most of the target's thread time, and its share.
    pub mostly: &'static str,
    pub mostly_share: f64,
    /// Median wall over the fastest filesystem's median wall for this step; for a step
    /// with a rate, the best median rate over this one's.
    pub vs_fastest: f64,
    /// The step's own rate when every pass has one, median, with its unit: pgbench's
    /// transactions per second (its time is fixed: the rate is its result), bonnie++'s and
    /// iozone's KiB/s, files/s or seeks/s (beside its time).
    pub rate: Option<(Unit, f64)>,
    /// pgbench's average latency, ms (median of the passes), shown with its tps.
    pub latency_ms: Option<f64>,
    pub page_cache: bool,
}

/// Thread time by class, in the order of the scheduler split.
fn classes(s: &StepRun) -> [(&'static str, u64); TIME_CLASSES as usize] {
    s.trace.own_classes()
}

/// Bytes the step's syscalls moved, and bytes its block I/O moved.
fn moved(s: &StepRun) -> (u64, u64) {
    let p = &s.trace.profile;
    let calls = p
        .syscalls
        .iter()
        .filter(|c| c.op == "read" || c.op == "write")
        .filter_map(|c| c.bytes)
        .sum();
    let block = p
        .block
        .iter()
        .filter(|b| b.class == "read" || b.class == "write")
        .map(|b| b.bytes)
        .sum();
    (calls, block)
}

/// The median of the passes' average latencies, when each has one.
fn latency_ms(runs: &[&StepRun]) -> Option<f64> {
    let v: Option<Vec<f64>> = (runs.iter())
        .map(|s| s.metrics.get(LATENCY_MS).copied())
        .collect();
    v.filter(|v| !v.is_empty()).map(median_f64)
}

/// The median of the passes' rates, when each has one of the same unit.
fn rate(runs: &[&StepRun]) -> Option<(Unit, f64)> {
    let rates: Option<Vec<(Unit, f64)>> = runs.iter().map(|s| rate::of(&s.metrics)).collect();
    let rates = rates.filter(|r| !r.is_empty())?;
    let unit = rates[0].0;
    let values: Option<Vec<f64>> = (rates.iter())
        .map(|(u, v)| (*u == unit).then_some(*v))
        .collect();
    Some((unit, median_f64(values?)))
}

fn row(step: &str, fs: &str, runs: &[&StepRun]) -> SummaryRow {
    let mut totals = [("", 0u64); TIME_CLASSES as usize];
    for s in runs {
        for (k, (name, ns)) in classes(s).into_iter().enumerate() {
            totals[k] = (name, totals[k].1 + ns);
        }
    }
    let all: u64 = totals.iter().map(|c| c.1).sum();
    let (mostly, top) = totals
        .iter()
        .copied()
        .max_by_key(|c| c.1)
        .unwrap_or(("", 0));
    let (calls, block) = runs
        .iter()
        .map(|s| moved(s))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    SummaryRow {
        step: step.into(),
        fs: fs.into(),
        passes: runs.len(),
        wall_ns: median(runs.iter().map(|s| s.trace.wall_ns).collect()),
        cpu_percent: median(
            runs.iter()
                .map(|s| (s.trace.cpu_percent() * 10.0) as u64)
                .collect(),
        ) as f64
            / 10.0,
        mostly: if all == 0 { "-" } else { mostly },
        mostly_share: if all == 0 {
            0.0
        } else {
            top as f64 / all as f64
        },
        vs_fastest: 1.0,
        rate: rate(runs),
        latency_ms: latency_ms(runs),
        page_cache: calls >= CACHE_MIN_BYTES * runs.len() as u64
            && (block as f64) < CACHE_SHARE * calls as f64,
    }
}

/// One row per step × filesystem that ran it, steps in run order.
pub fn rows(r: &RunResult) -> Vec<SummaryRow> {
    let mut out = Vec::new();
    for step in r.step_names() {
        let mut rows: Vec<SummaryRow> = r
            .filesystems
            .iter()
            .filter_map(|f| {
                let runs = f.runs_of(&step);
                (!runs.is_empty()).then(|| row(&step, &f.column(), &runs))
            })
            .collect();
        let rates: Option<Vec<f64>> = rows.iter().map(|r| r.rate.map(|x| x.1)).collect();
        let fastest = rows.iter().map(|r| r.wall_ns).min().unwrap_or(0).max(1);
        let best = rates
            .as_ref()
            .map(|r| r.iter().copied().fold(0.0, f64::max));
        for r in &mut rows {
            r.vs_fastest = match (best, r.rate) {
                (Some(best), Some((_, rate))) if rate > 0.0 => best / rate,
                _ => r.wall_ns as f64 / fastest as f64,
            };
        }
        out.extend(rows);
    }
    out
}

/// A step's slowest and fastest filesystem by `vs_fastest` (its wall, or its rate for a
/// step judged by one); None for a step that ran on fewer than two, or ran alike on all.
pub fn slowest_and_fastest<'a>(rows: &'a [SummaryRow], step: &str) -> Option<(&'a str, &'a str)> {
    let of_step = || rows.iter().filter(|r| r.step == step);
    let slow = of_step().max_by(|a, b| a.vs_fastest.total_cmp(&b.vs_fastest))?;
    let fast = of_step().min_by(|a, b| a.vs_fastest.total_cmp(&b.vs_fastest))?;
    (slow.fs != fast.fs).then_some((slow.fs.as_str(), fast.fs.as_str()))
}

/// The summary table for the terminal.
pub fn render(r: &RunResult) -> String {
    let rows = rows(r);
    let mut o = String::new();
    let mut last = "";
    let rated = rows.iter().any(|s| side_rate(s).is_some());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|s| {
            let step = if s.step == last { "" } else { &s.step };
            last = &s.step;
            let mut row = vec![step.to_string(), s.fs.clone(), result(s)];
            if rated {
                row.push(side_rate(s).unwrap_or_default());
            }
            row.extend([
                format!("{:.0}%", s.cpu_percent),
                format!("{} {:.0}%", s.mostly, 100.0 * s.mostly_share),
                format!("{:.2}×", s.vs_fastest),
                if s.page_cache { "page cache" } else { "" }.into(),
            ]);
            row
        })
        .collect();
    let mut head = vec!["step", "fs", "time"];
    if rated {
        head.push("rate");
    }
    head.extend(["CPU", "mostly", "vs fastest", ""]);
    o.push_str(&table(&head, &cells));
    let passes = rows.iter().map(|s| s.passes).max().unwrap_or(0);
    let _ = writeln!(
        o,
        "time and CPU: median of {passes} pass{}; mostly: the largest share of the target's \
         thread time (a parent's wait for its children left out)\nper-pass rows and every \
         time class: --verbose",
        if passes == 1 { "" } else { "es" }
    );
    if let Some(line) = prepared(r) {
        let _ = writeln!(o, "{line}");
    }
    if rows.iter().any(|s| s.rate.is_some()) {
        let _ = writeln!(o, "{RATE_NOTE}");
    }
    if rows.iter().any(|s| s.page_cache) {
        let _ = writeln!(
            o,
            "page cache: block I/O moved under {:.0}% of the bytes the step read and wrote, so \
             it timed memory, not the disk",
            100.0 * CACHE_SHARE
        );
    }
    o
}

/// What a row's time column shows: the step's rate when that is its result (with its
/// average latency when known), else its wall.
pub fn result(s: &SummaryRow) -> String {
    match (s.rate, s.latency_ms) {
        (Some((unit, v)), Some(ms)) if unit.is_result => {
            format!("{}, {ms:.3} ms avg", shown(unit, v))
        }
        (Some((unit, v)), None) if unit.is_result => shown(unit, v),
        _ => clock(s.wall_ns),
    }
}

/// A rate shown beside the time (not in its place); None where there is none.
pub fn side_rate(s: &SummaryRow) -> Option<String> {
    s.rate
        .filter(|(u, _)| !u.is_result)
        .map(|(u, v)| shown(u, v))
}

fn shown(unit: Unit, v: f64) -> String {
    format!("{v:.1} {}", unit.shown)
}

/// Says how a step with a rate is shown.
pub const RATE_NOTE: &str = "rate: the step's own, median of its passes: tps for a step whose \
    time is fixed (pgbench; shown as its time), KiB/s, files/s or seeks/s as bonnie++ and \
    iozone report them (its work over its time); its vs fastest is the best rate over its own";

/// The steps run untraced to prepare each pass (`--only` a step without what it needs).
pub fn prepared(r: &RunResult) -> Option<String> {
    let passes = r.filesystems.iter().flat_map(|f| &f.passes);
    let mut names: Vec<&str> = Vec::new();
    for p in passes.flat_map(|p| &p.prepared) {
        if !names.contains(&p.step.as_str()) {
            names.push(&p.step);
        }
    }
    (!names.is_empty()).then(|| {
        format!(
            "prepared untraced on each pass's fresh filesystem first (not results): {}",
            names.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{BlockRow, SyscallRow};
    use crate::results::{FsRun, PassRun};

    fn cell(step: &str, wall_s: u64, io_wait_s: u64, read: u64, block: u64) -> StepRun {
        let mut s = StepRun {
            step: step.into(),
            ..StepRun::default()
        };
        let t = &mut s.trace;
        t.wall_ns = wall_s * 1_000_000_000;
        t.sys_ns = t.wall_ns / 4;
        t.profile.time.on_cpu.ns = t.wall_ns / 4;
        t.profile.time.io_wait.ns = io_wait_s * 1_000_000_000;
        t.profile.syscalls.push(SyscallRow {
            op: "read".into(),
            bytes: Some(read),
            ..SyscallRow::default()
        });
        t.profile.block.push(BlockRow {
            class: "read".into(),
            bytes: block,
            ..BlockRow::default()
        });
        s
    }

    fn fs(name: &str, passes: Vec<Vec<StepRun>>) -> FsRun {
        FsRun {
            fs: name.into(),
            passes: passes
                .into_iter()
                .enumerate()
                .map(|(i, steps)| PassRun {
                    pass: i as u32 + 1,
                    steps,
                    ..PassRun::default()
                })
                .collect(),
            ..FsRun::default()
        }
    }

    /// pgbench runs for a fixed time: its rows show and rank its rate, not its wall.
    #[test]
    fn a_fixed_time_step_is_judged_by_its_rate() {
        let bench = |wall_s, tps| {
            let mut s = cell("pgbench", wall_s, 0, 0, 0);
            s.metrics.insert(rate::TPS.key.into(), tps);
            s.metrics.insert(LATENCY_MS.into(), 2.0);
            s
        };
        let r = RunResult {
            filesystems: vec![
                fs(
                    "ext4",
                    vec![vec![bench(10, 2000.0)], vec![bench(10, 2400.0)]],
                ),
                fs("xfs", vec![vec![bench(11, 1100.0)]]),
            ],
            ..RunResult::default()
        };
        let rows = rows(&r);
        assert_eq!(rows[0].rate, Some((rate::TPS, 2200.0)));
        assert_eq!((rows[0].vs_fastest, rows[1].vs_fastest), (1.0, 2.0));
        assert_eq!(result(&rows[1]), "1100.0 tps, 2.000 ms avg");
        assert!(render(&r).contains(RATE_NOTE));
    }

    #[test]
    fn medians_dominant_class_ratio_and_page_cache() {
        const MB: u64 = 1 << 20;
        let r = RunResult {
            filesystems: vec![
                fs(
                    "ext4",
                    vec![
                        vec![cell("read", 2, 1, 100 * MB, 100 * MB)],
                        vec![cell("read", 4, 3, 100 * MB, 100 * MB)],
                        vec![cell("read", 3, 2, 100 * MB, 100 * MB)],
                    ],
                ),
                fs("xfs", vec![vec![cell("read", 6, 0, 100 * MB, MB)]]),
            ],
            ..RunResult::default()
        };
        let rows = rows(&r);
        assert_eq!(rows.len(), 2);
        let (e, x) = (&rows[0], &rows[1]);
        assert_eq!(
            (e.fs.as_str(), e.wall_ns, e.passes),
            ("ext4", 3_000_000_000, 3)
        );
        assert_eq!(e.cpu_percent, 25.0);
        // ext4: 6 s I/O wait of 6 + 2.25 s thread time.
        assert_eq!(e.mostly, "I/O wait");
        assert!((e.mostly_share - 6.0 / 8.25).abs() < 1e-9);
        assert!(!e.page_cache);
        assert_eq!(x.mostly, "on-CPU");
        assert_eq!(x.vs_fastest, 2.0);
        assert!(x.page_cache, "1 MiB of block I/O for 100 MiB read");
        let text = render(&r);
        assert!(text.contains("0:03,00") && text.contains("2.00×"), "{text}");
        assert!(text.contains("page cache:"), "{text}");
    }
}
