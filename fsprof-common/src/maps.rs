//! Map keys, values and the small enumerations both sides agree on.

/// Largest syscall number tracked per-syscall (x86_64 and aarch64 stay well below).
pub const MAX_SYSCALLS: u32 = 1024;
/// Threads followed at once; a fork beyond this is counted in `Lost::TaskTableFull`.
pub const MAX_TASKS: u32 = 65536;
/// Slots of the follow hint (`tid % FOLLOW_HINT_SLOTS`): the followed tid in the slot, or
/// `FOLLOW_HINT_SHARED` once two followed tids have met there, or 0. A power of two at
/// least the usual `pid_max` (32768), so tids rarely share a slot.
pub const FOLLOW_HINT_SLOTS: u32 = 1 << 16;
pub const FOLLOW_HINT_SHARED: u32 = u32::MAX;

/// The hint slot of `tid`.
pub const fn follow_hint_slot(tid: u32) -> u32 {
    tid & (FOLLOW_HINT_SLOTS - 1)
}

/// What a hint slot holds after `tid` joins the followed threads.
pub const fn follow_hint_join(slot: u32, tid: u32) -> u32 {
    if slot == 0 || slot == tid {
        tid
    } else {
        FOLLOW_HINT_SHARED
    }
}
/// Threads whose last on-CPU sample is remembered (for the next one's weight): an LRU
/// map, so a thread forgotten among more gets one period, as a first sample does.
pub const MAX_SAMPLED_THREADS: u32 = 8192;
/// Distinct histogram buckets over all histograms. A trace uses a few thousand (each
/// histogram spans at most a few hundred buckets); the map is preallocated, so its size is
/// also start-up time.
pub const MAX_HIST_ENTRIES: u32 = 32768;
/// Block requests in flight at once across the traced devices without a slot (or a tag
/// beyond `INFLIGHT_TAGS`).
pub const MAX_INFLIGHT_REQUESTS: u32 = 65536;
/// A request in flight on a device with a slot sits at its hardware queue and driver tag
/// in an array: in flight, no two requests of a device share both (a tag is freed only
/// after its request completes), so no hash insert and delete per request (~470 ns).
/// Queues and tags beyond these (large NVMe arrays) go to the hash.
pub const INFLIGHT_QUEUES: u32 = 4;
pub const INFLIGHT_TAGS: u32 = 1024;
pub const MAX_INFLIGHT_SLOTS: u32 = MAX_BLOCK_SLOTS * INFLIGHT_QUEUES * INFLIGHT_TAGS;

/// INFLIGHT's entry for a request at `tag` of hardware queue `queue` on device `slot`;
/// None when the queue or tag is out of the array's range (or negative: no tag).
pub const fn inflight_index(slot: u32, queue: u32, tag: i32) -> Option<u32> {
    if slot >= MAX_BLOCK_SLOTS || queue >= INFLIGHT_QUEUES || tag < 0 {
        return None;
    }
    let tag = tag as u32;
    if tag >= INFLIGHT_TAGS {
        return None;
    }
    Some((slot * INFLIGHT_QUEUES + queue) * INFLIGHT_TAGS + tag)
}
/// (device, class) pairs.
pub const MAX_BLOCK_KEYS: u32 = 1024;
/// Devices in the block filter (and with slots).
pub const MAX_FILTER_DEVS: u32 = 64;

/// A `#[repr(u32)]` enum the kernel side indexes arrays by; with the `user` feature also
/// its snake_case names and variant list (see `names`).
macro_rules! indexed_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($body:tt)* }) => {
        $(#[$m])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[cfg_attr(
            feature = "user",
            derive(strum::IntoStaticStr, strum::VariantArray),
            strum(serialize_all = "snake_case")
        )]
        pub enum $name { $($body)* }
    };
}

indexed_enum! {
    /// Where a target thread's time goes, in the scheduler's terms.
    pub enum TimeClass {
        /// Running on a CPU.
        OnCpu = 0,
        /// Blocked uninterruptibly with `in_iowait` set (io_schedule): waiting for I/O.
        IoWait = 1,
        /// Blocked uninterruptibly without `in_iowait`: locks, page faults, other D-state waits.
        Uninterruptible = 2,
        /// Interruptible sleep: waiting for a child, a pipe, a timer, a futex.
        Sleep = 3,
        /// Runnable but not running: preempted, or woken and waiting for a CPU.
        RunQueue = 4,
        /// Stopped, traced or any state the above do not cover.
        Other = 5,
        /// On a CPU, but the scheduler did not charge it (`se.sum_exec_runtime`): a
        /// hypervisor ran another guest on that CPU (steal time; also interrupt time on
        /// kernels with CONFIG_IRQ_TIME_ACCOUNTING).
        Steal = 6,
    }
}
pub const TIME_CLASSES: u32 = 7;

indexed_enum! {
    /// Block request classes, following the kernel's own I/O accounting (`op_stat_group`):
    /// WRITE_ZEROES counts as a write, as it does in /sys/block/*/stat.
    pub enum BlockClass {
        Read = 0,
        Write = 1,
        Flush = 2,
        Discard = 3,
        Other = 4,
    }
}
pub const BLOCK_CLASSES: u32 = 5;

// REQ_OP_* values from include/linux/blk_types.h (stable uapi-like numbering).
const REQ_OP_READ: u32 = 0;
const REQ_OP_WRITE: u32 = 1;
const REQ_OP_FLUSH: u32 = 2;
const REQ_OP_DISCARD: u32 = 3;
const REQ_OP_SECURE_ERASE: u32 = 5;
const REQ_OP_ZONE_APPEND: u32 = 7;
const REQ_OP_WRITE_ZEROES: u32 = 9;
pub const REQ_OP_MASK: u32 = 0xff;

impl BlockClass {
    #[inline(always)]
    pub fn from_cmd_flags(flags: u32) -> BlockClass {
        match flags & REQ_OP_MASK {
            REQ_OP_READ => BlockClass::Read,
            REQ_OP_WRITE | REQ_OP_ZONE_APPEND | REQ_OP_WRITE_ZEROES => BlockClass::Write,
            REQ_OP_FLUSH => BlockClass::Flush,
            REQ_OP_DISCARD | REQ_OP_SECURE_ERASE => BlockClass::Discard,
            _ => BlockClass::Other,
        }
    }
}

/// What a histogram measures; part of `HistKey`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistKind {
    /// Syscall latency in ns; `id` = syscall number.
    SyscallLatency = 1,
    /// Block request size in bytes; `id` = device, `class` = BlockClass.
    BlockSize = 2,
    /// Block queue latency (request start/insert → issue) in ns.
    BlockQueueLatency = 3,
    /// Block device latency (issue → complete) in ns.
    BlockDeviceLatency = 4,
    /// Length of one off-CPU episode in ns; `class` = TimeClass.
    OffCpuEpisode = 5,
    /// Latency of a filesystem begin/end tracepoint pair in ns; `id` = pair.
    FsPairLatency = 6,
}

impl HistKind {
    pub fn from_u32(v: u32) -> Option<HistKind> {
        Some(match v {
            1 => HistKind::SyscallLatency,
            2 => HistKind::BlockSize,
            3 => HistKind::BlockQueueLatency,
            4 => HistKind::BlockDeviceLatency,
            5 => HistKind::OffCpuEpisode,
            6 => HistKind::FsPairLatency,
            _ => return None,
        })
    }
}

/// The key of a map that each CPU adds to apart (HISTS, STACK_WEIGHTS, WAKE_WEIGHTS,
/// BLOCK): one entry per (key, CPU) in a plain hash, summed over CPUs by userspace. The BPF core has no
/// atomic adds on stable Rust, so each CPU needs its own counters; a per-CPU hash gives
/// them too, but preallocates a per-CPU area for every element, one allocation each: 48 ms
/// to create STACK_WEIGHTS that way at every start, 3 ms as a plain hash.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuKey<K> {
    pub key: K,
    pub cpu: u32,
}

/// Entries of a CPU-keyed map per entry of the per-CPU map it stands for: one per CPU up to
/// this many; beyond, keys share the room (a full map is counted, never silent).
pub const CPU_KEYED_CPUS: u32 = 4;

/// One bucket of one histogram. Value: u64 count (a `CpuKey`'s CPU's).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HistKey {
    pub kind: u32,
    pub class: u32,
    pub id: u32,
    pub bucket: u32,
}

/// Histograms filled on hot paths get a dense row each: a per-CPU array row indexed by
/// bucket, an inlined lookup and an increment instead of a hash update (100–200 ns a call
/// on this machine kind). Userspace lays the rows out (fsprof::probes::dense) and may load
/// fewer on machines with many CPUs (rows are per CPU); the rest go to the histogram hash.
pub const MAX_DENSE_ROWS: u32 = 512;
/// Of those, at most this many for syscalls (the ones filesystem work calls most).
pub const DENSE_SYSCALL_ROWS: u32 = 64;
/// A row base or device slot that is not there.
pub const NO_ROW: u32 = u32::MAX;
/// Block devices with dense rows and per-CPU array statistics (a slot each).
pub const MAX_BLOCK_SLOTS: u32 = 8;
/// Block histogram kinds with a dense row per device slot and class, in row order:
/// consecutive kinds, so a kind's place in the row group is its distance from the first.
pub const BLOCK_ROW_KINDS: [HistKind; 3] = [
    HistKind::BlockSize,
    HistKind::BlockQueueLatency,
    HistKind::BlockDeviceLatency,
];
const _: () = assert!(
    HistKind::BlockQueueLatency as u32 == HistKind::BlockSize as u32 + 1
        && HistKind::BlockDeviceLatency as u32 == HistKind::BlockSize as u32 + 2
);

/// Row of block histogram `kind` (one of BLOCK_ROW_KINDS) of a device slot and class,
/// counted from the first block row.
pub const fn block_row(slot: u32, class: u32, kind: HistKind) -> u32 {
    (slot * BLOCK_CLASSES + class) * BLOCK_ROW_KINDS.len() as u32
        + (kind as u32 - HistKind::BlockSize as u32)
}

/// One dense histogram row: a count per bucket (`hist::bucket_of`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DenseHist {
    pub buckets: [u64; crate::hist::BUCKETS as usize],
}

/// Per-syscall totals, indexed by syscall number in a per-CPU array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallStats {
    pub count: u64,
    pub errors: u64,
    /// Sum of positive return values: bytes for the read/write family.
    pub ret_sum: u64,
    pub total_ns: u64,
}

/// Scheduler totals per `TimeClass`, in a per-CPU array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimeStats {
    pub total_ns: u64,
    pub episodes: u64,
}

/// Block key: kernel-encoded dev_t (major << 20 | minor) and BlockClass.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub dev: u32,
    pub class: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockStats {
    /// Completions (a request completed in parts counts each part).
    pub completions: u64,
    /// Bytes completed; matches the sectors the kernel adds to /sys/block/*/stat.
    pub bytes: u64,
    /// Requests issued to the driver.
    pub issued: u64,
    pub queue_ns: u64,
    pub device_ns: u64,
    /// Requests whose completion was not seen: their INFLIGHT entry was still taken when
    /// the tag was issued again (a tag is freed only after its request completes). Those
    /// still in flight at the end are counted from the tables by userspace.
    pub unseen: u64,
    /// Bytes completed of requests issued during the trace (`bytes` also holds those of
    /// requests issued before it): their sizes at issue add up to it.
    pub issued_bytes: u64,
}

/// Per-thread state of a followed task. The thread itself is the only writer except for
/// wakeups and switch-ins, which happen while it is not running, so no locking is needed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskState {
    /// When the thread last went on-CPU (0: not running or unknown).
    pub on_since: u64,
    /// Its `se.sum_exec_runtime` then (`EXEC_UNKNOWN`: not known, no steal is split off).
    pub exec_in: u64,
    /// When the current off-CPU episode (or its current phase) began.
    pub off_since: u64,
    /// TimeClass of that episode.
    pub off_class: u32,
    /// Syscall in flight (valid while `sc_start != 0`).
    pub sc_nr: u32,
    pub sc_start: u64,
    /// Zero until the thread execs the target command: syscalls fsprof's own forked child
    /// makes before exec are not the target's and are not counted. Inherited on fork.
    pub armed: u32,
    /// User stack id (USER_STACK_IDS) of the current off-CPU episode, taken at switch-out
    /// (a sleeping thread's user stack cannot be read); 0: none or not yet known.
    pub ep_user: u32,
    /// `OnCpuTask::ustack` while the thread is off-CPU inside a syscall.
    pub ustack: u32,
    /// With off_cpu_period_ns 0, the whole stack taken at switch-out (its frames include
    /// the scheduler's, which an unwind of a sleeping thread skips).
    pub ep_stack: u32,
    /// Non-zero: the episode began inside a syscall, whose user stack the thread will
    /// still have when it next runs in its own context.
    pub ep_in_syscall: u32,
    pub _pad: u32,
    /// A blocked phase chosen for a stack at its wakeup, waiting for the switch-in that
    /// unwinds the thread's kernel stack: its weight, phases, class and waker stack id.
    pub pend_ns: u64,
    pub pend_n: u32,
    pub pend_class: u32,
    pub pend_waker: u32,
    /// Phases given a kernel stack at the last switch-in whose user stack is taken when
    /// the thread next runs its own code in the kernel (switch-out or syscall exit); the
    /// kernel half waits in PENDING_KEYS. Bit 0: [0] is the blocked phase (with
    /// `aw_waker`); bit 1: [1] is the phase that ended at the switch-in.
    pub aw_mask: u32,
    pub aw_ns: [u64; 2],
    pub aw_n: [u32; 2],
    pub aw_class: [u32; 2],
    pub aw_waker: u32,
    pub _pad2: u32,
    /// Per off-CPU class: time and phases since the last stack of that class (not yet
    /// attributed), and that stack and its waker, which take the remainder at exit.
    pub short_ns: [u64; TIME_CLASSES as usize],
    pub short_n: [u32; TIME_CLASSES as usize],
    pub last_stack: [u32; TIME_CLASSES as usize],
    pub last_waker: [u32; TIME_CLASSES as usize],
    pub _pad3: u32,
    /// When fsprof began to follow the thread: its time classes add up to the time from
    /// here to its exit (`Counter::FollowedNs`) or to the end of the trace.
    pub followed_at: u64,
    /// Its on-CPU time so far (the time classes' on-CPU, closed intervals), and that time
    /// as it stood at its last on-CPU sample, plus one (0: no sample yet): a sample weighs
    /// the difference, so the samples add up to the on-CPU class.
    pub on_cpu_ns: u64,
    pub sampled_on: u64,
}

/// `TaskState::exec_in` of an interval whose start fsprof did not see in the kernel.
pub const EXEC_UNKNOWN: u64 = u64::MAX;

// Shared with userspace as plain bytes (aya::Pod): no implicit padding.
const _: () = assert!(core::mem::size_of::<TaskState>() == 296);

/// The followed thread running on a CPU (a per-CPU array of one), set at every switch-in:
/// the syscall programs, which run for every syscall of every thread, find it without a
/// hash lookup. A syscall in flight lives here while its thread is on this CPU and moves to
/// the thread's TaskState when it switches out (and back at its next switch-in, on any CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OnCpuTask {
    /// 0: no followed thread runs here.
    pub tid: u32,
    pub armed: u32,
    pub sc_nr: u32,
    /// User stack id captured during the syscall in flight (0: not yet). The user stack
    /// cannot change while a thread is inside one syscall, so every off-CPU episode of that
    /// syscall reuses it: rm on xfs switches out several times per unlinkat.
    pub ustack: u32,
    pub sc_start: u64,
    /// Non-zero: the thread's TaskState has phases waiting for its user stack (aw_mask),
    /// which its syscall exit takes.
    pub await_user: u32,
    pub _pad: u32,
}

/// Block request in flight since its issue, with its class as read then. In the REQUESTS
/// hash keyed by `rq`; in the INFLIGHT array `rq` says whose entry it is (0: none).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestTimes {
    pub rq: u64,
    pub issue: u64,
    pub class: u32,
    /// Kernel dev_t: whose request an entry left at the end of a trace is.
    pub dev: u32,
}

indexed_enum! {
    /// Counters of things that went wrong or were dropped; every report shows non-zero ones.
    pub enum Lost {
        /// A new thread could not be followed: task table full.
        TaskTableFull = 0,
        /// A histogram bucket could not be created: histogram map full.
        #[cfg_attr(feature = "user", strum(serialize = "histogram_full"))]
        HistFull = 1,
        /// A block (device, class) slot could not be created.
        BlockKeysFull = 2,
        /// A block request start could not be stored.
        RequestTableFull = 3,
        /// A kernel memory read failed (the offsets or the object were bad).
        #[cfg_attr(feature = "user", strum(serialize = "kernel_read_failed"))]
        ReadFailed = 4,
        /// A syscall number beyond MAX_SYSCALLS.
        SyscallOutOfRange = 5,
        /// A begun fs pair instance was overwritten by another that hashed to its slot (see
        /// `pending_slot`): its end finds nothing and its latency is missing.
        FsPairSlotTaken = 6,
        /// A timeline event found the TIMELINE ring buffer full.
        TimelineFull = 7,
    }
}
pub const LOST_KINDS: u32 = 8;

indexed_enum! {
    /// Plain event counters (not losses), per-CPU array.
    pub enum Counter {
        /// Threads and processes that joined the target through fork/clone.
        TasksForked = 0,
        /// Followed threads that exited.
        TasksExited = 1,
        /// Syscalls that never returned (exit, exit_group, or still running at exit).
        SyscallsUnfinished = 2,
        /// Stack captures whose kernel part failed (time goes to an "unavailable" stack).
        KernelStackFailed = 3,
        /// Stack captures whose user part failed or found USER_STACK_IDS full (the kernel part
        /// is kept).
        UserStackFailed = 4,
        /// New stacks that found STACK_IDS full (time goes to the "unavailable" stack).
        StackTableFull = 5,
        /// Code mappings the unwinder could not remember (USER_MAPPINGS full): frames in
        /// them show as "[mapping not recorded]".
        UserMappingsFull = 6,
        /// (stack, class) weights that could not be created: that time is missing from stacks.
        StackWeightsFull = 7,
        /// Wake edges that could not be created: that blocked time has no waker.
        WakeWeightsFull = 8,
        /// User stacks unwound (new or not), and the frames they held: the unwinder's work.
        UserStacksUnwound = 9,
        UserFramesUnwound = 10,
        /// Time spent unwinding them, ns (two clock reads per stack, ~90 ns, included).
        UserUnwindNs = 11,
        /// Switch-outs of a followed thread whose switch-in the kernel did not trace (see
        /// fsprof-ebpf sched::switch_in_unseen): its on-CPU time is known, not when it began.
        SwitchInsUnseen = 12,
        /// Time from following each thread that exited to its exit, ns: what its time
        /// classes add up to.
        FollowedNs = 13,
    }
}
pub const COUNTERS: u32 = 14;

indexed_enum! {
    /// fsprof's eBPF programs, each counting its own runs (`PROGRAM_RUNS`, per-CPU array): the
    /// kernel's run statistics cost two clock reads a run, so they are on only part of the time
    /// and the counts come from here. Names equal the programs' function names.
    pub enum Program {
        SysEnter = 0,
        SysExit = 1,
        SchedSwitch = 2,
        SchedWaking = 3,
        SchedProcessFork = 4,
        SchedProcessExec = 5,
        BlockRqIssue = 6,
        BlockRqComplete = 7,
        BlockRqRequeue = 8,
        FsEvent = 9,
        OnCpuSample = 10,
        FloorTp = 11,
        FloorSample = 12,
        TimelineSwitch = 13,
        TimelineWaking = 14,
        TimelineFork = 15,
    }
}
pub const PROGRAMS: u32 = 16;

/// Frames kept per kernel stack and per user stack. Filesystem paths from a syscall down to
/// io_schedule are 20-50 frames deep; deeper stacks are cut at the root end.
pub const KSTACK_DEPTH: usize = 64;
/// User frames a stack can hold (`--user-depth`); DEFAULT_USER_DEPTH are kept by default.
pub const USTACK_DEPTH: usize = 64;
pub const DEFAULT_USER_DEPTH: u32 = 48;
/// Distinct stacks per trace. Stacks are deduplicated in a hash keyed by the whole stack,
/// so unlike a BPF stack-trace map there are no hash-bucket collisions.
pub const MAX_STACKS: u32 = 32768;
/// (stack, class) weights per trace.
pub const MAX_STACK_WEIGHTS: u32 = 65536;
/// Stack class for on-CPU samples of kernel threads (TimeClass values are 0..6).
pub const STACK_CLASS_BACKGROUND: u32 = 6;
/// task_struct.flags bit of kernel threads (include/linux/sched.h).
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// A whole stack as captured: who, the kernel frames (instruction pointers, leaf first,
/// zero-filled) and the id of the user part (USER_STACK_IDS). The key of STACK_IDS.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackKey {
    pub tgid: u32,
    /// Non-zero for a kernel thread (no user frames).
    pub kthread: u32,
    pub comm: [u8; 16],
    /// User stack id; 0: none.
    pub user: u32,
    pub _pad: u32,
    pub kernel: [u64; KSTACK_DEPTH],
}

/// A process's user stack (instruction pointers, leaf first, zero-filled, the last one a
/// `unwind::StackEnd` when the walk stopped early): the key of USER_STACK_IDS. Whole
/// stacks refer to it by id, so its frames are hashed once per capture, not again inside
/// every whole stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UserStackKey {
    pub tgid: u32,
    /// The process image (`ImageKey::image`): frames are placed by its mappings.
    pub image: u32,
    pub user: [u64; USTACK_DEPTH],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightKey {
    pub stack: u32,
    /// TimeClass, or STACK_CLASS_BACKGROUND.
    pub class: u32,
}

/// One edge of "who made it wait": a followed thread blocked in stack `blocked` (class
/// `class`) until the task in stack `waker` woke it. The waker's stack is captured in the
/// wakeup, so it holds the waker's process, comm and the kernel path that woke (an I/O
/// completion in interrupt context, a lock release, a timer, a pipe write, …).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WakeKey {
    pub blocked: u32,
    pub waker: u32,
    /// TimeClass the thread was blocked in.
    pub class: u32,
    pub _pad: u32,
}

/// Wake edges per trace.
pub const MAX_WAKE_WEIGHTS: u32 = 16384;

/// Time attributed to one (stack, class): off-CPU intervals (exact) or on-CPU samples
/// (count × sample period).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Weight {
    pub ns: u64,
    pub count: u64,
}

/// Events of the filesystem's own tracepoints, counted by one raw-tracepoint program
/// attached to each with its index as the BPF cookie.
pub const MAX_FS_EVENTS: u32 = 4096;
/// Filesystems (superblock dev_t) whose events count when several may.
pub const MAX_FS_DEVS: u32 = 64;
/// begin/end pairs timed (e.g. jbd2 commit, ext4_sync_file).
pub const MAX_FS_PAIRS: u32 = 64;
/// Pointer hops from a tracepoint argument to the superblock's dev_t.
pub const FS_MAX_DEREF: usize = 5;
/// `dev_arg`: the event has no argument leading to a device (it counts everywhere);
/// `key_arg`: pairs are keyed by the current thread.
pub const FS_NO_ARG: u32 = u32::MAX;
/// Pairs an event can begin or end at once (jbd2_end_commit ends the commit and its
/// logging phase).
pub const FS_PAIR_SLOTS: usize = 2;

/// How to count one fs tracepoint. The device is argument `dev_arg` itself (`dev_is_arg`)
/// or found from it (a kernel pointer) by following `nderef` pointers at `derefs` and
/// reading a u32 dev_t at `dev_off` (e.g. inode → i_sb → s_dev); offsets come from BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FsEventCfg {
    pub dev_arg: u32,
    pub nderef: u32,
    pub derefs: [u32; FS_MAX_DEREF],
    pub dev_off: u32,
    /// Argument whose value keys pair instances (e.g. the transaction pointer), or
    /// FS_NO_ARG for the current thread.
    pub key_arg: u32,
    /// 1-based pair ids this event begins / ends; 0: unused slot.
    pub begins: [u32; FS_PAIR_SLOTS],
    pub ends: [u32; FS_PAIR_SLOTS],
    /// Non-zero: argument `dev_arg` is the dev_t itself (no hops, no read).
    pub dev_is_arg: u32,
}

/// A begun, not yet ended pair instance, in the `FS_PENDING` slot its (pair, key) hashes to;
/// `start` 0: free. An array, not a hash: an LRU hash insert, lookup and delete cost ~250 ns
/// per pair event here, an array slot a few loads and stores.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingPair {
    pub pair: u32,
    pub _pad: u32,
    pub key: u64,
    pub start: u64,
}

/// Slots of `FS_PENDING` (a power of two; 1.5 MiB). Few instances are open at once (a
/// commit, a sync per thread): two of 50 share a slot with probability ~2 %, and that is
/// counted (`Lost::FsPairSlotTaken`).
pub const FS_PENDING_SLOTS: u32 = 65536;

/// The `FS_PENDING` slot of pair instance (pair, key): keys are pointers (low bits zero,
/// neighbours close) or tids, so every bit is mixed in (splitmix64's finalizer).
#[inline(always)]
pub fn pending_slot(pair: u32, key: u64) -> u32 {
    let mut h = key ^ (pair as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (h ^ (h >> 31)) as u32 & (FS_PENDING_SLOTS - 1)
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    use crate::config::ProbeConfig;
    // SAFETY: all are repr(C) structs of integers with no padding holes that matter.
    unsafe impl aya::Pod for HistKey {}
    unsafe impl aya::Pod for SyscallStats {}
    unsafe impl aya::Pod for TimeStats {}
    unsafe impl aya::Pod for BlockKey {}
    unsafe impl aya::Pod for BlockStats {}
    unsafe impl aya::Pod for TaskState {}
    unsafe impl aya::Pod for RequestTimes {}
    unsafe impl aya::Pod for ProbeConfig {}
    unsafe impl aya::Pod for StackKey {}
    unsafe impl aya::Pod for WeightKey {}
    unsafe impl aya::Pod for WakeKey {}
    unsafe impl aya::Pod for Weight {}
    unsafe impl aya::Pod for FsEventCfg {}
    unsafe impl aya::Pod for PendingPair {}
    unsafe impl aya::Pod for DenseHist {}
    unsafe impl aya::Pod for UserStackKey {}
    unsafe impl aya::Pod for CpuKey<HistKey> {}
    unsafe impl aya::Pod for CpuKey<BlockKey> {}
    unsafe impl aya::Pod for CpuKey<WeightKey> {}
    unsafe impl aya::Pod for CpuKey<WakeKey> {}
}

// The keys are hashed as bytes: a CPU key must have no padding.
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<CpuKey<HistKey>>() == size_of::<HistKey>() + 4);
    assert!(size_of::<CpuKey<BlockKey>>() == size_of::<BlockKey>() + 4);
    assert!(size_of::<CpuKey<WeightKey>>() == size_of::<WeightKey>() + 4);
    assert!(size_of::<CpuKey<WakeKey>>() == size_of::<WakeKey>() + 4);
};

/// Names and variant lists for userspace, derived so they cannot drift from the variants;
/// the eBPF object only needs the discriminants.
#[cfg(feature = "user")]
mod names {
    use super::*;
    use strum::VariantArray;

    macro_rules! named {
        ($($t:ty = $count:expr),* $(,)?) => {$(
            impl $t {
                /// Every variant, in discriminant order (the kernel side indexes by it).
                pub const ALL: &'static [$t] = <$t as VariantArray>::VARIANTS;
                /// The snake_case name used in reports and JSON.
                pub fn name(self) -> &'static str {
                    self.into()
                }
            }
            const _: () = assert!(<$t>::ALL.len() == $count as usize);
        )*};
    }
    named!(
        TimeClass = TIME_CLASSES,
        BlockClass = BLOCK_CLASSES,
        Lost = LOST_KINDS,
        Counter = COUNTERS,
        Program = PROGRAMS
    );

    impl Program {
        /// The tracepoint the program runs on: its own name, but for the timeline's
        /// programs, which share the aggregating programs' tracepoints.
        pub fn tracepoint(self) -> &'static str {
            match self {
                Program::TimelineSwitch => "sched_switch",
                Program::TimelineWaking => "sched_waking",
                Program::TimelineFork => "sched_process_fork",
                p => p.name(),
            }
        }
    }

    impl BlockClass {
        pub fn from_u32(v: u32) -> BlockClass {
            Self::ALL
                .get(v as usize)
                .copied()
                .unwrap_or(BlockClass::Other)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn variant_order_is_discriminant_order() {
            for (i, c) in TimeClass::ALL.iter().enumerate() {
                assert_eq!(*c as usize, i);
            }
            for (i, c) in BlockClass::ALL.iter().enumerate() {
                assert_eq!(*c as usize, i);
            }
            for (i, c) in Lost::ALL.iter().enumerate() {
                assert_eq!(*c as usize, i);
            }
            for (i, c) in Counter::ALL.iter().enumerate() {
                assert_eq!(*c as usize, i);
            }
            for (i, c) in Program::ALL.iter().enumerate() {
                assert_eq!(*c as usize, i);
            }
        }

        #[test]
        fn follow_hint_slots_say_who_may_be_followed() {
            let (a, b) = (1234, 1234 + FOLLOW_HINT_SLOTS);
            assert_eq!(follow_hint_slot(a), follow_hint_slot(b));
            // Empty, then a's; again a's; shared once b meets a there, and shared stays.
            let s = follow_hint_join(0, a);
            assert_eq!(s, a);
            assert_eq!(follow_hint_join(s, a), a);
            let s = follow_hint_join(s, b);
            assert_eq!(s, FOLLOW_HINT_SHARED);
            assert_eq!(follow_hint_join(s, a), FOLLOW_HINT_SHARED);
        }

        #[test]
        fn inflight_entries_are_distinct_and_inside_the_array() {
            // Rising in (slot, queue, tag) order: no two requests share an entry.
            let mut last = None;
            for slot in 0..MAX_BLOCK_SLOTS {
                for queue in 0..INFLIGHT_QUEUES {
                    for tag in [0, 1, INFLIGHT_TAGS as i32 - 1] {
                        let i = inflight_index(slot, queue, tag).unwrap();
                        assert!(i < MAX_INFLIGHT_SLOTS && last < Some(i));
                        last = Some(i);
                    }
                }
            }
            // No tag, a tag, queue or slot beyond the array: the hash keeps those.
            assert_eq!(inflight_index(0, 0, -1), None);
            assert_eq!(inflight_index(0, 0, INFLIGHT_TAGS as i32), None);
            assert_eq!(inflight_index(0, INFLIGHT_QUEUES, 0), None);
            assert_eq!(inflight_index(MAX_BLOCK_SLOTS, 0, 0), None);
        }

        #[test]
        fn open_pair_instances_get_distinct_slots() {
            // Collisions among `n` open instances: a sync or truncate per thread
            // (consecutive tids) and journal transactions or writeback works (slab pointers).
            fn collisions(threads: u64, objects: u64) -> usize {
                let mut slots = [0u32; 4 * 256 + 6 * 64];
                let mut n = 0;
                for pair in 1..=4 {
                    for tid in 4000..4000 + threads {
                        slots[n] = pending_slot(pair, tid);
                        n += 1;
                    }
                }
                for pair in 5..=10 {
                    for i in 0..objects {
                        slots[n] = pending_slot(pair, 0xffff_8880_1234_5600 + 256 * i);
                        n += 1;
                    }
                }
                let slots = &mut slots[..n];
                assert!(slots.iter().all(|&s| s < FS_PENDING_SLOTS));
                slots.sort_unstable();
                slots.windows(2).filter(|w| w[0] == w[1]).count()
            }
            // More than are open at once in practice: none share a slot.
            assert_eq!(collisions(8, 4), 0);
            // 1,408 at once: about as many shared slots as a random function gives (~15).
            assert!(collisions(256, 64) <= 30);
        }

        #[test]
        fn names_are_the_published_ones() {
            assert_eq!(TimeClass::RunQueue.name(), "run_queue");
            assert_eq!(TimeClass::OnCpu.name(), "on_cpu");
            assert_eq!(BlockClass::Flush.name(), "flush");
            assert_eq!(Lost::HistFull.name(), "histogram_full");
            assert_eq!(Lost::ReadFailed.name(), "kernel_read_failed");
            assert_eq!(Counter::WakeWeightsFull.name(), "wake_weights_full");
            assert_eq!(Counter::UserMappingsFull.name(), "user_mappings_full");
        }
    }
}
