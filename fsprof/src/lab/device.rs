//! A user-named block device: used only when it is not mounted, not held by anything and
//! carries no filesystem or partition signature, unless the user forces it.

use std::{fs, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use super::{kernel_dev_of, mountinfo};
use fsprof_common::kdev;

/// Refuses `dev` with one line saying why, unless `force` (which still refuses a mounted
/// or held device: that would corrupt live data, not just old data).
pub fn check_user_device(dev: &Path, force: bool) -> Result<()> {
    let dev_t = kernel_dev_of(dev)?;
    let (major, minor) = kdev::split(dev_t);
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
    // O_EXCL on a block device fails with EBUSY while anyone has it open exclusively.
    use rustix::fs::{Mode, OFlags};
    if let Err(e) = rustix::fs::open(dev, OFlags::RDONLY | OFlags::EXCL, Mode::empty()) {
        bail!(
            "{} is in use ({}): refusing it",
            dev.display(),
            std::io::Error::from(e)
        );
    }
    if !force && let Some(sig) = signature(dev)? {
        bail!(
            "{} carries a {sig} signature (it may hold data): add --force to overwrite it",
            dev.display()
        );
    }
    Ok(())
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
