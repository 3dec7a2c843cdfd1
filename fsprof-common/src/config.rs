//! Kernel layout facts the eBPF programs need. Rust eBPF cannot emit CO-RE relocations, so
//! userspace reads these offsets from /sys/kernel/btf/vmlinux and sets them as a global
//! before loading.

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeConfig {
    /// offsetof(struct task_struct, pid)
    pub task_pid: u32,
    /// Byte holding the `in_iowait` bitfield of task_struct, and the bit's mask in it.
    pub task_in_iowait_byte: u32,
    pub task_in_iowait_mask: u32,
    /// offsetof(struct request, q), (struct request_queue, disk)
    pub request_q: u32,
    pub queue_disk: u32,
    /// offsetof(struct gendisk, major), (struct gendisk, first_minor)
    pub disk_major: u32,
    pub disk_first_minor: u32,
    /// offsetof(struct request, __data_len), (struct request, cmd_flags)
    pub request_data_len: u32,
    pub request_cmd_flags: u32,
    /// Non-zero: only devices in the DEVICES map count.
    pub filter_devices: u32,
    /// offsetof(struct task_struct, flags)
    pub task_flags: u32,
    /// Non-zero: capture off-CPU stacks at switch-out and keep on-CPU sample stacks.
    pub stacks: u32,
    /// Non-zero: on-CPU samples of kernel threads are kept (background work).
    pub background: u32,
    /// Non-zero: a filesystem joins FS_DEVS when a followed thread fires one of its
    /// events, so fs events follow the filesystems the target works on.
    pub fs_learn: u32,
    /// Weight of one on-CPU sample: the cpu-clock sample period, ns.
    pub sample_period_ns: u64,
    /// The one filesystem under test (a lab): its superblock's dev_t (kernel encoding),
    /// which fs tracepoint events must lead to; 0: the FS_DEVS map decides.
    pub fs_dev: u32,
    /// offsetof(struct request, start_time_ns): when the block layer took the request in,
    /// by the kernel's own clock (0 when neither I/O statistics nor a scheduler want it).
    pub request_start_time_ns: u32,
    /// Off-CPU waits at least this long get a stack each; shorter ones are sampled, one
    /// stack per this much waiting per thread and class, which carries the time since the
    /// last one (0: a stack for every wait).
    pub off_cpu_period_ns: u64,
    /// offsetof(struct task_struct, tgid), (struct task_struct, comm)
    pub task_tgid: u32,
    pub task_comm: u32,
    /// First dense histogram row (DENSE_HISTS) of the off-CPU episode classes, the fs
    /// pairs (by pair id - 1) and the block device slots (`block_row`); NO_ROW: none.
    pub rows_off_cpu: u32,
    pub rows_fs_pairs: u32,
    pub rows_block: u32,
    /// offsetof(struct request, tag), (struct request, mq_hctx), (struct blk_mq_hw_ctx,
    /// queue_num): where a request in flight sits in INFLIGHT (see `inflight_index`).
    pub request_tag: u32,
    pub request_mq_hctx: u32,
    pub hctx_queue_num: u32,
    /// offsetof(struct vm_area_struct, vm_start / vm_end / vm_flags / vm_pgoff / vm_file),
    /// (struct file, f_inode), (struct inode, i_ino / i_sb), (struct super_block, s_dev):
    /// the unwinder's way from an address to a file (see fsprof_common::unwind).
    pub vma_start: u32,
    pub vma_end: u32,
    pub vma_flags: u32,
    pub vma_pgoff: u32,
    pub vma_file: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// User frames kept per stack (≤ USTACK_DEPTH).
    pub user_depth: u32,
    /// offsetof(struct task_struct, mm), (struct mm_struct, start_code).
    pub task_mm: u32,
    pub mm_start_code: u32,
    /// offsetof(struct task_struct, se.sum_exec_runtime): the CPU time the scheduler
    /// charged the task, which leaves out time a hypervisor stole from its CPU.
    pub task_sum_exec: u32,
    /// offsetof(struct request, __sector), (struct task_struct, prio): the timeline's
    /// block slices and scheduler events.
    pub request_sector: u32,
    pub task_prio: u32,
    /// Non-zero: the timeline is on (`--timeline`): the fs event program also streams each
    /// completed pair, and sys_exit each syscall at least `timeline_syscall_ns` long.
    pub timeline: u32,
    /// Non-zero: the timeline takes the kernel stack of every thread that blocks in D state
    /// (where it blocked; ~2 µs a wait).
    pub timeline_blocked: u32,
    pub timeline_syscall_ns: u64,
}

// Passed to the kernel as plain bytes (aya::Pod): no implicit padding anywhere.
const _: () =
    assert!(core::mem::size_of::<ProbeConfig>() == 14 * 4 + 8 + 2 * 4 + 8 + 2 * 4 + 24 * 4 + 8);

// Task state bits (include/linux/sched.h); #defines, so not in BTF, and stable for decades.
pub const TASK_INTERRUPTIBLE: u32 = 0x1;
pub const TASK_UNINTERRUPTIBLE: u32 = 0x2;
pub const TASK_DEAD: u32 = 0x80;
