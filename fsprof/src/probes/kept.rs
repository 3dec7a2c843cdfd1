//! What fsprof reads from the kernel at every start, kept for this boot: the struct offsets,
//! the BTF tracepoints' typedef ids and the fs events' device filters (each takes btf_rs's
//! parse of the kernel's BTF, ~80 ms of CPU), the kernel's text symbols (/proc/kallsyms
//! takes ~45 ms of kernel time to print), and ELF files' compiled unwind tables. A copy in
//! /run/fsprof spares it.
//! A copy belongs to one boot, and (but for the symbols, `Kept::of_boot`) one BTF file and
//! one fsprof binary, so another boot, kernel or build of fsprof (whose answers may differ)
//! misses and reads again. Copies are root's alone (mode 0600): kernel addresses are not for
//! every user.

use std::{
    hash::{Hash, Hasher},
    io::Write,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

/// The running kernel's BTF: the struct offsets, tracepoint types and device filters come
/// from it, and what is kept is kept for it (its size and time key each copy).
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The copy of the struct offsets (`offsets::probe_config_kept`).
pub const OFFSETS: &str = "offsets-";
/// The copy of the fs events' device filters (`fs_events::device_filters`).
pub const FS_EVENTS: &str = "fs-events-";
/// The copy of the BTF tracepoints' typedef ids (`btf::tracepoints`).
pub const TRACE_IDS: &str = "btf-trace-ids-";
/// The copy of the kernel's text symbols (`aggregate::kallsyms`, a table searched in
/// place; "kallsyms-" held the text blazesym parsed).
pub const KALLSYMS: &str = "ksyms-";
/// The copies of ELF files' unwind tables (`unwind`), one per file: this, the file's
/// device and inode, then the hash.
pub const UNWIND: &str = "unwind-";

/// One kept copy: its file, named by its kind's prefix and the hash of what it belongs to.
pub struct Kept {
    path: PathBuf,
    prefix: String,
}

impl Kept {
    /// The copy of `prefix`'s answers for this boot, BTF file and fsprof binary; None when
    /// one of them cannot be read.
    pub fn of(prefix: &str) -> Option<Kept> {
        Kept::of_with(prefix, "")
    }

    /// `of`, for answers that also depend on `extra` (a file's size and time, say).
    pub fn of_with(prefix: &str, extra: &str) -> Option<Kept> {
        let exe = std::fs::metadata("/proc/self/exe").ok()?;
        let btf = std::fs::metadata(VMLINUX_BTF).ok()?;
        let exe_id = (exe.dev(), exe.ino(), exe.mtime(), exe.mtime_nsec());
        let btf_id = (VMLINUX_BTF, btf.len(), btf.mtime(), btf.mtime_nsec());
        Kept::of_boot(prefix, &format!("{exe_id:?} {btf_id:?} {extra}"))
    }

    /// The copy of answers that depend on the boot and `extra` alone, not on fsprof's
    /// build: every fsprof of this boot reads the same copy.
    pub fn of_boot(prefix: &str, extra: &str) -> Option<Kept> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (boot.trim(), extra).hash(&mut h);
        let dir = Path::new(crate::lab::MOUNT_ROOT);
        Some(Kept::in_dir(dir, prefix, &format!("{:016x}", h.finish())))
    }

    pub(crate) fn in_dir(dir: &Path, prefix: &str, key: &str) -> Kept {
        Kept {
            path: dir.join(format!("{prefix}{key}")),
            prefix: prefix.to_string(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    pub fn read(&self) -> Option<Vec<u8>> {
        std::fs::read(&self.path).ok()
    }

    /// Writes the copy whole or not at all (a temporary file renamed), dropping the copies
    /// of its kind that other boots or builds left. Best effort: a copy not kept costs only
    /// the next start's parse.
    pub fn write(&self, bytes: &[u8]) {
        let Some(dir) = self.path.parent() else {
            return;
        };
        if crate::lab::workdir::WorkDir::secure(dir).is_err() {
            return;
        }
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&self.prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(bytes));
        if written.is_err() || std::fs::rename(&tmp, &self.path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// Removes the oldest copies whose names start with `prefix` until those left take at most
/// `max_bytes`.
pub fn trim(prefix: &str, max_bytes: u64) {
    trim_in(Path::new(crate::lab::MOUNT_ROOT), prefix, max_bytes);
}

fn trim_in(dir: &Path, prefix: &str, max_bytes: u64) {
    let mut copies: Vec<(std::time::SystemTime, u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().ok()?, m.len(), e.path()))
        })
        .collect();
    copies.sort();
    let mut total: u64 = copies.iter().map(|c| c.1).sum();
    for (_, len, path) in copies {
        if total <= max_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

/// Whether a start finds every answer it needs kept, so nothing needs the BTF parse.
pub fn all_kept(fs_events: bool) -> bool {
    let has = |prefix| Kept::of(prefix).is_some_and(|k| k.exists());
    has(OFFSETS) && has(TRACE_IDS) && (!fs_events || has(FS_EVENTS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_reads_back_and_drops_only_its_own_kind() {
        let dir = std::env::temp_dir().join(format!("fsprof-kept-{}", std::process::id()));
        let old = Kept::in_dir(&dir, OFFSETS, "old");
        old.write(b"old");
        let other = Kept::in_dir(&dir, FS_EVENTS, "x");
        other.write(b"{}");
        let new = Kept::in_dir(&dir, OFFSETS, "new");
        new.write(b"new");
        assert_eq!(new.read().as_deref(), Some(&b"new"[..]));
        let mode = std::fs::metadata(new.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "root's alone");
        assert!(!old.exists(), "another build's copy is dropped");
        assert!(other.exists(), "another kind's copy stays");
        // Two files' tables, trimmed to 3 bytes: the newer copy stays.
        let (first, second) = (
            Kept::in_dir(&dir, "unwind-1-", "a"),
            Kept::in_dir(&dir, "unwind-2-", "b"),
        );
        first.write(b"aaa");
        std::thread::sleep(std::time::Duration::from_millis(20));
        second.write(b"bbb");
        assert!(first.exists(), "another file's copy stays");
        trim_in(&dir, UNWIND, 3);
        assert!(!first.exists() && second.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
