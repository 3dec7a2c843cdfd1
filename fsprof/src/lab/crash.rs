//! Crashing a lab filesystem on the host, bringing it back and checking it: the shutdown
//! ioctl without a log flush (what xfstests' `_scratch_shutdown` does, the nearest thing to a
//! power cut a running kernel offers), a mount that replays the journal, and the
//! filesystem's own checker in read-only mode.

use std::{
    os::fd::AsRawFd,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{FsKind, LabFs};

/// `FS_IOC_SHUTDOWN` (`_IOR('X', 125, __u32)`, shared by ext4, xfs and f2fs).
const FS_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587d;
/// Neither the log nor dirty data is flushed: what was not on the device is gone.
const SHUTDOWN_NOLOGFLUSH: u32 = 2;

/// How a filesystem was crashed; results of different methods are never mixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum CrashMethod {
    /// `FS_IOC_SHUTDOWN` with `FSOP_GOING_FLAGS_NOLOGFLUSH` on the running host kernel.
    ShutdownIoctl,
    /// A VM killed whole (qemu SIGKILL): the guest's memory is lost, what its disks
    /// acknowledged stays (cache=none; the host does not crash, so no write it was given is
    /// lost, as with a disk whose cache survives the cut).
    PowerCut,
}

impl CrashMethod {
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The method for `kind` on this host, or why there is none.
    pub fn on_host(kind: FsKind) -> Result<CrashMethod> {
        match kind {
            FsKind::Ext4 | FsKind::Xfs | FsKind::F2fs => Ok(CrashMethod::ShutdownIoctl),
            k => bail!(
                "cannot crash {k} on this host: its kernel driver has no shutdown ioctl \
                 (ext4, xfs and f2fs have one): cut a VM's power instead, with --kernel (e.g. \
                 --kernel deb:linux-image-amd64)"
            ),
        }
    }
}

/// Shuts the filesystem at `mountpoint` down as a power cut would leave it: every later
/// operation fails with EIO, and nothing more reaches the device.
pub fn shutdown(mountpoint: &Path) -> Result<()> {
    let dir = std::fs::File::open(mountpoint)
        .with_context(|| format!("opening {}", mountpoint.display()))?;
    let flags = SHUTDOWN_NOLOGFLUSH;
    // SAFETY: FS_IOC_SHUTDOWN reads one u32 through the pointer, which points to a live
    // local; the fd is open for the whole call.
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), FS_IOC_SHUTDOWN, &flags as *const u32) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("FS_IOC_SHUTDOWN on {}", mountpoint.display()));
    }
    Ok(())
}

/// The read-only check of one crashed, replayed filesystem.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Fsck {
    pub took: Duration,
    /// The checker found nothing to repair.
    pub clean: bool,
    /// Its first line of complaint when not clean.
    pub detail: String,
}

/// The filesystem's checker and its read-only options (exit status 0: nothing to repair).
fn fsck_command(kind: FsKind) -> Option<(&'static str, &'static [&'static str])> {
    match kind {
        FsKind::Ext2 | FsKind::Ext3 | FsKind::Ext4 => Some(("e2fsck", &["-f", "-n"])),
        FsKind::Xfs => Some(("xfs_repair", &["-n"])),
        FsKind::Btrfs => Some(("btrfs", &["check", "--readonly"])),
        FsKind::F2fs => Some(("fsck.f2fs", &["--dry-run"])),
        FsKind::Jfs => Some(("fsck.jfs", &["-n", "-f"])),
        FsKind::Reiserfs => Some(("reiserfsck", &["--check", "-f", "-y", "-q"])),
        _ => None,
    }
}

/// What boot runs before mounting a filesystem whose kernel driver does not replay its log:
/// jfs refuses to mount with a dirty log (EINVAL), and its fsck replays it (`-a`: replay,
/// check only if still dirty).
fn replay_command(kind: FsKind) -> Option<(&'static str, &'static [&'static str])> {
    match kind {
        FsKind::Jfs => Some(("fsck.jfs", &["-a"])),
        _ => None,
    }
}

/// A log replayed by the filesystem's own tool: how long it took, and what it said went
/// wrong (jfs's `fsck.jfs -a` reports "logredo failed" and goes on with the log
/// unreplayed, exit status 0: the mount then shows what the log did not bring back).
#[derive(Clone, Debug, Default)]
pub struct Replayed {
    pub took: Duration,
    pub complaint: Option<String>,
}

/// Replays the log of a crashed filesystem on `device` where mounting does not (see
/// `replay_command`); zero time and no complaint where the mount replays it.
pub fn replay(kind: FsKind, device: &Path) -> Result<Replayed> {
    let Some((prog, args)) = replay_command(kind) else {
        return Ok(Replayed::default());
    };
    let (took, out) = run_on(prog, args, device)?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // 0: clean; 1: errors corrected.
    if out.status.code().is_none_or(|c| c > 1) {
        bail!(
            "{prog} {} failed ({}): {}",
            args.join(" "),
            out.status,
            text.lines().last().unwrap_or("")
        );
    }
    Ok(Replayed {
        took,
        complaint: complaint(&text).map(|c| format!("{prog} {}: {c}", args.join(" "))),
    })
}

/// The lines of a tool's output that say something failed, joined.
fn complaint(text: &str) -> Option<String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("fail") || l.contains("error")
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// Runs `prog ARGS device`, timed.
fn run_on(prog: &str, args: &[&str], device: &Path) -> Result<(Duration, std::process::Output)> {
    let start = Instant::now();
    let out = Command::new(prog)
        .args(args)
        .arg(device)
        .output()
        .with_context(|| format!("running {prog}"))?;
    Ok((start.elapsed(), out))
}

/// Runs the read-only checker on `device`; None when the filesystem has none fsprof knows.
pub fn fsck(kind: FsKind, device: &Path) -> Result<Option<Fsck>> {
    let Some((prog, args)) = fsck_command(kind) else {
        return Ok(None);
    };
    let (took, out) = run_on(prog, args, device)?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let clean = out.status.success();
    let detail = if clean {
        String::new()
    } else {
        text.lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_string()
    };
    Ok(Some(Fsck {
        took,
        clean,
        detail,
    }))
}

impl LabFs {
    /// Crashes the filesystem (`method`), unmounts what is left and mounts it again,
    /// which replays its journal. Run `checked` after reading what the application finds.
    pub fn crash_and_remount(&mut self, method: CrashMethod) -> Result<Duration> {
        match method {
            CrashMethod::ShutdownIoctl => shutdown(self.mountpoint())?,
            CrashMethod::PowerCut => bail!("a power cut is the VM's: the guest cannot cut its own"),
        }
        self.unmount()?;
        self.mount_again()
    }

    /// Unmounts and runs the read-only checker: how the crash left the filesystem.
    pub fn checked(&mut self) -> Result<Option<Fsck>> {
        self.unmount()?;
        fsck(self.kind, self.device_path())
    }
}

/// How long a filesystem may keep a finished update in memory before it commits it: the
/// interval of its periodic journal commit or log write (from the mount options or the
/// kernel's default).
pub fn commit_interval(kind: FsKind, mount_opts: &str) -> Duration {
    let option = mount_opts
        .split(',')
        .find_map(|o| o.strip_prefix("commit="))
        .and_then(|v| v.parse::<u64>().ok());
    // The kernels' defaults: jbd2's JBD2_DEFAULT_MAX_COMMIT_AGE, btrfs' and reiserfs' 30 s
    // commit age, f2fs' checkpoint interval, nilfs2's segment constructor timeout.
    let secs = match kind {
        FsKind::Ext3 | FsKind::Ext4 => option.unwrap_or(5),
        FsKind::Btrfs | FsKind::Reiserfs => option.unwrap_or(30),
        FsKind::Xfs => crate::os::read_trimmed("/proc/sys/fs/xfs/xfssyncd_centisecs")
            .and_then(|s| s.parse::<u64>().ok())
            .map_or(30, |cs| cs.div_ceil(100)),
        FsKind::F2fs => 60,
        FsKind::Nilfs2 => 5,
        // jfs and ext2 have no commit of their own: writeback's 30 s expiry.
        _ => 30,
    };
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_interval_follows_the_mount_option() {
        assert_eq!(
            commit_interval(FsKind::Ext4, "data=journal,commit=2"),
            Duration::from_secs(2)
        );
        assert_eq!(commit_interval(FsKind::Ext4, ""), Duration::from_secs(5));
        assert_eq!(commit_interval(FsKind::Btrfs, ""), Duration::from_secs(30));
    }

    #[test]
    fn hosts_crash_only_what_has_the_ioctl() {
        assert!(CrashMethod::on_host(FsKind::Xfs).is_ok());
        let e = CrashMethod::on_host(FsKind::Btrfs).unwrap_err().to_string();
        assert!(
            e.contains("no shutdown ioctl") && e.contains("--kernel"),
            "{e}"
        );
    }
}
