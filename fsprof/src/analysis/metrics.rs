//! The figures of a cell (filesystem × step) that compare and explain reason about, one
//! value per pass.

use super::stats::median;
use crate::results::StepRun;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Ns,
    BytesPerSec,
}

/// One figure of a cell, per pass.
#[derive(Clone, Debug)]
pub struct Metric {
    pub name: String,
    pub unit: Unit,
    /// True when a larger value is worse (times, latencies); false for throughput.
    pub higher_is_worse: bool,
    pub values: Vec<f64>,
}

/// Smallest absolute difference worth flagging, per unit: below it a change is noise
/// whatever its percentage (a 40 % change of a 0.2 ms syncfs is nothing).
pub fn noise_floor(unit: Unit) -> f64 {
    match unit {
        Unit::Ns => 2_000_000.0,
        Unit::BytesPerSec => 1_000_000.0,
    }
}

fn metric(name: &str, unit: Unit, runs: &[&StepRun], f: impl Fn(&StepRun) -> f64) -> Metric {
    Metric {
        name: name.to_string(),
        unit,
        higher_is_worse: unit == Unit::Ns,
        values: runs.iter().map(|s| f(s)).collect(),
    }
}

/// Off-CPU ns of one pass that waited for `what` (0 without stacks or such waits).
pub fn waited_ns(s: &StepRun, what: &str) -> u64 {
    s.trace
        .stacks
        .iter()
        .flat_map(|st| &st.waited_for)
        .filter(|w| w.what == what)
        .map(|w| w.ns)
        .sum()
}

/// Median ns over the passes of every "waited for" any pass has (a pass without one counts
/// 0), largest first; empty without stacks.
pub fn waited_for_medians(runs: &[&StepRun]) -> Vec<(String, u64)> {
    let mut names: Vec<&str> = Vec::new();
    for s in runs {
        for w in s.trace.stacks.iter().flat_map(|st| &st.waited_for) {
            if !names.contains(&w.what.as_str()) {
                names.push(&w.what);
            }
        }
    }
    let mut v: Vec<(String, u64)> = names
        .into_iter()
        .map(|n| {
            (
                n.to_string(),
                median(runs.iter().map(|s| waited_ns(s, n)).collect()),
            )
        })
        .collect();
    v.sort_by_key(|(_, ns)| std::cmp::Reverse(*ns));
    v
}

/// Every figure of the cell: times, time classes, background, throughput, per-syscall and
/// per-block-class latency percentiles (those present in every pass).
pub fn cell_metrics(runs: &[&StepRun]) -> Vec<Metric> {
    let ns = Unit::Ns;
    let mut out = vec![
        metric("wall", ns, runs, |s| s.trace.wall_ns as f64),
        metric("user", ns, runs, |s| s.trace.user_ns as f64),
        metric("sys", ns, runs, |s| s.trace.sys_ns as f64),
        metric("I/O wait", ns, runs, |s| {
            s.trace.profile.time.io_wait.ns as f64
        }),
        metric("other D-wait", ns, runs, |s| {
            s.trace.profile.time.uninterruptible.ns as f64
        }),
        metric("run-queue", ns, runs, |s| {
            s.trace.profile.time.run_queue.ns as f64
        }),
        metric("syncfs", ns, runs, |s| s.syncfs_ns as f64),
        metric("kernel bg", ns, runs, |s| {
            s.trace.background.as_ref().map(|b| b.ns).unwrap_or(0) as f64
        }),
    ];
    // The workload's throughput: bytes its read/write calls moved per second until durable
    // (block bytes would reward a filesystem that writes more for the same work).
    let moved = |s: &StepRun| -> u64 {
        s.trace
            .profile
            .syscalls
            .iter()
            .filter_map(|c| c.bytes)
            .sum()
    };
    if runs.iter().all(|s| moved(s) > 0) {
        out.push(metric("throughput", Unit::BytesPerSec, runs, |s| {
            let t = (s.trace.wall_ns + s.syncfs_ns) as f64 / 1e9;
            if t > 0.0 { moved(s) as f64 / t } else { 0.0 }
        }));
    }
    let Some(first) = runs.first() else {
        return out;
    };
    // What the off-CPU time waited for (needs stacks), where it is 1 % of wall or more.
    for (what, _) in waited_for_medians(runs) {
        let values: Vec<f64> = runs.iter().map(|s| waited_ns(s, &what) as f64).collect();
        if values
            .iter()
            .any(|v| *v >= 0.01 * first.trace.wall_ns as f64)
        {
            out.push(Metric {
                name: format!("waited for {what}"),
                unit: ns,
                higher_is_worse: true,
                values,
            });
        }
    }
    for sc in &first.trace.profile.syscalls {
        // Only calls that matter to the cell: 1 % of its wall time or more.
        if (sc.total_ns as f64) < 0.01 * first.trace.wall_ns as f64 {
            continue;
        }
        let get = |s: &StepRun, p99: bool| {
            s.trace
                .profile
                .syscalls
                .iter()
                .find(|x| x.name == sc.name)
                .map(|x| if p99 { x.latency.p99 } else { x.latency.p50 } as f64)
        };
        for (label, p99) in [("p50", false), ("p99", true)] {
            let values: Option<Vec<f64>> = runs.iter().map(|s| get(s, p99)).collect();
            if let Some(values) = values {
                out.push(Metric {
                    name: format!("{} {label}", sc.name),
                    unit: ns,
                    higher_is_worse: true,
                    values,
                });
            }
        }
    }
    for b in &first.trace.profile.block {
        if b.completions < 10 {
            continue;
        }
        let values: Option<Vec<f64>> = runs
            .iter()
            .map(|s| {
                s.trace
                    .profile
                    .block
                    .iter()
                    .find(|x| x.class == b.class)
                    .map(|x| x.device_latency.p99 as f64)
            })
            .collect();
        if let Some(values) = values {
            out.push(Metric {
                name: format!("block {} device p99", b.class),
                unit: ns,
                higher_is_worse: true,
                values,
            });
        }
    }
    out
}
