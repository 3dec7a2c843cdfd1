//! The lab: fresh filesystems on loop devices, made, mounted and always taken down again.

pub mod capacity;
pub mod cleanup;
pub mod crash;
pub mod device;
pub mod fs_kind;
pub mod loopdev;
pub mod mount;
pub mod mountinfo;
pub mod quiesce;
pub mod workdir;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub use capacity::Capacity;
pub use fs_kind::FsKind;
use loopdev::{Image, LoopDevice};
use mount::Mount;

use fsprof_common::kdev;

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
    /// A real block device to format instead of a loop image (checked by the caller with
    /// `device::check_user_device`).
    pub device: Option<PathBuf>,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            size: 1 << 30,
            image_dir: PathBuf::from(DEFAULT_IMAGE_DIR),
            mkfs_opts: Vec::new(),
            mount_opts: String::new(),
            device: None,
        }
    }
}

/// The name of a new lab filesystem of `kind` in this process: its kind, and a number
/// from the second one at once on (the crash study mounts one per update pattern).
fn instance_tag(kind: FsKind) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static MADE: AtomicU32 = AtomicU32::new(0);
    match MADE.fetch_add(1, Ordering::Relaxed) {
        0 => kind.name().to_string(),
        n => format!("{}.{n}", kind.name()),
    }
}

/// What the filesystem lives on. Loop fields drop in order: detach, then delete the image.
pub enum Backing {
    Loop { device: LoopDevice, image: Image },
    User(PathBuf),
}

/// A fresh, mounted filesystem. Fields drop in order: unmount first, then the backing.
pub struct LabFs {
    pub kind: FsKind,
    mount: Mount,
    pub backing: Backing,
    pub mkfs_time: Duration,
    pub mount_time: Duration,
    mount_opts: String,
}

impl LabFs {
    pub fn create(kind: FsKind, opts: &LabOptions) -> Result<LabFs> {
        kind.check_available()?;
        let tag = instance_tag(kind);
        let backing = match &opts.device {
            Some(dev) => Backing::User(dev.clone()),
            None => {
                let image = Image::create(&opts.image_dir, &tag, opts.size)?;
                let device = LoopDevice::attach(&image)?;
                Backing::Loop { device, image }
            }
        };
        let dev = match &backing {
            Backing::Loop { device, .. } => device.path.clone(),
            Backing::User(p) => p.clone(),
        };
        let (prog, args) = kind.mkfs();
        let start = Instant::now();
        let out = Command::new(prog)
            .args(args)
            .args(&opts.mkfs_opts)
            .arg(&dev)
            .output()
            .with_context(|| format!("running {prog}"))?;
        let mkfs_time = start.elapsed();
        if !out.status.success() {
            bail!(
                "{prog} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Self::mounted(kind, backing, &tag, &opts.mount_opts, mkfs_time)
    }

    /// Mounts the filesystem already on `device` (a crashed one replays its journal here:
    /// `mount_time` is its recovery), without making a new one.
    pub fn existing(kind: FsKind, device: &Path, mount_opts: &str) -> Result<LabFs> {
        kind.check_available()?;
        let tag = instance_tag(kind);
        let backing = Backing::User(device.to_path_buf());
        Self::mounted(kind, backing, &tag, mount_opts, Duration::ZERO)
    }

    fn mounted(
        kind: FsKind,
        backing: Backing,
        tag: &str,
        mount_opts: &str,
        mkfs_time: Duration,
    ) -> Result<LabFs> {
        let dev = match &backing {
            Backing::Loop { device, .. } => device.path.clone(),
            Backing::User(p) => p.clone(),
        };
        workdir::WorkDir::secure(Path::new(MOUNT_ROOT))?;
        let target = Path::new(MOUNT_ROOT).join(format!(
            "{}{}-{tag}",
            loopdev::IMAGE_PREFIX,
            std::process::id(),
        ));
        let (mount, mount_time) = match kind {
            FsKind::Ntfs => mount_ntfs3g(&dev, &target, mount_opts)?,
            _ => Mount::new(&dev, &target, kind.kernel_name(), mount_opts)?,
        };
        Ok(LabFs {
            kind,
            mount,
            backing,
            mkfs_time,
            mount_time,
            mount_opts: mount_opts.to_string(),
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mount.target
    }

    pub fn device_path(&self) -> &Path {
        match &self.backing {
            Backing::Loop { device, .. } => &device.path,
            Backing::User(p) => p,
        }
    }

    /// Kernel dev_t of the device, for the block-layer filter.
    pub fn kernel_dev(&self) -> Result<u32> {
        kernel_dev_of(self.device_path())
    }

    /// Size of the device in bytes.
    pub fn device_bytes(&self) -> u64 {
        let name = self
            .device_path()
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        crate::os::read_trimmed(format!("/sys/class/block/{name}/size"))
            .and_then(|s| s.parse::<u64>().ok())
            .map(|sectors| sectors * 512)
            .unwrap_or(0)
    }

    pub fn capacity(&self) -> Result<Capacity> {
        Capacity::of(self.mountpoint())
    }

    pub fn unmount(&mut self) -> Result<Duration> {
        self.mount.unmount()
    }

    /// Mounts it again where it was, after `unmount` (a crashed filesystem replays its
    /// journal here); returns how long the mount took.
    pub fn mount_again(&mut self) -> Result<Duration> {
        if self.kind == FsKind::Ntfs {
            bail!("ntfs: fsprof does not mount ntfs-3g again");
        }
        let target = self.mount.target.clone();
        let fstype = self.kind.kernel_name();
        let (mount, took) = Mount::new(self.device_path(), &target, fstype, &self.mount_opts)?;
        self.mount = mount;
        Ok(took)
    }

    /// Its superblock's dev_t (kernel encoding), which its own tracepoints lead to.
    pub fn superblock_dev(&self) -> Result<u32> {
        superblock_dev_of(self.mountpoint())
    }

    /// The userspace process serving the filesystem (ntfs-3g's FUSE daemon), if any: found
    /// by its command line naming the device and the mount point.
    pub fn daemon_pid(&self) -> Option<u32> {
        if self.kind != FsKind::Ntfs {
            return None;
        }
        let (dev, mnt) = (
            self.device_path().to_string_lossy().into_owned(),
            self.mountpoint().to_string_lossy().into_owned(),
        );
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<String> = cmd
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            (args.iter().any(|a| a == &dev) && args.iter().any(|a| a == &mnt)).then_some(pid)
        })
    }

    /// The disks this filesystem's I/O reaches: its device, and for a loop image the disk
    /// holding the image (kernel names).
    pub fn own_disks(&self) -> Vec<String> {
        let mut out = vec![self.device_name()];
        if let Backing::Loop { image, .. } = &self.backing
            && let Some(d) = disk_holding(&image.path)
        {
            out.push(d);
        }
        out
    }

    /// Kernel name of the device (loop0), for per-device kernel threads (jbd2/loop0-8).
    pub fn device_name(&self) -> String {
        self.device_path()
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned()
    }

    /// syncfs(2) on the mounted filesystem: everything written is on the device after it.
    pub fn syncfs(&self) -> Result<Duration> {
        crate::os::syncfs(self.mountpoint())
    }
}

/// NTFS runs in userspace: ntfs-3g mounts it over FUSE and returns once it is mounted.
fn mount_ntfs3g(dev: &Path, target: &Path, options: &str) -> Result<(Mount, Duration)> {
    std::fs::create_dir_all(target)?;
    let mut cmd = Command::new("ntfs-3g");
    if !options.is_empty() {
        cmd.args(["-o", options]);
    }
    let start = Instant::now();
    let out = cmd
        .arg(dev)
        .arg(target)
        .output()
        .context("running ntfs-3g")?;
    let took = start.elapsed();
    if !out.status.success() {
        let _ = std::fs::remove_dir(target);
        bail!(
            "ntfs-3g {}: {}",
            dev.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((Mount::adopt(target), took))
}

/// The kernel name of the whole disk holding the file at `path` (a partition's disk).
fn disk_holding(path: &Path) -> Option<String> {
    let st = rustix::fs::stat(path).ok()?;
    let (ma, mi) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{ma}:{mi}")).ok()?;
    let disk = match sys.join("partition").exists() {
        true => sys.parent()?.to_path_buf(),
        false => sys,
    };
    Some(disk.file_name()?.to_string_lossy().into_owned())
}

/// The superblock dev_t (kernel encoding) of the filesystem holding `path`, as mountinfo
/// shows it (stat's st_dev differs on btrfs, whose subvolumes have devices of their own).
pub fn superblock_dev_of(path: &Path) -> Result<u32> {
    let path = path
        .canonicalize()
        .with_context(|| format!("resolving {}", path.display()))?;
    mountinfo::holding(&mountinfo::read(), &path)
        .map(|m| m.dev)
        .with_context(|| format!("no mount holds {}", path.display()))
}

/// The filesystem kind holding `dir`, from statfs's magic number (None: not one fsprof
/// knows the tracepoints of).
pub fn fs_kind_of(dir: &Path) -> Option<&'static str> {
    let st = rustix::fs::statfs(dir).ok()?;
    Some(match st.f_type as u64 {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x6573_5546 => "fuse",
        _ => return None,
    })
}

/// Kernel dev_t (major << 20 | minor) of a block device node.
pub fn kernel_dev_of(path: &Path) -> Result<u32> {
    let st = rustix::fs::stat(path)
        .map_err(std::io::Error::from)
        .with_context(|| format!("stat {}", path.display()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::BlockDevice {
        bail!("{} is not a block device", path.display());
    }
    Ok(kdev::make(
        rustix::fs::major(st.st_rdev),
        rustix::fs::minor(st.st_rdev),
    ))
}

/// Writes back dirty data and empties the page, dentry and inode caches, so a step starts
/// cold as the classic benchmarks did after a reboot.
pub fn drop_caches() -> Result<()> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("writing /proc/sys/vm/drop_caches")
}
