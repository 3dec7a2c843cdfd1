//! Loading and attaching the eBPF programs, and telling them whom to follow.

pub mod batch;
pub mod btf;
pub mod dense;
#[cfg(test)]
mod frames;
mod freeze;
pub mod fs_events;
pub mod kept;
pub mod mmapped;
pub mod offsets;
pub mod probe_cost;
pub mod prog_symbols;
pub mod raw_tracepoint;
pub mod timeline;
pub mod tracefs;
pub mod unwind;

use fsprof_common::MapName;
use std::{
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::HashMap,
    programs::{
        BtfTracePoint, PerfEvent, RawTracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use fsprof_common::{ProbeConfig, Program, TaskState, TimeClass, unwind::FileKey};
use probe_cost::CostWindows;

pub use fs_events::FsTarget;
pub use probe_cost::CostSampling;

/// The eBPF object built by build.rs from the fsprof-ebpf crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fsprof-probes"));

/// Programs attached to the tracepoint of their name, in this order, the optional ones
/// first: a request's completion and requeue before its issue, so no request issued
/// between the attaches leaves its entry behind (bursts of ~30 unseen completions at the
/// start of a trace on a busy disk). The timeline's block events come from these programs.
const REQUIRED: &[Program] = &[
    Program::SysEnter,
    Program::SysExit,
    Program::SchedSwitch,
    Program::SchedWaking,
    Program::SchedProcessFork,
    Program::SchedProcessExec,
    Program::BlockRqComplete,
    Program::BlockRqIssue,
];
/// Missing ones degrade a figure (requeue handling) but not the run.
const OPTIONAL: &[Program] = &[Program::BlockRqRequeue];
/// Of those, the ones attached as BTF tracepoints (typed arguments for helpers).
const BTF_TRACEPOINTS: &[Program] = &[
    Program::SchedSwitch,
    Program::SchedWaking,
    Program::BlockRqIssue,
    Program::BlockRqComplete,
    Program::BlockRqRequeue,
];
/// The timeline's programs (`--timeline`), attached only then; all BTF tracepoints.
const TIMELINE: &[Program] = &[
    Program::TimelineSwitch,
    Program::TimelineWaking,
    Program::TimelineFork,
];

/// The tracepoints of the BTF tracepoint programs, once each.
fn btf_tracepoints() -> impl Iterator<Item = &'static str> {
    let all = BTF_TRACEPOINTS
        .iter()
        .chain(TIMELINE)
        .map(|p| p.tracepoint());
    let mut seen = std::collections::BTreeSet::new();
    all.filter(move |t| seen.insert(*t))
}

/// Which of the filesystem's own tracepoints to count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FsEventSet {
    Off,
    /// `fs_events::CURATED`: waits, commits, flushes, background work units.
    #[default]
    Curated,
    /// Every event of the subsystems.
    Census,
}

/// What to watch besides the target's threads.
#[derive(Clone, Debug, Default)]
pub struct ProbeOptions {
    /// Only these block devices (kernel dev_t); empty: every device.
    pub devices: Vec<u32>,
    /// On-CPU sampling and off-CPU stacks; None: no stacks.
    pub stacks: Option<StackOptions>,
    /// Count this filesystem's own tracepoints; None: none.
    pub fs_events: Option<FsTarget>,
    /// Userspace processes that work for the filesystem (a FUSE daemon): their on-CPU
    /// samples are background work.
    pub background_pids: Vec<u32>,
    /// Attach programs that do nothing to the same hooks instead: the floor any tracer
    /// on these hooks pays (for benchmarks; the profile stays empty).
    pub floor: bool,
    /// How much of the time the kernel measures the programs' run time.
    pub cost_sampling: CostSampling,
    /// Stream every switch, wakeup and block request for a timeline (`--timeline`).
    pub timeline: Option<timeline::TimelineOptions>,
}

#[derive(Clone, Copy, Debug)]
pub struct StackOptions {
    /// cpu-clock samples per second per CPU.
    pub sample_hz: u32,
    /// Also sample kernel threads (the filesystem's background work).
    pub background: bool,
    /// Off-CPU waits this long get a stack each, shorter ones sampled per this much
    /// waiting (0: every wait).
    pub off_cpu_period_ns: u64,
    /// User frames kept per stack, at most USTACK_DEPTH (the rest: "[stack ends: depth
    /// limit]").
    pub user_depth: u32,
}

/// perf's default is 4000 Hz, bcc's profile 49 Hz, flame graph recipes use 99. A sample
/// costs 4–60 µs, mostly cache misses of the unwinder, and more the longer since the last
/// (docs/design.md), so a lower rate saves less than it seems: 999 Hz cost 2.2 % of an ext4
/// tree delete's wall, 199 Hz costs ~0.5–2 % and gives 5 ms resolution per CPU.
pub const DEFAULT_SAMPLE_HZ: u32 = 199;

/// The default off-CPU stack period: the on-CPU sample period, so a combined on/off-CPU
/// profile is sampled evenly over time (199 Hz: a stack per ~5 ms of a thread's waiting).
/// A picked wait costs ~12 µs (its kernel stack at switch-in, the waker's, the user
/// stack): ≤ 0.25 % of the waiting it stands for.
pub fn off_cpu_period_for(sample_hz: u32) -> u64 {
    1_000_000_000 / u64::from(sample_hz.clamp(1, 100_000))
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            sample_hz: DEFAULT_SAMPLE_HZ,
            background: true,
            off_cpu_period_ns: off_cpu_period_for(DEFAULT_SAMPLE_HZ),
            user_depth: fsprof_common::DEFAULT_USER_DEPTH,
        }
    }
}

/// Attached probes. Dropping this detaches and unloads everything; nothing is pinned.
pub struct Probes {
    pub(crate) ebpf: Ebpf,
    /// Tracepoints attached, in order.
    pub attached: Vec<&'static str>,
    /// Optional tracepoints that could not be attached, with the reason.
    pub missing: Vec<(&'static str, String)>,
    /// Sampling period (ns) when stacks are on.
    pub sample_period_ns: Option<u64>,
    /// `StackOptions::off_cpu_period_ns` when stacks are on.
    pub off_cpu_period_ns: u64,
    pub fs_events: Option<fs_events::FsEventsAttached>,
    /// The one filesystem whose events count, when it is fixed (a lab).
    pub fs_dev: Option<u32>,
    /// Optional parts that could not be set up (stacks, fs events), one line each.
    pub warnings: Vec<String>,
    /// Turns the kernel's BPF run-time statistics on and off while fsprof runs (the sysctl
    /// is never touched). None: not available.
    cost: Option<CostWindows>,
    /// With `floor`: the do-nothing programs' links.
    floor_links: Vec<OwnedFd>,
    /// What the dense histogram rows and block slots hold.
    pub dense: dense::DenseLayout,
    /// The user-stack unwinder's tables, when stacks are on.
    unwind: Option<unwind::UnwindTables>,
    /// How long loading and attaching took, by phase.
    pub laps: crate::os::Laps,
    /// The timeline's consumer, with `ProbeOptions::timeline`.
    timeline: Option<timeline::Consumer>,
    /// When following stopped (`freeze`): where every figure ends.
    pub frozen_at: Option<u64>,
    /// When the target's figures began: the command's release, or the last follow of a
    /// running one (set by `trace`; the timeline marks it).
    pub began_at: Option<u64>,
}

/// What a load prepares before the programs are verified.
struct Ahead {
    /// The unwinder's maps, when stacks are on: its tables start beside the verifier.
    unwind: Option<unwind::UnwindMaps>,
    /// The fs events to attach, worked out while the object loaded.
    fs_events: Option<Result<fs_events::FsEventsPlan>>,
}

/// After attaching: each program's runs from its first are counted by the program itself,
/// so the windows need not start before.
fn start_cost_windows(
    ebpf: &Ebpf,
    sampling: CostSampling,
    warnings: &mut Vec<String>,
) -> Option<CostWindows> {
    let ids = program_ids(ebpf);
    let (sampling, why) = sampling.on_this_machine();
    warnings.extend(why.map(String::from));
    CostWindows::start(ids, sampling)
        .map_err(|e| warnings.push(format!("fsprof's own cost is not measured: {e:#}")))
        .ok()
}

/// The kernel's ids of the object's programs.
pub fn program_ids(ebpf: &Ebpf) -> Vec<u32> {
    ebpf.programs()
        .filter_map(|(_, p)| p.info().ok().map(|i| i.id()))
        .collect()
}

/// Map `m` of the loaded object.
pub(crate) fn map(ebpf: &Ebpf, m: MapName) -> Result<&aya::maps::Map> {
    ebpf.map(m.name())
        .with_context(|| format!("map {} missing from the eBPF object", m.name()))
}

/// Every entry of CPU-keyed map `m` (see fsprof_common::CpuKey): one per key and CPU that
/// added to it, the CPU dropped; callers sum.
pub(crate) fn cpu_keyed<K, V: aya::Pod>(ebpf: &Ebpf, m: MapName) -> Result<Vec<(K, V)>>
where
    fsprof_common::CpuKey<K>: aya::Pod,
{
    batch::entries(map(ebpf, m)?, |k: fsprof_common::CpuKey<K>, v: Vec<V>| {
        (k.key, v[0])
    })
}

/// CPU-keyed maps and their room per CPU; created with room for up to CPU_KEYED_CPUS CPUs.
const CPU_KEYED: [(MapName, u32); 4] = [
    (MapName::Hists, fsprof_common::MAX_HIST_ENTRIES),
    (MapName::StackWeights, fsprof_common::MAX_STACK_WEIGHTS),
    (MapName::WakeWeights, fsprof_common::MAX_WAKE_WEIGHTS),
    (MapName::Block, fsprof_common::MAX_BLOCK_KEYS),
];

/// Map `m` of the loaded object, to write.
pub(crate) fn map_mut(ebpf: &mut Ebpf, m: MapName) -> Result<&mut aya::maps::Map> {
    ebpf.map_mut(m.name())
        .with_context(|| format!("map {} missing from the eBPF object", m.name()))
}

/// Refuses early, with one line each, what would otherwise fail deep inside the loader.
pub fn check_environment() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("fsprof must run as root (it loads eBPF programs): try `sudo fsprof …`");
    }
    if !Path::new(kept::VMLINUX_BTF).exists() {
        bail!(
            "no kernel BTF at {}: fsprof needs a kernel built with CONFIG_DEBUG_INFO_BTF=y",
            kept::VMLINUX_BTF
        );
    }
    Ok(())
}

/// The probes' configuration: kernel offsets from BTF, and what the options turn on.
fn probe_config(opts: &ProbeOptions, period: Option<u64>) -> Result<ProbeConfig> {
    let mut config = offsets::probe_config_kept(Path::new(kept::VMLINUX_BTF))?;
    config.filter_devices = u32::from(!opts.devices.is_empty());
    if let (Some(s), Some(p)) = (opts.stacks, period) {
        config.stacks = 1;
        config.background = s.background.into();
        config.sample_period_ns = p;
        config.off_cpu_period_ns = s.off_cpu_period_ns;
        config.user_depth = s.user_depth.clamp(1, fsprof_common::USTACK_DEPTH as u32);
    }
    if let Some(t) = opts.timeline {
        config.timeline = 1;
        config.timeline_syscall_ns = t.syscall_min_ns;
        config.timeline_blocked = t.blocked_functions.into();
    }
    if let Some(t) = &opts.fs_events {
        if let Some(dev) = fixed_fs_dev(t) {
            config.fs_dev = dev;
        }
        config.fs_learn = t.learn.into();
    }
    Ok(config)
}

/// The one filesystem whose events count, when it is fixed (a lab).
fn fixed_fs_dev(t: &FsTarget) -> Option<u32> {
    match (t.devs.as_slice(), t.learn) {
        ([dev], false) => Some(*dev),
        _ => None,
    }
}

/// CPUs the kernel may run (per-CPU maps have a value for each).
fn possible_cpus() -> Result<usize> {
    aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))
}

/// Where the dense histogram rows and block slots go. Filtered: the named devices, each
/// with a slot while they last; else the disks present now get the slots and any other
/// device is counted in the hashes.
fn dense_layout(opts: &ProbeOptions) -> Result<dense::DenseLayout> {
    let cpus = possible_cpus()?;
    let slot_candidates = if opts.devices.is_empty() {
        dense::present_disks()
    } else {
        opts.devices.clone()
    };
    Ok(dense::plan(
        cpus,
        &dense::hot_syscalls(),
        fs_events::PAIR_COUNT,
        &slot_candidates,
    ))
}

/// TASKS' room: a thread id per possible one, up to MAX_TASKS. No more threads than
/// pid_max can live at once, and a dead one's entry is taken over by its id's next
/// thread, so a follow is never refused for room below that; the kernel zeroes the whole
/// preallocated table at creation (65,536 × 272 bytes, ~6 ms, where pid_max is 32,768).
fn tasks_room() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map_or(fsprof_common::MAX_TASKS, |n: u32| {
            n.clamp(1, fsprof_common::MAX_TASKS)
        })
}

fn timeline_bytes(on: bool) -> u32 {
    use fsprof_common::timeline::{TIMELINE_BYTES, TIMELINE_OFF_BYTES};
    if on {
        TIMELINE_BYTES
    } else {
        TIMELINE_OFF_BYTES
    }
}

/// Loads the object (maps created, programs not yet verified) and fills the lookup maps.
fn load_object(
    mut config: ProbeConfig,
    dense: &dense::DenseLayout,
    opts: &ProbeOptions,
) -> Result<Ebpf> {
    config.rows_off_cpu = dense.off_cpu;
    config.rows_fs_pairs = dense.fs_pairs;
    config.rows_block = dense.block;
    // The loader borrows it and is dropped on another thread (below): 192 bytes a load.
    let config: &'static ProbeConfig = Box::leak(Box::new(config));
    let mut loader = btf::loader();
    let cpus = (possible_cpus()? as u32).clamp(1, fsprof_common::CPU_KEYED_CPUS);
    for (m, room) in CPU_KEYED {
        loader.map_max_entries(m.name(), room * cpus);
    }
    let mut ebpf = loader
        .override_global("CONFIG", config, true)
        .map_max_entries(MapName::DenseHists.name(), dense.rows.len().max(1) as u32)
        .map_max_entries(
            MapName::Timeline.name(),
            timeline_bytes(opts.timeline.is_some()),
        )
        .map_max_entries(
            MapName::FsCounts.name(),
            opts.fs_events.as_ref().map_or(1, fs_events::room),
        )
        .map_max_entries(MapName::Tasks.name(), tasks_room())
        .load(EBPF_OBJECT)
        .context("loading fsprof's eBPF object")?;
    // Freeing its parse of the kernel's BTF took ~3 ms of the start, on the main thread.
    std::thread::spawn(move || drop(loader));
    let mut rows: aya::maps::Array<_, u32> =
        aya::maps::Array::try_from(map_mut(&mut ebpf, MapName::SyscallRow)?)?;
    for &(nr, row) in &dense.syscalls {
        rows.set(nr, row + 1, 0)?;
    }
    let mut devices: HashMap<_, u32, u32> =
        HashMap::try_from(map_mut(&mut ebpf, MapName::Devices)?)?;
    for (slot, dev) in dense.slots.iter().enumerate() {
        devices.insert(dev, slot as u32, 0)?;
    }
    for dev in opts.devices.iter().skip(dense.slots.len()) {
        devices.insert(dev, fsprof_common::NO_ROW, 0)?;
    }
    if !opts.background_pids.is_empty() {
        let mut bg: HashMap<_, u32, u8> =
            HashMap::try_from(map_mut(&mut ebpf, MapName::BackgroundPids)?)?;
        for pid in &opts.background_pids {
            bg.insert(pid, 1, 0)?;
        }
    }
    Ok(ebpf)
}

impl Probes {
    pub fn load(opts: &ProbeOptions) -> Result<Probes> {
        Probes::load_while(opts, || ())
    }

    /// `load`, with `meanwhile` run on this thread while the maps are created on another
    /// (the kernel zeroes them on one CPU, ~35 ms).
    pub fn load_while(opts: &ProbeOptions, meanwhile: impl FnOnce()) -> Result<Probes> {
        check_environment()?;
        let mut laps = crate::os::Laps::start();
        let period = opts.stacks.map(|s| off_cpu_period_for(s.sample_hz));
        let config = probe_config(opts, period)?;
        laps.lap("offsets");
        let dense = dense_layout(opts)?;
        let (ebpf, fs_plan) = std::thread::scope(|s| {
            let loading = s.spawn(|| load_object(config, &dense, opts));
            let fs_plan = (opts.fs_events.as_ref())
                .filter(|_| !opts.floor)
                .map(fs_events::plan);
            meanwhile();
            laps.lap("beside_load");
            (loading.join().expect("loading thread"), fs_plan)
        });
        let mut ebpf = ebpf?;
        laps.lap("load");
        let ahead = Ahead {
            unwind: match period {
                Some(_) if !opts.floor => Some(unwind::UnwindMaps::take(&mut ebpf)?),
                _ => None,
            },
            fs_events: fs_plan,
        };
        let mut probes = Probes {
            ebpf,
            attached: Vec::new(),
            missing: Vec::new(),
            sample_period_ns: None,
            off_cpu_period_ns: config.off_cpu_period_ns,
            fs_events: None,
            fs_dev: opts.fs_events.as_ref().and_then(fixed_fs_dev),
            warnings: Vec::new(),
            cost: None,
            floor_links: Vec::new(),
            dense,
            unwind: None,
            laps,
            timeline: None,
            frozen_at: None,
            began_at: None,
        };
        if opts.floor {
            probes.attach_floor(opts, period)?;
        } else {
            probes.attach_all(opts, period, ahead)?;
        }
        probes.cost = start_cost_windows(&probes.ebpf, opts.cost_sampling, &mut probes.warnings);
        probes.laps.lap("attach");
        Ok(probes)
    }

    /// The tracepoints (required ones or an error), the sampler and the fs events; the
    /// unwind tables start while the programs are verified.
    fn attach_all(&mut self, opts: &ProbeOptions, period: Option<u64>, ahead: Ahead) -> Result<()> {
        let sampler = period.map(|_| Program::OnCpuSample);
        let timeline = if opts.timeline.is_some() {
            TIMELINE
        } else {
            &[]
        };
        // The fs events' program too: loaded at attach, it was verified after the others.
        let fs_event = opts.fs_events.as_ref().map(|_| Program::FsEvent);
        let (loaded, unwind) = verify_in_parallel(
            &mut self.ebpf,
            REQUIRED
                .iter()
                .chain(OPTIONAL)
                .chain(&sampler)
                .chain(timeline)
                .chain(&fs_event),
            || ahead.unwind.map(unwind::UnwindTables::start).transpose(),
        )?;
        self.unwind = unwind?;
        self.laps.lap("verify");
        for (&p, required) in OPTIONAL
            .iter()
            .map(|p| (p, false))
            .chain(REQUIRED.iter().map(|p| (p, true)))
        {
            let name = p.name();
            match loaded.get(p).and_then(|()| attach(&mut self.ebpf, p)) {
                Ok(()) => self.attached.push(name),
                Err(e) if required => {
                    return Err(e.context(format!("attaching required tracepoint {name}")));
                }
                Err(e) => self.missing.push((name, format!("{e:#}"))),
            }
        }
        if let Some(p) = period {
            match loaded
                .get(Program::OnCpuSample)
                .and_then(|()| attach_sampler(&mut self.ebpf, Program::OnCpuSample, p))
            {
                Ok(()) => self.sample_period_ns = Some(p),
                Err(e) => self.warnings.push(format!("no on-CPU stacks: {e:#}")),
            }
        }
        if opts.timeline.is_some() {
            self.start_timeline(&loaded)?;
        }
        self.laps.lap("attach");
        if let Some(plan) = ahead.fs_events {
            match plan.and_then(|p| fs_events::attach(&mut self.ebpf, p)) {
                Ok(a) => self.fs_events = Some(a),
                Err(e) => self
                    .warnings
                    .push(format!("no filesystem tracepoints: {e:#}")),
            }
        }
        self.laps.lap("fs_events");
        Ok(())
    }

    /// Attaches the timeline's programs and starts draining their ring.
    fn start_timeline(&mut self, loaded: &Verified) -> Result<()> {
        let ring = self
            .ebpf
            .take_map(MapName::Timeline.name())
            .context("map TIMELINE missing from the eBPF object")?;
        let consumer = timeline::Consumer::start(aya::maps::RingBuf::try_from(ring)?)?;
        for &p in TIMELINE {
            loaded
                .get(p)
                .and_then(|()| attach(&mut self.ebpf, p))
                .with_context(|| format!("attaching the timeline's {}", p.name()))?;
            self.attached.push(p.name());
        }
        self.timeline = Some(consumer);
        Ok(())
    }

    /// Stops the timeline's consumer; the records it read (None: no timeline).
    pub fn finish_timeline(&mut self) -> Option<Result<timeline::Stream>> {
        self.timeline.take().map(timeline::Consumer::finish)
    }

    /// Loads the unwind tables of `program` and its libraries before it runs.
    pub fn preload_unwind(&self, program: &Path) {
        if let Some(u) = &self.unwind {
            u.preload(program);
        }
    }

    /// The files the user-stack unwinder met, by the kernel's key, with their paths.
    pub fn unwind_files(&self) -> std::collections::BTreeMap<FileKey, PathBuf> {
        self.unwind.as_ref().map(|u| u.finish()).unwrap_or_default()
    }

    /// The kernel's run-time statistics of fsprof's programs so far; ends the measuring.
    /// None: the kernel keeps none for us.
    pub fn finish_cost_windows(&self) -> Option<probe_cost::WindowTotals> {
        self.cost.as_ref().map(CostWindows::finish)
    }

    /// One line naming the hook set, printed at start, and a warning per missing hook.
    pub fn describe(&self) -> String {
        let what = if self.floor_links.is_empty() {
            "tracepoints"
        } else {
            "do-nothing programs (floor) on tracepoints"
        };
        let mut s = format!("fsprof: attached {what}: {}", self.attached.join(" "));
        if let Some(p) = self.sample_period_ns {
            s.push_str(&format!(
                "; cpu-clock sampling at {} Hz; {}",
                1_000_000_000 / p.max(1),
                off_cpu_stacks(self.off_cpu_period_ns)
            ));
        }
        if let Some(f) = &self.fs_events {
            s.push_str(&format!(
                "; {} {}tracepoints of {}",
                f.attached(),
                if f.census { "(all) " } else { "" },
                f.subsystems.join(",")
            ));
        }
        for (name, why) in &self.missing {
            s.push_str(&format!(
                "\nfsprof: warning: optional tracepoint {name} not attached: {why}"
            ));
        }
        for w in &self.warnings {
            s.push_str(&format!("\nfsprof: warning: {w}"));
        }
        if let Some(f) = &self.fs_events
            && !f.failed.is_empty()
        {
            s.push_str(&format!(
                "\nfsprof: warning: {} tracepoints not attached (first: {})",
                f.failed.len(),
                f.failed[0]
            ));
        }
        s
    }

    /// Starts following thread `tid`; its future children are followed by the kernel side.
    /// `armed: false` holds off syscall counting until the thread execs (for a child fsprof
    /// forked itself); running processes are armed at once.
    pub fn follow(&mut self, tid: u32, armed: bool) -> Result<()> {
        let now = monotonic_ns();
        let state = match crate::os::schedstat(tid) {
            // Forked but not yet run (a loaded machine): it waits for a CPU from now, and
            // its first stack takes its user half on its way out of fork, as a child
            // forked under the probes does (fsprof-ebpf `sched_process_fork`).
            Some([_, _, 0]) => TaskState {
                off_since: now,
                off_class: TimeClass::RunQueue as u32,
                exec_in: 0,
                ep_in_syscall: 1,
                ..TaskState::default()
            },
            // A held child may still be running toward its wait, and if released before
            // it blocks it never switches out: assume on-CPU from now. If it is asleep
            // instead, its next switch-in restarts the interval, so the guess costs nothing.
            _ => TaskState {
                on_since: now,
                exec_in: exec_in(tid),
                ..TaskState::default()
            },
        };
        self.follow_with(
            tid,
            TaskState {
                armed: armed.into(),
                followed_at: now,
                ..state
            },
        )
    }

    /// Follows a thread that is already running, starting its current interval now in
    /// the class its /proc state shows (a spinning thread may not switch for seconds).
    pub fn follow_running(&mut self, tid: u32, proc_state: char) -> Result<()> {
        let now = monotonic_ns();
        let off = |class: TimeClass| TaskState {
            off_since: now,
            off_class: class as u32,
            // Its switch-in may go untraced: the charge since now is its on-CPU part.
            exec_in: exec_in(tid),
            ..TaskState::default()
        };
        let state = match proc_state {
            'R' => TaskState {
                on_since: now,
                exec_in: exec_in(tid),
                ..TaskState::default()
            },
            'S' | 'I' => off(TimeClass::Sleep),
            'D' => off(TimeClass::Uninterruptible),
            _ => off(TimeClass::Other),
        };
        let state = TaskState {
            armed: 1,
            followed_at: now,
            ..state
        };
        self.follow_with(tid, state)
    }

    fn follow_with(&mut self, tid: u32, state: TaskState) -> Result<()> {
        // The hint first, as the kernel side does (fsprof-ebpf common::follow).
        let mut hint: aya::maps::Array<_, u32> =
            aya::maps::Array::try_from(map_mut(&mut self.ebpf, MapName::FollowHint)?)?;
        let slot = fsprof_common::follow_hint_slot(tid);
        let held = hint.get(&slot, 0)?;
        hint.set(slot, fsprof_common::follow_hint_join(held, tid), 0)?;
        let mut tasks: HashMap<_, u32, TaskState> =
            HashMap::try_from(map_mut(&mut self.ebpf, MapName::Tasks)?)?;
        tasks
            .insert(tid, state, 0)
            .with_context(|| format!("following thread {tid}"))?;
        Ok(())
    }
}

/// `TaskState::exec_in` for an on-CPU interval starting now, from /proc.
fn exec_in(tid: u32) -> u64 {
    crate::os::sum_exec_runtime(tid).unwrap_or(fsprof_common::EXEC_UNKNOWN)
}

impl Probes {
    /// Waits (at most 200 ms) until `tid`'s last switch-out has been seen. A parent can reap
    /// a child before the child's final context switch, which closes its last on-CPU
    /// interval: collecting in between could read the time classes before that interval
    /// lands and the thread table after it left (a spinning target lost 0.35 s of 1 s).
    pub fn await_final_switch(&self, tid: u32) {
        if !self.floor_links.is_empty() {
            return; // nothing removes threads from the table then
        }
        let Some(Ok(tasks)) = self
            .ebpf
            .map(MapName::Tasks.name())
            .map(HashMap::<_, u32, TaskState>::try_from)
        else {
            return;
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
        while tasks.get(&tid, 0).is_ok() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Threads still followed: descendants of the target that outlived it.
    pub fn followed(&self) -> Result<Vec<u32>> {
        let tasks: HashMap<_, u32, TaskState> =
            HashMap::try_from(map(&self.ebpf, MapName::Tasks)?)?;
        Ok(tasks.keys().filter_map(|k| k.ok()).collect())
    }
}

pub use crate::os::monotonic_ns;

/// How off-CPU stacks are taken, for headers and reports.
pub fn off_cpu_stacks(period_ns: u64) -> String {
    if period_ns == 0 {
        return "an off-CPU stack at every switch-out".into();
    }
    let p = crate::units::duration_ns(period_ns);
    format!("off-CPU stacks for every wait ≥ {p}, shorter ones sampled per {p} of waiting")
}

/// The cpu-clock sampler on every online CPU, all processes (the program keeps only the
/// target and kernel threads); `p` is loaded already.
fn attach_sampler(ebpf: &mut Ebpf, p: Program, period_ns: u64) -> Result<()> {
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    let prog: &mut PerfEvent = program_mut(ebpf, p)?.try_into()?;
    for cpu in cpus {
        prog.attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Period(period_ns),
            false,
        )
        .with_context(|| format!("attaching the cpu-clock sampler on CPU {cpu}"))?;
    }
    Ok(())
}

/// The programs the verifier takes longest on, longest first (strace -T of
/// BPF_PROG_LOAD, 6.18: 45, 21, 13 and 12 ms; every other program ≤ 8 ms). Verified first,
/// the others fill in beside them: the verify lap is then about half the verifier's total.
const LONGEST_TO_VERIFY: [Program; 4] = [
    Program::SchedSwitch,
    Program::SysExit,
    Program::OnCpuSample,
    Program::BlockRqIssue,
];

/// Loads `programs`, one per CPU at a time: the kernel verifies a program on the loading
/// thread, and fsprof's take ~75 ms of verification on one CPU (strace -T: see
/// `LONGEST_TO_VERIFY`), with `meanwhile` run on this thread. Returns each program's
/// outcome by name, and what `meanwhile` returned.
fn verify_in_parallel<'p, T>(
    ebpf: &mut Ebpf,
    programs: impl Iterator<Item = &'p Program>,
    meanwhile: impl FnOnce() -> T,
) -> Result<(Verified, T)> {
    let wanted: Vec<&str> = programs.map(|p| p.name()).collect();
    let btf = btf::tracepoints()?;
    let mut queue: Vec<_> = ebpf
        .programs_mut()
        .filter(|(n, _)| wanted.contains(n))
        .collect();
    // Popped from the end: the longest to verify go first, so the threads end together.
    let rank = |n: &str| {
        let longest = LONGEST_TO_VERIFY.iter().position(|p| p.name() == n);
        longest.map_or(0, |i| LONGEST_TO_VERIFY.len() - i)
    };
    queue.sort_by_key(|(n, _)| rank(n));
    let queue = std::sync::Mutex::new(queue);
    let outcomes = std::sync::Mutex::new(std::collections::BTreeMap::new());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let done = std::thread::scope(|scope| {
        for _ in 0..threads.min(wanted.len()) {
            scope.spawn(|| {
                loop {
                    // Its own statement: the guard of a `while let` scrutinee lives through
                    // the body, and one thread then verified every program while the other
                    // waited (strace: all loads on one thread, 0.32 s).
                    let next = queue.lock().expect("queue").pop();
                    let Some((name, prog)) = next else { break };
                    let r = verify(name, prog, btf).map_err(|e| format!("{e:#}"));
                    outcomes
                        .lock()
                        .expect("outcomes")
                        .insert(name.to_string(), r);
                }
            });
        }
        meanwhile()
    });
    Ok((Verified(outcomes.into_inner().expect("outcomes")), done))
}

/// Each program's load outcome, by name.
struct Verified(std::collections::BTreeMap<String, Result<(), String>>);

impl Verified {
    fn get(&self, p: Program) -> Result<()> {
        let name = p.name();
        match self.0.get(name) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(anyhow::anyhow!("loading {name}: {e}")),
            None => Err(anyhow::anyhow!(
                "program {name} missing from the eBPF object"
            )),
        }
    }
}

/// Loads one program of the kinds fsprof attaches by name (the verifier runs here).
fn verify(name: &str, prog: &mut aya::programs::Program, btf: &aya::Btf) -> Result<()> {
    use aya::programs::Program::*;
    let hook = Program::ALL
        .iter()
        .find(|p| p.name() == name)
        .map_or(name, |p| p.tracepoint());
    match prog {
        BtfTracePoint(p) => p.load(hook, btf)?,
        RawTracePoint(p) => p.load()?,
        PerfEvent(p) => p.load()?,
        _ => bail!("program {name} is of an unexpected kind"),
    }
    Ok(())
}

impl Probes {
    /// The floor: `floor_tp` on every hook the real programs use (one program, many
    /// links), the do-nothing sampler, and the do-nothing program on the same fs events.
    fn attach_floor(&mut self, opts: &ProbeOptions, period: Option<u64>) -> Result<()> {
        let floor = [Program::FloorTp, Program::FloorSample];
        let (loaded, ()) = verify_in_parallel(
            &mut self.ebpf,
            floor[..1 + usize::from(period.is_some())].iter(),
            || (),
        )?;
        loaded.get(Program::FloorTp)?;
        let prog = program_mut(&mut self.ebpf, Program::FloorTp)?;
        let fd = prog.fd()?.as_fd().as_raw_fd();
        for &p in REQUIRED.iter().chain(OPTIONAL) {
            if let Ok(link) = raw_tracepoint::attach_raw(fd, p.name(), 0) {
                self.floor_links.push(link);
                self.attached.push(p.name());
            }
        }
        if let Some(p) = period
            && let Err(e) = loaded
                .get(Program::FloorSample)
                .and_then(|()| attach_sampler(&mut self.ebpf, Program::FloorSample, p))
        {
            self.warnings.push(format!("no floor sampler: {e:#}"));
        }
        if let Some(t) = &opts.fs_events {
            match fs_events::attach_floor(&mut self.ebpf, t) {
                Ok(f) => self.floor_links.extend(f.into_links()),
                Err(e) => self.warnings.push(format!("no floor fs events: {e:#}")),
            }
        }
        Ok(())
    }
}

/// Program `p` of the object.
pub(crate) fn program_mut(ebpf: &mut Ebpf, p: Program) -> Result<&mut aya::programs::Program> {
    ebpf.program_mut(p.name())
        .with_context(|| format!("program {} missing from the eBPF object", p.name()))
}

/// Attaches loaded program `p` to the tracepoint of its name.
fn attach(ebpf: &mut Ebpf, p: Program) -> Result<()> {
    let name = p.name();
    let prog = program_mut(ebpf, p)?;
    if BTF_TRACEPOINTS.contains(&p) || TIMELINE.contains(&p) {
        let prog: &mut BtfTracePoint = prog.try_into()?;
        prog.attach().with_context(|| format!("attaching {name}"))?;
    } else {
        let prog: &mut RawTracePoint = prog.try_into()?;
        prog.attach(name)
            .with_context(|| format!("attaching {name}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use fsprof_common::MapName;
    use strum::VariantArray;

    use super::*;

    /// Every map and program name userspace uses is in the built object, and every map and
    /// program of the object has its name here: no root needed, the object is only parsed.
    #[test]
    fn object_has_every_name_userspace_uses() {
        let obj = aya_obj::Object::parse(EBPF_OBJECT).expect("the built eBPF object parses");
        let maps: Vec<&str> = obj
            .maps
            .keys()
            .map(String::as_str)
            .filter(|m| !m.starts_with('.'))
            .collect();
        let ours: Vec<&str> = MapName::VARIANTS.iter().map(|m| m.name()).collect();
        for m in &ours {
            assert!(maps.contains(m), "map {m} is not in the eBPF object");
        }
        for m in &maps {
            assert!(ours.contains(m), "the object's map {m} has no MapName");
        }
        let programs: Vec<&str> = obj.programs.keys().map(String::as_str).collect();
        let ours: Vec<&str> = Program::ALL.iter().map(|p| p.name()).collect();
        for p in &ours {
            assert!(
                programs.contains(p),
                "program {p} is not in the eBPF object"
            );
        }
        for p in &programs {
            assert!(ours.contains(p), "the object's program {p} has no Program");
        }
    }
}
