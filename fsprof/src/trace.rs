//! `fsprof trace`: probes → target → aggregation, for one command or one process tree.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::{
    aggregate::{
        self, Profile, folded,
        stacks::{self, BackgroundSummary, StackSummary, Stacks},
        timeline::TimelineSummary,
    },
    lab::{self, LabFs, quiesce},
    os,
    probes::{FsEventSet, FsTarget, ProbeOptions, Probes},
    signals, target,
};

/// Version of the JSON layout of `TraceResult` (docs/json.md). Bump on any breaking change.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, Default)]
pub struct TraceOptions {
    /// Command to start; empty with `pid` set.
    pub command: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// Follow this running process tree instead of starting a command.
    pub pid: Option<u32>,
    /// The disks that are the lab's (its device, the disk holding its image): the machine
    /// check counts the others' traffic.
    pub own_disks: Vec<String>,
    /// With a command: also follow these running process trees (a server the command
    /// talks to, e.g. PostgreSQL under pgbench).
    pub also_follow: Vec<u32>,
    /// With `pid`: stop after this long (else when it exits or on Ctrl-C).
    pub duration: Option<Duration>,
    pub probes: ProbeOptions,
    /// Print the hook-set line to stderr.
    pub verbose: bool,
    /// After the command exits, kill the descendants it left running that use this
    /// filesystem (on a lab filesystem they would keep it busy and block the unmount).
    pub kill_leftovers_in: Option<PathBuf>,
    /// After the command exits, syncfs this filesystem with the probes still attached, so
    /// the block I/O of writing back what the command left dirty lands in this trace.
    pub sync_after: Option<PathBuf>,
    /// After the syncfs, freeze and thaw that filesystem (still traced): its deferred
    /// background work (xfs inode inactivation, btrfs cleanup) then lands here too.
    pub quiesce_after: bool,
    /// Kernel name of the device under test (loop0): per-device kernel threads of other
    /// devices (jbd2/vda-8) are not its background work.
    pub device_name: Option<String>,
    /// Where to write folded stacks and flame graphs (needs `probes.stacks`).
    pub flames: Option<FlameOutput>,
    /// Where to write the timeline (a Perfetto trace; needs `probes.timeline`).
    pub timeline: Option<PathBuf>,
}

/// File extension of a timeline, as Perfetto's UI names its traces.
pub const TIMELINE_EXT: &str = "perfetto-trace";

impl TraceOptions {
    /// Points everything at a lab filesystem: the command starts in it, only its device's
    /// block I/O counts, its tracepoints (with `fs_events`) and its per-device kernel threads
    /// and FUSE daemon are its own, leftovers in it are killed, and after the command it is
    /// synced and (with `quiesce`) frozen and thawed, all still traced.
    pub fn on_lab(&mut self, labfs: &LabFs, fs_events: FsEventSet, quiesce: bool) -> Result<()> {
        let mnt = labfs.mountpoint().to_path_buf();
        self.cwd = Some(mnt.clone());
        self.kill_leftovers_in = Some(mnt.clone());
        self.sync_after = Some(mnt);
        self.quiesce_after = quiesce;
        self.probes.devices = vec![labfs.kernel_dev()?];
        self.probes.fs_events = match fs_events {
            FsEventSet::Off => None,
            set => Some(FsTarget {
                kinds: vec![labfs.kind.name().to_string()],
                devs: vec![labfs.superblock_dev()?],
                learn: false,
                census: set == FsEventSet::Census,
            }),
        };
        self.probes.background_pids = labfs.daemon_pid().into_iter().collect();
        self.device_name = Some(labfs.device_name());
        self.own_disks = labfs.own_disks();
        Ok(())
    }
}

/// The fs events of a trace outside a lab. `on` names the filesystem to watch (the one
/// holding that path). Without it: the local filesystems holding the paths the command
/// names (its arguments, also words inside a `sh -c` script), else the one it starts in;
/// and, as it runs, every filesystem one of its threads fires an event on. Every local
/// filesystem kind mounted is attached, so a filesystem learned later has its events.
pub fn fs_events_outside_lab(
    set: FsEventSet,
    on: Option<&Path>,
    command: &[String],
    cwd: &Path,
) -> Result<Option<FsTarget>> {
    let census = set == FsEventSet::Census;
    if set == FsEventSet::Off {
        return Ok(None);
    }
    let mounts = lab::mountinfo::read();
    let local = |m: &&lab::mountinfo::MountEntry| LOCAL_FS.contains(&m.fstype.as_str());
    if let Some(path) = on {
        let path = path
            .canonicalize()
            .with_context(|| format!("--fs-events-on {}", path.display()))?;
        let m = lab::mountinfo::holding(&mounts, &path)
            .with_context(|| format!("no mount holds {}", path.display()))?;
        return Ok(Some(FsTarget {
            kinds: vec![m.fstype],
            devs: vec![m.dev],
            learn: false,
            census,
        }));
    }
    let mut devs: Vec<u32> = Vec::new();
    for p in named_paths(command, cwd) {
        if let Some(m) = lab::mountinfo::holding(&mounts, &p).filter(|m| local(&m))
            && !devs.contains(&m.dev)
        {
            devs.push(m.dev);
        }
    }
    if devs.is_empty()
        && let Some(m) = cwd
            .canonicalize()
            .ok()
            .and_then(|c| lab::mountinfo::holding(&mounts, &c))
            .filter(|m| local(&m))
    {
        devs.push(m.dev);
    }
    let mut kinds: Vec<String> = Vec::new();
    for m in mounts.iter().filter(local) {
        if !kinds.contains(&m.fstype) {
            kinds.push(m.fstype.clone());
        }
    }
    if kinds.is_empty() {
        return Ok(None);
    }
    Ok(Some(FsTarget {
        kinds,
        devs,
        learn: true,
        census,
    }))
}

/// Existing paths a command line names: each argument, and each word of an argument that
/// holds several (a shell script), that contains a `/` or starts with `.`, relative ones
/// taken from `cwd`. Programs are skipped: the command's own, and those it runs through a
/// wrapper (`time`, `taskset`, `sh -c`), which live on the root filesystem, not the one
/// under test — watching it also counts what a loop device does on its backing file there.
fn named_paths(command: &[String], cwd: &Path) -> Vec<PathBuf> {
    command
        .iter()
        .flat_map(|a| a.split_whitespace())
        .map(|w| w.trim_matches(['"', '\'']))
        // Only words shaped like paths: a bare word ("x", "f") that happens to name a file
        // in the cwd is not the target's filesystem (the cwd fallback covers bare names).
        .filter(|w| !w.starts_with('-') && (w.contains('/') || w.starts_with('.')))
        .filter_map(|w| cwd.join(w).canonicalize().ok())
        .filter(|p| !is_program(p))
        .collect()
}

fn is_program(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Filesystem types whose tracepoints fsprof knows (see `probes::fs_events::subsystems_for`).
const LOCAL_FS: &[&str] = &["ext2", "ext3", "ext4", "xfs", "btrfs", "fuseblk"];

/// Flame graph files of one trace: `{dir}/{stem}.{kind}.folded|svg`, titled `title`.
#[derive(Clone, Debug)]
pub struct FlameOutput {
    pub dir: PathBuf,
    pub stem: String,
    pub title: String,
    /// Also draw SVGs with this (a run draws them per cell, over all passes, instead).
    pub svg: Option<folded::Renderer>,
    /// Also write pprof profiles into this directory, with the same stem.
    pub pprof: Option<PathBuf>,
}

/// One traced interval, as printed and as written with `--json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TraceResult {
    pub schema_version: u32,
    pub fsprof_version: String,
    pub kernel: String,
    pub command: Vec<String>,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub wall_ns: u64,
    pub user_ns: u64,
    pub sys_ns: u64,
    pub hooks: Vec<String>,
    pub missing_hooks: Vec<String>,
    /// With `sync_after`: how long the syncfs took (returned → durable).
    pub syncfs_ns: Option<u64>,
    /// With `quiesce_after`: how long freeze + thaw took (durable → background work done);
    /// null when not done or the filesystem cannot be frozen.
    #[serde(default)]
    pub quiesce_ns: Option<u64>,
    pub profile: Profile,
    /// Stack totals and top stacks; null without stacks.
    #[serde(default)]
    pub stacks: Option<StackSummary>,
    /// Kernel threads' work for the filesystem (sampled); null without stacks.
    #[serde(default)]
    pub background: Option<BackgroundSummary>,
    /// Files written: "on-cpu.svg", "off-cpu.folded", … → path.
    #[serde(default)]
    pub flames: std::collections::BTreeMap<String, String>,
    /// fsprof's own time before and after the command, by phase (offsets, btf, load,
    /// unwind, verify, attach, fs_events, preload, collect, stacks): its start-up and tear-down cost.
    #[serde(default)]
    pub own_time_ns: std::collections::BTreeMap<String, u64>,
    /// What the whole machine did meanwhile; null when /proc/stat could not be read.
    #[serde(default)]
    pub machine: Option<MachineLoad>,
    /// The timeline written (`--timeline`); null without one.
    #[serde(default)]
    pub timeline: Option<TimelineSummary>,
}

/// The whole machine's CPU time while the target ran (/proc/stat, 10 ms ticks): user and
/// system time of every process and kernel thread, the target's included and the servers
/// it also follows (pgbench's PostgreSQL) left out, and time the hypervisor stole. `compare`
/// takes the target's own time off to see whether the machine was as quiet on both sides.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MachineLoad {
    pub user_ns: u64,
    pub steal_ns: u64,
    /// System, irq and softirq time; null in files of fsprof versions that did not keep it.
    #[serde(default)]
    pub system_ns: Option<u64>,
    /// In a lab: bytes read and written on the machine's other disks (not the lab's
    /// device, nor the disk holding its image), from /proc/diskstats; null outside one.
    #[serde(default)]
    pub other_disk_bytes: Option<u64>,
}

/// The machine's figures when the target started.
struct MachineBefore {
    cpu: Option<os::MachineCpu>,
    disks: Option<u64>,
    /// The followed servers' user and system time then, ns.
    servers: (u64, u64),
}

impl MachineBefore {
    fn now(opts: &TraceOptions) -> MachineBefore {
        MachineBefore {
            cpu: os::machine_cpu(),
            disks: other_disks(opts),
            servers: followed_cpu_ns(&opts.also_follow),
        }
    }
}

/// Bytes moved so far on the disks that are not the lab's (none outside a lab).
fn other_disks(opts: &TraceOptions) -> Option<u64> {
    (!opts.own_disks.is_empty()).then(|| os::disk_bytes(&opts.own_disks))?
}

impl MachineLoad {
    /// The machine's figures since `before`, the followed servers' time left out.
    fn since(before: &MachineBefore, opts: &TraceOptions) -> Option<MachineLoad> {
        let (b, a) = (before.cpu?, os::machine_cpu()?);
        let (now, then) = (followed_cpu_ns(&opts.also_follow), before.servers);
        let served = (now.0.saturating_sub(then.0), now.1.saturating_sub(then.1));
        let disks = (before.disks, other_disks(opts));
        Some(MachineLoad {
            user_ns: a.user.saturating_sub(b.user).saturating_sub(served.0),
            steal_ns: a.steal.saturating_sub(b.steal),
            system_ns: Some(a.system.saturating_sub(b.system).saturating_sub(served.1)),
            other_disk_bytes: match disks {
                (Some(b), Some(a)) => Some(a.saturating_sub(b)),
                _ => None,
            },
        })
    }
}

/// User and system time of processes followed beside the command (a step's server) so
/// far, ns.
fn followed_cpu_ns(pids: &[u32]) -> (u64, u64) {
    pids.iter()
        .filter_map(|&p| target::process_cpu(p))
        .map(|(user, sys)| (ns(user), ns(sys)))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// Syscalls that wait for children: a parent's time in them is its children's, counted
/// already in theirs.
pub const WAIT_FOR_CHILD: &[&str] = &["wait4", "waitid", "waitpid"];
/// The kernel function all of them wait in (kernel/exit.c).
pub const WAIT_FOR_CHILD_KERNEL: &str = "do_wait";

impl TraceResult {
    pub fn cpu_percent(&self) -> f64 {
        if self.wall_ns == 0 {
            return 0.0;
        }
        100.0 * (self.user_ns + self.sys_ns) as f64 / self.wall_ns as f64
    }

    /// Time a parent slept waiting for its children (in wait4 and its kind): at most the
    /// sleep class.
    pub fn waiting_for_children_ns(&self) -> u64 {
        let p = &self.profile;
        let waiting: u64 = (p.syscalls.iter())
            .filter(|s| WAIT_FOR_CHILD.contains(&s.name.as_str()))
            .map(|s| s.total_ns)
            .sum();
        waiting.min(p.time.sleep.ns)
    }

    /// The time classes as "where the time mostly went" reads them, everywhere it is said
    /// (summary, HTML, CSV, explain): a parent's sleep waiting for its children is the
    /// children's time, not a class of the step's.
    pub fn own_classes(&self) -> [(&'static str, u64); fsprof_common::TIME_CLASSES as usize] {
        let waiting = self.waiting_for_children_ns();
        let sleep = crate::aggregate::time_label(fsprof_common::TimeClass::Sleep);
        self.profile
            .time
            .labeled()
            .map(|(l, ns)| (l, if l == sleep { ns - waiting } else { ns }))
    }
}

/// Whether task `tid` has its cwd, root, executable or an open file under `dir`. Only such
/// tasks are killed: a followed thread id could in principle have been reused by now.
fn uses(tid: u32, dir: &std::path::Path) -> bool {
    let base = std::path::PathBuf::from(format!("/proc/{tid}"));
    let links = ["cwd", "root", "exe"].into_iter().map(|l| base.join(l));
    let fds = std::fs::read_dir(base.join("fd"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path());
    links
        .chain(fds)
        .filter_map(|l| std::fs::read_link(l).ok())
        .any(|target| target.starts_with(dir))
}

fn kill_leftovers(probes: &Probes, dir: &std::path::Path) -> Result<()> {
    let left: Vec<u32> = probes
        .followed()?
        .into_iter()
        .filter(|&t| uses(t, dir))
        .collect();
    if left.is_empty() {
        return Ok(());
    }
    eprintln!(
        "fsprof: killing {} task(s) the command left running in {}",
        left.len(),
        dir.display()
    );
    for &tid in &left {
        target::signal(tid, rustix::process::Signal::KILL);
    }
    let start = Instant::now();
    while left.iter().any(|&t| target::alive(t)) && start.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

fn finish_stacks(result: &mut TraceResult, st: &Stacks, out: Option<&FlameOutput>) -> Result<()> {
    result.stacks = Some(st.summary());
    result.background = Some(st.background_summary());
    if let Some(o) = out {
        let title = format!("{} · kernel {}", o.title, result.kernel);
        let mut written = folded::write_all(st, &o.dir, &o.stem, &title, o.svg)?;
        if let Some(dir) = &o.pprof {
            written.extend(crate::aggregate::pprof::write_all(
                st, dir, &o.stem, &title,
            )?);
        }
        result.flames = written
            .into_iter()
            .map(|(k, p)| (k, p.display().to_string()))
            .collect();
    }
    Ok(())
}

/// Traces `opts.command` on a fresh `kind` filesystem (`{mnt}` in the command is its mount
/// point, and its cwd) after the untraced `prepare` script; the filesystem is removed
/// afterwards whatever happens.
pub fn run_on_lab(
    kind: lab::FsKind,
    lab_opts: &lab::LabOptions,
    prepare: Option<&str>,
    fs_events: FsEventSet,
    mut opts: TraceOptions,
) -> Result<TraceResult> {
    signals::install();
    let labfs = LabFs::create(kind, lab_opts)?;
    eprintln!(
        "fsprof: {kind} on {} mounted at {} (mkfs {}, mount {})",
        labfs.device_path().display(),
        labfs.mountpoint().display(),
        crate::units::seconds(labfs.mkfs_time.as_nanos() as u64),
        crate::units::seconds(labfs.mount_time.as_nanos() as u64)
    );
    let mnt = labfs.mountpoint().to_string_lossy().into_owned();
    opts.command = opts
        .command
        .iter()
        .map(|a| a.replace("{mnt}", &mnt))
        .collect();
    opts.on_lab(&labfs, fs_events, true)?;
    if let Some(f) = &mut opts.flames {
        f.title = format!("{kind} · {}", f.title);
    }
    if let Some(script) = prepare {
        let script = script.replace("{mnt}", &mnt);
        eprintln!("fsprof: preparing (untraced): {script}");
        let status = std::process::Command::new("sh")
            .args(["-c", &script])
            .current_dir(labfs.mountpoint())
            .status()
            .context("running the --prepare command")?;
        if !status.success() {
            anyhow::bail!("--prepare command failed ({status}): {script}");
        }
        labfs.syncfs()?;
    }
    lab::drop_caches()?;
    signals::check()?;
    run(&opts)
}

/// Loads the unwind tables of a running process's program and libraries.
fn preload_running(probes: &Probes, pid: u32) {
    if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        probes.preload_unwind(&exe);
    }
}

/// Loads the probes, with what start-up waits on done side by side. aya's loader parses
/// the kernel's BTF (~30 ms) on a helper thread and then creates the maps (~35 ms, one
/// CPU); the BTF tracepoints' small BTF (`btf::tracepoints`) is made on another. This
/// thread meanwhile maps the kernel's symbols and reads the unwind tables of fsprof and of
/// the target's program (`while_loading`). btf_rs's parse (~80 ms) runs on another thread
/// only when the offsets, the tracepoints' ids or the fs events' device filters are not
/// kept from an earlier start of this boot (`probes::kept`); whoever needs a parse waits.
fn load_probes(opts: &TraceOptions) -> Result<Probes> {
    if !crate::probes::kept::all_kept(opts.probes.fs_events.is_some()) {
        std::thread::spawn(crate::probes::btf::parse_kernel);
    }
    crate::probes::btf::make_loader_ahead();
    std::thread::spawn(|| crate::probes::btf::tracepoints().is_ok());
    Probes::load_while(&opts.probes, || while_loading(opts))
}

/// What naming stacks needs, made ready while the object loads: the kernel's symbols
/// (blazesym's symbolizer, for user frames, is this thread's) and the unwind tables that
/// `preload` copies into the maps.
fn while_loading(opts: &TraceOptions) {
    if opts.probes.stacks.is_none() {
        return;
    }
    crate::aggregate::symbols::with(|s| {
        s.read_kernel_symbols();
    });
    let target = (opts.command.first()).and_then(|c| target::resolve_program(c).ok());
    let programs: Vec<_> = [std::env::current_exe().ok(), target]
        .into_iter()
        .flatten()
        .collect();
    crate::probes::unwind::warm(&programs);
}

pub fn run(opts: &TraceOptions) -> Result<TraceResult> {
    signals::install();
    let mut probes = load_probes(opts)?;
    if opts.verbose {
        eprintln!("{}", probes.describe());
    }
    let mut result = TraceResult {
        schema_version: SCHEMA_VERSION,
        fsprof_version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: os::kernel_release(),
        command: opts.command.clone(),
        pid: opts.pid,
        hooks: probes.attached.iter().map(|s| s.to_string()).collect(),
        missing_hooks: probes.missing.iter().map(|(s, _)| s.to_string()).collect(),
        ..Default::default()
    };
    probes.laps.skip();
    match opts.pid {
        Some(pid) => watch_running(&mut probes, opts, pid, &mut result)?,
        None => run_command(&mut probes, opts, &mut result)?,
    }
    finish(&mut probes, opts, &mut result)?;
    result.own_time_ns = probes.laps.ns.clone();
    Ok(result)
}

/// `--pid`: follows a running process tree until it ends, a signal, or `--duration`.
fn watch_running(
    probes: &mut Probes,
    opts: &TraceOptions,
    pid: u32,
    result: &mut TraceResult,
) -> Result<()> {
    preload_running(probes, pid);
    probes.laps.lap("preload");
    let before = target::process_cpu(pid);
    for (tid, state) in target::process_tree_threads(pid)? {
        probes.follow_running(tid, state)?;
    }
    probes.began_at = Some(crate::os::monotonic_ns());
    let start = Instant::now();
    let machine = MachineBefore::now(opts);
    while target::alive(pid)
        && signals::received().is_none()
        && opts.duration.is_none_or(|d| start.elapsed() < d)
    {
        thread::sleep(Duration::from_millis(50));
    }
    result.wall_ns = ns(start.elapsed());
    result.machine = MachineLoad::since(&machine, opts);
    if let (Some((u0, s0)), Some((u1, s1))) = (before, target::process_cpu(pid)) {
        result.user_ns = ns(u1.saturating_sub(u0));
        result.sys_ns = ns(s1.saturating_sub(s0));
    }
    Ok(())
}

/// Starts the command held before exec, follows it (and `also_follow`) and waits for it.
fn run_command(probes: &mut Probes, opts: &TraceOptions, result: &mut TraceResult) -> Result<()> {
    signals::check()?;
    for &pid in &opts.also_follow {
        preload_running(probes, pid);
        for (tid, state) in target::process_tree_threads(pid)? {
            probes.follow_running(tid, state)?;
        }
    }
    if let Ok(p) = target::resolve_program(&opts.command[0]) {
        probes.preload_unwind(&p);
    }
    probes.laps.lap("preload");
    let held = target::spawn_held(&opts.command, opts.cwd.as_deref())?;
    let pid = held.pid();
    probes.follow(pid, false)?;
    let machine = MachineBefore::now(opts);
    probes.began_at = Some(crate::os::monotonic_ns());
    let exit = held.run()?;
    result.machine = MachineLoad::since(&machine, opts);
    probes.await_final_switch(pid);
    result.exit_code = exit.code;
    result.exit_signal = exit.signal;
    result.wall_ns = ns(exit.wall);
    result.user_ns = ns(exit.user);
    result.sys_ns = ns(exit.sys);
    Ok(())
}

/// After the target: syncfs (probes still attached), following stopped, the maps read,
/// the stacks named, the timeline written (its off-CPU stacks named as the graphs name
/// them), leftovers killed.
fn finish(probes: &mut Probes, opts: &TraceOptions, result: &mut TraceResult) -> Result<()> {
    if let Some(fs) = &opts.sync_after {
        result.syncfs_ns = Some(ns(os::syncfs(fs)?));
        if opts.quiesce_after {
            result.quiesce_ns = quiesce::quiesce(fs)?.map(ns);
        }
    }
    probes.laps.skip();
    probes.freeze()?;
    let stream = probes.finish_timeline();
    let (profile, open) = aggregate::collect(probes)?;
    result.profile = profile;
    probes.laps.lap("collect");
    let watched = (result.profile.fs_events.iter()).flat_map(|f| &f.watched);
    let fs_types: Vec<String> = (watched.clone())
        .map(|w| w.fstype.clone())
        .filter(|t| !t.is_empty())
        .collect();
    // Outside a lab the block figures are of every disk: keep the target's filesystems'.
    if opts.device_name.is_none() {
        let sources: Vec<String> = watched.map(|w| w.source.clone()).collect();
        let rows = std::mem::take(&mut result.profile.block);
        (result.profile.block, result.profile.other_block) =
            aggregate::block::split_by_disk(rows, &sources);
    }
    let bg = stacks::Background {
        dev_name: opts.device_name.as_deref(),
        fs_types: &fs_types,
    };
    let stacks = stacks::collect(probes, &open, bg)?;
    if let Some(st) = &stacks {
        finish_stacks(result, st, opts.flames.as_ref())?;
    }
    probes.laps.lap("stacks");
    if let Some(stream) = stream {
        let off_cpu = aggregate::timeline::OffCpuStacks {
            named: stacks.as_ref().map(|s| &s.named),
            open: &open,
        };
        result.timeline = Some(write_timeline(
            probes,
            opts,
            stream?,
            &result.kernel,
            &off_cpu,
        )?);
    }
    if let Some(dir) = &opts.kill_leftovers_in
        && opts.pid.is_none()
    {
        kill_leftovers(probes, dir)?;
    }
    Ok(())
}

/// The timeline's stream written as a Perfetto trace to `--timeline`.
fn write_timeline(
    probes: &mut Probes,
    opts: &TraceOptions,
    stream: crate::probes::timeline::Stream,
    kernel: &str,
    off_cpu: &aggregate::timeline::OffCpuStacks,
) -> Result<aggregate::timeline::TimelineSummary> {
    let path = opts
        .timeline
        .as_deref()
        .context("a timeline without a file")?;
    let names = aggregate::timeline::SpanNames {
        pairs: probes
            .fs_events
            .iter()
            .flat_map(|f| f.pairs.iter().cloned())
            .collect(),
        syscall_min_ns: opts.probes.timeline.map_or(0, |t| t.syscall_min_ns),
    };
    let written = aggregate::timeline::write(
        path,
        stream,
        kernel,
        &names,
        off_cpu,
        aggregate::timeline::Following {
            began: probes.began_at,
            ended: probes.frozen_at,
        },
    )?;
    probes.laps.lap("timeline");
    Ok(written)
}
