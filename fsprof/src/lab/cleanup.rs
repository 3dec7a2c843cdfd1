//! `fsprof cleanup`: removes what a killed run left behind, and only that: mounts under
//! /run/fsprof named fsprof-PID-*, loop devices backed by fsprof-PID-*.img images, and those
//! images, for PIDs that no longer run the process that made them.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Result;

use super::{
    DEFAULT_IMAGE_DIR, MOUNT_ROOT,
    loopdev::{IMAGE_PREFIX, LoopDevice},
};

/// PID encoded in an fsprof-PID-… name.
fn owner(name: &str) -> Option<u32> {
    name.strip_prefix(IMAGE_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// True when `path` (named fsprof-PID-…) was made by a process that is gone: no process
/// has its PID, or the one that has it started after `path` last changed (the PID was
/// reused). Judged by time, not by name: a run of a copy of fsprof, or of a test binary
/// linking it, is alive too. A path that cannot be read (a deleted image a loop device
/// still holds) is alive while its PID is.
fn orphaned(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(pid) = owner(file_name(path)) else {
        return false;
    };
    // ctime, which no one can set back (a mount point's: its filesystem's root, made by
    // the run's mkfs).
    let changed = fs::symlink_metadata(path)
        .ok()
        .map(|m| UNIX_EPOCH + Duration::new(m.ctime() as u64, m.ctime_nsec() as u32));
    gone(crate::os::process_started(pid), changed)
}

/// Whether the maker of a path last changed at `changed` is gone, its PID's process now
/// having started at `started`.
fn gone(started: Option<SystemTime>, changed: Option<SystemTime>) -> bool {
    match (started, changed) {
        (None, _) => true,
        (Some(s), Some(c)) => s > c,
        (Some(_), None) => false,
    }
}

fn file_name(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// Removes orphaned mounts, loop devices and images; returns what it did, one line each.
pub fn cleanup(image_dirs: &[&Path]) -> Result<Vec<String>> {
    let mut done = Vec::new();
    for m in super::mountinfo::read() {
        let target = m.point.to_string_lossy();
        if m.point.starts_with(MOUNT_ROOT) && orphaned(&m.point) {
            // A run killed during a quiesce leaves the filesystem frozen.
            super::quiesce::thaw(&m.point);
            if rustix::mount::unmount(&m.point, rustix::mount::UnmountFlags::DETACH).is_ok() {
                done.push(format!("unmounted {target}"));
            }
            let _ = fs::remove_dir(&m.point);
        }
    }
    if let Ok(entries) = fs::read_dir(MOUNT_ROOT) {
        for e in entries.flatten() {
            if orphaned(&e.path()) && fs::remove_dir(e.path()).is_ok() {
                done.push(format!("removed mount point {}", e.path().display()));
            }
        }
    }
    for (dev, back) in attached_loops() {
        // An image deleted while attached still pins its device.
        let img = Path::new(back.trim_end_matches(" (deleted)"));
        if file_name(img).ends_with(".img") && orphaned(img) && LoopDevice::detach(&dev).is_ok() {
            done.push(format!("detached {} ({back})", dev.display()));
        }
    }
    for dir in image_dirs {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !orphaned(&e.path()) {
                continue;
            }
            if name.ends_with(".img") {
                // A VM (`run --kernel`) whose fsprof died still runs on its image.
                for pid in processes_naming(&e.path()) {
                    if let Some(p) = rustix::process::Pid::from_raw(pid)
                        && rustix::process::kill_process(p, rustix::process::Signal::KILL).is_ok()
                    {
                        done.push(format!("killed process {pid} using {}", e.path().display()));
                    }
                }
                if fs::remove_file(e.path()).is_ok() {
                    done.push(format!("removed image {}", e.path().display()));
                }
            } else if name.ends_with("-vm")
                && e.file_type().is_ok_and(|t| t.is_dir())
                && fs::remove_dir_all(e.path()).is_ok()
            {
                done.push(format!("removed VM share {}", e.path().display()));
            }
        }
    }
    Ok(done)
}

/// Processes whose command line names `path` (qemu names its disk image there).
fn processes_naming(path: &Path) -> Vec<i32> {
    let needle = path.as_os_str().as_encoded_bytes();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(e.path().join("cmdline")).ok()?;
            cmdline
                .windows(needle.len())
                .any(|w| w == needle)
                .then_some(pid)
        })
        .collect()
}

/// Attached loop devices and their backing files, as the kernel lists them in
/// /sys/block/loopN/loop/backing_file (whole lines: a path may hold spaces).
fn attached_loops() -> Vec<(PathBuf, String)> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let back = fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            let dev = Path::new("/dev").join(e.file_name());
            Some((dev, back.trim_end_matches('\n').to_string()))
        })
        .collect()
}

pub fn default_image_dirs() -> Vec<&'static Path> {
    vec![Path::new(DEFAULT_IMAGE_DIR)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fsprof_names_have_owners() {
        assert_eq!(owner("fsprof-1234-ext4.img"), Some(1234));
        assert_eq!(owner("fsprof-1234-xfs"), Some(1234));
        assert_eq!(owner("other-1234.img"), None);
        assert!(!orphaned(Path::new("/var/tmp/important.img")));
    }

    /// This test's own file is alive, though the process is not called fsprof; under a
    /// PID that is gone it is not; nor under a PID whose process started after it changed.
    #[test]
    fn alive_by_start_time_not_by_name() {
        let dir = std::env::temp_dir();
        let mine = dir.join(format!(
            "{IMAGE_PREFIX}{}-cleanup-test.img",
            std::process::id()
        ));
        fs::write(&mine, b"").unwrap();
        assert!(!orphaned(&mine));
        let unused = dir.join(format!("{IMAGE_PREFIX}{}-cleanup-test.img", i32::MAX - 1));
        fs::write(&unused, b"").unwrap();
        assert!(orphaned(&unused));
        fs::remove_file(&unused).unwrap();
        fs::remove_file(&mine).unwrap();
        let t = |s| Some(UNIX_EPOCH + Duration::from_secs(s));
        assert!(gone(t(200), t(100)), "PID reused after the file was made");
        assert!(!gone(t(100), t(100)) && !gone(t(100), t(200)));
        assert!(
            !gone(t(100), None),
            "a deleted image is alive while its PID is"
        );
    }
}
