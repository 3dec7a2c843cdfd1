//! Stacks: capturing and deduplicating them, and their weights: off-CPU stacks (see
//! `offcpu`: which waits get one, and when) and on-CPU stacks sampled by a cpu-clock perf
//! event (weighted by the sample period), for the target and for kernel threads
//! (background work). Stacks are deduplicated in the kernel into ids; userspace
//! reads ids, weights and the stacks once, at the end.
//!
//! Safety (see main.rs): map values (scratch keys, weights), helpers (`bpf_get_stack`,
//! `bpf_get_task_stack`) and global functions.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_NOEXIST, task_struct},
    helpers::{bpf_get_current_comm, bpf_get_current_task, bpf_get_smp_processor_id, generated},
    macros::{map, perf_event},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::PerfEventContext,
};
use fsprof_common::{
    Counter, CpuKey, MAX_SAMPLED_THREADS, MAX_STACK_WEIGHTS, MAX_STACKS, MAX_WAKE_WEIGHTS,
    PF_KTHREAD, Program, STACK_CLASS_BACKGROUND, StackKey, TaskState, TimeClass, UserStackKey,
    WakeKey, Weight, WeightKey,
};

use crate::{
    common::{
        conf, count, current_tgid, current_tid, entry, followed, now, on_cpu_so_far, ran,
        read_kernel,
    },
    unwind,
};

/// Whole stack (kernel frames + user stack id) → id (0 means "no stack").
#[map]
static STACK_IDS: HashMap<StackKey, u32> = HashMap::with_max_entries(MAX_STACKS, 0);

/// User stack → id, in the same id space as STACK_IDS.
#[map]
static USER_STACK_IDS: HashMap<UserStackKey, u32> = HashMap::with_max_entries(MAX_STACKS, 0);

#[map]
static STACK_WEIGHTS: HashMap<CpuKey<WeightKey>, Weight> =
    HashMap::with_max_entries(MAX_STACK_WEIGHTS, 0);

/// Ids handed out on this CPU. Ids are `cpu << 20 | sequence`: no atomics needed (the BPF
/// core has none), and the two capturing contexts cannot interleave on one CPU (sched_switch
/// runs with interrupts off, the sampler in the timer interrupt).
#[map]
static WAKE_WEIGHTS: HashMap<CpuKey<WakeKey>, Weight> =
    HashMap::with_max_entries(MAX_WAKE_WEIGHTS, 0);

#[map]
static STACK_SEQ: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Processes (tgid) that do the filesystem's work in userspace, e.g. the ntfs-3g FUSE
/// daemon: sampled as background work, with their user stacks.
#[map]
static BACKGROUND_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(16, 0);

/// Scratch space for a key (too big for the 512-byte BPF stack), one slot per program kind
/// that captures: a wakeup from an interrupt or a sample may run while sched_switch or a
/// syscall exit is half-way through its key on the same CPU.
pub const SLOT_SCHED: u32 = 0;
pub const SLOT_SAMPLE: u32 = 1;
pub const SLOT_WAKE: u32 = 2;
pub const SLOT_SYSCALL: u32 = 3;
const SLOTS: u32 = unwind::SLOTS;
#[map]
static KEY_SCRATCH: PerCpuArray<StackKey> = PerCpuArray::with_max_entries(SLOTS, 0);

const KSTACK_BYTES: u32 = core::mem::size_of::<[u64; fsprof_common::KSTACK_DEPTH]>() as u32;

#[inline(always)]
pub fn get_stack(ctx: *mut core::ffi::c_void, buf: *mut u64, size: u32, flags: u64) -> i64 {
    unsafe { generated::bpf_get_stack(ctx, buf.cast(), size, flags) }
}

#[inline(always)]
fn is_kthread() -> bool {
    let task = unsafe { bpf_get_current_task() };
    read_kernel::<u32>(task, conf!(task_flags)).is_some_and(|f| f & PF_KTHREAD != 0)
}

#[inline(always)]
fn next_id() -> Option<u32> {
    let seq = STACK_SEQ.get_ptr_mut(0)?;
    unsafe {
        *seq += 1;
        Some((bpf_get_smp_processor_id() << 20) | (*seq & 0xf_ffff))
    }
}

/// The id `key` has in `ids`, making one when it is new (`made` says so); None when the
/// table is full.
#[inline(always)]
fn id_of<K>(ids: &HashMap<K, u32>, key: &K) -> Option<(u32, bool)> {
    if let Some(id) = unsafe { ids.get(key) } {
        return Some((*id, false));
    }
    let id = next_id()?;
    if ids.insert(key, &id, BPF_NOEXIST as u64).is_err() {
        // Another CPU inserted the same stack first, or the table is full.
        return unsafe { ids.get(key) }.map(|id| (*id, false));
    }
    Some((id, true))
}

/// Id of the current thread's user stack (see `unwind`), creating it when new; 0 when
/// there is none or it cannot be had (counted).
#[inline(always)]
pub fn capture_user(slot: u32, tgid: u32) -> u32 {
    let Some(key) = unwind::user_stack(slot, tgid) else {
        return 0;
    };
    match id_of(&USER_STACK_IDS, unsafe { &*key }) {
        Some((id, _)) => id,
        None => {
            count(Counter::UserStackFailed);
            0
        }
    }
}

/// Fills the key's identity fields and kernel frames (`unwind` writes them; negative:
/// failed, counted) in scratch slot `slot`.
#[inline(always)]
fn fill_key(
    slot: u32,
    fill: impl FnOnce(&mut StackKey),
    unwind: impl FnOnce(*mut u64) -> i64,
) -> Option<*mut StackKey> {
    let key = KEY_SCRATCH.get_ptr_mut(slot)?;
    let k = unsafe { &mut *key };
    fill(k);
    k._pad = 0;
    // bpf_get_stack and bpf_get_task_stack zero-fill what they do not write, on success
    // and on failure, so the key's bytes are fully determined by the stack.
    if unwind(k.kernel.as_mut_ptr()) < 0 {
        count(Counter::KernelStackFailed);
        return None;
    }
    Some(key)
}

/// The id of a whole stack, made when new; 0 when the table is full (counted).
#[inline(always)]
pub fn key_id(key: &StackKey) -> u32 {
    match id_of(&STACK_IDS, key) {
        Some((id, _)) => id,
        None => {
            count(Counter::StackTableFull);
            0
        }
    }
}

/// Id of the current context's stack with user stack `user` (0: none), creating it when
/// new; 0 when it cannot be had (counted). `ctx` is the program's context, which
/// bpf_get_stack unwinds from.
#[inline(always)]
pub fn capture(ctx: *mut core::ffi::c_void, slot: u32, kthread: bool, user: u32) -> u32 {
    let key = fill_key(
        slot,
        |key| {
            key.tgid = current_tgid();
            key.kthread = kthread as u32;
            key.comm = bpf_get_current_comm().unwrap_or([0; 16]);
            key.user = user;
        },
        |buf| get_stack(ctx, buf, KSTACK_BYTES, 0),
    );
    key.map_or(0, |k| key_id(unsafe { &*k }))
}

/// The key of the kernel stack a followed thread that is not running sleeps in (unwound
/// from its saved context; the unwinder leaves out scheduler functions), with user stack
/// `user`, in the switch scratch slot.
#[inline(always)]
pub fn task_key(task: *mut task_struct, user: u32) -> Option<*mut StackKey> {
    let base = task as u64;
    fill_key(
        SLOT_SCHED,
        |key| {
            key.tgid = read_kernel::<u32>(base, conf!(task_tgid)).unwrap_or(0);
            key.kthread = 0;
            key.comm = read_kernel::<[u8; 16]>(base, conf!(task_comm)).unwrap_or([0; 16]);
            key.user = user;
        },
        |buf| unsafe { generated::bpf_get_task_stack(task, buf.cast(), KSTACK_BYTES, 0) },
    )
}

/// Adds `ns` over `n` off-CPU phases (or one on-CPU sample) to (stack, class). A global
/// BPF function, as `add_wake`: the verifier checks it once per program, not once per
/// caller state (see docs/design.md, Start-up). 1 when added.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn add_weight(stack: u32, class: u32, ns: u64, n: u32) -> u32 {
    let Some(p) = entry(&STACK_WEIGHTS, WeightKey { stack, class }) else {
        count(Counter::StackWeightsFull);
        return 0;
    };
    unsafe {
        (*p).ns += ns;
        (*p).count += n as u64;
    }
    1
}

/// The stack of the current context as the waker of a blocked followed thread: its task
/// and kernel path.
#[inline(always)]
pub fn capture_waker(ctx: *mut core::ffi::c_void) -> u32 {
    capture(ctx, SLOT_WAKE, is_kthread(), 0)
}

/// Blocked time `ns` over `n` wakeups on the (blocked stack, waker) edge; a global BPF
/// function (see `add_weight`). 1 when added.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn add_wake(waker: u32, blocked: u32, class: u32, ns: u64, n: u32) -> u32 {
    let key = WakeKey {
        blocked,
        waker,
        class,
        _pad: 0,
    };
    let Some(p) = entry(&WAKE_WEIGHTS, key) else {
        count(Counter::WakeWeightsFull);
        return 0;
    };
    unsafe {
        (*p).ns += ns;
        (*p).count += n as u64;
    }
    1
}

/// cpu-clock sample on one CPU: the interrupted task's stack, if it is followed (on-CPU
/// time of the target), a kernel thread or a filesystem daemon (background work, classified
/// in userspace).
#[perf_event]
pub fn on_cpu_sample(ctx: PerfEventContext) -> u32 {
    ran(Program::OnCpuSample);
    let tid = current_tid();
    if tid == 0 {
        return 0; // idle
    }
    let task = followed(tid);
    let (class, kthread) = if task.is_some() {
        (TimeClass::OnCpu as u32, false)
    } else if conf!(background) != 0 && is_kthread() {
        (STACK_CLASS_BACKGROUND, true)
    } else if conf!(background) != 0 && unsafe { BACKGROUND_PIDS.get(&current_tgid()) }.is_some() {
        (STACK_CLASS_BACKGROUND, false)
    } else {
        return 0;
    };
    let user = if kthread {
        0
    } else {
        capture_user(SLOT_SAMPLE, current_tgid())
    };
    let id = capture(ctx.as_ptr(), SLOT_SAMPLE, kthread, user);
    add_weight(id, class, sample_weight(tid, task), 1);
    0
}

/// `se.sum_exec_runtime` of each sampled thread at its last sample.
#[map]
static SAMPLED_EXEC: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_SAMPLED_THREADS, 0);

/// A sample's weight: the thread's CPU time since its previous sample (one period for its
/// first). The timer counts guest time, so a period of which a hypervisor stole half still
/// ends in a whole sample; the time weighed leaves steal out. A followed thread's is its
/// on-CPU time as the time classes count it (`sched::on_cpu_so_far`), so over its samples
/// the weights add up to its on-CPU class: the scheduler's charge alone ran ahead of it
/// where a woken thread waited for an idle CPU to wake (on FUSE, 4 µs of 20 a request,
/// against the switches: +20 % in the graphs). Other threads' (background work) is the
/// scheduler's charge, kept in an LRU map.
#[inline(always)]
fn sample_weight(tid: u32, task: Option<*mut TaskState>) -> u64 {
    let period = conf!(sample_period_ns);
    let current = unsafe { bpf_get_current_task() };
    let Some(exec) = read_kernel::<u64>(current, conf!(task_sum_exec)) else {
        return period;
    };
    let (now, last) = match task {
        Some(t) => unsafe {
            let so_far = on_cpu_so_far(t, now(), exec);
            (so_far, core::mem::replace(&mut (*t).sampled_on, so_far + 1))
        },
        None => {
            let last = unsafe { SAMPLED_EXEC.get(&tid) }.copied().unwrap_or(0);
            let _ = SAMPLED_EXEC.insert(&tid, &(exec + 1), 0);
            (exec, last)
        }
    };
    match last {
        0 => period,
        l if now + 1 >= l => now + 1 - l,
        _ => period,
    }
}
