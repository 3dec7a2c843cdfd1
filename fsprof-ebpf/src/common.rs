//! Maps and helpers shared by every probe.
//!
//! Safety (see main.rs): map values (`entry`, the task table), kernel memory
//! (`read_kernel`, `btf_read`) and helpers (clock, pid); the helpers here are where the
//! other modules' unsafe reads go through.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel, generated,
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use fsprof_common::{
    BlockClass, COUNTERS, Counter, CpuKey, DenseHist, EXEC_UNKNOWN, FOLLOW_HINT_SHARED,
    FOLLOW_HINT_SLOTS, HistKey, HistKind, LOST_KINDS, Lost, MAX_DENSE_ROWS, MAX_HIST_ENTRIES,
    MAX_TASKS, NO_ROW, OnCpuTask, PROGRAMS, ProbeConfig, Program, TaskState, TimeClass,
    config::{TASK_INTERRUPTIBLE, TASK_UNINTERRUPTIBLE},
    follow_hint_join, follow_hint_slot,
    hist::{BUCKETS, bucket_of},
};

/// Set by userspace before load (see fsprof::probes::offsets).
#[unsafe(no_mangle)]
pub static CONFIG: ProbeConfig = ProbeConfig {
    task_pid: 0,
    task_in_iowait_byte: 0,
    task_in_iowait_mask: 0,
    request_q: 0,
    queue_disk: 0,
    disk_major: 0,
    disk_first_minor: 0,
    request_data_len: 0,
    request_cmd_flags: 0,
    filter_devices: 0,
    task_flags: 0,
    stacks: 0,
    background: 0,
    fs_learn: 0,
    sample_period_ns: 0,
    fs_dev: 0,
    request_start_time_ns: 0,
    off_cpu_period_ns: 0,
    task_tgid: 0,
    task_comm: 0,
    rows_off_cpu: 0,
    rows_fs_pairs: 0,
    rows_block: 0,
    request_tag: 0,
    request_mq_hctx: 0,
    hctx_queue_num: 0,
    vma_start: 0,
    vma_end: 0,
    vma_flags: 0,
    vma_pgoff: 0,
    vma_file: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
    user_depth: 0,
    task_mm: 0,
    mm_start_code: 0,
    task_sum_exec: 0,
    request_sector: 0,
    task_prio: 0,
    timeline: 0,
    timeline_blocked: 0,
    timeline_syscall_ns: 0,
};

/// Threads being followed: the target and everything it forks.
#[map]
static TASKS: HashMap<u32, TaskState> = HashMap::with_max_entries(MAX_TASKS, 0);

/// Which tids may be in TASKS (see `FOLLOW_HINT_SLOTS`): one array load turns away the
/// switches, wakeups and syscalls of everything else on the machine before a hash lookup.
#[map]
static FOLLOW_HINT: Array<u32> = Array::with_max_entries(FOLLOW_HINT_SLOTS, 0);

/// The state of `tid` if it is followed.
#[inline(always)]
pub fn followed(tid: u32) -> Option<*mut TaskState> {
    let hint = *FOLLOW_HINT.get(follow_hint_slot(tid))?;
    if hint != tid && hint != FOLLOW_HINT_SHARED {
        return None;
    }
    TASKS.get_ptr_mut(tid)
}

/// Starts following `tid`. The hint goes first: a hint without a task costs a lookup, a
/// task without its hint would be missed. Two forks on two CPUs race on a slot only when
/// their tids are `FOLLOW_HINT_SLOTS` apart, which sequential tid allocation rules out.
#[inline(always)]
pub fn follow(tid: u32, state: &TaskState) -> Result<(), i32> {
    if let Some(slot) = FOLLOW_HINT.get_ptr_mut(follow_hint_slot(tid)) {
        unsafe { *slot = follow_hint_join(*slot, tid) };
    }
    TASKS.insert(tid, state, 0)
}

/// Stops following `tid` (it exited); a slot shared with another tid stays shared.
#[inline(always)]
pub fn unfollow(tid: u32) {
    let _ = TASKS.remove(tid);
    if let Some(slot) = FOLLOW_HINT.get_ptr_mut(follow_hint_slot(tid))
        && unsafe { *slot } == tid
    {
        unsafe { *slot = 0 };
    }
}

/// The followed thread on this CPU, if any (see `OnCpuTask`).
#[map]
static ON_CPU: PerCpuArray<OnCpuTask> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn on_cpu() -> Option<*mut OnCpuTask> {
    ON_CPU.get_ptr_mut(0)
}

/// Makes followed thread `tid` the one running on CPU `c`, with its syscall in flight.
#[inline(always)]
pub unsafe fn run_here(c: *mut OnCpuTask, tid: u32, t: *mut TaskState) {
    unsafe {
        (*c).tid = tid;
        (*c).armed = (*t).armed;
        (*c).sc_nr = (*t).sc_nr;
        (*c).sc_start = (*t).sc_start;
        (*c).ustack = (*t).ustack;
        (*t).sc_start = 0;
    }
}

/// At a syscall on CPU `c` with no followed thread: the current thread, if followed,
/// runs here from now (`run_here`). Its switch-in was before it was followed (a -p
/// target, a thread already running) or was not traced (sched::switch_in_unseen). The
/// hint turns everything else away with one array load.
#[inline(always)]
pub unsafe fn adopt_current(c: *mut OnCpuTask) -> bool {
    let tid = current_tid();
    let Some(t) = followed(tid) else {
        return false;
    };
    unsafe { run_here(c, tid, t) };
    true
}

#[map]
// Preallocated: with BPF_F_NO_PREALLOC an insert can fail transiently when the kernel's
// per-CPU element cache is empty, which would lose samples for no good reason.
static HISTS: HashMap<CpuKey<HistKey>, u64> = HashMap::with_max_entries(MAX_HIST_ENTRIES, 0);

#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOST_KINDS, 0);

#[map]
static EVENTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS, 0);

/// One field of CONFIG. Volatile: the loader rewrites this global, the compiler must not
/// fold its zeros; and field by field, as a volatile read of the whole struct loads all of
/// it (26 loads in every program that read one field).
macro_rules! conf {
    ($field:ident) => {
        $crate::common::read_conf(core::ptr::addr_of!($crate::common::CONFIG.$field))
    };
}
pub(crate) use conf;

#[inline(always)]
pub fn read_conf<T>(field: *const T) -> T {
    unsafe { core::ptr::read_volatile(field) }
}

#[inline(always)]
pub fn now() -> u64 {
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub fn current_tid() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

#[inline(always)]
pub fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

#[inline(always)]
fn bump(array: &PerCpuArray<u64>, index: u32) {
    if let Some(p) = array.get_ptr_mut(index) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
pub fn lost(kind: Lost) {
    bump(&LOST, kind as u32);
}

#[inline(always)]
pub fn count(counter: Counter) {
    bump(&EVENTS, counter as u32);
}

#[inline(always)]
pub fn count_n(counter: Counter, n: u64) {
    if let Some(p) = EVENTS.get_ptr_mut(counter as u32) {
        unsafe { *p += n };
    }
}

/// Runs per program: exact counts beside the kernel's run statistics, which are on only
/// part of the time (see fsprof::probes::cost_windows).
#[map]
static PROGRAM_RUNS: PerCpuArray<u64> = PerCpuArray::with_max_entries(PROGRAMS, 0);

#[inline(always)]
pub fn ran(program: Program) {
    bump(&PROGRAM_RUNS, program as u32);
}

/// Reads a `T` at `base + offset` in kernel memory; a failed read is counted.
#[inline(always)]
pub fn read_kernel<T>(base: u64, offset: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    match unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T) } {
        Ok(v) => Some(v),
        Err(_) => {
            lost(Lost::ReadFailed);
            None
        }
    }
}

/// Reads a `T` at `base + offset` of kernel memory into `dst`; false when `base` is 0 or
/// the read fails (counted).
#[inline(always)]
fn read_raw<T>(dst: *mut T, base: u64, offset: u32) -> bool {
    if base == 0 {
        return false;
    }
    let src = (base + offset as u64) as *const core::ffi::c_void;
    let size = core::mem::size_of::<T>() as u32;
    if unsafe { generated::bpf_probe_read_kernel(dst.cast(), size, src) } != 0 {
        lost(Lost::ReadFailed);
        return false;
    }
    true
}

/// `read_kernel` of a u64 into `dst` (map memory: no stack slot for the value, which the
/// unwinder's frames cannot spare); a failed read is counted.
#[inline(always)]
pub fn read_into(dst: &mut u64, base: u64, offset: u32) -> Option<()> {
    read_raw(dst, base, offset).then_some(())
}

/// `read_kernel`, zero when it fails. No Option: LLVM may load an Option's payload before
/// testing it, and Linux 6.1's verifier refuses that read of a stack slot never written.
#[inline(always)]
pub fn read_or_zero<T: Default>(base: u64, offset: u32) -> T {
    let mut v = T::default();
    read_raw(&mut v, base, offset);
    v
}

/// Pointer to this CPU's value for `key` in a CPU-keyed hash (see `CpuKey`), creating it
/// zeroed when absent; None when the map is full.
#[inline(always)]
pub fn entry<K, V: Default>(map: &HashMap<CpuKey<K>, V>, key: K) -> Option<*mut V> {
    let key = CpuKey {
        key,
        cpu: unsafe { bpf_get_smp_processor_id() },
    };
    if let Some(p) = map.get_ptr_mut(&key) {
        return Some(p);
    }
    // Only this CPU writes this key; a full map fails the insert and the lookup.
    let _ = map.insert(&key, &V::default(), BPF_NOEXIST as u64);
    map.get_ptr_mut(&key)
}

/// `entry`, counting a full map as `full`.
#[inline(always)]
pub fn entry_or_lost<K, V: Default>(
    map: &HashMap<CpuKey<K>, V>,
    key: K,
    full: Lost,
) -> Option<*mut V> {
    let p = entry(map, key);
    if p.is_none() {
        lost(full);
    }
    p
}

/// Dense histogram rows (see `MAX_DENSE_ROWS`), laid out by userspace.
#[map]
static DENSE_HISTS: PerCpuArray<DenseHist> = PerCpuArray::with_max_entries(MAX_DENSE_ROWS, 0);

/// Adds one `value` to histogram (kind, class, id): to its dense row `row` when it has one
/// (not NO_ROW), else to the histogram hash. Inlined: for the programs that run per syscall.
#[inline(always)]
pub fn hist_add_row(row: u32, kind: HistKind, class: u32, id: u32, value: u64) {
    add_to_row(row, kind as u32, class, id, value);
}

/// `hist_add_row` as a global BPF function, for programs that run per switch or request:
/// inlined, the bucket search's six branches multiplied the states the verifier followed
/// through the rest of the caller (see docs/design.md, Start-up); out of line it is
/// checked once per program, for a call per value. 1.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn hist_add_row_global(row: u32, kind: u32, class: u32, id: u32, value: u64) -> u32 {
    add_to_row(row, kind, class, id, value);
    1
}

#[inline(always)]
fn add_to_row(row: u32, kind: u32, class: u32, id: u32, value: u64) {
    if row != NO_ROW
        && let Some(h) = DENSE_HISTS.get_ptr_mut(row)
    {
        let b = bucket_of(value);
        if b < BUCKETS {
            unsafe { (*h).buckets[b as usize] += 1 };
        }
        return;
    }
    hist_add(kind, class, id, value);
}

/// `base + offset`, or NO_ROW when there is no base.
#[inline(always)]
pub fn row_at(base: u32, offset: u32) -> u32 {
    if base == NO_ROW {
        NO_ROW
    } else {
        base + offset
    }
}

/// Adds one `value` to histogram (kind, class, id) in the histogram hash; a global BPF
/// function (see `hist_add_row_global`): the slow path of every histogram. 1 when added.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn hist_add(kind: u32, class: u32, id: u32, value: u64) -> u32 {
    let key = HistKey {
        kind,
        class,
        id,
        bucket: bucket_of(value),
    };
    let Some(p) = entry_or_lost(&HISTS, key, Lost::HistFull) else {
        return 0;
    };
    unsafe { *p += 1 };
    1
}

/// A `T` at `base + offset` of a typed pointer (a BTF tracepoint's argument, or a pointer
/// field loaded through one): a plain load that the verifier checks against BTF and
/// guards, no helper call. The offset is a constant to the verifier: it comes from the
/// frozen, read-only CONFIG.
#[inline(always)]
pub fn btf_read<T>(base: *const u8, offset: u32) -> T {
    unsafe { core::ptr::read_volatile(base.add(offset as usize).cast::<T>()) }
}

/// `tid` of a typed task pointer.
#[inline(always)]
pub fn btf_task_tid(task: *const u8) -> u32 {
    btf_read::<i32>(task, conf!(task_pid)) as u32
}

/// `tid` of a `struct task_struct *`.
#[inline(always)]
pub fn task_tid(task: u64) -> Option<u32> {
    read_kernel::<i32>(task, conf!(task_pid)).map(|p| p as u32)
}

/// CPU time the scheduler charged `t` since `exec_in`, at most `span`; None when
/// `exec_in` is not known.
#[inline(always)]
pub unsafe fn charged(t: *const TaskState, exec: u64, span: u64) -> Option<u64> {
    let from = unsafe { (*t).exec_in };
    (from != EXEC_UNKNOWN).then(|| exec.saturating_sub(from).min(span))
}

/// The on-CPU time of `t`, running now (`now`, its `se.sum_exec_runtime` `exec`), up to
/// now: its closed intervals and what the open one (or one whose switch-in went untraced)
/// holds so far, split as its close will split it.
#[inline(always)]
pub unsafe fn on_cpu_so_far(t: *const TaskState, now: u64, exec: u64) -> u64 {
    unsafe {
        let since = if (*t).on_since != 0 {
            (*t).on_since
        } else {
            (*t).off_since
        };
        let span = now.saturating_sub(since);
        let open = match ((*t).on_since, since) {
            (_, 0) => 0,
            (0, _) => charged(t, exec, span).unwrap_or(0),
            _ => charged(t, exec, span).unwrap_or(span),
        };
        (*t).on_cpu_ns + open
    }
}

// What two features read alike: the block programs and the timeline a request's class and
// length, the scheduler's and the timeline's a switched-out thread's class.

#[inline(always)]
pub fn class_of(rq: *const u8) -> BlockClass {
    BlockClass::from_cmd_flags(btf_read::<u32>(rq, conf!(request_cmd_flags)))
}

#[inline(always)]
pub fn data_len(rq: *const u8) -> u32 {
    btf_read::<u32>(rq, conf!(request_data_len))
}

/// The class of a thread switched out: preempted (or runnable) waits in the run queue, an
/// uninterruptible sleep is I/O wait when the task is in io_schedule, else other D-wait.
#[inline(always)]
pub fn off_class(preempt: bool, state: u32, prev: u64) -> TimeClass {
    if preempt || state == 0 {
        return TimeClass::RunQueue;
    }
    if state & TASK_UNINTERRUPTIBLE != 0 {
        let iowait = read_kernel::<u8>(prev, conf!(task_in_iowait_byte)).unwrap_or(0);
        if iowait as u32 & conf!(task_in_iowait_mask) != 0 {
            return TimeClass::IoWait;
        }
        return TimeClass::Uninterruptible;
    }
    if state & TASK_INTERRUPTIBLE != 0 {
        return TimeClass::Sleep;
    }
    TimeClass::Other
}
