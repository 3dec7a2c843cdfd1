//! Quiescing a filesystem: freeze and thaw it, which returns only when all its deferred
//! work is done (xfs inactivates unlinked inodes in background workers after unlink
//! returns; btrfs frees extents in its transaction kthread) and everything is on disk.
//! Done with the probes attached, so that work lands in the step that caused it.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use rustix::ioctl::{NoArg, Opcode, opcode};

// _IOWR('X', 119, int) and _IOWR('X', 120, int) in linux/fs.h; the kernel ignores the int.
const FIFREEZE: Opcode = opcode::read_write::<libc::c_int>(b'X', 119);
const FITHAW: Opcode = opcode::read_write::<libc::c_int>(b'X', 120);

fn ioctl<const OP: Opcode>(dir: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(dir)?;
    // SAFETY: OP is FIFREEZE or FITHAW, which take no memory from us.
    unsafe { rustix::ioctl::ioctl(&f, NoArg::<OP>::new()) }?;
    Ok(())
}

/// Thaws the filesystem at `dir` when dropped: a frozen filesystem is never left behind.
struct Frozen(PathBuf);

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = ioctl::<FITHAW>(&self.0);
    }
}

/// Freezes and thaws the filesystem mounted at `dir`; returns how long that took, or None
/// when the filesystem cannot be frozen (FUSE, or one already frozen by someone else).
pub fn quiesce(dir: &Path) -> Result<Option<Duration>> {
    let start = Instant::now();
    match ioctl::<FIFREEZE>(dir) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL | libc::EBUSY)
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e).with_context(|| format!("freezing {}", dir.display())),
    }
    let frozen = Frozen(dir.to_path_buf());
    drop(frozen);
    Ok(Some(start.elapsed()))
}

/// Thaws `dir` if frozen (for `fsprof cleanup` after a SIGKILL mid-quiesce).
pub fn thaw(dir: &Path) -> bool {
    ioctl::<FITHAW>(dir).is_ok()
}
