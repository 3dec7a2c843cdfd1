//! Reads the kernel-side aggregates out of the maps into a `Profile`.

pub mod background;
pub mod block;
pub mod folded;
pub mod fs_events;
pub mod histogram;
pub mod kallsyms;
pub mod pprof;
pub mod probe_cost;
pub mod sched;
pub mod stacks;
pub mod symbols;
pub mod syscalls;
pub mod timeline;
pub mod wakes;

pub use sched::{ClassTime, TIME_LABELS, TimeSplit, time_label};
pub use syscalls::SyscallRow;

use fsprof_common::MapName;
use std::collections::{BTreeMap, HashMap as StdHashMap};

use anyhow::Result;
use aya::maps::PerCpuArray;
use fsprof_common::{COUNTERS, Counter, DenseHist, HistKey, HistKind, Lost};
use serde::{Deserialize, Serialize};

use crate::probes::Probes;
use histogram::{Summary, from_buckets};

/// Everything the kernel side aggregated for one traced interval.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Profile {
    /// One row per syscall the target made, by total time, longest first.
    pub syscalls: Vec<SyscallRow>,
    /// Thread-time of the target by scheduler state, in ns summed over its threads.
    pub time: TimeSplit,
    /// One row per (device, class) with traffic: the target's devices (a lab's, or outside
    /// one the devices of the filesystems the target used).
    pub block: Vec<BlockRow>,
    /// Outside a lab: the rows of devices that hold none of the filesystems the target used
    /// (other processes' I/O, shown apart, in no figure of the target's).
    #[serde(default)]
    pub other_block: Vec<BlockRow>,
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

fn sum<T, A: Default>(values: &[T], add: impl Fn(A, &T) -> A) -> A {
    values.iter().fold(A::default(), add)
}

/// `recursion_misses` of this trace's programs by program name, from their fds' entries
/// in /proc/self/fdinfo (reading every fd's took ~2 ms).
fn recursion_misses(probes: &Probes) -> BTreeMap<String, u64> {
    use std::os::fd::{AsFd, AsRawFd};
    let mut out = BTreeMap::new();
    for (name, p) in probes.ebpf.programs() {
        let Ok(fd) = p.fd() else { continue };
        let path = format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd());
        let Ok(info) = std::fs::read_to_string(path) else {
            continue;
        };
        let misses = info
            .lines()
            .find_map(|l| l.strip_prefix("recursion_misses:"))
            .and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(n) = misses.filter(|&n| n > 0) {
            *out.entry(name.to_string()).or_insert(0) += n;
        }
    }
    out
}

pub(crate) use crate::probes::dense::HistId;
pub use block::BlockRow;

fn read_hists(probes: &Probes) -> Result<StdHashMap<HistId, Vec<(u32, u64)>>> {
    let mut out: StdHashMap<HistId, Vec<(u32, u64)>> = StdHashMap::new();
    for (k, n) in crate::probes::cpu_keyed::<HistKey, u64>(&probes.ebpf, MapName::Hists)? {
        out.entry((k.kind, k.class, k.id))
            .or_default()
            .push((k.bucket, n));
    }
    let dense = crate::probes::batch::entries(
        crate::probes::map(&probes.ebpf, MapName::DenseHists)?,
        |_: u32, per_cpu: Vec<DenseHist>| {
            (0..fsprof_common::hist::BUCKETS as usize)
                .map(|b| (b as u32, per_cpu.iter().map(|h| h.buckets[b]).sum::<u64>()))
                .filter(|(_, n)| *n > 0)
                .collect::<Vec<_>>()
        },
    )?;
    for (buckets, id) in dense.into_iter().zip(&probes.dense.rows) {
        out.entry(*id).or_default().extend(buckets);
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

/// The loss counters, the programs' recursion misses and the block completions never
/// seen, into `profile.lost`; returns the fs-event program's misses (reported with the fs
/// events).
fn lost(probes: &Probes, profile: &mut Profile) -> Result<u64> {
    let lost: PerCpuArray<_, u64> =
        PerCpuArray::try_from(crate::probes::map(&probes.ebpf, MapName::Lost)?)?;
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
    let fs_misses = misses
        .remove(fsprof_common::Program::FsEvent.name())
        .unwrap_or(0);
    let core: u64 = misses.values().sum();
    if core > 0 {
        profile.lost.insert("recursion_misses".to_string(), core);
    }
    let unseen: u64 = profile.block.iter().map(|b| b.unseen).sum();
    if unseen > 0 {
        profile.lost.insert(block::LOST_UNSEEN.to_string(), unseen);
    }
    Ok(fs_misses)
}

/// Reads every aggregate, after `Probes::freeze` (read live, the figures would not add
/// up). Also returns the off-CPU intervals still open, per stack, for `stacks::collect`.
pub fn collect(probes: &Probes) -> Result<(Profile, Vec<stacks::OpenInterval>)> {
    let ebpf = &probes.ebpf;
    let hists = read_hists(probes)?;
    let mut profile = Profile {
        syscalls: syscalls::collect(ebpf, &hists)?,
        time: sched::collect(ebpf, &hists)?,
        ..Profile::default()
    };
    let end = (probes.frozen_at).unwrap_or_else(crate::probes::monotonic_ns);
    let open = sched::open_intervals(ebpf, end, &mut profile.time)?;
    profile.block = block::collect(probes, &hists)?;
    let fs_misses = lost(probes, &mut profile)?;

    let events: PerCpuArray<_, u64> =
        PerCpuArray::try_from(crate::probes::map(ebpf, MapName::Events)?)?;
    let counter = |c: Counter| -> Result<u64> {
        debug_assert!((c as u32) < COUNTERS);
        Ok(events.get(&(c as u32), 0)?.iter().sum())
    };
    profile.tasks_forked = counter(Counter::TasksForked)?;
    profile.tasks_exited = counter(Counter::TasksExited)?;
    profile.syscalls_unfinished = counter(Counter::SyscallsUnfinished)?;
    profile.time.switch_ins_unseen = counter(Counter::SwitchInsUnseen)?;
    profile.time.followed_ns += counter(Counter::FollowedNs)?;
    profile.fs_events = fs_events::collect(probes, &hists)?;
    profile.probe_cost = probe_cost::collect(probes)?;
    if let Some(f) = &mut profile.fs_events {
        f.lost_nested = fs_misses;
    }
    Ok((profile, open))
}
