//! The filesystems fsprof knows, how to make them, and whether this machine can.

use std::{fmt, fs, process::Command};

use anyhow::{Result, bail};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "lowercase")]
pub enum FsKind {
    Ext2,
    Ext3,
    Ext4,
    Xfs,
    Btrfs,
    Ntfs,
    Jfs,
    Reiserfs,
    F2fs,
    Nilfs2,
}

impl FsKind {
    pub const ALL: &'static [FsKind] = <FsKind as strum::VariantArray>::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Result<FsKind> {
        let s = s.trim().to_ascii_lowercase();
        match FsKind::ALL
            .iter()
            .find(|k| k.name() == s || (s == "ntfs-3g" && **k == FsKind::Ntfs))
        {
            Some(k) => Ok(*k),
            None => {
                let known: Vec<_> = FsKind::ALL.iter().map(|k| k.name()).collect();
                bail!("unknown filesystem {s:?}; known: {}", known.join(", "))
            }
        }
    }

    /// Name in /proc/filesystems (ntfs-3g runs in userspace over FUSE).
    pub fn kernel_name(self) -> &'static str {
        match self {
            FsKind::Ntfs => "fuse",
            k => k.name(),
        }
    }

    /// mkfs program and its arguments before the device. ext* initialise inode tables and
    /// journal now, not in a background thread that would disturb the measurements.
    pub fn mkfs(self) -> (&'static str, &'static [&'static str]) {
        const EXT_INIT: &[&str] = &["-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0"];
        match self {
            FsKind::Ext2 => ("mkfs.ext2", EXT_INIT),
            FsKind::Ext3 => ("mkfs.ext3", EXT_INIT),
            FsKind::Ext4 => ("mkfs.ext4", EXT_INIT),
            FsKind::Xfs => ("mkfs.xfs", &["-f", "-q"]),
            FsKind::Btrfs => ("mkfs.btrfs", &["-f", "-q"]),
            FsKind::Ntfs => ("mkfs.ntfs", &["-F", "-Q", "-q"]),
            FsKind::Jfs => ("mkfs.jfs", &["-q"]),
            FsKind::Reiserfs => ("mkfs.reiserfs", &["-q", "-f"]),
            FsKind::F2fs => ("mkfs.f2fs", &["-f", "-q"]),
            FsKind::Nilfs2 => ("mkfs.nilfs2", &["-f", "-q"]),
        }
    }

    /// Debian package that ships the mkfs tool.
    pub fn package(self) -> &'static str {
        match self {
            FsKind::Ext2 | FsKind::Ext3 | FsKind::Ext4 => "e2fsprogs",
            FsKind::Xfs => "xfsprogs",
            FsKind::Btrfs => "btrfs-progs",
            FsKind::Ntfs => "ntfs-3g",
            FsKind::Jfs => "jfsutils",
            FsKind::Reiserfs => "reiserfsprogs",
            FsKind::F2fs => "f2fs-tools",
            FsKind::Nilfs2 => "nilfs-tools",
        }
    }

    /// Ok when the kernel and the tools support it, else the reason and the fix.
    pub fn check_available(self) -> Result<()> {
        if !kernel_supports(self.kernel_name()) {
            bail!(
                "{}: this kernel ({}) has no {} filesystem driver",
                self.name(),
                crate::os::kernel_release(),
                self.kernel_name()
            );
        }
        let tool = self.mkfs().0;
        if !on_path(tool) {
            bail!(
                "{}: {tool} not found; install it with `apt-get install {}`",
                self.name(),
                self.package()
            );
        }
        if self == FsKind::Ntfs && !on_path("ntfs-3g") {
            bail!("ntfs: ntfs-3g not found; install it with `apt-get install ntfs-3g`");
        }
        Ok(())
    }
}

impl fmt::Display for FsKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn listed(name: &str) -> bool {
    fs::read_to_string("/proc/filesystems")
        .map(|s| s.lines().any(|l| l.split_whitespace().last() == Some(name)))
        .unwrap_or(false)
}

/// Whether the kernel has the driver, loading its module first if needed.
pub fn kernel_supports(name: &str) -> bool {
    if listed(name) {
        return true;
    }
    let _ = Command::new("modprobe").args(["-q", name]).status();
    listed(name)
}

pub fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names() {
        assert_eq!(FsKind::parse("XFS").unwrap(), FsKind::Xfs);
        assert_eq!(FsKind::parse("ntfs-3g").unwrap(), FsKind::Ntfs);
        assert_eq!(FsKind::Nilfs2.name(), "nilfs2");
        for &k in FsKind::ALL {
            assert_eq!(FsKind::parse(k.name()).unwrap(), k);
        }
        let e = FsKind::parse("zfs").unwrap_err().to_string();
        assert!(
            e.contains("unknown filesystem") && e.contains("ext4"),
            "{e}"
        );
    }
}
