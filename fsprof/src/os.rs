//! Small operating-system helpers every layer may use; this module imports nothing of
//! fsprof's.

use std::{
    io::Read,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

/// Reads a whole small file into a String, trimmed.
pub fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    let mut s = String::new();
    std::fs::File::open(path)
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    Some(s.trim().to_string())
}

/// Writes `text` to `path` atomically (a temp file beside it, then rename): a reader, a
/// full disk or a kill mid-write never leaves half a file over a good one.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = std::path::PathBuf::from(tmp);
    let written = std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Refuses, before any work, output paths fsprof could not write at the end: a file or
/// directory must go in a directory that exists and takes new files (tried with a file of
/// its own, removed at once).
pub fn ensure_writable<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    for p in paths {
        let dir = match p.is_dir() {
            true => p,
            false => p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
        };
        let probe = dir.join(format!(".fsprof-write-{}", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .with_context(|| {
                format!(
                    "cannot write {}: {} takes no new file",
                    p.display(),
                    dir.display()
                )
            })?;
        let _ = std::fs::remove_file(&probe);
    }
    Ok(())
}

/// Lap times of fsprof's own work, by phase name (ns), for its start-up and tear-down cost.
#[derive(Debug)]
pub struct Laps {
    last: std::time::Instant,
    pub ns: std::collections::BTreeMap<String, u64>,
}

impl Laps {
    pub fn start() -> Laps {
        Laps {
            last: std::time::Instant::now(),
            ns: Default::default(),
        }
    }

    /// Ends phase `name` (added to it when it recurs) and starts the next.
    pub fn lap(&mut self, name: &str) {
        let now = std::time::Instant::now();
        *self.ns.entry(name.to_string()).or_default() += (now - self.last).as_nanos() as u64;
        self.last = now;
    }

    /// Starts the next phase now, leaving out the time since the last lap.
    pub fn skip(&mut self) {
        self.last = std::time::Instant::now();
    }
}

/// CLOCK_MONOTONIC in ns: the clock of bpf_ktime_get_ns and of the kernel log's stamps.
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Waits until every BPF program running now has returned: the kernel runs tracing
/// programs inside an RCU read-side section, and MEMBARRIER_CMD_GLOBAL is one
/// synchronize_rcu (a single CPU needs none: this call could not run beside one).
pub fn bpf_programs_settle() -> Result<()> {
    use rustix::thread::{MembarrierCommand, membarrier};
    membarrier(MembarrierCommand::Global).context("membarrier(MEMBARRIER_CMD_GLOBAL)")
}

/// CPU time the scheduler has charged thread `tid` (`se.sum_exec_runtime`, the first field
/// of /proc/<tid>/schedstat), ns; None once it has gone.
pub fn sum_exec_runtime(tid: u32) -> Option<u64> {
    schedstat(tid).map(|s| s[0])
}

/// /proc/<tid>/schedstat: CPU time charged (ns), time waiting on a run queue (ns), and
/// the timeslices it has run.
pub fn schedstat(tid: u32) -> Option<[u64; 3]> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/schedstat")).ok()?;
    let mut f = s.split_whitespace().map(|x| x.parse::<u64>().ok());
    Some([f.next()??, f.next()??, f.next()??])
}

/// /proc/PID/stat from its third field on: comm may contain spaces and parens, so the
/// fields restart after the last ')'.
fn stat_after_comm(pid: u32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(s[s.rfind(')')? + 2..].to_string())
}

/// The state letter of thread `tid` (R, S, D, …: /proc/TID/stat's third field).
pub fn task_state(tid: u32) -> Option<char> {
    stat_after_comm(tid)?.chars().next()
}

/// Field `n` (1-based, as in proc(5)) of /proc/PID/stat.
pub fn stat_field(pid: u32, n: usize) -> Option<u64> {
    stat_after_comm(pid)?.split(' ').nth(n - 3)?.parse().ok()
}

/// A pipe, both ends close-on-exec: no command fsprof runs holds an end of fsprof's.
pub fn pipe() -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(std::io::Error::from)
        .context("pipe2")
}

/// When process `pid` started (wall clock, never later than it did: /proc/stat's boot
/// time is in whole seconds, rounded down); None when it is gone.
pub fn process_started(pid: u32) -> Option<std::time::SystemTime> {
    let ticks = stat_field(pid, 22)?;
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let boot: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let tick = u128::from(rustix::param::clock_ticks_per_second());
    let since_boot = Duration::from_nanos((u128::from(ticks) * 1_000_000_000 / tick) as u64);
    Some(std::time::UNIX_EPOCH + Duration::from_secs(boot) + since_boot)
}

/// The machine's CPU time so far from /proc/stat's `cpu` line, ns: (user + nice of every
/// process, steal). The kernel keeps it in USER_HZ ticks (10 ms), so it is fine over a run of
/// many cells, coarse over one short cell.
pub fn machine_cpu() -> Option<MachineCpu> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let hz = rustix::param::clock_ticks_per_second().max(1);
    let ns = |ticks: u64| ticks * (1_000_000_000 / hz);
    // user nice system idle iowait irq softirq steal …
    Some(MachineCpu {
        user: ns(f.first()? + f.get(1)?),
        system: ns(f.get(2)? + f.get(5)? + f.get(6)?),
        steal: ns(*f.get(7)?),
    })
}

/// Bytes read and written so far on the machine's whole disks but `exclude` (kernel
/// names), from /proc/diskstats (sectors of 512 bytes).
pub fn disk_bytes(exclude: &[String]) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/diskstats").ok()?;
    let mut bytes = 0;
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(&name) = f.get(2) else { continue };
        let whole = Path::new("/sys/block").join(name).exists();
        if !whole || exclude.iter().any(|e| e == name) {
            continue;
        }
        let sectors = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        bytes += (sectors(5) + sectors(9)) * 512;
    }
    Some(bytes)
}

/// The whole machine's CPU time so far, ns: in user mode, in the kernel (system, irq,
/// softirq), stolen by the hypervisor.
#[derive(Clone, Copy, Debug)]
pub struct MachineCpu {
    pub user: u64,
    pub system: u64,
    pub steal: u64,
}

/// The machine's name (/proc/sys/kernel/hostname).
/// Page cache bytes dirty and under writeback, machine-wide (/proc/vmstat `nr_dirty`,
/// `nr_writeback`, in pages).
pub fn dirty_bytes() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    let pages = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let page = rustix::param::page_size() as u64;
    Some((pages("nr_dirty")? * page, pages("nr_writeback")? * page))
}

pub fn hostname() -> String {
    read_trimmed("/proc/sys/kernel/hostname").unwrap_or_default()
}

/// The running kernel's build (`uname -v`: build number, options, date).
pub fn kernel_build() -> String {
    read_trimmed("/proc/sys/kernel/version").unwrap_or_default()
}

/// 128 random bits in hex, from the kernel's generator: an id no other run shares.
pub fn random_id() -> String {
    let mut b = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        // No /dev/urandom: time and pid still tell runs apart.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        b[..8].copy_from_slice(&t.as_nanos().to_le_bytes()[..8]);
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn kernel_release() -> String {
    read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default()
}

/// syncfs(2) on the filesystem holding `path`; returns how long it took.
pub fn syncfs(path: &Path) -> Result<Duration> {
    let f = std::fs::File::open(path)?;
    let start = Instant::now();
    rustix::fs::syncfs(&f)
        .map_err(std::io::Error::from)
        .context("syncfs")?;
    Ok(start.elapsed())
}
