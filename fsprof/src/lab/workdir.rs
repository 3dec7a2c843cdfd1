//! The work directory (`--dir`, /var/tmp/fsprof by default) as only root controls it.
//! fsprof runs as root and keeps there what it formats (loop images), what its workloads
//! copy (sources) and what its VMs boot (kernels, the guest's fsprof): a user who could
//! write there, or swap the directory itself, could make a root fsprof format, copy or
//! boot a file of theirs. So the directory and every parent up to a sticky world-writable
//! one (/var/tmp) must belong to root and be writable by nobody else; fsprof creates what
//! is missing 0700, and files in it are made with O_EXCL|O_NOFOLLOW under an open
//! descriptor of the directory, names not guessable from the pid alone.

use std::{
    ffi::OsStr,
    fs::File,
    io::Read,
    os::{
        fd::OwnedFd,
        unix::fs::{DirBuilderExt, MetadataExt},
    },
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use rustix::fs::{Mode, OFlags};

const S_ISVTX: u32 = 0o1000;
const OTHERS_WRITE: u32 = 0o022;

/// A work directory checked safe and held open.
pub struct WorkDir {
    pub path: PathBuf,
    fd: OwnedFd,
}

impl WorkDir {
    /// Makes `dir` (0700, root's) where missing and checks it and its parents; refuses
    /// in one line, saying why and what to do, one that another user owns or can write.
    pub fn secure(dir: &Path) -> Result<WorkDir> {
        let dir = absolute(dir)?;
        check_parents(&dir)?;
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(&dir, flags, Mode::empty())
            .map_err(std::io::Error::from)
            .with_context(|| format!("opening {} (a symlink is refused)", dir.display()))?;
        let st = rustix::fs::fstat(&fd).map_err(std::io::Error::from)?;
        refuse_unsafe(&dir, st.st_uid, st.st_mode)?;
        Ok(WorkDir { path: dir, fd })
    }

    /// Creates a new file `prefix`-RANDOM-`suffix` in it, exclusive and not through a
    /// link, mode 0600: the file and its path.
    pub fn create_file(&self, prefix: &str, suffix: &str) -> Result<(File, PathBuf)> {
        let name = format!("{prefix}{}{suffix}", random_hex());
        let flags =
            OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::RDWR | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name.as_str(), flags, Mode::from_raw_mode(0o600))
            .map_err(std::io::Error::from)
            .with_context(|| format!("creating {}", self.path.join(&name).display()))?;
        Ok((File::from(fd), self.path.join(name)))
    }

    /// Removes `name` from it (whatever is there now: unlink does not follow links).
    pub fn remove(&self, name: &OsStr) {
        let _ = rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::empty());
    }

    /// A subdirectory made 0700 where missing (checked as the directory itself is).
    pub fn subdir(&self, name: &str) -> Result<WorkDir> {
        WorkDir::secure(&self.path.join(name))
    }
}

fn absolute(dir: &Path) -> Result<PathBuf> {
    match dir.is_absolute() {
        true => Ok(dir.to_path_buf()),
        false => Ok(std::env::current_dir()?.join(dir)),
    }
}

/// Whether a directory with `uid` and `mode` is safe for root to work in: root's (or
/// this user's), writable by nobody else.
fn refuse_unsafe(dir: &Path, uid: u32, mode: u32) -> Result<()> {
    let me = rustix::process::geteuid().as_raw();
    if uid != me && uid != 0 {
        bail!(
            "{} belongs to {}, not root: another user could put files there that fsprof, as root, would format or run; remove it or give --dir a directory of root's",
            dir.display(),
            user_name(uid)
        );
    }
    if mode & OTHERS_WRITE != 0 {
        bail!(
            "{} is writable by other users (mode {:o}): they could swap fsprof's files there; chmod 700 it or give --dir a directory only root can write",
            dir.display(),
            mode & 0o7777
        );
    }
    Ok(())
}

/// Every existing parent of `dir` below the nearest sticky world-writable one (/tmp,
/// /var/tmp: there each user keeps only their own names) must be safe too, else a user
/// could rename a directory on the way and put another in its place.
fn check_parents(dir: &Path) -> Result<()> {
    for p in dir.ancestors().skip(1) {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            continue; // made below by fsprof, 0700
        };
        if meta.file_type().is_symlink() {
            bail!(
                "{} is a symbolic link: give --dir a path without links (the directory it points to)",
                p.display()
            );
        }
        let mode = meta.mode();
        if mode & S_ISVTX != 0 && mode & 0o002 != 0 {
            return Ok(());
        }
        refuse_unsafe(p, meta.uid(), mode)?;
    }
    Ok(())
}

fn user_name(uid: u32) -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let name = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.get(2) == Some(&uid.to_string().as_str())).then(|| f[0].to_string())
    });
    match name {
        Some(n) => format!("user {n} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// 16 hex digits from the kernel's random source.
pub fn random_hex() -> String {
    let mut b = [0u8; 8];
    let read = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        // Never without randomness: the clock's nanoseconds and the pid, mixed.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        b = (t ^ u64::from(std::process::id()).rotate_left(32)).to_ne_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_users_and_group_or_world_write_are_refused() {
        let d = Path::new("/x");
        assert!(refuse_unsafe(d, 0, 0o40700).is_ok());
        assert!(refuse_unsafe(d, 0, 0o40755).is_ok());
        let other = refuse_unsafe(d, 65534, 0o40700).unwrap_err().to_string();
        assert!(
            other.contains("not root") && other.contains("--dir"),
            "{other}"
        );
        let world = refuse_unsafe(d, 0, 0o40777).unwrap_err().to_string();
        assert!(
            world.contains("writable by other users") && world.contains("chmod 700"),
            "{world}"
        );
        assert!(refuse_unsafe(d, 0, 0o40775).is_err());
    }

    #[test]
    fn random_names_differ() {
        assert_ne!(random_hex(), random_hex());
        assert_eq!(random_hex().len(), 16);
    }
}
