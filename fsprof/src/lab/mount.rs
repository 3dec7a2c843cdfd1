//! Mounting and unmounting, with the time each takes.

use std::{
    ffi::CString,
    fs,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use rustix::{
    io::Errno,
    mount::{MountFlags, UnmountFlags, mount, unmount},
};

/// Splits mount(8)-style options into generic MS_* flags and the filesystem's own data
/// string (e.g. "noatime,data=writeback" → MS_NOATIME + "data=writeback").
pub fn split_options(options: &str) -> (MountFlags, String) {
    let mut flags = MountFlags::empty();
    let mut data = Vec::new();
    for opt in options.split(',').filter(|o| !o.is_empty()) {
        flags |= match opt {
            "ro" => MountFlags::RDONLY,
            "noatime" => MountFlags::NOATIME,
            "nodiratime" => MountFlags::NODIRATIME,
            "relatime" => MountFlags::RELATIME,
            "strictatime" => MountFlags::STRICTATIME,
            "lazytime" => MountFlags::LAZYTIME,
            "sync" => MountFlags::SYNCHRONOUS,
            "dirsync" => MountFlags::DIRSYNC,
            "nodev" => MountFlags::NODEV,
            "nosuid" => MountFlags::NOSUID,
            "noexec" => MountFlags::NOEXEC,
            "rw" | "defaults" | "async" | "atime" => MountFlags::empty(),
            _ => {
                data.push(opt);
                MountFlags::empty()
            }
        };
    }
    (flags, data.join(","))
}

/// A mounted filesystem, unmounted (and its mount point removed) on drop.
pub struct Mount {
    pub target: PathBuf,
    mounted: bool,
}

impl Mount {
    /// Mounts `device` (kernel fs type `fstype`) at a new directory `target`.
    pub fn new(
        device: &Path,
        target: &Path,
        fstype: &str,
        options: &str,
    ) -> Result<(Mount, Duration)> {
        fs::create_dir_all(target).with_context(|| format!("creating {}", target.display()))?;
        let mut m = Mount {
            target: target.to_path_buf(),
            mounted: false,
        };
        let (flags, data) = split_options(options);
        let data_c = CString::new(data.as_str())?;
        let log = KernelLog::from_now();
        let start = Instant::now();
        let rc = mount(
            device,
            target,
            fstype,
            flags,
            (!data.is_empty()).then_some(data_c.as_c_str()),
        );
        let took = start.elapsed();
        if let Err(e) = rc {
            bail!(
                "mount -t {fstype} -o {options:?} {} {}: {e}{}",
                device.display(),
                target.display(),
                log.last()
                    .map_or(String::new(), |k| format!(" (kernel: {k})"))
            );
        }
        m.mounted = true;
        Ok((m, took))
    }

    /// Wraps an existing mount (e.g. one made by ntfs-3g) so it is unmounted on drop.
    pub fn adopt(target: &Path) -> Mount {
        Mount {
            target: target.to_path_buf(),
            mounted: true,
        }
    }

    /// Unmounts, retrying briefly while busy; returns the time the successful call took.
    pub fn unmount(&mut self) -> Result<Duration> {
        if !self.mounted {
            let _ = fs::remove_dir(&self.target);
            return Ok(Duration::ZERO);
        }
        for attempt in 0..50 {
            let start = Instant::now();
            match unmount(&self.target, UnmountFlags::empty()) {
                Ok(()) => {
                    self.mounted = false;
                    let _ = fs::remove_dir(&self.target);
                    return Ok(start.elapsed());
                }
                Err(e) if e != Errno::BUSY || attempt == 49 => {
                    return Err(std::io::Error::from(e))
                        .with_context(|| format!("umount {}", self.target.display()));
                }
                Err(_) => thread::sleep(Duration::from_millis(100)),
            }
        }
        unreachable!()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.unmount().is_err() {
            // Last resort: detach lazily so the loop device can still go away.
            let _ = unmount(&self.target, UnmountFlags::DETACH);
            let _ = fs::remove_dir(&self.target);
        }
    }
}

/// The kernel log from a point on (/dev/kmsg read from its end): a refused mount's own
/// reason (`ext4: Unknown parameter 'x'`, `EXT4-fs (loop0): can't mount with
/// journal_async_commit in data=ordered mode`).
struct KernelLog(Option<fs::File>);

impl KernelLog {
    fn from_now() -> KernelLog {
        use std::{io::Seek, os::unix::fs::OpenOptionsExt};
        let f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .and_then(|mut f| f.seek(std::io::SeekFrom::End(0)).map(|_| f));
        KernelLog(f.ok())
    }

    /// The last message logged since `from_now`, other than a device's size change.
    fn last(self) -> Option<String> {
        use std::io::Read;
        let mut f = self.0?;
        let mut buf = [0u8; 8192];
        let mut last = None;
        // One record per read; EAGAIN when none is left (EPIPE: one was overwritten).
        for _ in 0..1000 {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let rec = String::from_utf8_lossy(&buf[..n]);
                    let msg = rec.split_once(';').map_or("", |x| x.1);
                    let msg = msg.lines().next().unwrap_or_default().trim();
                    if !msg.is_empty() && !msg.contains("capacity change") {
                        last = Some(msg.to_string());
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
                Err(_) => break,
            }
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_flags_are_not_data() {
        let (flags, data) = split_options("noatime,data=writeback,ro");
        assert_eq!(flags, MountFlags::NOATIME | MountFlags::RDONLY);
        assert_eq!(data, "data=writeback");
    }
}
