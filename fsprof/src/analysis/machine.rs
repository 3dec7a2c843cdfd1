//! Whether the machine was as quiet on both sides of a comparison. Other processes (a build
//! beside the benchmark, a backup) and the hypervisor (steal) take CPUs from the workload
//! between one run and the next; its run-queue time then moves in cells of every filesystem,
//! and so does the time its filesystem's kernel threads wait for one; the verdict rule, which
//! sees only the spread of each side's passes, would flag that as the filesystem's. The
//! measure is independent of the workload: the CPU time every other process and kernel
//! thread spent (user and system, the filesystem's own kernel threads and fsprof's programs
//! left out) and the time stolen, from /proc/stat around each cell (docs/design.md,
//! "Verdicts"). A neighbour busy in the kernel (a loop device under constant I/O) shows in
//! system time, which the check once left out.

use serde::Serialize;

use crate::results::StepRun;

/// A side's load differs from the other's by this many CPUs or more: the machine differed.
pub const DIFFERS_CPUS: f64 = 0.1;
/// Or the machine's other disks moved this many bytes a second more on one side (a quiet
/// machine moves none beside a lab cell).
pub const DIFFERS_DISK_BPS: f64 = 4.0 * 1024.0 * 1024.0;

#[derive(Clone, Debug, Default, Serialize, schemars::JsonSchema)]
pub struct MachineCheck {
    /// CPUs that other processes and kernel threads kept busy (user and system time, the
    /// filesystem's own kernel threads left out), plus CPUs stolen by the hypervisor,
    /// averaged over the wall time of the compared cells: base side.
    pub base_cpus: f64,
    pub new_cpus: f64,
    /// Bytes a second the machine's other disks moved (not the lab's device nor the disk
    /// of its image), each side; null when a side has no record of it.
    #[serde(default)]
    pub base_disk_bps: Option<f64>,
    #[serde(default)]
    pub new_disk_bps: Option<f64>,
    /// |new_cpus − base_cpus| ≥ `threshold_cpus` beyond the tick resolution of each side,
    /// or the other disks' rates ≥ `DIFFERS_DISK_BPS` apart.
    pub differed: bool,
    pub threshold_cpus: f64,
    /// Flags of times that include waiting, set aside (made inconclusive).
    pub set_aside: usize,
}

/// How far one pass's figure of other processes' CPU time may be off: /proc/stat counts in
/// USER_HZ ticks (10 ms) per CPU, so a difference of two reads is off by up to a tick per CPU
/// (2 here), and the target's own user time, taken from it, is counted differently (rusage).
/// Over a 14 ms cell that is worth 1.4 CPUs: CI once saw a 3-pass cell of 14 ms "differ".
const PASS_RESOLUTION_NS: f64 = 20e6;

/// CPU time of the machine that was not the target's, in one pass: other processes' user
/// and system time, kernel threads' but for the filesystem's background work, fsprof's own
/// programs left out too, and steal.
fn others_ns(s: &StepRun) -> Option<u64> {
    let (m, t) = (s.trace.machine?, &s.trace);
    let user = m.user_ns.saturating_sub(t.user_ns);
    let own_kernel = t.sys_ns
        + t.background.as_ref().map_or(0, |b| b.ns)
        + t.profile.probe_cost.as_ref().map_or(0, |c| c.run_ns);
    let system = m.system_ns.map_or(0, |sys| sys.saturating_sub(own_kernel));
    Some(user + system + m.steal_ns)
}

/// Other processes' and kernel threads' CPU plus steal, over wall, of these passes, and
/// how many CPUs that may be off by (`PASS_RESOLUTION_NS` per pass); None when one of them
/// has no record of the machine (results of an fsprof before it kept one).
fn load<'a>(passes: impl Iterator<Item = &'a StepRun>) -> Option<(f64, f64)> {
    let (mut other, mut wall, mut n) = (0u64, 0u64, 0u32);
    for s in passes {
        other += others_ns(s)?;
        wall += s.trace.wall_ns;
        n += 1;
    }
    (wall > 0).then(|| {
        let wall = wall as f64;
        (
            other as f64 / wall,
            f64::from(n) * PASS_RESOLUTION_NS / wall,
        )
    })
}

/// Bytes a second the other disks moved over these passes; None when one has no record.
fn disk_rate<'a>(passes: impl Iterator<Item = &'a StepRun>) -> Option<f64> {
    let (mut bytes, mut wall) = (0u64, 0u64);
    for s in passes {
        bytes += s.trace.machine?.other_disk_bytes?;
        wall += s.trace.wall_ns;
    }
    (wall > 0).then(|| bytes as f64 * 1e9 / wall as f64)
}

/// The check over the compared passes of each side.
pub fn check<'a>(
    base: impl Iterator<Item = &'a StepRun> + Clone,
    new: impl Iterator<Item = &'a StepRun> + Clone,
) -> Option<MachineCheck> {
    let ((b, b_off), (n, n_off)) = (load(base.clone())?, load(new.clone())?);
    let (bd, nd) = (disk_rate(base), disk_rate(new));
    let disks_apart = matches!((bd, nd), (Some(x), Some(y)) if (x - y).abs() >= DIFFERS_DISK_BPS);
    Some(MachineCheck {
        base_cpus: b,
        new_cpus: n,
        base_disk_bps: bd,
        new_disk_bps: nd,
        // Apart by the threshold beyond what the ticks can be off by.
        differed: (n - b).abs() - b_off - n_off >= DIFFERS_CPUS || disks_apart,
        threshold_cpus: DIFFERS_CPUS,
        set_aside: 0,
    })
}

impl MachineCheck {
    /// ", other disks moved X MiB/s during base, Y during new" when known.
    pub fn disks(&self) -> String {
        match (self.base_disk_bps, self.new_disk_bps) {
            (Some(b), Some(n)) => format!(
                ", the other disks moved {:.1} MiB/s during base, {:.1} during new",
                b / 1048576.0,
                n / 1048576.0
            ),
            _ => String::new(),
        }
    }

    /// The note of a comparison whose machine differed.
    pub fn describe(&self) -> String {
        format!(
            "the machine differed: other processes, kernel threads and the hypervisor took {:.2} CPUs during the base runs, {:.2} during the new ones (≥ {:.2} apart){}; {} flag{} of times that include waiting set aside as inconclusive (they may be the machine's; user, sys and kernel bg CPU time keep theirs): compare runs made on equally quiet machines",
            self.base_cpus,
            self.new_cpus,
            self.threshold_cpus,
            self.disks(),
            self.set_aside,
            if self.set_aside == 1 { "" } else { "s" },
        )
    }
}
