//! The lab: fresh filesystems on loop devices, made, mounted and always taken down again.

pub mod fs_kind;
pub mod loopdev;
pub mod mount;

use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub use fs_kind::FsKind;
use loopdev::{Image, LoopDevice};
use mount::Mount;

use crate::aggregate::make_kdev;

/// Where images and mount points go unless told otherwise. Images must not live on tmpfs:
/// the loop device's direct I/O would then measure memory, not a disk.
pub const DEFAULT_IMAGE_DIR: &str = "/var/tmp/fsprof";
pub const MOUNT_ROOT: &str = "/run/fsprof";

#[derive(Clone, Debug)]
pub struct LabOptions {
    pub size: u64,
    pub image_dir: PathBuf,
    pub mkfs_opts: Vec<String>,
    pub mount_opts: String,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            size: 1 << 30,
            image_dir: PathBuf::from(DEFAULT_IMAGE_DIR),
            mkfs_opts: Vec::new(),
            mount_opts: String::new(),
        }
    }
}

/// A fresh, mounted filesystem. Fields drop in order: unmount, detach, delete the image.
pub struct LabFs {
    pub kind: FsKind,
    mount: Mount,
    pub device: LoopDevice,
    pub image: Image,
    pub mkfs_time: Duration,
    pub mount_time: Duration,
}

impl LabFs {
    pub fn create(kind: FsKind, opts: &LabOptions) -> Result<LabFs> {
        kind.check_available()?;
        let image = Image::create(&opts.image_dir, kind.name(), opts.size)?;
        let device = LoopDevice::attach(&image.path)?;
        let (prog, args) = kind.mkfs();
        let start = Instant::now();
        let out = Command::new(prog)
            .args(args)
            .args(&opts.mkfs_opts)
            .arg(&device.path)
            .output()
            .with_context(|| format!("running {prog}"))?;
        let mkfs_time = start.elapsed();
        if !out.status.success() {
            bail!(
                "{prog} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let target = Path::new(MOUNT_ROOT).join(format!(
            "{}{}-{}",
            loopdev::IMAGE_PREFIX,
            std::process::id(),
            kind.name()
        ));
        let (mount, mount_time) =
            Mount::new(&device.path, &target, kind.kernel_name(), &opts.mount_opts)?;
        Ok(LabFs {
            kind,
            mount,
            device,
            image,
            mkfs_time,
            mount_time,
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mount.target
    }

    /// Kernel dev_t of the loop device, for the block-layer filter.
    pub fn kernel_dev(&self) -> Result<u32> {
        kernel_dev_of(&self.device.path)
    }

    pub fn unmount(&mut self) -> Result<Duration> {
        self.mount.unmount()
    }

    /// syncfs(2) on the mounted filesystem: everything written is on the device after it.
    pub fn syncfs(&self) -> Result<Duration> {
        let f = std::fs::File::open(self.mountpoint())?;
        let start = Instant::now();
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) } != 0 {
            return Err(std::io::Error::last_os_error()).context("syncfs");
        }
        Ok(start.elapsed())
    }
}

/// Kernel dev_t (major << 20 | minor) of a block device node.
pub fn kernel_dev_of(path: &Path) -> Result<u32> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::stat(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("stat {}", path.display()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFBLK {
        bail!("{} is not a block device", path.display());
    }
    Ok(make_kdev(libc::major(st.st_rdev), libc::minor(st.st_rdev)))
}

/// Writes back dirty data and empties the page, dentry and inode caches, so a step starts
/// cold as the classic benchmarks did after a reboot.
pub fn drop_caches() -> Result<()> {
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("writing /proc/sys/vm/drop_caches")
}
