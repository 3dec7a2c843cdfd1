//! Which histograms get a dense row (`DENSE_HISTS`, a per-CPU array row indexed by bucket)
//! and which block devices a slot (per-CPU array statistics and rows), within a memory
//! budget: the kernel side then adds to them with an inlined array lookup instead of a hash
//! update. Everything else goes to the histogram and block hashes, which the aggregation
//! merges with these.

use fsprof_common::{
    BLOCK_CLASSES, BLOCK_ROW_KINDS, DENSE_SYSCALL_ROWS, DenseHist, HistKind, MAX_BLOCK_SLOTS,
    MAX_DENSE_ROWS, NO_ROW, TIME_CLASSES, block_row,
};

/// Per-CPU memory the dense rows may take together (a row is 11 KiB per CPU): 2 CPUs
/// fit every row, 64 still the off-CPU classes and the hottest syscalls.
const DENSE_BUDGET_BYTES: usize = 16 << 20;

/// Syscalls whose latency histograms get a dense row (the rest use the histogram hash):
/// what filesystem work calls most.
const HOT_SYSCALLS: &[&str] = &[
    "read",
    "write",
    "pread64",
    "pwrite64",
    "openat",
    "close",
    "newfstatat",
    "statx",
    "fstat",
    "lseek",
    "getdents64",
    "unlinkat",
    "unlink",
    "mkdir",
    "mkdirat",
    "renameat2",
    "rename",
    "fsync",
    "fdatasync",
    "fcntl",
    "futex",
    "fallocate",
    "readlink",
    "copy_file_range",
    // Metadata calls of tar, cp -a and rsync: one each per file extracted or copied.
    "utimensat",
    "fchown",
    "fchmod",
    "fchownat",
    "fchmodat",
    "chmod",
    "chown",
    "lchown",
    "symlinkat",
    "symlink",
    "linkat",
    "link",
    "rmdir",
    "readlinkat",
    "faccessat2",
    "access",
    "ftruncate",
    "truncate",
    "fgetxattr",
    "flistxattr",
    "fsetxattr",
    "lgetxattr",
    "llistxattr",
    "lsetxattr",
    "preadv",
    "pwritev",
    "readv",
    "writev",
    "sync_file_range",
    "syncfs",
    "sendfile",
    "ioctl",
    "fstatfs",
    "statfs",
    "mmap",
    "munmap",
    "madvise",
    // Database and server loops (pgbench's postgres).
    "epoll_wait",
    "recvfrom",
    "sendto",
];

/// Numbers of HOT_SYSCALLS on this architecture, in order.
pub fn hot_syscalls() -> Vec<u32> {
    HOT_SYSCALLS
        .iter()
        .filter_map(|n| crate::syscall_table::number(n))
        .collect()
}

/// (kind, class, id) of a histogram.
pub type HistId = (u32, u32, u32);

#[derive(Debug, Default)]
pub struct DenseLayout {
    /// The histogram of each row, by row.
    pub rows: Vec<HistId>,
    /// (syscall number, row).
    pub syscalls: Vec<(u32, u32)>,
    /// First row of the off-CPU episode classes, the fs pairs (pair id - 1) and the block
    /// slots; NO_ROW: none.
    pub off_cpu: u32,
    pub fs_pairs: u32,
    pub block: u32,
    /// The device (kernel dev_t) of each block slot, by slot.
    pub slots: Vec<u32>,
}

/// Lays out rows for `cpus` CPUs: the off-CPU classes first (every switch of a followed
/// thread), then `syscalls` in order, the `fs_pairs` pairs, and a slot per device of
/// `devices` in order while the budget lasts.
pub fn plan(cpus: usize, syscalls: &[u32], fs_pairs: u32, devices: &[u32]) -> DenseLayout {
    let row_bytes = std::mem::size_of::<DenseHist>() * cpus.max(1);
    let budget = (DENSE_BUDGET_BYTES / row_bytes).min(MAX_DENSE_ROWS as usize);
    let mut l = DenseLayout {
        off_cpu: NO_ROW,
        fs_pairs: NO_ROW,
        block: NO_ROW,
        ..Default::default()
    };
    let fits = |l: &DenseLayout, n: usize| l.rows.len() + n <= budget;
    if fits(&l, TIME_CLASSES as usize) {
        l.off_cpu = l.rows.len() as u32;
        l.rows
            .extend((0..TIME_CLASSES).map(|c| (HistKind::OffCpuEpisode as u32, c, 0)));
    }
    for &nr in syscalls.iter().take(DENSE_SYSCALL_ROWS as usize) {
        if !fits(&l, 1) {
            break;
        }
        l.syscalls.push((nr, l.rows.len() as u32));
        l.rows.push((HistKind::SyscallLatency as u32, 0, nr));
    }
    if fs_pairs > 0 && fits(&l, fs_pairs as usize) {
        l.fs_pairs = l.rows.len() as u32;
        l.rows
            .extend((1..=fs_pairs).map(|p| (HistKind::FsPairLatency as u32, 0, p)));
    }
    let per_slot = (BLOCK_CLASSES as usize) * BLOCK_ROW_KINDS.len();
    let base = l.rows.len() as u32;
    for &dev in devices.iter().take(MAX_BLOCK_SLOTS as usize) {
        if !fits(&l, per_slot) {
            break;
        }
        let slot = l.slots.len() as u32;
        l.slots.push(dev);
        l.rows.resize(l.rows.len() + per_slot, (0, 0, 0));
        for class in 0..BLOCK_CLASSES {
            for kind in BLOCK_ROW_KINDS {
                let row = (base + block_row(slot, class, kind)) as usize;
                l.rows[row] = (kind as u32, class, dev);
            }
        }
    }
    if !l.slots.is_empty() {
        l.block = base;
    }
    l
}

/// Whole disks present now (kernel dev_t), those in use first: loop devices without a
/// backing file have size 0.
pub fn present_disks() -> Vec<u32> {
    let mut disks: Vec<(bool, String, u32)> = std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).ok();
            let (major, minor) = read("dev")?
                .trim()
                .split_once(':')
                .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))?;
            let empty = read("size").is_none_or(|s| s.trim() == "0");
            let name = e.file_name().to_string_lossy().into_owned();
            Some((empty, name, fsprof_common::kdev::make(major, minor)))
        })
        .collect();
    disks.sort();
    disks.into_iter().map(|(_, _, dev)| dev).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_unique_and_block_rows_match_the_kernel_formula() {
        let l = plan(2, &[0, 1, 257], 20, &[7 << 20, 254 << 20]);
        assert_eq!(l.off_cpu, 0);
        // A row per time class (indexed by class), then the syscalls.
        let n = TIME_CLASSES;
        assert_eq!(l.syscalls, vec![(0, n), (1, n + 1), (257, n + 2)]);
        assert_eq!(l.fs_pairs, n + 3);
        assert_eq!(l.slots.len(), 2);
        let mut seen = std::collections::HashSet::new();
        assert!(
            l.rows.iter().all(|r| seen.insert(*r)),
            "a histogram has two rows"
        );
        // The row the kernel computes for (slot 1, write, device latency).
        let row = l.block + block_row(1, 1, HistKind::BlockDeviceLatency);
        assert_eq!(
            l.rows[row as usize],
            (HistKind::BlockDeviceLatency as u32, 1, 254 << 20)
        );
        assert_eq!(l.rows[(l.fs_pairs + 19) as usize].2, 20);
    }

    #[test]
    fn every_hot_syscall_is_known_and_has_a_row() {
        // A misspelt name would silently lose its row.
        assert_eq!(hot_syscalls().len(), HOT_SYSCALLS.len());
        assert!(HOT_SYSCALLS.len() <= DENSE_SYSCALL_ROWS as usize);
    }

    #[test]
    fn many_cpus_keep_the_hottest_rows_within_budget() {
        let nrs: Vec<u32> = (0..64).collect();
        let l = plan(64, &nrs, 20, &[7 << 20]);
        let rows_bytes = l.rows.len() * std::mem::size_of::<DenseHist>() * 64;
        assert!(rows_bytes <= DENSE_BUDGET_BYTES, "{rows_bytes}");
        assert_eq!(l.off_cpu, 0);
        assert!(!l.syscalls.is_empty());
        assert!(l.slots.is_empty() && l.block == NO_ROW);
    }
}
