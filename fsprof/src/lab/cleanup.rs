//! `fsprof cleanup`: removes what a killed run left behind, and only that: mounts under
//! /run/fsprof named fsprof-PID-*, loop devices backed by fsprof-PID-*.img images, and those
//! images, for PIDs that are no longer a running fsprof.

use std::{fs, path::Path, process::Command};

use anyhow::Result;

use super::{DEFAULT_IMAGE_DIR, MOUNT_ROOT, loopdev::IMAGE_PREFIX};

/// PID encoded in an fsprof-PID-… name.
fn owner(name: &str) -> Option<u32> {
    name.strip_prefix(IMAGE_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// True when `name` belongs to no live fsprof process.
fn orphaned(name: &str) -> bool {
    match owner(name) {
        None => false,
        Some(pid) => fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim() != "fsprof")
            .unwrap_or(true),
    }
}

fn file_name(p: &str) -> &str {
    Path::new(p)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
}

/// Removes orphaned mounts, loop devices and images; returns what it did, one line each.
pub fn cleanup(image_dirs: &[&Path]) -> Result<Vec<String>> {
    let mut done = Vec::new();
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    for line in mounts.lines() {
        let Some(target) = line.split_whitespace().nth(1) else {
            continue;
        };
        if target.starts_with(MOUNT_ROOT) && orphaned(file_name(target)) {
            // A run killed during a quiesce leaves the filesystem frozen.
            super::quiesce::thaw(Path::new(target));
            if rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH).is_ok() {
                done.push(format!("unmounted {target}"));
            }
            let _ = fs::remove_dir(target);
        }
    }
    if let Ok(entries) = fs::read_dir(MOUNT_ROOT) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if orphaned(&name) && fs::remove_dir(e.path()).is_ok() {
                done.push(format!("removed mount point {}", e.path().display()));
            }
        }
    }
    let list = Command::new("losetup")
        .args(["--list", "--noheadings", "--output", "NAME,BACK-FILE"])
        .output()?;
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        let mut f = line.split_whitespace();
        let (Some(dev), Some(back)) = (f.next(), f.next()) else {
            continue;
        };
        let img = file_name(back);
        if img.ends_with(".img") && orphaned(img) {
            let ok = Command::new("losetup")
                .args(["-d", dev])
                .status()?
                .success();
            if ok {
                done.push(format!("detached {dev} ({back})"));
            }
        }
    }
    for dir in image_dirs {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".img") && orphaned(&name) && fs::remove_file(e.path()).is_ok() {
                done.push(format!("removed image {}", e.path().display()));
            }
        }
    }
    Ok(done)
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
        assert!(!orphaned("important.img"));
    }
}
