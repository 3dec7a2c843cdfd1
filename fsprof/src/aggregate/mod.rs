//! Reads the kernel-side aggregates out of the maps into a `Profile`.

pub mod background;
pub mod block;
pub mod folded;
pub mod fs_events;
pub mod histogram;
pub mod probe_cost;
pub mod stacks;
pub mod symbols;
pub mod wakes;

use std::collections::{BTreeMap, HashMap as StdHashMap};

use anyhow::{Context, Result};
use aya::maps::{HashMap, PerCpuArray, PerCpuHashMap, PerCpuValues};
use fsprof_common::{
    COUNTERS, Counter, DenseHist, EXEC_UNKNOWN, HistKey, HistKind, Lost, MAX_SYSCALLS,
    SyscallStats, TIME_CLASSES, TaskState, TimeClass, TimeStats,
};
use serde::{Deserialize, Serialize};

use crate::{
    probes::{Probes, monotonic_ns},
    syscall_table,
};
use histogram::{Summary, from_buckets};

/// Everything the kernel side aggregated for one traced interval.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Profile {
    /// One row per syscall the target made, by total time, longest first.
    pub syscalls: Vec<SyscallRow>,
    /// Thread-time of the target by scheduler state, in ns summed over its threads.
    pub time: TimeSplit,
    /// One row per (device, class) with traffic.
    pub block: Vec<BlockRow>,
    /// Non-zero loss counters by name; empty when nothing was lost.
    pub lost: BTreeMap<String, u64>,
    pub tasks_forked: u64,
    pub tasks_exited: u64,
    pub syscalls_unfinished: u64,
    /// The filesystem's own tracepoints; null when not traced.
    #[serde(default)]
    pub fs_events: Option<fs_events::FsEventsProfile>,
    /// fsprof's own kernel-side cost; null when the kernel kept no statistics.
    #[serde(default)]
    pub probe_cost: Option<probe_cost::ProbeCost>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SyscallRow {
    pub nr: u32,
    pub name: String,
    /// VFS operation group (open, read, write, …) or "other".
    pub op: String,
    pub count: u64,
    pub errors: u64,
    /// Bytes transferred, for syscalls that move data; null otherwise.
    pub bytes: Option<u64>,
    pub total_ns: u64,
    /// Latency in ns.
    pub latency: Summary,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ClassTime {
    pub ns: u64,
    /// Number of contiguous intervals spent in the class.
    pub episodes: u64,
    /// Length of one interval, ns (off-CPU classes only).
    pub episode: Option<Summary>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TimeSplit {
    pub on_cpu: ClassTime,
    pub io_wait: ClassTime,
    pub uninterruptible: ClassTime,
    pub sleep: ClassTime,
    pub run_queue: ClassTime,
    pub other: ClassTime,
    /// On a CPU but not charged by the scheduler: stolen by the hypervisor.
    #[serde(default)]
    pub steal: ClassTime,
}

/// The time classes as reports name them, in the order they list them.
pub const TIME_LABELS: [(TimeClass, &str); TIME_CLASSES as usize] = [
    (TimeClass::OnCpu, "on-CPU"),
    (TimeClass::Steal, "steal"),
    (TimeClass::IoWait, "I/O wait"),
    (TimeClass::Uninterruptible, "other D-wait"),
    (TimeClass::Sleep, "sleep"),
    (TimeClass::RunQueue, "run-queue"),
    (TimeClass::Other, "other"),
];

/// A time class's label, as reports, graphs and compare name it.
pub const fn time_label(c: TimeClass) -> &'static str {
    let mut i = 0;
    while i < TIME_LABELS.len() {
        if TIME_LABELS[i].0 as u32 == c as u32 {
            return TIME_LABELS[i].1;
        }
        i += 1;
    }
    "other"
}

impl TimeSplit {
    /// (label, ns) of every class, in `TIME_LABELS` order.
    pub fn labeled(&self) -> [(&'static str, u64); TIME_CLASSES as usize] {
        TIME_LABELS.map(|(c, l)| (l, self.class(c).ns))
    }
    pub fn class(&self, c: TimeClass) -> &ClassTime {
        match c {
            TimeClass::OnCpu => &self.on_cpu,
            TimeClass::IoWait => &self.io_wait,
            TimeClass::Uninterruptible => &self.uninterruptible,
            TimeClass::Sleep => &self.sleep,
            TimeClass::RunQueue => &self.run_queue,
            TimeClass::Other => &self.other,
            TimeClass::Steal => &self.steal,
        }
    }
    fn class_mut(&mut self, c: TimeClass) -> &mut ClassTime {
        match c {
            TimeClass::OnCpu => &mut self.on_cpu,
            TimeClass::IoWait => &mut self.io_wait,
            TimeClass::Uninterruptible => &mut self.uninterruptible,
            TimeClass::Sleep => &mut self.sleep,
            TimeClass::RunQueue => &mut self.run_queue,
            TimeClass::Other => &mut self.other,
            TimeClass::Steal => &mut self.steal,
        }
    }
    /// Time off any CPU: the classes besides on-CPU and steal.
    pub fn off_cpu_ns(&self) -> u64 {
        TimeClass::ALL
            .iter()
            .filter(|&&c| c != TimeClass::OnCpu && c != TimeClass::Steal)
            .map(|&c| self.class(c).ns)
            .sum()
    }
}

fn sum<T: aya::Pod, A: Default>(values: &PerCpuValues<T>, add: impl Fn(A, &T) -> A) -> A {
    values.iter().fold(A::default(), add)
}

/// `recursion_misses` of this trace's programs by program name, from /proc/self/fdinfo.
fn recursion_misses(probes: &Probes) -> BTreeMap<String, u64> {
    let names: StdHashMap<u32, &str> = probes
        .ebpf
        .programs()
        .filter_map(|(name, p)| p.info().ok().map(|i| (i.id(), name)))
        .collect();
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fdinfo") else {
        return out;
    };
    for info in dir
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
    {
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(n)) = (field("prog_id:"), field("recursion_misses:"))
            && n > 0
            && let Some(name) = names.get(&(id as u32))
        {
            *out.entry(name.to_string()).or_insert(0) += n;
        }
    }
    out
}

pub(crate) use crate::probes::dense::HistId;
pub use block::BlockRow;

fn read_hists(probes: &Probes) -> Result<StdHashMap<HistId, Vec<(u32, u64)>>> {
    let map: PerCpuHashMap<_, HistKey, u64> =
        PerCpuHashMap::try_from(probes.ebpf.map("HISTS").context("HISTS map")?)?;
    let mut out: StdHashMap<HistId, Vec<(u32, u64)>> = StdHashMap::new();
    for item in map.iter() {
        let (k, v) = item?;
        let n: u64 = v.iter().sum();
        out.entry((k.kind, k.class, k.id))
            .or_default()
            .push((k.bucket, n));
    }
    let dense: PerCpuArray<_, DenseHist> =
        PerCpuArray::try_from(probes.ebpf.map("DENSE_HISTS").context("DENSE_HISTS map")?)?;
    for (row, id) in probes.dense.rows.iter().enumerate() {
        let per_cpu = dense.get(&(row as u32), 0)?;
        let buckets = out.entry(*id).or_default();
        for b in 0..fsprof_common::hist::BUCKETS as usize {
            let n: u64 = per_cpu.iter().map(|h| h.buckets[b]).sum();
            if n > 0 {
                buckets.push((b as u32, n));
            }
        }
    }
    Ok(out)
}

pub(crate) fn summary(
    hists: &StdHashMap<HistId, Vec<(u32, u64)>>,
    kind: HistKind,
    class: u32,
    id: u32,
) -> Summary {
    hists
        .get(&(kind as u32, class, id))
        .map(|b| Summary::of(&from_buckets(b.iter().copied())))
        .unwrap_or_default()
}

/// Reads every aggregate. Safe to call while probes are attached (a live snapshot). Also
/// returns the off-CPU intervals still open, per stack, for `stacks::collect`.
pub fn collect(probes: &Probes) -> Result<(Profile, Vec<stacks::OpenInterval>)> {
    let ebpf = &probes.ebpf;
    let hists = read_hists(probes)?;
    let mut profile = Profile::default();

    let sc: PerCpuArray<_, SyscallStats> =
        PerCpuArray::try_from(ebpf.map("SYSCALLS").context("SYSCALLS map")?)?;
    for nr in 0..MAX_SYSCALLS {
        let s: SyscallStats = sum(&sc.get(&nr, 0)?, |a: SyscallStats, b| SyscallStats {
            count: a.count + b.count,
            errors: a.errors + b.errors,
            ret_sum: a.ret_sum.wrapping_add(b.ret_sum),
            total_ns: a.total_ns + b.total_ns,
        });
        if s.count == 0 {
            continue;
        }
        let name = syscall_table::name(nr);
        profile.syscalls.push(SyscallRow {
            nr,
            op: syscall_table::op_of(&name).to_string(),
            bytes: syscall_table::moves_bytes(&name).then_some(s.ret_sum),
            name,
            count: s.count,
            errors: s.errors,
            total_ns: s.total_ns,
            latency: summary(&hists, HistKind::SyscallLatency, 0, nr),
        });
    }
    profile
        .syscalls
        .sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.nr.cmp(&b.nr)));

    let times: PerCpuArray<_, TimeStats> =
        PerCpuArray::try_from(ebpf.map("TIMES").context("TIMES map")?)?;
    for &class in TimeClass::ALL {
        let t: TimeStats = sum(&times.get(&(class as u32), 0)?, |a: TimeStats, b| {
            TimeStats {
                total_ns: a.total_ns + b.total_ns,
                episodes: a.episodes + b.episodes,
            }
        });
        let c = profile.time.class_mut(class);
        c.ns = t.total_ns;
        c.episodes = t.episodes;
        if class != TimeClass::OnCpu && class != TimeClass::Steal {
            c.episode = Some(summary(&hists, HistKind::OffCpuEpisode, class as u32, 0));
        }
    }

    // Threads still alive (a -p target, or daemons the command left) have an interval
    // open: count it up to now.
    let tasks: HashMap<_, u32, TaskState> =
        HashMap::try_from(ebpf.map("TASKS").context("TASKS map")?)?;
    let now = monotonic_ns();
    let mut open = Vec::new();
    for item in tasks.iter() {
        let (tid, t) = item?;
        // No kernel stack was taken for the open phase or the time not yet attributed:
        // they go to the last stack of their class, as at exit.
        let last = |class: u32| t.last_stack.get(class as usize).copied().unwrap_or(0);
        if t.off_since != 0 {
            open.push((
                last(t.off_class),
                t.off_class,
                now.saturating_sub(t.off_since),
            ));
        }
        if t.pend_ns != 0 {
            open.push((last(t.pend_class), t.pend_class, t.pend_ns));
        }
        for i in 0..2 {
            if t.aw_mask & (1 << i) != 0 {
                open.push((last(t.aw_class[i]), t.aw_class[i], t.aw_ns[i]));
            }
        }
        for (class, &ns) in t.short_ns.iter().enumerate() {
            if ns != 0 {
                open.push((last(class as u32), class as u32, ns));
            }
        }
        if t.on_since != 0 {
            let wall = now.saturating_sub(t.on_since);
            let ran = match crate::os::sum_exec_runtime(tid) {
                Some(exec) if t.exec_in != EXEC_UNKNOWN => exec.saturating_sub(t.exec_in).min(wall),
                _ => wall,
            };
            profile.time.on_cpu.ns += ran;
            profile.time.steal.ns += wall - ran;
        }
        if t.off_since != 0 {
            let class = TimeClass::ALL
                .get(t.off_class as usize)
                .copied()
                .unwrap_or(TimeClass::Other);
            profile.time.class_mut(class).ns += now.saturating_sub(t.off_since);
        }
    }

    profile.block = block::collect(probes, &hists)?;

    let lost: PerCpuArray<_, u64> = PerCpuArray::try_from(ebpf.map("LOST").context("LOST map")?)?;
    for &kind in Lost::ALL {
        let n: u64 = lost.get(&(kind as u32), 0)?.iter().sum();
        if n > 0 {
            profile.lost.insert(kind.name().to_string(), n);
        }
    }
    // The kernel skips a program that would nest in itself on one CPU (e.g. a completion in
    // an interrupt while the same program runs in task context) and counts the skip.
    let mut misses = recursion_misses(probes);
    // fs events nest in themselves when one fires in an interrupt (writeback completion)
    // while the program runs in task context; they are reported with the fs events.
    let fs_misses = misses.remove("fs_event").unwrap_or(0);
    let core: u64 = misses.values().sum();
    if core > 0 {
        profile.lost.insert("recursion_misses".to_string(), core);
    }
    let unseen: u64 = profile.block.iter().map(|b| b.unseen).sum();
    if unseen > 0 {
        profile.lost.insert(block::LOST_UNSEEN.to_string(), unseen);
    }
    let events: PerCpuArray<_, u64> =
        PerCpuArray::try_from(ebpf.map("EVENTS").context("EVENTS map")?)?;
    let counter = |c: Counter| -> Result<u64> {
        debug_assert!((c as u32) < COUNTERS);
        Ok(events.get(&(c as u32), 0)?.iter().sum())
    };
    profile.tasks_forked = counter(Counter::TasksForked)?;
    profile.tasks_exited = counter(Counter::TasksExited)?;
    profile.syscalls_unfinished = counter(Counter::SyscallsUnfinished)?;
    profile.fs_events = fs_events::collect(probes, &hists)?;
    profile.probe_cost = probe_cost::collect(probes)?;
    if let Some(f) = &mut profile.fs_events {
        f.lost_nested = fs_misses;
    }
    Ok((profile, open))
}
