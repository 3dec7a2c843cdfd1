//! Loading and attaching the eBPF programs, and telling them whom to follow.

pub mod btf;
pub mod cost_windows;
pub mod dense;
pub mod fs_events;
pub mod mmapped;
pub mod offsets;
pub mod raw_tracepoint;
pub mod tracefs;
pub mod unwind;

use std::{
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::HashMap,
    programs::{
        BtfTracePoint, PerfEvent, RawTracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use cost_windows::CostWindows;
use fsprof_common::{TaskState, TimeClass, unwind::FileKey};

pub use cost_windows::CostSampling;
pub use fs_events::FsTarget;

/// The eBPF object built by build.rs from the fsprof-ebpf crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fsprof-probes"));

/// Program names equal their tracepoint names.
const REQUIRED: &[&str] = &[
    "sys_enter",
    "sys_exit",
    "sched_switch",
    "sched_waking",
    "sched_process_fork",
    "sched_process_exec",
    "block_rq_issue",
    "block_rq_complete",
];
/// Of those, the ones attached as BTF tracepoints (typed arguments for helpers).
const BTF_TRACEPOINTS: &[&str] = &[
    "sched_switch",
    "sched_waking",
    "block_rq_issue",
    "block_rq_complete",
    "block_rq_requeue",
];

/// Missing ones degrade a figure (requeue handling) but not the run.
const OPTIONAL: &[&str] = &["block_rq_requeue"];

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
}

/// After attaching: each program's runs from its first are counted by the program itself,
/// so the windows need not start before.
fn start_cost_windows(
    ebpf: &Ebpf,
    sampling: CostSampling,
    warnings: &mut Vec<String>,
) -> Option<CostWindows> {
    let ids = ebpf
        .programs()
        .filter_map(|(_, p)| p.info().ok().map(|i| i.id()))
        .collect();
    let (sampling, why) = sampling.on_this_machine();
    warnings.extend(why.map(String::from));
    CostWindows::start(ids, sampling)
        .map_err(|e| warnings.push(format!("fsprof's own cost is not measured: {e:#}")))
        .ok()
}

/// Refuses early, with one line each, what would otherwise fail deep inside the loader.
pub fn check_environment() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("fsprof must run as root (it loads eBPF programs): try `sudo fsprof …`");
    }
    if !Path::new(offsets::VMLINUX_BTF).exists() {
        bail!(
            "no kernel BTF at {}: fsprof needs a kernel built with CONFIG_DEBUG_INFO_BTF=y",
            offsets::VMLINUX_BTF
        );
    }
    Ok(())
}

impl Probes {
    pub fn load(opts: &ProbeOptions) -> Result<Probes> {
        check_environment()?;
        let mut config = offsets::probe_config(Path::new(offsets::VMLINUX_BTF))?;
        config.filter_devices = u32::from(!opts.devices.is_empty());
        let period = opts.stacks.map(|s| off_cpu_period_for(s.sample_hz));
        if let (Some(s), Some(p)) = (opts.stacks, period) {
            config.stacks = 1;
            config.background = s.background.into();
            config.sample_period_ns = p;
            config.off_cpu_period_ns = s.off_cpu_period_ns;
            config.user_depth = s.user_depth.clamp(1, fsprof_common::USTACK_DEPTH as u32);
        }
        let mut fs_dev = None;
        if let Some(t) = &opts.fs_events {
            if let ([dev], false) = (t.devs.as_slice(), t.learn) {
                fs_dev = Some(*dev);
                config.fs_dev = *dev;
            }
            config.fs_learn = t.learn.into();
        }
        let mut warnings = Vec::new();
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        // Filtered: the named devices, each with a slot while they last; else the disks
        // present now get the slots and any other device is counted in the hashes.
        let slot_candidates = if opts.devices.is_empty() {
            dense::present_disks()
        } else {
            opts.devices.clone()
        };
        let dense = dense::plan(
            cpus,
            &dense::hot_syscalls(),
            fs_events::PAIR_COUNT,
            &slot_candidates,
        );
        config.rows_off_cpu = dense.off_cpu;
        config.rows_fs_pairs = dense.fs_pairs;
        config.rows_block = dense.block;
        let mut ebpf = EbpfLoader::new()
            .override_global("CONFIG", &config, true)
            .map_max_entries("DENSE_HISTS", dense.rows.len().max(1) as u32)
            .load(EBPF_OBJECT)
            .context("loading fsprof's eBPF object")?;
        {
            let mut map: aya::maps::Array<_, u32> =
                aya::maps::Array::try_from(ebpf.map_mut("SYSCALL_ROW").context("SYSCALL_ROW")?)?;
            for &(nr, row) in &dense.syscalls {
                map.set(nr, row + 1, 0)?;
            }
        }
        {
            let mut devices: HashMap<_, u32, u32> =
                HashMap::try_from(ebpf.map_mut("DEVICES").context("DEVICES map")?)?;
            for (slot, dev) in dense.slots.iter().enumerate() {
                devices.insert(dev, slot as u32, 0)?;
            }
            for dev in opts.devices.iter().skip(dense.slots.len()) {
                devices.insert(dev, fsprof_common::NO_ROW, 0)?;
            }
        }
        if !opts.background_pids.is_empty() {
            let mut bg: HashMap<_, u32, u8> = HashMap::try_from(
                ebpf.map_mut("BACKGROUND_PIDS")
                    .context("BACKGROUND_PIDS map")?,
            )?;
            for pid in &opts.background_pids {
                bg.insert(pid, 1, 0)?;
            }
        }
        let mut attached = Vec::new();
        let mut missing = Vec::new();
        let unwind = match period {
            Some(_) if !opts.floor => Some(unwind::UnwindTables::start(&mut ebpf)?),
            _ => None,
        };
        if opts.floor {
            let floor_links = attach_floor(&mut ebpf, opts, period, &mut attached, &mut warnings)?;
            let cost = start_cost_windows(&ebpf, opts.cost_sampling, &mut warnings);
            return Ok(Probes {
                ebpf,
                attached,
                missing,
                sample_period_ns: period,
                off_cpu_period_ns: config.off_cpu_period_ns,
                fs_events: None,
                fs_dev,
                warnings,
                cost,
                floor_links,
                dense,
                unwind,
            });
        }
        for (names, required) in [(REQUIRED, true), (OPTIONAL, false)] {
            for &name in names {
                match attach(&mut ebpf, name) {
                    Ok(()) => attached.push(name),
                    Err(e) if required => {
                        return Err(e.context(format!("attaching required tracepoint {name}")));
                    }
                    Err(e) => missing.push((name, format!("{e:#}"))),
                }
            }
        }
        let mut sample_period_ns = None;
        if let Some(p) = period {
            match attach_sampler(&mut ebpf, "on_cpu_sample", p) {
                Ok(()) => sample_period_ns = Some(p),
                Err(e) => warnings.push(format!("no on-CPU stacks: {e:#}")),
            }
        }
        let fs_events = match &opts.fs_events {
            Some(t) => match fs_events::attach(&mut ebpf, t) {
                Ok(a) => Some(a),
                Err(e) => {
                    warnings.push(format!("no filesystem tracepoints: {e:#}"));
                    None
                }
            },
            None => None,
        };
        let cost = start_cost_windows(&ebpf, opts.cost_sampling, &mut warnings);
        Ok(Probes {
            ebpf,
            attached,
            missing,
            sample_period_ns,
            off_cpu_period_ns: config.off_cpu_period_ns,
            fs_events,
            fs_dev,
            warnings,
            cost,
            floor_links: Vec::new(),
            dense,
            unwind,
        })
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
    pub fn finish_cost_windows(&self) -> Option<cost_windows::WindowTotals> {
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
        // A held child may still be running toward its wait, and if released before it
        // blocks it never switches out: assume on-CPU from now. If it is asleep instead,
        // its next switch-in restarts the interval, so the guess costs nothing.
        let state = TaskState {
            on_since: monotonic_ns(),
            exec_in: exec_in(tid),
            armed: armed.into(),
            ..TaskState::default()
        };
        self.follow_with(tid, state)
    }

    /// Follows a thread that is already running, starting its current interval now in
    /// the class its /proc state shows (a spinning thread may not switch for seconds).
    pub fn follow_running(&mut self, tid: u32, proc_state: char) -> Result<()> {
        let now = monotonic_ns();
        let off = |class: TimeClass| TaskState {
            off_since: now,
            off_class: class as u32,
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
        self.follow_with(tid, TaskState { armed: 1, ..state })
    }

    fn follow_with(&mut self, tid: u32, state: TaskState) -> Result<()> {
        // The hint first, as the kernel side does (fsprof-ebpf common::follow).
        let mut hint: aya::maps::Array<_, u32> =
            aya::maps::Array::try_from(self.ebpf.map_mut("FOLLOW_HINT").context("FOLLOW_HINT")?)?;
        let slot = fsprof_common::follow_hint_slot(tid);
        let held = hint.get(&slot, 0)?;
        hint.set(slot, fsprof_common::follow_hint_join(held, tid), 0)?;
        let mut tasks: HashMap<_, u32, TaskState> =
            HashMap::try_from(self.ebpf.map_mut("TASKS").context("TASKS map")?)?;
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
            .map("TASKS")
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
            HashMap::try_from(self.ebpf.map("TASKS").context("TASKS map")?)?;
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
/// target and kernel threads).
fn attach_sampler(ebpf: &mut Ebpf, name: &str, period_ns: u64) -> Result<()> {
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    let prog: &mut PerfEvent = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing from the eBPF object"))?
        .try_into()?;
    prog.load().with_context(|| format!("loading {name}"))?;
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

/// The floor: `floor_tp` on every hook the real programs use (one program, many links),
/// the do-nothing sampler, and the do-nothing program on the same fs events.
fn attach_floor(
    ebpf: &mut Ebpf,
    opts: &ProbeOptions,
    period: Option<u64>,
    attached: &mut Vec<&'static str>,
    warnings: &mut Vec<String>,
) -> Result<Vec<OwnedFd>> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut("floor_tp")
        .context("program floor_tp missing from the eBPF object")?
        .try_into()?;
    prog.load().context("loading floor_tp")?;
    let fd = prog.fd()?.as_fd().as_raw_fd();
    let mut links = Vec::new();
    for &name in REQUIRED.iter().chain(OPTIONAL) {
        if let Ok(link) = raw_tracepoint::attach_raw(fd, name, 0) {
            links.push(link);
            attached.push(name);
        }
    }
    if let Some(p) = period
        && let Err(e) = attach_sampler(ebpf, "floor_sample", p)
    {
        warnings.push(format!("no floor sampler: {e:#}"));
    }
    if let Some(t) = &opts.fs_events {
        match fs_events::attach_floor(ebpf, t) {
            Ok(f) => links.extend(f.into_links()),
            Err(e) => warnings.push(format!("no floor fs events: {e:#}")),
        }
    }
    Ok(links)
}

fn attach(ebpf: &mut Ebpf, name: &'static str) -> Result<()> {
    if BTF_TRACEPOINTS.contains(&name) {
        let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
        let prog: &mut BtfTracePoint = ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} missing from the eBPF object"))?
            .try_into()?;
        prog.load(name, &btf)
            .with_context(|| format!("loading {name}"))?;
        prog.attach().with_context(|| format!("attaching {name}"))?;
        return Ok(());
    }
    let prog: &mut RawTracePoint = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing from the eBPF object"))?
        .try_into()?;
    prog.load().with_context(|| format!("loading {name}"))?;
    prog.attach(name)
        .with_context(|| format!("attaching {name}"))?;
    Ok(())
}
