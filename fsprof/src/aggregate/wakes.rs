//! Who made the target wait. Each blocked interval that a wakeup ended carries the waker's
//! stack, captured in the wakeup (the waker's context): its task and the kernel path that
//! woke. From that path and task comes what the time waited for: the disk (a block
//! completion), a journal or log commit, a lock or resource another thread released, a
//! timer, the target's own threads, or someone else.

use serde::{Deserialize, Serialize};

use super::background;

/// What ended a wait for a CPU: the run-queue time class, under the name waits carry.
pub const RUN_QUEUE_WAKER: &str = "a CPU (run-queue)";

/// Blocked time by what ended it; with run-queue time and "no wakeup seen", adds up to
/// the off-CPU time exactly.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WaitedFor {
    pub what: String,
    pub ns: u64,
    /// Wakeups (intervals) behind it.
    pub wakes: u64,
}

/// One blocked stack and the waker that ended its intervals.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TopWake {
    pub what: String,
    pub ns: u64,
    pub wakes: u64,
    /// The blocked thread: comm and stack, leaf first.
    pub comm: String,
    pub blocked: Vec<String>,
    /// The waker's class (interrupt, a kernel thread class, target, a process name) and
    /// its kernel stack at the wakeup, leaf first.
    pub waker: String,
    pub waker_frames: Vec<String>,
}

/// A symbolized wake edge. Frames root first, as in `WeightedStack`.
#[derive(Clone, Debug, Default)]
pub struct WakeEdge {
    pub class: u32,
    pub comm: String,
    pub blocked_kernel: Vec<String>,
    pub blocked_user: Vec<String>,
    /// Where each frame of `blocked_kernel`, `blocked_user` and `waker_kernel` is.
    pub blocked_kernel_at: Vec<super::symbols::At>,
    pub blocked_user_at: Vec<super::symbols::At>,
    pub waker_comm: String,
    pub waker_tgid: u32,
    pub waker_kthread: bool,
    pub waker_kernel: Vec<String>,
    pub waker_kernel_at: Vec<super::symbols::At>,
    pub ns: u64,
    pub count: u64,
}

/// Frames that end a block request: whoever runs them completes I/O.
const IO_DONE: &[&str] = &[
    "bio_endio",
    "blk_mq_end_request",
    "blk_update_request",
    "blk_complete_reqs",
    "blk_mq_complete_request",
    "iomap_dio_bio_end_io",
    "end_buffer_async_read",
    "end_bio_bh_io_sync",
];
/// Prefixes of journal and log code.
const LOG: &[&str] = &[
    "jbd2_",
    "xlog_",
    "xfs_log_",
    "btrfs_commit_transaction",
    "btrfs_sync_log",
];
/// Frames that release a lock or a waited-on resource.
const RELEASE: &[&str] = &[
    "mutex_unlock",
    "__mutex_unlock_slowpath",
    "up",
    "__up",
    "up_read",
    "up_write",
    "rwsem_wake",
    "percpu_up_write",
    "xfs_buf_unlock",
    "xfs_iunlock",
    "folio_unlock",
    "unlock_page",
    "folio_wake_bit",
    "wake_up_bit",
    "__wake_up_bit",
    "wake_up_var",
];
const TIMER: &[&str] = &[
    "hrtimer_wakeup",
    "process_timeout",
    "call_timer_fn",
    "__run_timers",
    "__hrtimer_run_queues",
];
/// Frames of interrupt and softirq entry: the current task only happened to be there.
const IRQ: &[&str] = &[
    "common_interrupt",
    "asm_common_interrupt",
    "handle_softirqs",
    "__do_softirq",
    "irq_exit_rcu",
    "do_softirq",
];

/// A function's name without the compiler's clone suffixes (rwsem_wake.isra.0).
fn base(f: &str) -> &str {
    f.split_once('.').map_or(f, |(b, _)| b)
}

fn has(frames: &[String], names: &[&str]) -> bool {
    frames.iter().any(|f| names.contains(&base(f)))
}

fn has_prefix(frames: &[String], prefixes: &[&str]) -> bool {
    frames
        .iter()
        .any(|f| prefixes.iter().any(|p| f.starts_with(p)))
}

/// Who woke: interrupt context, a kernel thread by the background figure's classes, the
/// target, or another process by name.
pub fn waker_class(e: &WakeEdge, target: &dyn Fn(u32) -> bool) -> String {
    let irq = has(&e.waker_kernel, IRQ)
        || e.waker_kernel
            .iter()
            .any(|f| f.starts_with("asm_sysvec_") || f.starts_with("__sysvec_"));
    if irq {
        return "interrupt".into();
    }
    if e.waker_tgid == 0 {
        return "idle CPU".into();
    }
    if target(e.waker_tgid) {
        return "target".into();
    }
    if e.waker_kthread {
        return background::classify(&e.waker_comm, &e.waker_kernel, None).unwrap_or_else(|| {
            let base = e.waker_comm.split(['/', ':']).next().unwrap_or_default();
            format!("kernel thread {base}")
        });
    }
    e.waker_comm.clone()
}

/// Scheduler and wakeup plumbing at the leaf of every blocked and waker stack: skipped in
/// one-line paths so they start where the code chose to wait or to wake.
const PLUMBING: &[&str] = &[
    "__schedule",
    "schedule",
    "schedule_timeout",
    "schedule_preempt_disabled",
    "io_schedule",
    "io_schedule_timeout",
    "try_to_wake_up",
    "wake_up_q",
    "wake_up_process",
    "__wake_up_common",
    "__wake_up",
    "autoremove_wake_function",
    "default_wake_function",
];

pub fn past_plumbing(frames: &[String]) -> &[String] {
    let n = frames
        .iter()
        .take_while(|f| PLUMBING.contains(&f.as_str()))
        .count();
    &frames[n..]
}

/// What the blocked time of `e` waited for (documented in docs/json.md).
pub fn waited_for(e: &WakeEdge, target: &dyn Fn(u32) -> bool) -> String {
    let w = &e.waker_kernel;
    if has(&e.blocked_kernel, &["balance_dirty_pages"]) {
        return "writeback throttling".into();
    }
    if has(w, IO_DONE) {
        return "disk I/O".into();
    }
    // A release inside log code (a buffer unlocked at CIL commit) is still a release.
    let who = waker_class(e, target);
    if has(w, RELEASE) {
        return format!("lock or resource released by {who}");
    }
    if has_prefix(w, LOG) {
        return "journal or log commit".into();
    }
    if has(w, TIMER) {
        return "sleep or timer".into();
    }
    if who == "target" {
        return "the target's own threads".into();
    }
    format!("woken by {who}")
}

/// Blocked time by what it waited for, largest first, completed to `off_cpu_ns` with the
/// run-queue time and the blocked time no wakeup ended (still blocked, or exited).
pub fn split(
    edges: &[WakeEdge],
    target: &dyn Fn(u32) -> bool,
    run_queue_ns: u64,
    off_cpu_ns: u64,
) -> Vec<WaitedFor> {
    let mut by: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for e in edges {
        let v = by.entry(waited_for(e, target)).or_default();
        v.0 += e.ns;
        v.1 += e.count;
    }
    let woken: u64 = by.values().map(|v| v.0).sum();
    let mut out: Vec<WaitedFor> = by
        .into_iter()
        .map(|(what, (ns, wakes))| WaitedFor { what, ns, wakes })
        .collect();
    if run_queue_ns > 0 {
        out.push(WaitedFor {
            what: RUN_QUEUE_WAKER.into(),
            ns: run_queue_ns,
            wakes: 0,
        });
    }
    let rest = off_cpu_ns.saturating_sub(woken + run_queue_ns);
    if rest > 0 {
        out.push(WaitedFor {
            what: "no wakeup seen".into(),
            ns: rest,
            wakes: 0,
        });
    }
    out.sort_by_key(|w| std::cmp::Reverse(w.ns));
    out
}

/// The heaviest edges, for reports and `explain`.
pub fn top(
    edges: &[WakeEdge],
    target: &dyn Fn(u32) -> bool,
    n: usize,
    frames: usize,
) -> Vec<TopWake> {
    let mut v: Vec<&WakeEdge> = edges.iter().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.ns));
    v.into_iter()
        .take(n)
        .map(|e| TopWake {
            what: waited_for(e, target),
            ns: e.ns,
            wakes: e.count,
            comm: e.comm.clone(),
            blocked: e
                .blocked_kernel
                .iter()
                .rev()
                .chain(e.blocked_user.iter().rev())
                .take(frames)
                .cloned()
                .collect(),
            waker: waker_class(e, target),
            waker_frames: e.waker_kernel.iter().rev().take(frames).cloned().collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    fn edge(
        blocked: &[&str],
        waker_comm: &str,
        tgid: u32,
        kthread: bool,
        waker: &[&str],
    ) -> WakeEdge {
        WakeEdge {
            class: 1,
            comm: "rm".into(),
            blocked_kernel: v(blocked),
            waker_comm: waker_comm.into(),
            waker_tgid: tgid,
            waker_kthread: kthread,
            waker_kernel: v(waker),
            ns: 1000,
            count: 1,
            ..WakeEdge::default()
        }
    }

    #[test]
    fn waited_for_comes_from_the_wakers_path() {
        let target = |t: u32| t == 42;
        let io = edge(
            &["do_syscall_64", "io_schedule"],
            "bash",
            7,
            false,
            &[
                "asm_common_interrupt",
                "blk_mq_end_request",
                "bio_endio",
                "try_to_wake_up",
            ],
        );
        assert_eq!(waited_for(&io, &target), "disk I/O");
        assert_eq!(waker_class(&io, &target), "interrupt");
        let lock = edge(
            &["xfs_buf_lock", "down", "schedule"],
            "kworker/1:2",
            99,
            true,
            &[
                "worker_thread",
                "process_one_work",
                "xfs_inodegc_worker",
                "xfs_buf_unlock",
                "up",
                "try_to_wake_up",
            ],
        );
        assert_eq!(
            waited_for(&lock, &target),
            "lock or resource released by xfs-inodegc"
        );
        let pipe = edge(
            &["pipe_read", "schedule"],
            "sh",
            42,
            false,
            &["pipe_write", "__wake_up"],
        );
        assert_eq!(waited_for(&pipe, &target), "the target's own threads");
        let timer = edge(
            &["do_nanosleep"],
            "swapper/0",
            0,
            true,
            &["__hrtimer_run_queues", "hrtimer_wakeup"],
        );
        assert_eq!(waited_for(&timer, &target), "sleep or timer");
        let cil = edge(
            &["down_read", "xlog_cil_commit"],
            "kworker/0:1",
            98,
            true,
            &[
                "process_one_work",
                "xlog_cil_push_work",
                "up_write",
                "rwsem_wake.isra.0",
            ],
        );
        assert_eq!(
            waited_for(&cil, &target),
            "lock or resource released by xfs-cil"
        );
        let commit = edge(
            &["jbd2_log_wait_commit"],
            "jbd2/loop0-8",
            97,
            true,
            &["kjournald2", "jbd2_journal_commit_transaction", "__wake_up"],
        );
        assert_eq!(waited_for(&commit, &target), "journal or log commit");
        let other = edge(&["pipe_read"], "cat", 5, false, &["pipe_write"]);
        assert_eq!(waited_for(&other, &target), "woken by cat");
    }

    #[test]
    fn split_adds_up_to_the_off_cpu_time() {
        let target = |_| false;
        let e = [
            edge(&[], "x", 1, false, &["bio_endio"]),
            edge(&[], "x", 1, false, &["bio_endio"]),
            edge(&[], "x", 1, false, &["hrtimer_wakeup"]),
        ];
        let s = split(&e, &target, 500, 10_000);
        let total: u64 = s.iter().map(|w| w.ns).sum();
        assert_eq!(total, 10_000);
        assert_eq!(s[0].what, "no wakeup seen");
        let io = s.iter().find(|w| w.what == "disk I/O").unwrap();
        assert_eq!((io.ns, io.wakes), (2000, 2));
    }
}
