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
}
