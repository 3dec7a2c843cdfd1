//! The terminal report of `fsprof run`, in the spirit of the classic studies: per step,
//! rows filesystem × pass with time (m:ss,cc) and CPU%, then user / sys / I/O wait / other
//! waits beside them, then the median with min–max over passes.

use crate::analysis::stats::median;
use std::fmt::Write as _;

use super::table::table;
use crate::aggregate::stacks::UserCompleteness;
use crate::results::{RunResult, StepRun};
use crate::units::{bytes, clock, duration_ns, seconds};

/// Columns after CPU%: user, sys, kernel background, I/O wait, other D, run-queue, syncfs,
/// quiesce, probes (fsprof's own kernel time).
pub const COLS: usize = 10;

fn row(fs: &str, pass: String, cells: [u64; COLS], cpu: f64) -> Vec<String> {
    let [wall, rest @ ..] = cells;
    let mut v = vec![
        fs.to_string(),
        pass,
        clock(wall),
        String::new(),
        format!("{cpu:.0}%"),
    ];
    v.extend(rest.iter().map(|&ns| seconds(ns)));
    v
}

/// Medians over passes of `cells`.
pub fn median_cells(runs: &[&StepRun]) -> [u64; COLS] {
    std::array::from_fn(|k| median(runs.iter().map(|s| cells(s)[k]).collect()))
}

/// wall, user, sys, kernel background, I/O wait, other D, run-queue, syncfs, quiesce,
/// probes.
pub fn cells(s: &StepRun) -> [u64; COLS] {
    let t = &s.trace;
    let time = &t.profile.time;
    [
        t.wall_ns,
        t.user_ns,
        t.sys_ns,
        t.background.as_ref().map(|b| b.ns).unwrap_or(0),
        time.io_wait.ns,
        time.uninterruptible.ns,
        time.run_queue.ns,
        s.syncfs_ns,
        t.quiesce_ns.unwrap_or(0),
        t.profile.probe_cost.as_ref().map(|c| c.run_ns).unwrap_or(0),
    ]
}

/// One line per filesystem: the fs's own begin/end latencies and most frequent events.
fn fs_event_lines(o: &mut String, fs: &str, runs: &[&StepRun]) {
    let Some(f) = runs
        .first()
        .and_then(|s| s.trace.profile.fs_events.as_ref())
    else {
        return;
    };
    let pairs: Vec<String> = f
        .pairs
        .iter()
        .map(|p| {
            format!(
                "{} {}× p50 {} p99 {}",
                p.name,
                p.count,
                duration_ns(p.latency.p50),
                duration_ns(p.latency.p99)
            )
        })
        .collect();
    let events: Vec<String> = f
        .events
        .iter()
        .filter(|e| e.filtered)
        .take(3)
        .map(|e| format!("{} {}", e.name, e.count))
        .collect();
    if pairs.is_empty() && events.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "  {fs} pass 1 tracepoints: {}{}{}",
        pairs.join(", "),
        if pairs.is_empty() || events.is_empty() {
            ""
        } else {
            "; "
        },
        events.join(", ")
    );
}

/// The run's report: the summary, or with `verbose` every pass of every step with all
/// time classes; then the filesystems' own figures.
pub fn render(r: &RunResult, verbose: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "fsprof run: suite {} (scale {}, {} pass{}, {} job{}), kernel {}, {} CPUs{}",
        r.suite,
        r.scale,
        r.passes,
        if r.passes == 1 { "" } else { "es" },
        r.jobs,
        if r.jobs == 1 { "" } else { "s" },
        r.kernel,
        r.cpus,
        if r.complete { "" } else { "  [INCOMPLETE]" }
    );
    if let Some(vm) = &r.vm {
        let _ = writeln!(o, "  {}", vm.describe());
    }
    if verbose {
        steps(&mut o, r);
    } else {
        o.push('\n');
        o.push_str(&super::run_summary::render(r));
    }
    failures(&mut o, r);
    user_stacks(&mut o, r, None);
    filesystems(&mut o, r);
    o
}

/// The failed cells, one line each: their figures are left out of everything above.
fn failures(o: &mut String, r: &RunResult) {
    let failed = r.failures();
    if failed.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "
FAILED: {} cell{} (left out of the figures above)",
        failed.len(),
        if failed.len() == 1 { "" } else { "s" }
    );
    for (fs, pass, step, why) in failed {
        let _ = writeln!(o, "  {fs} {step} pass {pass}: {why}");
    }
}

/// Per filesystem, how many user stacks of `step` (None: every step) are whole.
fn user_stacks(o: &mut String, r: &RunResult, step: Option<&str>) {
    for f in &r.filesystems {
        let mut u = UserCompleteness::default();
        for p in &f.passes {
            for s in p.steps.iter().filter(|s| step.is_none_or(|n| s.step == n)) {
                if let Some(st) = &s.trace.stacks {
                    u.merge(&st.user_stacks);
                }
            }
        }
        if let Some(line) = super::table::user_completeness(&u) {
            let _ = writeln!(o, "  {}: {line}", f.column());
        }
    }
}

/// Per step: a row per filesystem and pass, then the median with min–max.
fn steps(o: &mut String, r: &RunResult) {
    let steps = r.step_names();
    let header = [
        "fs",
        "pass",
        "time",
        "min–max",
        "CPU",
        "user",
        "sys",
        "kernel bg",
        "I/O wait",
        "other D",
        "run-queue",
        "syncfs",
        "quiesce",
        "probes",
    ];
    for step in &steps {
        let _ = writeln!(o, "\n{step}");
        let mut rows = Vec::new();
        for f in &r.filesystems {
            let runs = f.runs_of(step);
            for (i, s) in runs.iter().enumerate() {
                rows.push(row(
                    &f.column(),
                    (i + 1).to_string(),
                    cells(s),
                    s.trace.cpu_percent(),
                ));
            }
            if runs.len() > 1 {
                let walls: Vec<u64> = runs.iter().map(|s| s.trace.wall_ns).collect();
                let cpu = median(
                    runs.iter()
                        .map(|s| (s.trace.cpu_percent() * 10.0) as u64)
                        .collect(),
                ) as f64
                    / 10.0;
                let mut m = row(&f.column(), "median".into(), median_cells(&runs), cpu);
                m[3] = format!(
                    "{}–{}",
                    clock(*walls.iter().min().unwrap_or(&0)),
                    clock(*walls.iter().max().unwrap_or(&0))
                );
                rows.push(m);
            }
        }
        o.push_str(&table(&header, &rows));
        for f in &r.filesystems {
            fs_event_lines(o, &f.column(), &f.runs_of(step));
        }
        user_stacks(o, r, Some(step));
        for f in &r.filesystems {
            for p in &f.passes {
                for s in p
                    .steps
                    .iter()
                    .filter(|s| &s.step == step && !s.metrics.is_empty())
                {
                    let m: Vec<String> = s
                        .metrics
                        .iter()
                        .map(|(k, v)| format!("{k} {v:.1}"))
                        .collect();
                    let _ = writeln!(o, "  {} pass {}: {}", f.column(), p.pass, m.join(", "));
                }
            }
        }
    }
}

/// mkfs, mount and umount times and capacity per filesystem; lost events; interruption.
fn filesystems(o: &mut String, r: &RunResult) {
    let _ = writeln!(o, "\nfilesystems (median over passes)");
    let mut rows = Vec::new();
    for f in &r.filesystems {
        let med = |get: &dyn Fn(&crate::results::PassRun) -> Option<u64>| {
            median(f.passes.iter().filter_map(get).collect())
        };
        let last_capacity = f
            .passes
            .last()
            .and_then(|p| p.steps.iter().rev().find_map(|s| s.capacity_after));
        let after_mkfs = f
            .passes
            .last()
            .map(|p| p.capacity_after_mkfs)
            .unwrap_or_default();
        let usable = if f.device_bytes > 0 {
            format!(
                "{:.2}%",
                100.0 * after_mkfs.avail_bytes as f64 / f.device_bytes as f64
            )
        } else {
            "-".into()
        };
        rows.push(vec![
            f.column(),
            f.mount_opts.clone(),
            seconds(med(&|p| Some(p.mkfs_ns))),
            seconds(med(&|p| Some(p.mount_ns))),
            seconds(med(&|p| p.umount_ns)),
            bytes(f.device_bytes),
            usable,
            last_capacity
                .map(|c| bytes(c.used_bytes))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    o.push_str(&table(
        &[
            "fs",
            "mount opts",
            "mkfs",
            "mount",
            "umount",
            "device",
            "usable after mkfs",
            "used after delete",
        ],
        &rows,
    ));
    let lost: u64 = r
        .filesystems
        .iter()
        .flat_map(|f| &f.passes)
        .flat_map(|p| &p.steps)
        .map(|s| s.trace.profile.lost.values().sum::<u64>())
        .sum();
    if lost > 0 {
        let _ = writeln!(
            o,
            "\nLOST EVENTS: {lost} over the run; figures are incomplete"
        );
    }
    if let Some(why) = &r.interrupted {
        let _ = writeln!(o, "\nrun stopped early: {why}");
    }
}
