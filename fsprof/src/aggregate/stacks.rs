//! Stack weights out of the kernel maps: symbolized stacks with their time, per class, for
//! the target (on-CPU samples, exact off-CPU intervals) and for kernel threads doing the
//! filesystem's background work.

use fsprof_common::MapName;
use std::collections::{BTreeMap, HashMap as StdHashMap};

use anyhow::Result;
use aya::maps::{HashMap, PerCpuArray};
use fsprof_common::{
    Counter, STACK_CLASS_BACKGROUND, StackKey, TimeClass, UserStackKey, WakeKey, Weight, WeightKey,
    unwind::{FileKey, ImageKey, ProcessMappings, StackEnd},
};
use serde::{Deserialize, Serialize};

use super::{
    background,
    symbols::{self, At, located},
    wakes::{self, TopWake, WaitedFor, WakeEdge},
};
use crate::probes::Probes;

/// Label of a stack class, as the reports and graphs print it.
pub fn class_label(class: u32) -> &'static str {
    match TimeClass::ALL.get(class as usize) {
        Some(&c) => super::time_label(c),
        None if class == STACK_CLASS_BACKGROUND => "background",
        None => "other",
    }
}

/// One stack and the time spent in it.
#[derive(Clone, Debug, Default)]
pub struct WeightedStack {
    pub comm: String,
    pub tgid: u32,
    /// TimeClass, or STACK_CLASS_BACKGROUND.
    pub class: u32,
    /// Background work: the thread class (xfs-inodegc, jbd2, writeback, …).
    pub group: Option<String>,
    /// Root first.
    pub user: Vec<String>,
    /// Root first (syscall entry … leaf).
    pub kernel: Vec<String>,
    /// Where each frame of `user` and `kernel` is.
    pub user_at: Vec<At>,
    pub kernel_at: Vec<At>,
    pub ns: u64,
    /// Samples (on-CPU) or intervals (off-CPU).
    pub count: u64,
    /// The user part reaches the program's entry (no "[stack ends: …]" frame).
    pub user_whole: bool,
}

impl WeightedStack {
    /// Frames leaf first, kernel then user: how a reader scans "where was it".
    pub fn leaf_first(&self) -> impl Iterator<Item = &String> {
        self.kernel.iter().rev().chain(self.user.iter().rev())
    }
}

/// All stacks of one trace.
#[derive(Clone, Debug, Default)]
pub struct Stacks {
    pub sample_period_ns: u64,
    /// See `StackSummary::off_cpu_period_ns`.
    pub off_cpu_period_ns: u64,
    /// The target: on-CPU (class 0) and off-CPU classes.
    pub target: Vec<WeightedStack>,
    /// Kernel-thread samples attributed to the filesystem's background work.
    pub background: Vec<WeightedStack>,
    /// Kernel-thread samples not attributed to it (other kernel work), ns.
    pub unattributed_background_ns: u64,
    pub problems: BTreeMap<String, u64>,
    pub distinct: u64,
    /// Blocked intervals of the target by (blocked stack, waker).
    pub wakes: Vec<WakeEdge>,
    /// The unwinder's counters: stacks, frames, ns.
    pub unwinder: (u64, u64, u64),
    /// The files of the frames' `At::File`, by path.
    pub files: BTreeMap<FileKey, std::path::PathBuf>,
    /// The target's stacks by id, for the timeline (its records name stacks by id).
    pub named: StdHashMap<u32, NamedStack>,
    /// Kernel addresses in these stacks that no function holds (`[kernel] 0x…` frames).
    pub unnamed_kernel_frames: u64,
}

/// A stack as exports without addresses show it (the timeline): its process, and its
/// frames root first, user then kernel, each with the file its code is in.
#[derive(Clone, Debug, Default)]
pub struct NamedStack {
    pub tgid: u32,
    /// (function, file): "[kernel]" for the kernel's frames, "" where not known.
    pub frames: Vec<(String, String)>,
}

impl NamedStack {
    fn of(s: &WeightedStack, files: &BTreeMap<FileKey, std::path::PathBuf>) -> NamedStack {
        let file = |at: At| match at {
            At::Kernel(_) => "[kernel]".to_string(),
            At::File(f, _) => files
                .get(&f)
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            At::Nowhere => String::new(),
        };
        let user = located(&s.user, &s.user_at);
        let kernel = located(&s.kernel, &s.kernel_at);
        NamedStack {
            tgid: s.tgid,
            frames: user
                .chain(kernel)
                .map(|(n, at)| (n.to_string(), file(at)))
                .collect(),
        }
    }
}

/// A stack shown in reports and kept in the JSON (`explain` reads these).
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TopStack {
    pub class: String,
    pub ns: u64,
    pub comm: String,
    /// Leaf first, at most TOP_FRAMES.
    pub frames: Vec<String>,
}

const TOP_STACKS: usize = 10;
const TOP_FRAMES: usize = 16;

/// What the stacks add up to, for the JSON and the reports.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StackSummary {
    /// The sampling period (the weight of a thread's first sample).
    pub sample_period_ns: u64,
    pub on_cpu_samples: u64,
    /// The samples' weights (each its thread's on-CPU time since the thread's previous
    /// sample): the target's on-CPU time but for each thread's head and tail.
    pub on_cpu_sampled_ns: u64,
    /// Off-CPU time in stacks, exact: equals the off-CPU time classes.
    pub off_cpu_ns: u64,
    /// Off-CPU waits at least this long got a stack each; shorter ones were sampled per
    /// thread and class, one stack per this much waiting, carrying the time since the last
    /// (so per-stack weights of short waits are estimates, their sums exact). 0: a stack
    /// for every wait.
    #[serde(default)]
    pub off_cpu_period_ns: u64,
    pub off_cpu_by_class: BTreeMap<String, u64>,
    pub distinct_stacks: u64,
    /// Failed or dropped stack captures by kind (kernel_stack_failed, user_stack_failed,
    /// stack_table_full, user_mappings_full, stack_weights_full); empty when none.
    pub capture_problems: BTreeMap<String, u64>,
    pub top_on_cpu: Vec<TopStack>,
    pub top_off_cpu: Vec<TopStack>,
    /// The off-CPU time by what ended it (see docs/json.md); adds up to `off_cpu_ns`.
    #[serde(default)]
    pub waited_for: Vec<WaitedFor>,
    /// The heaviest (blocked stack, waker) pairs.
    #[serde(default)]
    pub top_wakes: Vec<TopWake>,
    /// How many user stacks reach the program's entry.
    #[serde(default)]
    pub user_stacks: UserCompleteness,
    /// Distinct kernel addresses that no function holds, shown as `[kernel] 0x…` frames
    /// (code loaded and gone during the trace: a BPF program, a module).
    #[serde(default)]
    pub unnamed_kernel_frames: u64,
    /// The target's (stack, class) weights: the folded files round each to µs.
    #[serde(default)]
    pub weighted_stacks: u64,
}

/// How many of the target's user stacks are whole: unwound from the leaf to the program's
/// entry (`_start`, or `clone3` for a thread), the rest ending in a "[stack ends: …]" frame.
/// Stacks taken inside execve, between two programs, have no user part and are counted
/// apart (in `ends` only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UserCompleteness {
    /// On-CPU samples, and those whose user stack is whole.
    pub on_cpu: u64,
    pub on_cpu_whole: u64,
    /// Off-CPU stacks (waits that got one), and those whose user stack is whole.
    pub off_cpu: u64,
    pub off_cpu_whole: u64,
    /// Stacks (samples and waits) by why their user part ends early: the frame's label.
    pub ends: BTreeMap<String, u64>,
    /// The unwinder's work: user stacks unwound in the kernel (every capture, new or
    /// not), their frames, and the time it took, ns (nothing is copied to userspace).
    #[serde(default)]
    pub unwound: u64,
    #[serde(default)]
    pub frames: u64,
    #[serde(default)]
    pub unwind_ns: u64,
}

impl UserCompleteness {
    fn add(&mut self, s: &WeightedStack) {
        let no_code = StackEnd::NoUserCode.label();
        if s.user.first().is_some_and(|f| f == no_code) {
            // Between two programs: no user stack to unwind.
            *self.ends.entry(no_code.to_string()).or_insert(0) += s.count;
            return;
        }
        let (all, whole) = if s.class == TimeClass::OnCpu as u32 {
            (&mut self.on_cpu, &mut self.on_cpu_whole)
        } else {
            (&mut self.off_cpu, &mut self.off_cpu_whole)
        };
        *all += s.count;
        if s.user_whole {
            *whole += s.count;
            return;
        }
        let end = s.user.first().filter(|f| f.starts_with("[stack ends"));
        let why = end.map_or("[no user stack]", |f| f.as_str());
        *self.ends.entry(why.to_string()).or_insert(0) += s.count;
    }

    /// Adds another trace's figures (a step over passes, a whole run).
    pub fn merge(&mut self, o: &UserCompleteness) {
        self.on_cpu += o.on_cpu;
        self.on_cpu_whole += o.on_cpu_whole;
        self.off_cpu += o.off_cpu;
        self.off_cpu_whole += o.off_cpu_whole;
        for (why, n) in &o.ends {
            *self.ends.entry(why.clone()).or_insert(0) += n;
        }
        self.unwound += o.unwound;
        self.frames += o.frames;
        self.unwind_ns += o.unwind_ns;
    }

    /// Share of on-CPU samples with a whole user stack, if there were samples.
    pub fn on_cpu_share(&self) -> Option<f64> {
        (self.on_cpu > 0).then(|| self.on_cpu_whole as f64 / self.on_cpu as f64)
    }

    pub fn off_cpu_share(&self) -> Option<f64> {
        (self.off_cpu > 0).then(|| self.off_cpu_whole as f64 / self.off_cpu as f64)
    }
}

/// Kernel threads' on-CPU work for the filesystem during the trace (sampled).
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BackgroundSummary {
    /// Sampled on-CPU time of kernel threads attributed to the filesystem, ns.
    pub ns: u64,
    pub samples: u64,
    /// By thread class, largest first.
    pub by_class: Vec<(String, u64)>,
    /// Kernel-thread samples with no filesystem, block or writeback frame, ns.
    pub unattributed_ns: u64,
    pub top: Vec<TopStack>,
}

fn top<'a>(
    stacks: impl IntoIterator<Item = &'a WeightedStack>,
    label: impl Fn(&WeightedStack) -> String,
) -> Vec<TopStack> {
    let mut v: Vec<&WeightedStack> = stacks.into_iter().collect();
    v.sort_by_key(|s| std::cmp::Reverse(s.ns));
    v.into_iter()
        .take(TOP_STACKS)
        .map(|s| TopStack {
            class: label(s),
            ns: s.ns,
            comm: s.comm.clone(),
            frames: s.leaf_first().take(TOP_FRAMES).cloned().collect(),
        })
        .collect()
}

impl Stacks {
    pub fn summary(&self) -> StackSummary {
        let (on, off): (Vec<&WeightedStack>, Vec<&WeightedStack>) = self
            .target
            .iter()
            .partition(|s| s.class == TimeClass::OnCpu as u32);
        let mut by_class = BTreeMap::new();
        for s in &off {
            *by_class
                .entry(TimeClass::ALL[s.class as usize].name().to_string())
                .or_insert(0) += s.ns;
        }
        let off_cpu_ns: u64 = off.iter().map(|s| s.ns).sum();
        let run_queue = TimeClass::RunQueue as u32;
        let run_queue_ns = off
            .iter()
            .filter(|s| s.class == run_queue)
            .map(|s| s.ns)
            .sum();
        let tgids: std::collections::HashSet<u32> = self.target.iter().map(|s| s.tgid).collect();
        let target = |t: u32| tgids.contains(&t);
        let mut user_stacks = UserCompleteness::default();
        self.target.iter().for_each(|s| user_stacks.add(s));
        (
            user_stacks.unwound,
            user_stacks.frames,
            user_stacks.unwind_ns,
        ) = self.unwinder;
        StackSummary {
            user_stacks,
            waited_for: wakes::split(&self.wakes, &target, run_queue_ns, off_cpu_ns),
            top_wakes: wakes::top(&self.wakes, &target, TOP_STACKS, TOP_FRAMES),
            sample_period_ns: self.sample_period_ns,
            off_cpu_period_ns: self.off_cpu_period_ns,
            on_cpu_samples: on.iter().map(|s| s.count).sum(),
            on_cpu_sampled_ns: on.iter().map(|s| s.ns).sum(),
            off_cpu_ns,
            off_cpu_by_class: by_class,
            distinct_stacks: self.distinct,
            unnamed_kernel_frames: self.unnamed_kernel_frames,
            weighted_stacks: self.target.len() as u64,
            capture_problems: self.problems.clone(),
            top_on_cpu: top(on, |s| class_label(s.class).to_string()),
            top_off_cpu: top(off, |s| class_label(s.class).to_string()),
        }
    }

    pub fn background_summary(&self) -> BackgroundSummary {
        let mut by: BTreeMap<String, u64> = BTreeMap::new();
        for s in &self.background {
            *by.entry(s.group.clone().unwrap_or_default()).or_insert(0) += s.ns;
        }
        let mut by_class: Vec<(String, u64)> = by.into_iter().collect();
        by_class.sort_by_key(|c| std::cmp::Reverse(c.1));
        BackgroundSummary {
            ns: self.background.iter().map(|s| s.ns).sum(),
            samples: self.background.iter().map(|s| s.count).sum(),
            by_class,
            unattributed_ns: self.unattributed_background_ns,
            top: top(&self.background, |s| s.group.clone().unwrap_or_default()),
        }
    }
}

/// The frame under which fsprof's own programs' on-CPU time is grouped.
pub const PROBES_FRAME: &str = "[fsprof probes]";

/// Leaf-first kernel frames as the stack should show them. An off-CPU stack was captured
/// by fsprof's sched_switch program: its tracing frames at the leaf are the capture, not
/// the target's, and go. An on-CPU sample that interrupted one of fsprof's programs (`ours`
/// holds a frame of one: the address is in its code) shows that program's cost:
/// everything from the tracepoint down becomes one `[fsprof probes]` frame, so a reader
/// sees what the profiler itself cost and where it was called.
fn own_frames(
    mut kernel: Vec<(String, At)>,
    on_cpu: bool,
    ours: &mut dyn FnMut(u64) -> bool,
) -> Vec<(String, At)> {
    if !on_cpu {
        let trim = kernel
            .iter()
            .take_while(|(n, _)| is_tracing_frame(n))
            .count();
        kernel.drain(..trim);
        return kernel;
    }
    let in_ours = kernel
        .iter()
        .any(|(_, at)| matches!(*at, At::Kernel(a) if ours(a)));
    if !in_ours {
        return kernel;
    }
    // The root-most tracing frame: where the kernel called into the tracepoint.
    if let Some(i) = kernel.iter().rposition(|(n, _)| is_tracing_frame(n)) {
        kernel.drain(..=i);
        kernel.insert(0, (PROBES_FRAME.to_string(), At::Nowhere));
    }
    kernel
}

/// Tracing machinery at the leaf of a stack captured from a tracepoint: not the target's.
fn is_tracing_frame(name: &str) -> bool {
    [
        "bpf_",
        "__bpf_",
        "__traceiter_",
        "perf_trace_",
        "trace_call_bpf",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

fn comm_str(c: &[u8; 16]) -> String {
    let end = c.iter().position(|&b| b == 0).unwrap_or(16);
    String::from_utf8_lossy(&c[..end]).into_owned()
}

fn nonzero(frames: &[u64]) -> Vec<u64> {
    frames.iter().copied().take_while(|&a| a != 0).collect()
}

/// A map of key → id, turned around.
fn by_id<K: aya::Pod>(ebpf: &aya::Ebpf, m: MapName) -> Result<StdHashMap<u32, K>> {
    let ids: HashMap<_, K, u32> = HashMap::try_from(crate::probes::map(ebpf, m)?)?;
    let mut out = StdHashMap::new();
    for item in ids.iter() {
        let (k, id) = item?;
        out.insert(id, k);
    }
    Ok(out)
}

/// Who a stack id belongs to and its frames, root first.
#[derive(Default)]
struct Resolved {
    comm: String,
    tgid: u32,
    kthread: bool,
    kernel: Vec<String>,
    user: Vec<String>,
    kernel_at: Vec<At>,
    user_at: Vec<At>,
    user_whole: bool,
}

/// A user stack's frames (leaf first), each named in the mapping the unwinder recorded
/// for its process image, with where it is; whether it reached the program's entry.
fn user_frames(
    syms: &mut symbols::Symbols,
    key: &UserStackKey,
    mappings: &StdHashMap<ImageKey, ProcessMappings>,
) -> (Vec<(String, At)>, bool) {
    let image = ImageKey {
        tgid: key.tgid,
        image: key.image,
    };
    let maps = mappings.get(&image);
    let mut out = Vec::new();
    for (i, ip) in nonzero(&key.user).into_iter().enumerate() {
        if let Some(end) = StackEnd::of(ip) {
            out.push((end.label().to_string(), At::Nowhere));
            return (out, false);
        }
        let map = maps.and_then(|m| {
            m.maps[..(m.n as usize).min(m.maps.len())]
                .iter()
                .find(|m| (m.start..m.end).contains(&ip))
        });
        out.push(match map {
            Some(m) if m.file.ino != 0 => {
                let offset = ip - m.start + m.offset;
                (syms.user(m.file, offset, i == 0), At::File(m.file, offset))
            }
            Some(_) => (format!("[anonymous code] 0x{ip:x}"), At::Nowhere),
            None => (format!("[mapping not recorded] 0x{ip:x}"), At::Nowhere),
        });
    }
    let whole = !out.is_empty();
    (out, whole)
}

/// Root-first names and places of leaf-first frames.
fn root_first(mut frames: Vec<(String, At)>) -> (Vec<String>, Vec<At>) {
    frames.reverse();
    frames.into_iter().unzip()
}

/// The path of every file a frame of `stacks` is in.
fn files_of(stacks: &Stacks, syms: &mut symbols::Symbols) -> BTreeMap<FileKey, std::path::PathBuf> {
    let wakes = stacks.wakes.iter().map(|w| &w.blocked_user_at);
    let all = stacks
        .target
        .iter()
        .chain(&stacks.background)
        .map(|s| &s.user_at);
    let mut out = BTreeMap::new();
    for at in all.chain(wakes).flatten() {
        if let At::File(f, _) = at
            && !out.contains_key(f)
            && let Some(p) = syms.path_of(*f)
        {
            out.insert(*f, p);
        }
    }
    out
}

/// Off-CPU time of thread `tid` still open at collection (`at`), or not yet given to a
/// stack: it goes to `stack`, the last of its class.
#[derive(Clone, Copy, Debug)]
pub struct OpenInterval {
    pub tid: u32,
    pub stack: u32,
    pub class: u32,
    pub ns: u64,
    pub at: u64,
}

/// Weight (ns, count) per (stack, class), the open intervals added.
fn read_weights(
    ebpf: &aya::Ebpf,
    open: &[OpenInterval],
) -> Result<BTreeMap<(u32, u32), (u64, u64)>> {
    let mut w: BTreeMap<(u32, u32), (u64, u64)> = BTreeMap::new();
    for (k, x) in crate::probes::cpu_keyed::<WeightKey, Weight>(ebpf, MapName::StackWeights)? {
        let e = w.entry((k.stack, k.class)).or_default();
        e.0 += x.ns;
        e.1 += x.count;
    }
    for o in open {
        let e = w.entry((o.stack, o.class)).or_default();
        e.0 += o.ns;
        e.1 += 1;
    }
    Ok(w)
}

/// The unwinder's work and the capture problems, from the event counters.
fn read_counters(ebpf: &aya::Ebpf, stacks: &mut Stacks) -> Result<()> {
    let events: PerCpuArray<_, u64> =
        PerCpuArray::try_from(crate::probes::map(ebpf, MapName::Events)?)?;
    let total = |c: Counter| -> Result<u64> { Ok(events.get(&(c as u32), 0)?.iter().sum()) };
    stacks.unwinder = (
        total(Counter::UserStacksUnwound)?,
        total(Counter::UserFramesUnwound)?,
        total(Counter::UserUnwindNs)?,
    );
    for c in [
        Counter::KernelStackFailed,
        Counter::UserStackFailed,
        Counter::StackTableFull,
        Counter::UserMappingsFull,
        Counter::StackWeightsFull,
        Counter::WakeWeightsFull,
    ] {
        let n = total(c)?;
        if n > 0 {
            stacks.problems.insert(c.name().to_string(), n);
        }
    }
    Ok(())
}

/// (wake edge, ns, count) summed over CPUs.
fn read_wakes(ebpf: &aya::Ebpf) -> Result<Vec<(WakeKey, u64, u64)>> {
    let mut wakes: std::collections::HashMap<WakeKey, (u64, u64)> = Default::default();
    for (k, x) in crate::probes::cpu_keyed::<WakeKey, Weight>(ebpf, MapName::WakeWeights)? {
        let e = wakes.entry(k).or_default();
        e.0 += x.ns;
        e.1 += x.count;
    }
    Ok(wakes.into_iter().map(|(k, (ns, n))| (k, ns, n)).collect())
}

/// Where background work belongs: the lab's device (per-device threads: jbd2/loop0-8) and
/// the types of the filesystems the target used (another filesystem's work is not its).
#[derive(Clone, Copy, Default)]
pub struct Background<'a> {
    pub dev_name: Option<&'a str>,
    pub fs_types: &'a [String],
}

/// Files a resolved stack as the target's, background work (a kernel thread's for the
/// filesystem, or a userspace daemon's: FUSE), or unattributed background time.
fn place(stacks: &mut Stacks, mut s: WeightedStack, who: Option<&Resolved>, bg: Background) {
    let ns = s.ns;
    let class = s.class;
    // A userspace daemon's samples (FUSE) are background work by who it is.
    let daemon = who.is_some_and(|r| !r.kthread);
    if class == STACK_CLASS_BACKGROUND && daemon {
        s.group = Some(format!("fs daemon ({})", s.comm));
        stacks.background.push(s);
    } else if class == STACK_CLASS_BACKGROUND {
        let group = background::classify(&s.comm, &s.kernel, bg.dev_name)
            .filter(|g| background::for_target(g, &s.kernel, bg.fs_types));
        match group {
            Some(g) => {
                s.group = Some(g);
                stacks.background.push(s);
            }
            None => stacks.unattributed_background_ns += ns,
        }
    } else {
        stacks.target.push(s);
    }
}

pub fn collect(probes: &Probes, open: &[OpenInterval], bg: Background) -> Result<Option<Stacks>> {
    let Some(period) = probes.sample_period_ns else {
        return Ok(None);
    };
    let ebpf = &probes.ebpf;
    let captured = Captured::read(ebpf)?;
    let files = probes.unwind_files();
    let w = read_weights(ebpf, open)?;
    let mut stacks = Stacks {
        sample_period_ns: period,
        off_cpu_period_ns: probes.off_cpu_period_ns,
        distinct: captured.keys.len() as u64,
        ..Default::default()
    };
    read_counters(ebpf, &mut stacks)?;
    let wakes = read_wakes(ebpf)?;
    let mut off_cpu = Vec::new();
    symbols::with(|syms| {
        syms.new_trace();
        syms.know_files(&files);
        for ((id, class), (ns, count)) in w {
            let on_cpu = class == TimeClass::OnCpu as u32 || class == STACK_CLASS_BACKGROUND;
            let who = captured.resolve(syms, id, on_cpu);
            let s = weighted(class, ns, count, who.as_ref());
            if !on_cpu && who.is_some() {
                off_cpu.push((id, s.clone()));
            }
            place(&mut stacks, s, who.as_ref(), bg);
        }
        for (k, ns, count) in wakes {
            let blocked = captured.resolve(syms, k.blocked, false);
            let waker = captured.resolve(syms, k.waker, false);
            let (blocked, waker) = (blocked.unwrap_or_default(), waker.unwrap_or_default());
            stacks.wakes.push(wake_edge(&k, ns, count, blocked, waker));
        }
        stacks.files = files_of(&stacks, syms);
        stacks.unnamed_kernel_frames = syms.unnamed_kernel();
    });
    for (id, s) in off_cpu {
        let named = NamedStack::of(&s, &stacks.files);
        stacks.named.insert(id, named);
    }
    Ok(Some(stacks))
}

/// What naming a stack id needs from the maps: the whole stacks, the user stacks, the
/// processes' mappings, and the programs whose own frames are cut.
struct Captured {
    keys: StdHashMap<u32, StackKey>,
    user_stacks: StdHashMap<u32, UserStackKey>,
    mappings: StdHashMap<ImageKey, ProcessMappings>,
    /// The kernel's ids of fsprof's programs.
    programs: std::collections::HashSet<u32>,
}

impl Captured {
    fn read(ebpf: &aya::Ebpf) -> Result<Captured> {
        let m: HashMap<_, ImageKey, ProcessMappings> =
            HashMap::try_from(crate::probes::map(ebpf, MapName::UserMappings)?)?;
        Ok(Captured {
            keys: by_id(ebpf, MapName::StackIds)?,
            user_stacks: by_id(ebpf, MapName::UserStackIds)?,
            mappings: m.iter().collect::<Result<_, _>>()?,
            programs: crate::probes::program_ids(ebpf).into_iter().collect(),
        })
    }

    /// A stack id → who and where (frames root first), symbolized once per use.
    fn resolve(&self, syms: &mut symbols::Symbols, id: u32, on_cpu: bool) -> Option<Resolved> {
        let k = self.keys.get(&id)?;
        let addrs = nonzero(&k.kernel);
        let named = syms.kernel(&addrs).into_iter();
        let kernel: Vec<(String, At)> = named.zip(addrs.iter().map(|&a| At::Kernel(a))).collect();
        let mut ours = |a| {
            syms.program_at(a)
                .is_some_and(|id| self.programs.contains(&id))
        };
        let (kernel, kernel_at) = root_first(own_frames(kernel, on_cpu, &mut ours));
        let (user, user_whole) = match self.user_stacks.get(&k.user) {
            Some(u) => user_frames(syms, u, &self.mappings),
            None => (Vec::new(), false),
        };
        let (user, user_at) = root_first(user);
        Some(Resolved {
            comm: comm_str(&k.comm),
            tgid: k.tgid,
            kthread: k.kthread != 0,
            kernel,
            user,
            kernel_at,
            user_at,
            user_whole,
        })
    }
}

/// One (stack, class) weight with its frames, or "[stack unavailable]".
fn weighted(class: u32, ns: u64, count: u64, who: Option<&Resolved>) -> WeightedStack {
    let mut s = WeightedStack {
        class,
        ns,
        count,
        ..Default::default()
    };
    match who {
        Some(r) => {
            s.comm = r.comm.clone();
            s.tgid = r.tgid;
            s.kernel = r.kernel.clone();
            s.user = r.user.clone();
            s.kernel_at = r.kernel_at.clone();
            s.user_at = r.user_at.clone();
            s.user_whole = r.user_whole;
        }
        None => s.comm = "[stack unavailable]".to_string(),
    }
    s
}

/// One "who made it wait" edge, both ends named.
fn wake_edge(k: &WakeKey, ns: u64, count: u64, blocked: Resolved, waker: Resolved) -> WakeEdge {
    WakeEdge {
        class: k.class,
        comm: blocked.comm,
        blocked_kernel: blocked.kernel,
        blocked_user: blocked.user,
        blocked_kernel_at: blocked.kernel_at,
        blocked_user_at: blocked.user_at,
        waker_comm: waker.comm,
        waker_tgid: waker.tgid,
        waker_kthread: waker.kthread,
        waker_kernel: waker.kernel,
        waker_kernel_at: waker.kernel_at,
        ns,
        count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    /// `own_frames` on names with made-up addresses (a frame named bpf_prog_…_X is at
    /// 0x1000 + X's index in `programs`, others at 1), its names back.
    fn own(names: Vec<String>, on_cpu: bool, programs: &[String]) -> Vec<String> {
        let at = |n: &str| {
            let prog = n.strip_prefix("bpf_prog_").and_then(|r| r.split_once('_'));
            let i = prog.and_then(|(_, name)| programs.iter().position(|p| p == name));
            At::Kernel(i.map_or(1, |i| 0x1000 + i as u64))
        };
        let frames = names.into_iter().map(|n| (n.clone(), at(&n))).collect();
        own_frames(frames, on_cpu, &mut |a| a >= 0x1000)
            .into_iter()
            .map(|f| f.0)
            .collect()
    }

    #[test]
    fn own_programs_grouped_on_cpu_trimmed_off_cpu() {
        let progs = v(&["block_rq_issue", "sched_switch", "span"]);
        let sample = v(&[
            "htab_lru_map_update_elem",
            "bpf_prog_0123456789abcdef_block_rq_issue",
            "bpf_trace_run1",
            "__traceiter_block_rq_issue",
            "blk_mq_submit_bio",
            "submit_bio",
        ]);
        assert_eq!(
            own(sample.clone(), true, &progs),
            v(&[PROBES_FRAME, "blk_mq_submit_bio", "submit_bio"])
        );
        // A sample in a subprogram whose caller's frame the unwinder skipped is ours too.
        let sub = v(&["bpf_prog_4567_span", "bpf_trace_run2", "syscall_exit_work"]);
        assert_eq!(
            own(sub, true, &progs),
            v(&[PROBES_FRAME, "syscall_exit_work"])
        );
        // Somebody else's program is left as it is.
        assert_eq!(own(sample.clone(), true, &v(&["other"])), sample);
        let off = v(&[
            "bpf_get_stack",
            "bpf_prog_0123_sched_switch",
            "__schedule",
            "schedule",
        ]);
        assert_eq!(own(off, false, &progs), v(&["__schedule", "schedule"]));
    }
}
