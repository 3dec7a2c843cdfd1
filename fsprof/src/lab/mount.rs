//! Mounting and unmounting, with the time each takes.

use std::{
    ffi::CString,
    fs,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// Splits mount(8)-style options into generic MS_* flags and the filesystem's own data
/// string (e.g. "noatime,data=writeback" → MS_NOATIME + "data=writeback").
pub fn split_options(options: &str) -> (libc::c_ulong, String) {
    let mut flags = 0;
    let mut data = Vec::new();
    for opt in options.split(',').filter(|o| !o.is_empty()) {
        flags |= match opt {
            "ro" => libc::MS_RDONLY,
            "noatime" => libc::MS_NOATIME,
            "nodiratime" => libc::MS_NODIRATIME,
            "relatime" => libc::MS_RELATIME,
            "strictatime" => libc::MS_STRICTATIME,
            "lazytime" => libc::MS_LAZYTIME,
            "sync" => libc::MS_SYNCHRONOUS,
            "dirsync" => libc::MS_DIRSYNC,
            "nodev" => libc::MS_NODEV,
            "nosuid" => libc::MS_NOSUID,
            "noexec" => libc::MS_NOEXEC,
            "rw" | "defaults" | "async" | "atime" => 0,
            _ => {
                data.push(opt);
                0
            }
        };
    }
    (flags, data.join(","))
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("paths have no NUL")
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
        let fstype_c = CString::new(fstype)?;
        let start = Instant::now();
        let rc = unsafe {
            libc::mount(
                cstr(device).as_ptr(),
                cstr(target).as_ptr(),
                fstype_c.as_ptr(),
                flags,
                if data.is_empty() {
                    std::ptr::null()
                } else {
                    data_c.as_ptr().cast()
                },
            )
        };
        let took = start.elapsed();
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            bail!(
                "mount -t {fstype} -o {options:?} {} {}: {e}",
                device.display(),
                target.display()
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
        let target = cstr(&self.target);
        for attempt in 0..50 {
            let start = Instant::now();
            if unsafe { libc::umount2(target.as_ptr(), 0) } == 0 {
                self.mounted = false;
                let _ = fs::remove_dir(&self.target);
                return Ok(start.elapsed());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) || attempt == 49 {
                return Err(e).with_context(|| format!("umount {}", self.target.display()));
            }
            thread::sleep(Duration::from_millis(100));
        }
        unreachable!()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.unmount().is_err() {
            // Last resort: detach lazily so the loop device can still go away.
            unsafe { libc::umount2(cstr(&self.target).as_ptr(), libc::MNT_DETACH) };
            let _ = fs::remove_dir(&self.target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_flags_are_not_data() {
        let (flags, data) = split_options("noatime,data=writeback,ro");
        assert_eq!(flags, libc::MS_NOATIME | libc::MS_RDONLY);
        assert_eq!(data, "data=writeback");
    }
}
