//! Helpers for the integration tests: they run as root against the real kernel, on loop
//! filesystems that are always removed (the lab types clean up in `Drop`, also on panic).

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use fsprof::{
    lab::{FsKind, LabFs, LabOptions},
    trace::{self, TraceOptions, TraceResult},
};

/// getppid calls made by each `spawner child` and each `spawner tree` thread.
pub const CHILD_CALLS: u64 = 3;
pub const THREAD_CALLS: u64 = 20;

/// Whether the tests that load eBPF and make loop filesystems can run.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    euid == 0
}

/// A fresh filesystem of `kind` and `size` bytes, with images under /var/tmp/fsprof-tests.
pub fn lab(kind: FsKind, size: u64, mount_opts: &str) -> LabFs {
    let opts = LabOptions {
        size,
        image_dir: PathBuf::from("/var/tmp/fsprof-tests"),
        mount_opts: mount_opts.to_string(),
        ..Default::default()
    };
    LabFs::create(kind, &opts).expect("creating lab filesystem")
}

pub fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// Traces `command` started in `cwd`.
pub fn trace(command: Vec<String>, cwd: Option<&Path>) -> TraceResult {
    let opts = TraceOptions {
        command,
        cwd: cwd.map(Path::to_path_buf),
        ..Default::default()
    };
    checked_trace(trace::run(&opts).expect("tracing"))
}

/// Fails naming every invariant of `fsprof check` that does not hold, with its figures.
fn assert_checks(c: &fsprof::check::Checks, what: &str) {
    let failed = c.failed();
    assert!(
        failed.is_empty() && c.unreadable.is_empty(),
        "fsprof check of {what} failed ({}):\n{}",
        failed.join(", "),
        c.render()
    );
}

/// `fsprof check` of outputs a test wrote (results files, graphs, profiles, timelines,
/// history stores): every invariant that applies holds, and some applies.
pub fn checked(paths: &[&Path]) {
    let c = check_all(paths);
    assert!(
        c.checked_any(),
        "nothing to check in {paths:?}:\n{}",
        c.render()
    );
}

fn check_all(paths: &[&Path]) -> fsprof::check::Checks {
    let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let c = fsprof::check::check_paths(&paths);
    assert_checks(&c, &paths.join(" "));
    c
}

/// A `fsprof run` results file, checked first (a run whose every cell failed has nothing
/// to check).
pub fn load_run(path: &Path) -> fsprof::results::RunResult {
    check_all(&[path]);
    fsprof::results::RunResult::load(path).expect("reading run results")
}

/// A crash study's results file, checked first.
pub fn load_study(path: &Path) -> fsprof::results::crash::CrashStudy {
    checked(&[path]);
    serde_json::from_str(&fs::read_to_string(path).unwrap()).expect("reading a crash study")
}

/// The same for a trace run in this process: its figures and the files it wrote (paths
/// relative to the current directory).
pub fn checked_trace(t: TraceResult) -> TraceResult {
    let mut c = fsprof::check::Checks::default();
    fsprof::check::check_trace_result(&mut c, "trace", &t, Path::new("."))
        .expect("reading the trace's outputs");
    assert_checks(&c, &format!("a trace of {:?}", t.command));
    t
}

/// Makes a nested tree: `dirs` directories with `files` small files each, some nested.
pub fn make_tree(root: &Path, dirs: u32, files: u32) -> Result<()> {
    for d in 0..dirs {
        let dir = root.join(format!("dir{d}")).join(format!("sub{}", d % 3));
        fs::create_dir_all(&dir)?;
        for f in 0..files {
            fs::write(
                dir.join(format!("file{f}")),
                vec![b'x'; (f as usize * 37) % 3000],
            )?;
        }
    }
    Ok(())
}

/// Per-syscall call counts of `command` as `strace -c -f` sees them.
pub fn strace_counts(command: &[String], cwd: &Path) -> Result<BTreeMap<String, u64>> {
    let out = cwd.join(".strace-summary");
    let status = Command::new("strace")
        .args(["-c", "-f", "-U", "name,calls", "-o"])
        .arg(&out)
        .args(command)
        .current_dir(cwd)
        .status()
        .context("running strace (apt-get install strace)")?;
    if !status.success() {
        bail!("strace {command:?} failed: {status}");
    }
    let text = fs::read_to_string(&out)?;
    fs::remove_file(&out)?;
    Ok(strace_summary(&text))
}

/// Per-syscall call counts of a `strace -c -U name,calls` summary.
pub fn strace_summary(text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if let (Some(name), Some(n)) = (it.next(), it.next())
            && let Ok(n) = n.parse::<u64>()
            && name != "total"
        {
            counts.insert(name.to_string(), n);
        }
    }
    counts
}

/// Per-syscall counts from an fsprof result.
pub fn fsprof_counts(r: &TraceResult) -> BTreeMap<String, u64> {
    r.profile
        .syscalls
        .iter()
        .map(|s| (s.name.clone(), s.count))
        .collect()
}

/// The fields of /sys/block/NAME/stat (Documentation/block/stat.rst), 0-based.
pub fn sysfs_block_stat(dev: &Path) -> Vec<u64> {
    let name = dev.file_name().unwrap().to_string_lossy();
    let stat = fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
    stat.split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

/// Waits until the device is idle: no request in flight (/sys/block/NAME/inflight) and its
/// stat unchanged since the last look. A request that completes between a probe attaching
/// and a stat snapshot (or between the last snapshot and the probes' read-out) would be
/// counted by one side only.
pub fn wait_block_idle(dev: &Path) {
    let name = dev.file_name().unwrap().to_string_lossy().into_owned();
    let inflight = format!("/sys/block/{name}/inflight");
    let mut last = sysfs_block_stat(dev);
    wait_until(
        &format!("{name} idle"),
        std::time::Duration::from_secs(60),
        || {
            let now = sysfs_block_stat(dev);
            let idle =
                fs::read_to_string(&inflight).is_ok_and(|t| t.split_whitespace().all(|n| n == "0"));
            let still = now == last;
            last = now;
            idle && still
        },
    );
}

/// The state letter of process `pid` (/proc/PID/stat), None when it is gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Polls `ready` every 20 ms until it holds: a test goes on the moment the event it needs
/// happens. `limit` is only a safety net: past it the test fails, naming what never came.
pub fn wait_until(what: &str, limit: std::time::Duration, mut ready: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !ready() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Mounts of fsprof process `pid` (its images and mount points carry its PID).
pub fn mounts_of(pid: u32) -> usize {
    let me = format!("fsprof-{pid}-");
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts.lines().filter(|l| l.contains(&me)).count()
}

/// A neighbour busy in the kernel beside a test's target: a fresh ext4 lab filesystem
/// written in a loop (its page cache, its loop device, its journal, writeback), stopped
/// and taken down when dropped, also when the test fails.
pub struct Neighbour {
    shell: std::process::Child,
    pub fs: LabFs,
}

impl Neighbour {
    pub fn start() -> Neighbour {
        let fs = lab(FsKind::Ext4, 512 << 20, "");
        let f = fs.mountpoint().join("f");
        // Small buffered writes: most of its time is its own system time (copies into the
        // page cache), the rest its filesystem's writeback through the loop device.
        let script = format!(
            "while :; do dd if=/dev/zero of={} bs=4k count=20000 status=none; done",
            f.display()
        );
        let shell = Command::new("sh").args(["-c", &script]).spawn().unwrap();
        let n = Neighbour { shell, fs };
        // Busy: its device has moved data.
        let first = sysfs_block_stat(n.fs.device_path());
        wait_until(
            "the neighbour writing",
            std::time::Duration::from_secs(30),
            || sysfs_block_stat(n.fs.device_path())[6] > first[6],
        );
        n
    }

    /// The neighbour's device as block rows name it ("major:minor").
    pub fn dev(&self) -> String {
        let (ma, mi) = fsprof_common::kdev::split(self.fs.kernel_dev().unwrap());
        format!("{ma}:{mi}")
    }

    /// The loop, then its dd (named by the mount point), before the filesystem goes.
    fn stop(&mut self) {
        let _ = self.shell.kill();
        let _ = self.shell.wait();
        let m = self.fs.mountpoint().display().to_string();
        let _ = Command::new("pkill").args(["-KILL", "-f", &m]).status();
        let running = || {
            Command::new("pgrep")
                .args(["-f", &m])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        wait_until(
            "the neighbour's dd gone",
            std::time::Duration::from_secs(30),
            || !running(),
        );
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Fails with the command's stderr unless it exited 0.
pub fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `fsprof trace ARGS --json JSON -- sh -c SCRIPT`, which must succeed: what it said on
/// stderr, and its result read back.
/// Its flame graphs go beside JSON unless ARGS say where (never into the test's cwd).
pub fn trace_sh(args: &[&str], json: &Path, script: &str) -> (String, TraceResult) {
    let flames = json.with_extension("flames");
    let own_flames = !args.iter().any(|a| *a == "--flames" || *a == "--no-stacks");
    let run = Command::new(fsprof_bin())
        .arg("trace")
        .args(args)
        .args(own_flames.then_some("--flames"))
        .args(own_flames.then_some(&flames))
        .arg("--json")
        .arg(json)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert_success(&run);
    if own_flames {
        checked(&[json, &flames]);
    } else {
        checked(&[json]);
    }
    let result = serde_json::from_str(&fs::read_to_string(json).unwrap()).unwrap();
    (String::from_utf8_lossy(&run.stderr).into_owned(), result)
}

/// fsprof's binary, built next to the test executables (target/<profile>/fsprof).
/// A small crash study on ext4 (crashed at once, no cost pass) of `patterns`, recorded
/// in `history`, written to `json`: add arguments (`--label`) and run it.
pub fn small_crash_study(trials: u32, patterns: &str, history: &str, json: &Path) -> Command {
    let mut c = Command::new(fsprof_bin());
    c.args(["crash", "--fs", "ext4", "--at", "now", "--size", "256M"])
        .args(["--trials", &trials.to_string(), "--pattern", patterns])
        .args(["--cost-updates", "0", "--history", history, "--json"])
        .arg(json);
    c
}

pub fn fsprof_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("fsprof");
    assert!(
        bin.exists(),
        "{} missing: build the workspace first (cargo xtask test does)",
        bin.display()
    );
    bin
}

pub fn drop_caches() {
    fsprof::lab::drop_caches().expect("dropping caches");
}

/// Traces `command` in `cwd` with stacks on, flame files in `flames`, and the fs events
/// of the filesystem at `fs` (when given, with its device as the block filter).
pub fn trace_with_stacks(
    command: Vec<String>,
    cwd: Option<&Path>,
    fs: Option<&LabFs>,
    flames: &Path,
) -> TraceResult {
    let stacks = fsprof::probes::StackOptions::default();
    trace_with_stack_options(command, cwd, fs, flames, stacks)
}

pub fn trace_with_stack_options(
    command: Vec<String>,
    cwd: Option<&Path>,
    fs: Option<&LabFs>,
    flames: &Path,
    stacks: fsprof::probes::StackOptions,
) -> TraceResult {
    let mut opts = TraceOptions {
        command,
        cwd: cwd.map(Path::to_path_buf),
        flames: Some(trace::FlameOutput {
            dir: flames.to_path_buf(),
            stem: "t".into(),
            title: "test".into(),
            svg: Some(fsprof::report::flame::render),
            pprof: None,
        }),
        ..Default::default()
    };
    opts.probes.stacks = Some(stacks);
    if let Some(fs) = fs {
        opts.on_lab(fs, fsprof::probes::FsEventSet::Curated, true)
            .unwrap();
        if let Some(c) = cwd {
            opts.cwd = Some(c.to_path_buf());
        }
    }
    checked_trace(trace::run(&opts).expect("tracing"))
}

/// A fresh directory for a test's output files, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("fsprof-test-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A folded stack file: stack → weight.
pub fn read_folded(path: &Path) -> BTreeMap<String, u64> {
    fsprof::aggregate::folded::read_folded(path).expect("reading folded stacks")
}

/// Background time a FUSE daemon (e.g. "ntfs-3g") spent serving the trace's target.
pub fn fs_daemon_ns(bg: &fsprof::aggregate::stacks::BackgroundSummary, daemon: &str) -> u64 {
    let class = format!("fs daemon ({daemon}");
    bg.by_class
        .iter()
        .filter(|(c, _)| c.starts_with(&class))
        .map(|(_, ns)| ns)
        .sum()
}

/// Bytes of one block request class (read, write, …) over all devices of a trace.
pub fn block_bytes(r: &TraceResult, class: &str) -> u64 {
    r.profile
        .block
        .iter()
        .filter(|b| b.class == class)
        .map(|b| b.bytes)
        .sum()
}

/// A running `fsprof` child that has attached its probes, killed (SIGKILL) and reaped if
/// the test fails before it ends it, so a failing assert leaves no tracer running.
pub struct Attached {
    child: Option<std::process::Child>,
    /// What it printed on stderr up to "attached tracepoints".
    pub stderr: String,
}

impl Attached {
    /// Starts `fsprof ARGS` and returns once it says it attached its probes.
    pub fn spawn(args: &[&str]) -> Attached {
        let mut child = Command::new(fsprof_bin())
            .args(args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = child.stderr.take().unwrap();
        let mut seen = String::new();
        let mut buf = [0u8; 512];
        let mut a = Attached {
            child: Some(child),
            stderr: String::new(),
        };
        while !seen.contains("attached tracepoints") {
            let n = std::io::Read::read(&mut err, &mut buf).unwrap();
            assert!(n > 0, "fsprof ended before attaching: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        // Keep reading, so the child never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        a.stderr = seen;
        a
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends `signal` and waits: the exit status.
    pub fn signal(mut self, signal: i32) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, signal) };
        child.wait().unwrap()
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `fsprof cleanup` when the test panics while this is alive: what a killed run left
/// (mount, loop device, image) does not outlive a failing test.
pub struct CleanupOnFailure;

impl Drop for CleanupOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = Command::new(fsprof_bin()).arg("cleanup").output();
        }
    }
}

/// The type of the filesystem that holds `p` (from /proc/self/mountinfo).
pub fn fs_kind_of(p: &Path) -> String {
    let m = fsprof::lab::mountinfo::holding(
        &fsprof::lab::mountinfo::read(),
        &p.canonicalize().unwrap(),
    )
    .unwrap();
    m.fstype
}

/// On-CPU and run-queue ns the scheduler charged the threads of `pid`
/// (/proc/PID/task/*/schedstat): the independent figure for fsprof's time split.
pub fn schedstat(pid: u32) -> (u64, u64) {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .map(|s| {
            let v: Vec<u64> = s
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (v[0], v[1])
        })
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// fsprof lost no event. Requests the kernel ends without `block_rq_complete` (bpftrace on
/// the same tracepoint misses them too: docs/design.md, "Block layer") are counted as unseen,
/// not lost by fsprof: a few per thousand requests at most.
pub fn assert_nothing_lost(profile: &fsprof::aggregate::Profile, what: &str) {
    let (unseen, issued) = unseen_of(profile, what);
    assert_unseen_bound(unseen, issued, what);
}

/// Asserts no loss but unseen block completions; returns (unseen, requests issued), for a
/// bound over many cells (one cell of a few hundred requests may meet a few).
pub fn unseen_of(profile: &fsprof::aggregate::Profile, what: &str) -> (u64, u64) {
    let mut lost = profile.lost.clone();
    let unseen = lost
        .remove(fsprof::aggregate::block::LOST_UNSEEN)
        .unwrap_or(0);
    assert!(lost.is_empty(), "{what}: {lost:?}");
    (unseen, profile.block.iter().map(|b| b.issued).sum())
}

/// At most 0.2 %: single cells of random reads have met ~35 unseen of ~850 (ext4
/// bonnie-rand-stat, btrfs iozone-randread). The quick suite: 16 in a run of the build
/// before session 32's probe changes (one cell 13), 13, 72 and 140 of ~95,000 after; whether
/// those changes play a part is not settled, and the cause is not found yet.
pub fn assert_unseen_bound(unseen: u64, issued: u64, what: &str) {
    assert!(
        unseen <= 2 + issued / 500,
        "{what}: {unseen} of {issued} requests unseen"
    );
}

/// Nothing of fsprof process `pid` (its names carry its PID) is left: mount, loop device,
/// image.
pub fn assert_nothing_left_of(pid: u32) {
    let me = format!("fsprof-{pid}-");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(&me), "{mounts}");
    let loops =
        String::from_utf8_lossy(&Command::new("losetup").arg("-a").output().unwrap().stdout)
            .into_owned();
    assert!(!loops.contains(&me), "{loops}");
    let images: Vec<String> = std::fs::read_dir("/var/tmp/fsprof")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&me))
        .collect();
    assert!(images.is_empty(), "{images:?}");
}
