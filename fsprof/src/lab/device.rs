//! A user-named block device: used only when it is not mounted, not held by anything and
//! carries no filesystem or partition signature, unless the user forces it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::mountinfo;
use fsprof_common::kdev;

/// Refuses `dev` with one line saying why, unless `force` (which still refuses a mounted
/// or held device: that would corrupt live data, not just old data). The user's path is
/// opened once (exclusively: EBUSY while anyone holds it so) and everything is checked on
/// that descriptor's device; what fsprof formats afterwards is the kernel's own node of
/// that device (/dev/NAME, which only root can change), returned, never the path again.
pub fn check_user_device(dev: &Path, force: bool) -> Result<PathBuf> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(dev, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(std::io::Error::from)
        .with_context(|| format!("opening {}", dev.display()))?;
    let st = rustix::fs::fstat(&fd).map_err(std::io::Error::from)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::BlockDevice {
        bail!("{} is not a block device", dev.display());
    }
    let (major, minor) = (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev));
    let node = kernel_node(major, minor, st.st_rdev).with_context(|| {
        format!(
            "{}: the kernel's node of device {major}:{minor}",
            dev.display()
        )
    })?;
    let dev_t = kdev::make(major, minor);
    if let Some(m) = mountinfo::read().into_iter().find(|m| m.dev == dev_t) {
        bail!(
            "{} is mounted at {}: refusing to use it",
            dev.display(),
            m.point.display()
        );
    }
    let sys = format!("/sys/dev/block/{major}:{minor}");
    let holders = fs::read_dir(format!("{sys}/holders"))
        .map(|d| d.count())
        .unwrap_or(0);
    if holders > 0 {
        bail!(
            "{} is in use (held by device-mapper, md or another device): refusing it",
            dev.display()
        );
    }
    // O_EXCL on a block device fails with EBUSY while anyone has it open exclusively;
    // opened again through this descriptor, not the user's path.
    let again = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    let flags = OFlags::RDONLY | OFlags::EXCL | OFlags::CLOEXEC;
    if let Err(e) = rustix::fs::open(again.as_str(), flags, Mode::empty()) {
        let e = std::io::Error::from(e);
        bail!("{} is in use ({e}): refusing it", dev.display());
    }
    if !force && let Some(sig) = signature(&node)? {
        bail!(
            "{} carries a {sig} signature (it may hold data): add --force to overwrite it",
            dev.display()
        );
    }
    Ok(node)
}

/// /dev/NAME of device `major:minor` (its uevent's DEVNAME), when it is that device's node
/// itself, not a link.
fn kernel_node(major: u32, minor: u32, rdev: u64) -> Result<PathBuf> {
    let uevent = fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent"))?;
    let name = uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .context("no DEVNAME in its uevent")?;
    let node = Path::new("/dev").join(name);
    let st = rustix::fs::lstat(&node).map_err(std::io::Error::from)?;
    let block =
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::BlockDevice;
    if !block || st.st_rdev != rdev || st.st_uid != 0 {
        bail!("{} is not root's node of it", node.display());
    }
    Ok(node)
}

/// The filesystem or partition-table type blkid finds on `dev`, if any.
fn signature(dev: &Path) -> Result<Option<String>> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(dev)
        .output()
        .context("running blkid (util-linux)")?;
    // Exit 2: nothing found.
    if out.status.code() == Some(2) {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k).map(str::to_string))
    };
    Ok(Some(
        field("TYPE=")
            .or_else(|| field("PTTYPE=").map(|p| format!("{p} partition table")))
            .unwrap_or_else(|| "data".into()),
    ))
}
