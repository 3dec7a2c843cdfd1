//! Sparse backing images attached as loop devices with direct I/O, so the page cache of
//! the filesystem under test is the only one in the way. An image is created exclusive
//! under the checked work directory's descriptor, and the loop device is set up from the
//! image's open file (LOOP_CONFIGURE, Linux 5.8; LOOP_SET_FD before), never by its path:
//! what is attached is the file fsprof made, whatever its name points to by then.

use std::{
    fs::File,
    os::fd::{AsRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use rustix::fs::{Mode, OFlags};

use super::workdir::WorkDir;

/// Image file names start with this, then the pid; `fsprof cleanup` relies on it.
pub const IMAGE_PREFIX: &str = "fsprof-";

/// A sparse file, removed on drop (by its name under the work directory's descriptor).
pub struct Image {
    pub path: PathBuf,
    pub file: File,
    dir: WorkDir,
}

impl Image {
    /// `fsprof-PID-RANDOM-tag.img` in the work directory `dir`, `size` bytes, sparse.
    pub fn create(dir: &Path, tag: &str, size: u64) -> Result<Image> {
        let dir = WorkDir::secure(dir)?;
        let prefix = format!("{IMAGE_PREFIX}{}-", std::process::id());
        let (file, path) = dir.create_file(&prefix, &format!("-{tag}.img"))?;
        file.set_len(size)
            .with_context(|| format!("sizing {} to {size} bytes", path.display()))?;
        // The loop device reads and writes it with direct I/O (the kernel sets this too
        // where the filesystem has it; tmpfs has not, and then the loop does without).
        if let Ok(flags) = rustix::fs::fcntl_getfl(&file) {
            let _ = rustix::fs::fcntl_setfl(&file, flags | OFlags::DIRECT);
        }
        Ok(Image { path, file, dir })
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        if let Some(name) = self.path.file_name() {
            self.dir.remove(name);
        }
    }
}

/// An attached loop device, detached on drop.
pub struct LoopDevice {
    pub path: PathBuf,
    fd: Option<OwnedFd>,
}

const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_SET_DIRECT_IO: libc::c_ulong = 0x4C08;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn ioctl(fd: &impl AsRawFd, request: libc::c_ulong, arg: libc::c_ulong) -> std::io::Result<i32> {
    // SAFETY: `request` is a loop ioctl given the argument it takes (a value or a pointer
    // to a live struct of its type).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) };
    match r {
        r if r < 0 => Err(std::io::Error::last_os_error()),
        r => Ok(r),
    }
}

fn info(flags: u32) -> LoopInfo64 {
    // SAFETY: loop_info64 is integers and byte arrays, valid when zeroed.
    let mut i: LoopInfo64 = unsafe { std::mem::zeroed() };
    i.flags = flags;
    i
}

impl LoopDevice {
    /// A free loop device set up on `image`'s open file, with direct I/O.
    pub fn attach(image: &Image) -> Result<LoopDevice> {
        let control = File::options()
            .read(true)
            .write(true)
            .open("/dev/loop-control")
            .context("opening /dev/loop-control (modprobe loop)")?;
        // Another program may take the free device first: then the next one.
        for _ in 0..16 {
            let n = ioctl(&control, LOOP_CTL_GET_FREE, 0).context("LOOP_CTL_GET_FREE")?;
            let path = PathBuf::from(format!("/dev/loop{n}"));
            let fd = rustix::fs::open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
                .map_err(std::io::Error::from)
                .with_context(|| format!("opening {}", path.display()))?;
            match configure(&fd, &image.file) {
                Ok(()) => return Ok(LoopDevice { path, fd: Some(fd) }),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("setting up {} on {}", path.display(), image.path.display())
                    });
                }
            }
        }
        bail!("no free loop device: others took each one fsprof was offered")
    }

    /// Detaches the loop device at `path` (what `fsprof cleanup` found).
    pub fn detach(path: &Path) -> Result<()> {
        let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        ioctl(&f, LOOP_CLR_FD, 0).with_context(|| format!("detaching {}", path.display()))?;
        Ok(())
    }
}

/// LOOP_CONFIGURE in one step; where the kernel lacks it (before 5.8), LOOP_SET_FD and
/// then the flags.
fn configure(dev: &OwnedFd, image: &File) -> std::io::Result<()> {
    let config = LoopConfig {
        fd: image.as_raw_fd() as u32,
        block_size: 0,
        info: info(LO_FLAGS_DIRECT_IO),
        reserved: [0; 8],
    };
    match ioctl(
        dev,
        LOOP_CONFIGURE,
        &config as *const LoopConfig as libc::c_ulong,
    ) {
        Ok(_) => return Ok(()),
        Err(e) if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOTTY)) => return Err(e),
        Err(_) => {}
    }
    ioctl(dev, LOOP_SET_FD, image.as_raw_fd() as libc::c_ulong)?;
    let status = info(0);
    let set = ioctl(
        dev,
        LOOP_SET_STATUS64,
        &status as *const LoopInfo64 as libc::c_ulong,
    )
    .and_then(|_| ioctl(dev, LOOP_SET_DIRECT_IO, 1));
    if let Err(e) = set {
        let _ = ioctl(dev, LOOP_CLR_FD, 0);
        return Err(e);
    }
    Ok(())
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            let _ = ioctl(&fd, LOOP_CLR_FD, 0);
        }
    }
}
