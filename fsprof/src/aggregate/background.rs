//! Which kernel threads' work belongs to the filesystem under test: classified from the
//! thread's name and, for workqueue workers, from the work function in its stack.

/// Prefixes of functions that do filesystem, block or writeback work.
pub const FS_PREFIXES: &[&str] = &[
    "xfs_",
    "xlog_",
    "ext4_",
    "jbd2_",
    "btrfs_",
    "iomap_",
    "loop_",
    "lo_",
    "fuse_",
    "wb_",
    "writeback_",
    "blk_",
    "submit_bio",
];

fn work_class(work: &str) -> Option<&'static str> {
    Some(match work {
        "xfs_inodegc_worker" => "xfs-inodegc",
        "xlog_cil_push_work" => "xfs-cil",
        "xlog_ioend_work" => "xfs-log",
        "xfs_end_io" | "xfs_buf_ioend_work" | "xfs_end_bio" => "xfs-ioend",
        "xfs_blockgc_worker" => "xfs-blockgc",
        "wb_workfn" => "writeback",
        w if w.starts_with("loop_") => "loop",
        w if w.starts_with("xfs") || w.starts_with("xlog") => "xfs-other",
        w if w.starts_with("btrfs") => "btrfs-workers",
        w if w.starts_with("ext4") => "ext4",
        w if w.starts_with("jbd2") => "jbd2",
        w if w.starts_with("iomap") => "iomap",
        w if w.starts_with("blk_") || w.starts_with("flush_") => "block",
        _ => return None,
    })
}

/// The thread class of a kernel-thread sample, or None when it is not the filesystem's
/// work. `kernel` is root first. `dev` (e.g. "loop0") restricts per-device threads.
pub fn classify(comm: &str, kernel: &[String], dev: Option<&str>) -> Option<String> {
    let on_dev = |c: &str| dev.is_none_or(|d| c.contains(d));
    if comm.starts_with("jbd2/") {
        return on_dev(comm).then(|| "jbd2".to_string());
    }
    if comm.starts_with("xfsaild") {
        return on_dev(comm).then(|| "xfs-ail".to_string());
    }
    if let Some(rest) = comm.strip_prefix("btrfs-") {
        return Some(format!("btrfs-{rest}"));
    }
    if comm.starts_with("kworker") {
        let work = kernel
            .iter()
            .position(|f| f == "process_one_work")
            .and_then(|i| kernel.get(i + 1));
        if let Some(c) = work.and_then(|w| work_class(w)) {
            return Some(c.to_string());
        }
    }
    // Any other kernel thread counts when it runs filesystem, block or writeback code.
    let fs_frame = kernel
        .iter()
        .any(|f| FS_PREFIXES.iter().any(|p| f.starts_with(p)));
    if !fs_frame {
        return None;
    }
    let base = comm
        .split(['/', ':'])
        .next()
        .filter(|b| !b.is_empty())
        .unwrap_or("kthread");
    Some(format!("{base} (fs frames)"))
}

/// The filesystem whose work a background stack of `group` is (by its thread and its
/// frames), as mountinfo names its type: None for work of no one filesystem (the block
/// layer, a loop device, writeback with no filesystem's frame).
pub fn family(group: &str, kernel: &[String]) -> Option<&'static str> {
    const FRAMES: &[(&str, &str)] = &[
        ("xfs_", "xfs"),
        ("xlog_", "xfs"),
        ("ext4_", "ext4"),
        ("jbd2_", "ext4"),
        ("btrfs_", "btrfs"),
        ("fuse_", "fuse"),
        ("f2fs_", "f2fs"),
        ("jfs_", "jfs"),
        ("reiserfs_", "reiserfs"),
        ("nilfs_", "nilfs2"),
    ];
    // A loop device's worker runs its backing file's filesystem for the filesystem on the
    // loop device (a lab's image lives on the root filesystem): that is no one family's.
    if group == "loop"
        || kernel
            .iter()
            .any(|f| f.starts_with("loop_") || f.starts_with("lo_"))
    {
        return None;
    }
    let by_group = FRAMES
        .iter()
        .find(|(p, _)| group.starts_with(&p[..p.len() - 1]));
    let by_frame =
        || (kernel.iter().rev()).find_map(|f| FRAMES.iter().find(|(p, _)| f.starts_with(p)));
    by_group.or_else(by_frame).map(|(_, fs)| *fs)
}

/// Whether a background stack belongs to a trace whose target used filesystems of
/// `types` (mountinfo's names; empty: not known, all count): work for another filesystem
/// is another process's (a neighbour's writeback is not the target's).
pub fn for_target(group: &str, kernel: &[String], types: &[String]) -> bool {
    let same = |t: &str, fs: &str| {
        t == fs
            || (fs == "ext4" && (t == "ext2" || t == "ext3"))
            || (fs == "fuse" && t.starts_with("fuse"))
    };
    match family(group, kernel) {
        Some(fs) if !types.is_empty() => types.iter().any(|t| same(t, fs)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn classifies_threads() {
        let inodegc = s(&[
            "ret_from_fork",
            "kthread",
            "worker_thread",
            "process_one_work",
            "xfs_inodegc_worker",
            "xfs_inactive",
        ]);
        assert_eq!(
            classify("kworker/1:2", &inodegc, Some("loop0")).as_deref(),
            Some("xfs-inodegc")
        );
        assert_eq!(
            classify("jbd2/loop0-8", &[], Some("loop0")).as_deref(),
            Some("jbd2")
        );
        assert_eq!(classify("jbd2/vda-8", &[], Some("loop0")), None);
        let idle = s(&[
            "ret_from_fork",
            "kthread",
            "smpboot_thread_fn",
            "run_ksoftirqd",
            "handle_softirqs",
            "rcu_core",
        ]);
        assert_eq!(classify("ksoftirqd/0", &idle, None), None);
        let blk = s(&[
            "ret_from_fork",
            "kthread",
            "smpboot_thread_fn",
            "handle_softirqs",
            "blk_done_softirq",
        ]);
        assert_eq!(
            classify("ksoftirqd/0", &blk, None).as_deref(),
            Some("ksoftirqd (fs frames)")
        );
        let wb = s(&[
            "ret_from_fork",
            "kthread",
            "worker_thread",
            "process_one_work",
            "wb_workfn",
        ]);
        assert_eq!(
            classify("kworker/u8:1", &wb, None).as_deref(),
            Some("writeback")
        );
    }

    #[test]
    fn work_for_another_filesystem_is_not_the_targets() {
        let k = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ext4_wb = k(&[
            "ret_from_fork",
            "process_one_work",
            "wb_workfn",
            "ext4_writepages",
        ]);
        let xfs = vec!["xfs".to_string()];
        assert_eq!(family("writeback", &ext4_wb), Some("ext4"));
        assert!(!for_target("writeback", &ext4_wb, &xfs));
        assert!(for_target("xfs-inodegc", &k(&["xfs_inodegc_worker"]), &xfs));
        assert!(!for_target("jbd2", &k(&["kjournald2"]), &xfs));
        // Work of no one filesystem, or no filesystem known: it counts.
        // A loop worker writing the image's ext4 backing file works for the xfs on it.
        let loop_work = k(&["loop_process_work", "ext4_file_write_iter"]);
        assert!(for_target("loop", &loop_work, &xfs));
        assert!(for_target("writeback", &ext4_wb, &[]));
        assert!(for_target(
            "ext4",
            &k(&["ext4_end_io"]),
            &["ext3".to_string()]
        ));
    }
}
