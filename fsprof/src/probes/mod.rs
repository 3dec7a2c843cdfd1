//! Loading and attaching the eBPF programs, and telling them whom to follow.

pub mod offsets;

use std::path::Path;

use anyhow::{Context, Result, bail};
use aya::{Ebpf, EbpfLoader, maps::HashMap, programs::RawTracePoint};
use fsprof_common::{TaskState, TimeClass};

/// The eBPF object built by build.rs from the fsprof-ebpf crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/fsprof-probes"));

/// (program, raw tracepoint). Program names equal their tracepoint names.
const REQUIRED: &[&str] = &[
    "sys_enter",
    "sys_exit",
    "sched_switch",
    "sched_wakeup",
    "sched_process_fork",
    "sched_process_exec",
    "block_rq_issue",
    "block_rq_complete",
];
/// Missing ones degrade a figure (queue latency, requeue handling) but not the run.
const OPTIONAL: &[&str] = &["block_io_start", "block_rq_insert", "block_rq_requeue"];

/// What to watch besides the target's threads.
#[derive(Clone, Debug, Default)]
pub struct ProbeOptions {
    /// Only these block devices (kernel dev_t); empty: every device.
    pub devices: Vec<u32>,
}

/// Attached probes. Dropping this detaches and unloads everything; nothing is pinned.
pub struct Probes {
    pub(crate) ebpf: Ebpf,
    /// Tracepoints attached, in order.
    pub attached: Vec<&'static str>,
    /// Optional tracepoints that could not be attached, with the reason.
    pub missing: Vec<(&'static str, String)>,
}

/// Refuses early, with one line each, what would otherwise fail deep inside the loader.
pub fn check_environment() -> Result<()> {
    if unsafe { libc::geteuid() } != 0 {
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
        let mut ebpf = EbpfLoader::new()
            .override_global("CONFIG", &config, true)
            .load(EBPF_OBJECT)
            .context("loading fsprof's eBPF object")?;
        if !opts.devices.is_empty() {
            let mut filter: HashMap<_, u32, u8> =
                HashMap::try_from(ebpf.map_mut("DEVICE_FILTER").context("DEVICE_FILTER map")?)?;
            for dev in &opts.devices {
                filter.insert(dev, 1, 0)?;
            }
        }
        let mut attached = Vec::new();
        let mut missing = Vec::new();
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
        Ok(Probes {
            ebpf,
            attached,
            missing,
        })
    }

    /// One line naming the hook set, printed at start, and a warning per missing hook.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "fsprof: attached raw tracepoints: {}",
            self.attached.join(" ")
        );
        for (name, why) in &self.missing {
            s.push_str(&format!(
                "\nfsprof: warning: optional tracepoint {name} not attached: {why}"
            ));
        }
        s
    }

    /// Starts following thread `tid`; its future children are followed by the kernel side.
    /// `armed: false` holds off syscall counting until the thread execs (for a child fsprof
    /// forked itself); running processes are armed at once.
    pub fn follow(&mut self, tid: u32, armed: bool) -> Result<()> {
        // Held before exec, so asleep: the first switch event starts its accounting.
        let state = TaskState {
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
                ..TaskState::default()
            },
            'S' | 'I' => off(TimeClass::Sleep),
            'D' => off(TimeClass::Uninterruptible),
            _ => off(TimeClass::Other),
        };
        self.follow_with(tid, TaskState { armed: 1, ..state })
    }

    fn follow_with(&mut self, tid: u32, state: TaskState) -> Result<()> {
        let mut tasks: HashMap<_, u32, TaskState> =
            HashMap::try_from(self.ebpf.map_mut("TASKS").context("TASKS map")?)?;
        tasks
            .insert(tid, state, 0)
            .with_context(|| format!("following thread {tid}"))?;
        Ok(())
    }
}

impl Probes {
    /// Threads still followed: descendants of the target that outlived it.
    pub fn followed(&self) -> Result<Vec<u32>> {
        let tasks: HashMap<_, u32, TaskState> =
            HashMap::try_from(self.ebpf.map("TASKS").context("TASKS map")?)?;
        Ok(tasks.keys().filter_map(|k| k.ok()).collect())
    }
}

/// CLOCK_MONOTONIC in ns: the clock of bpf_ktime_get_ns.
pub fn monotonic_ns() -> u64 {
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn attach(ebpf: &mut Ebpf, name: &'static str) -> Result<()> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing from the eBPF object"))?
        .try_into()?;
    prog.load().with_context(|| format!("loading {name}"))?;
    prog.attach(name)
        .with_context(|| format!("attaching {name}"))?;
    Ok(())
}
