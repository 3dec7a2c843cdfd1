//! The time split (fsprof-ebpf `sched.rs`): the target's thread-time by scheduler state,
//! and the intervals still open when it is read.

use std::collections::HashMap as StdHashMap;

use anyhow::Result;
use aya::{
    Ebpf,
    maps::{HashMap, PerCpuArray},
};
use fsprof_common::{
    EXEC_UNKNOWN, HistKind, MapName, TIME_CLASSES, TaskState, TimeClass, TimeStats,
};
use serde::{Deserialize, Serialize};

use super::{HistId, histogram::Summary, stacks, sum, summary};

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
    /// Switch-ins the kernel ran without a sched_switch event (on these VMs, after each
    /// thread of the VM's agent). The on-CPU time that followed is still exact (the
    /// scheduler's charge); only where it began is inferred, and any steal in it counts
    /// in the off-CPU phase before it.
    #[serde(default)]
    pub switch_ins_unseen: u64,
    /// The followed threads' time, ns: from when each was followed to its exit or the end
    /// of the trace. The classes (steal included) add up to it; 0 in files of fsprof
    /// versions that did not record it.
    #[serde(default)]
    pub followed_ns: u64,
    /// Threads still followed when the figures were read (alive at the end).
    #[serde(default)]
    pub open_threads: u64,
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

/// Each class's total, intervals and (off-CPU) interval lengths.
pub(super) fn collect(
    ebpf: &Ebpf,
    hists: &StdHashMap<HistId, Vec<(u32, u64)>>,
) -> Result<TimeSplit> {
    let mut split = TimeSplit::default();
    let times: PerCpuArray<_, TimeStats> =
        PerCpuArray::try_from(crate::probes::map(ebpf, MapName::Times)?)?;
    for &class in TimeClass::ALL {
        let t: TimeStats = sum(&times.get(&(class as u32), 0)?, |a: TimeStats, b| {
            TimeStats {
                total_ns: a.total_ns + b.total_ns,
                episodes: a.episodes + b.episodes,
            }
        });
        let c = split.class_mut(class);
        c.ns = t.total_ns;
        c.episodes = t.episodes;
        if class != TimeClass::OnCpu && class != TimeClass::Steal {
            c.episode = Some(summary(hists, HistKind::OffCpuEpisode, class as u32, 0));
        }
    }

    Ok(split)
}

/// Threads still alive (a -p target, or daemons the command left) have an interval open:
/// counts it into `split` up to `end` (the freeze), and returns the open off-CPU intervals
/// per stack.
pub(super) fn open_intervals(
    ebpf: &Ebpf,
    end: u64,
    split: &mut TimeSplit,
) -> Result<Vec<stacks::OpenInterval>> {
    let tasks: HashMap<_, u32, TaskState> =
        HashMap::try_from(crate::probes::map(ebpf, MapName::Tasks)?)?;
    let mut open = Vec::new();
    for item in tasks.iter() {
        let (tid, t) = item?;
        // A program in flight at the freeze may have closed the thread's phase a few µs
        // after it: the thread's time then ends there, where its classes do.
        let now = end.max(t.off_since).max(t.on_since);
        let exec = crate::os::sum_exec_runtime(tid);
        // Charged since `exec_in` (the last switch-in or switch-out), at most `span`.
        let charged = |span: u64| match exec {
            Some(e) if t.exec_in != EXEC_UNKNOWN => e.saturating_sub(t.exec_in).min(span),
            _ => span,
        };
        // An open off-CPU phase ends where a switch-in the kernel did not trace began
        // (see fsprof-ebpf sched::switch_in_unseen): what was charged since is on-CPU.
        let (off_ns, unseen_ns) = if t.off_since != 0 {
            let span = now.saturating_sub(t.off_since);
            let ran = if exec.is_some() { charged(span) } else { 0 };
            (span - ran, ran)
        } else {
            (0, 0)
        };
        // No kernel stack was taken for the open phase or the time not yet attributed:
        // they go to the last stack of their class, as at exit.
        let mut push = |class: u32, ns: u64| {
            open.push(stacks::OpenInterval {
                tid,
                stack: t.last_stack.get(class as usize).copied().unwrap_or(0),
                class,
                ns,
                at: now,
            })
        };
        if t.off_since != 0 {
            push(t.off_class, off_ns);
        }
        if t.pend_ns != 0 {
            push(t.pend_class, t.pend_ns);
        }
        for i in 0..2 {
            if t.aw_mask & (1 << i) != 0 {
                push(t.aw_class[i], t.aw_ns[i]);
            }
        }
        for (class, &ns) in t.short_ns.iter().enumerate() {
            if ns != 0 {
                push(class as u32, ns);
            }
        }
        if t.followed_at != 0 {
            split.followed_ns += now.saturating_sub(t.followed_at);
        }
        split.open_threads += 1;
        split.on_cpu.ns += unseen_ns;
        if t.on_since != 0 {
            let wall = now.saturating_sub(t.on_since);
            let ran = charged(wall);
            split.on_cpu.ns += ran;
            // Stolen only if it still holds a CPU: a thread whose switch-out the kernel did
            // not trace (PID 1's on these VMs) has been off-CPU since, in the state /proc
            // shows.
            let class = match crate::os::task_state(tid) {
                Some('R') | None => TimeClass::Steal,
                Some('S' | 'I') => TimeClass::Sleep,
                Some('D') => TimeClass::Uninterruptible,
                Some(_) => TimeClass::Other,
            };
            split.class_mut(class).ns += wall - ran;
        }
        if t.off_since != 0 {
            let class = TimeClass::ALL
                .get(t.off_class as usize)
                .copied()
                .unwrap_or(TimeClass::Other);
            split.class_mut(class).ns += off_ns;
        }
    }

    Ok(open)
}
