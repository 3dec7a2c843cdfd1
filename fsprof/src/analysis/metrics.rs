//! The figures of a cell (filesystem × step) that compare and explain reason about, one
//! value per pass.

use fsprof_common::TimeClass;

use super::stats::median;
use crate::{
    aggregate::{time_label, wakes::RUN_QUEUE_WAKER},
    results::StepRun,
    workload::rate,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Ns,
    BytesPerSec,
    /// Events a second (the step's own rate).
    PerSec,
}

/// What a figure is: figures of one kind spread alike across cells (the verdict rule
/// learns it per kind) and a floor below which a change is nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Kind {
    Wall,
    User,
    Sys,
    /// The off-CPU time classes (I/O wait, other D-wait, run-queue).
    TimeClass,
    Syncfs,
    /// Sampled on-CPU time: samples weighted by the CPU time charged between them, whose
    /// spread is at most that of a Poisson count of periods (the variance the verdict uses).
    KernelBg,
    Throughput,
    /// The step's own rate where it is the step's result (pgbench's tps: its time is fixed).
    Rate,
    WaitedFor,
    /// A per-call latency percentile (syscall or block request), from log-linear buckets.
    LatencyP50,
    LatencyP99,
}

impl Kind {
    /// Smallest absolute difference worth flagging: below it a change is noise whatever its
    /// percentage (a 40 % change of a 0.2 ms syncfs is nothing). A step's times need 2 ms;
    /// a per-call latency 1 µs (the two clock reads that time a call take ~0.1 µs).
    pub fn floor(self) -> f64 {
        match self {
            Kind::LatencyP50 | Kind::LatencyP99 => 1_000.0,
            Kind::Throughput => 1_000_000.0,
            Kind::Rate => 0.0,
            _ => 2_000_000.0,
        }
    }
    pub fn unit(self) -> Unit {
        match self {
            Kind::Throughput => Unit::BytesPerSec,
            Kind::Rate => Unit::PerSec,
            _ => Unit::Ns,
        }
    }
}

/// One figure of a cell, per pass.
#[derive(Clone, Debug)]
pub struct Metric {
    pub name: String,
    pub kind: Kind,
    /// True when a larger value is worse (times, latencies); false for throughput.
    pub higher_is_worse: bool,
    pub values: Vec<f64>,
    /// How finely the figure is measured: a sample period for sampled figures (their count
    /// is Poisson), the relative bucket width for percentiles.
    pub resolution: Resolution,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Resolution {
    Exact,
    /// Each value is a count of samples of this many ns.
    Sampled(f64),
    /// Each value is a bucket midpoint, the bucket this wide relative to the value.
    Bucket(f64),
}

impl Metric {
    pub fn unit(&self) -> Unit {
        self.kind.unit()
    }
}

fn metric(name: &str, kind: Kind, runs: &[&StepRun], f: impl Fn(&StepRun) -> f64) -> Metric {
    Metric {
        name: name.to_string(),
        kind,
        higher_is_worse: kind.unit() == Unit::Ns,
        values: runs.iter().map(|s| f(s)).collect(),
        resolution: Resolution::Exact,
    }
}

/// Linux splits a task's CPU time into user and sys in proportion to the timer ticks that
/// found it in each (HZ = 250 on Debian's kernels and this project's hosts: 4 ms), so the
/// split moves by whole ticks: a step with 0 ms user in one run has 4 ms in the next.
const TICK_NS: f64 = 4e6;

/// Relative width of a latency bucket (log-linear, `SUB_BITS` sub-buckets a power of two).
const BUCKET_WIDTH: f64 = 1.0 / fsprof_common::hist::SUB_COUNT as f64;

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
    let period = runs
        .iter()
        .find_map(|s| s.trace.stacks.as_ref().map(|st| st.sample_period_ns))
        .unwrap_or(0) as f64;
    let mut out = vec![
        metric("wall", Kind::Wall, runs, |s| s.trace.wall_ns as f64),
        Metric {
            resolution: Resolution::Sampled(TICK_NS),
            ..metric("user", Kind::User, runs, |s| s.trace.user_ns as f64)
        },
        Metric {
            resolution: Resolution::Sampled(TICK_NS),
            ..metric("sys", Kind::Sys, runs, |s| s.trace.sys_ns as f64)
        },
    ];
    // The off-CPU classes a filesystem moves time between.
    out.extend(
        [
            TimeClass::IoWait,
            TimeClass::Uninterruptible,
            TimeClass::RunQueue,
        ]
        .map(|c| {
            metric(time_label(c), Kind::TimeClass, runs, |s| {
                s.trace.profile.time.class(c).ns as f64
            })
        }),
    );
    out.extend([
        metric("syncfs", Kind::Syncfs, runs, |s| s.syncfs_ns as f64),
        Metric {
            resolution: Resolution::Sampled(period),
            ..metric("kernel bg", Kind::KernelBg, runs, |s| {
                s.trace.background.as_ref().map(|b| b.ns).unwrap_or(0) as f64
            })
        },
    ]);
    // The workload's throughput: bytes its read/write calls moved per second until durable
    // (block bytes would reward a filesystem that writes more for the same work). Only
    // where the bytes vary between passes (pgbench: work done in a set time): for a fixed
    // amount of work it is wall + syncfs in other units, and testing both counted one
    // change twice (identical runs: ext4 cpu wall -33 % and throughput +40 %, two flags).
    let moved = |s: &StepRun| -> u64 {
        s.trace
            .profile
            .syscalls
            .iter()
            .filter_map(|c| c.bytes)
            .sum()
    };
    let (lo, hi) = runs
        .iter()
        .map(|s| moved(s))
        .fold((u64::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
    // Fixed work within 1 % (a shell's reads of its environment differ by a few bytes).
    let varies = hi as f64 > lo as f64 * 1.01;
    // A step whose result is its own rate (pgbench's tps) is judged by that, in place of
    // the bytes its calls moved: one figure for one quantity.
    let own: Option<Vec<(rate::Unit, f64)>> =
        runs.iter().map(|s| rate::result_of(&s.metrics)).collect();
    if let Some(&[(unit, _), ..]) = own.as_deref() {
        out.push(metric(unit.key, Kind::Rate, runs, |s| {
            rate::result_of(&s.metrics).map_or(0.0, |r| r.1)
        }));
    } else if varies && lo > 0 {
        out.push(metric("throughput", Kind::Throughput, runs, |s| {
            let t = (s.trace.wall_ns + s.syncfs_ns) as f64 / 1e9;
            if t > 0.0 { moved(s) as f64 / t } else { 0.0 }
        }));
    }
    let Some(first) = runs.first() else {
        return out;
    };
    out.extend(waited_for_metrics(runs, first));
    out.extend(syscall_metrics(runs, first));
    out.extend(block_metrics(runs, first));
    out
}

/// What the off-CPU time waited for (needs stacks), where it is 1 % of wall or more;
/// waiting for a CPU is the run-queue class under another name.
fn waited_for_metrics(runs: &[&StepRun], first: &StepRun) -> Vec<Metric> {
    let mut out = Vec::new();
    for (what, _) in waited_for_medians(runs) {
        if what == RUN_QUEUE_WAKER {
            continue;
        }
        let values: Vec<f64> = runs.iter().map(|s| waited_ns(s, &what) as f64).collect();
        if values
            .iter()
            .any(|v| *v >= 0.01 * first.trace.wall_ns as f64)
        {
            out.push(Metric {
                values,
                ..metric(&format!("waited for {what}"), Kind::WaitedFor, runs, |_| {
                    0.0
                })
            });
        }
    }
    out
}

/// p50 and p99 latency of each syscall that took 1 % of the cell's wall or more.
fn syscall_metrics(runs: &[&StepRun], first: &StepRun) -> Vec<Metric> {
    let mut out = Vec::new();
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
                .filter(|x| x.count >= min_calls(p99))
                .map(|x| if p99 { x.latency.p99 } else { x.latency.p50 } as f64)
        };
        for (kind, p99) in [(Kind::LatencyP50, false), (Kind::LatencyP99, true)] {
            let values: Option<Vec<f64>> = runs.iter().map(|s| get(s, p99)).collect();
            if let Some(values) = values {
                let label = if p99 { "p99" } else { "p50" };
                out.push(latency(format!("{} {label}", sc.name), kind, values));
            }
        }
    }
    out
}

/// Device-latency p99 of each block class.
fn block_metrics(runs: &[&StepRun], first: &StepRun) -> Vec<Metric> {
    let mut out = Vec::new();
    for b in &first.trace.profile.block {
        let values: Option<Vec<f64>> = runs
            .iter()
            .map(|s| {
                s.trace
                    .profile
                    .block
                    .iter()
                    .find(|x| x.class == b.class)
                    .filter(|x| x.completions >= min_calls(true))
                    .map(|x| x.device_latency.p99 as f64)
            })
            .collect();
        if let Some(values) = values {
            let name = format!("block {} device p99", b.class);
            out.push(latency(name, Kind::LatencyP99, values));
        }
    }
    out
}

/// Calls (or requests) a pass needs for a percentile to be a figure: a p99 of fewer than 100
/// is the slowest one (one event, measured: a 10× swing between identical runs), a p50 of
/// fewer than 10 one of a handful.
fn min_calls(p99: bool) -> u64 {
    if p99 { 100 } else { 10 }
}

fn latency(name: String, kind: Kind, values: Vec<f64>) -> Metric {
    Metric {
        name,
        kind,
        higher_is_worse: true,
        values,
        resolution: Resolution::Bucket(BUCKET_WIDTH),
    }
}
