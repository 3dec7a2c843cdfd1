//! Scheduler: splits each followed thread's time into on-CPU and off-CPU classes, and
//! follows forks so the target includes every descendant thread and process.

use aya_ebpf::{
    EbpfContext,
    macros::{map, raw_tracepoint},
    maps::PerCpuArray,
    programs::RawTracePointContext,
};
use fsprof_common::{
    Counter, HistKind, Lost, TIME_CLASSES, TaskState, TimeClass, TimeStats,
    config::{TASK_DEAD, TASK_INTERRUPTIBLE, TASK_UNINTERRUPTIBLE},
};

use crate::{
    common::{
        TASKS, config, count, current_tgid, current_tid, hist_add, lost, now, on_cpu, read_kernel,
        task_tid,
    },
    stacks::{SLOT_SCHED, add_wake, add_weight, capture, capture_user},
};

#[map]
static TIMES: PerCpuArray<TimeStats> = PerCpuArray::with_max_entries(TIME_CLASSES, 0);

#[inline(always)]
fn add_time(class: u32, ns: u64) {
    if let Some(s) = TIMES.get_ptr_mut(class) {
        unsafe {
            (*s).total_ns += ns;
            (*s).episodes += 1;
        }
    }
    if class != TimeClass::OnCpu as u32 {
        hist_add(HistKind::OffCpuEpisode, class, 0, ns);
    }
}

/// Closes the current off-CPU phase of `t` at `ts`; its time also goes to the stack the
/// thread switched out with, so off-CPU stack weights add up to the class totals exactly.
#[inline(always)]
unsafe fn close_off_phase(t: *mut TaskState, ts: u64) {
    unsafe {
        if (*t).off_since != 0 {
            let ns = ts.saturating_sub((*t).off_since);
            add_time((*t).off_class, ns);
            if config().stacks != 0 {
                add_weight((*t).stack, (*t).off_class, ns);
            }
            (*t).off_since = 0;
        }
    }
}

#[inline(always)]
fn off_class(preempt: bool, state: u32, prev: u64) -> TimeClass {
    if preempt || state == 0 {
        return TimeClass::RunQueue;
    }
    if state & TASK_UNINTERRUPTIBLE != 0 {
        let cfg = config();
        let iowait = read_kernel::<u8>(prev, cfg.task_in_iowait_byte).unwrap_or(0);
        if iowait as u32 & cfg.task_in_iowait_mask != 0 {
            return TimeClass::IoWait;
        }
        return TimeClass::Uninterruptible;
    }
    if state & TASK_INTERRUPTIBLE != 0 {
        return TimeClass::Sleep;
    }
    TimeClass::Other
}

// TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
//          unsigned int prev_state)
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> i32 {
    let ts = now();
    // The tracepoint runs before the switch: current is still `prev`.
    let prev_tid = current_tid();
    let cpu = on_cpu();
    if let Some(t) = TASKS.get_ptr_mut(prev_tid) {
        // Its syscall in flight (if any) moves from this CPU to the thread. Plain integers,
        // not an Option: LLVM loads an Option's payload before testing it, and verifiers
        // before 6.4-ish reject that read of an unwritten stack slot.
        let (mut in_syscall, mut cached_ustack) = (false, 0u32);
        if let Some(c) = cpu
            && unsafe { (*c).tid } == prev_tid
        {
            unsafe {
                (*t).sc_nr = (*c).sc_nr;
                (*t).sc_start = (*c).sc_start;
                if (*c).sc_start != 0 {
                    in_syscall = true;
                    cached_ustack = (*c).ustack;
                }
            }
        }
        let preempt = ctx.arg::<u64>(0) & 1 != 0;
        let prev = ctx.arg::<u64>(1);
        let state = ctx.arg::<u64>(3) as u32;
        unsafe {
            if (*t).on_since != 0 {
                add_time(TimeClass::OnCpu as u32, ts.saturating_sub((*t).on_since));
                (*t).on_since = 0;
            }
        }
        if state & TASK_DEAD != 0 {
            if unsafe { (*t).sc_start } != 0 {
                count(Counter::SyscallsUnfinished);
            }
            let _ = TASKS.remove(prev_tid);
            count(Counter::TasksExited);
        } else {
            let stack = if config().stacks != 0 {
                let user = if cached_ustack != 0 {
                    cached_ustack
                } else {
                    capture_user(ctx.as_ptr(), SLOT_SCHED, current_tgid())
                };
                // Kept for the next episode of the same syscall only.
                unsafe { (*t).ustack = if in_syscall { user } else { 0 } };
                capture(ctx.as_ptr(), SLOT_SCHED, false, user)
            } else {
                0
            };
            unsafe {
                (*t).off_since = ts;
                (*t).off_class = off_class(preempt, state, prev) as u32;
                (*t).stack = stack;
            }
        }
    }
    let Some(c) = cpu else {
        return 0;
    };
    unsafe {
        (*c).tid = 0;
        (*c).sc_start = 0;
    }
    let next = ctx.arg::<u64>(2);
    if let Some(next_tid) = task_tid(next)
        && let Some(t) = TASKS.get_ptr_mut(next_tid)
    {
        unsafe {
            close_off_phase(t, ts);
            (*t).on_since = ts;
            // ... and back to the CPU it runs on now.
            (*c).tid = next_tid;
            (*c).armed = (*t).armed;
            (*c).sc_nr = (*t).sc_nr;
            (*c).sc_start = (*t).sc_start;
            (*c).ustack = (*t).ustack;
            (*t).sc_start = 0;
        }
    }
    0
}

// TP_PROTO(struct task_struct *p): a sleeper is being woken; from here on it waits for a
// CPU, which is run-queue time, not sleep. sched_waking, not sched_wakeup: it runs in the
// waker's own context even when the wakeup is queued to another CPU (then sched_wakeup
// fires there, in an IPI), so with stacks on the waker's stack is what the blocked time
// waited for.
#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn sched_waking(ctx: RawTracePointContext) -> i32 {
    let ts = now();
    if let Some(tid) = task_tid(ctx.arg::<u64>(0))
        && let Some(t) = TASKS.get_ptr_mut(tid)
    {
        unsafe {
            if (*t).off_since != 0 && (*t).off_class != TimeClass::RunQueue as u32 {
                if config().stacks != 0 {
                    let ns = ts.saturating_sub((*t).off_since);
                    add_wake(ctx.as_ptr(), (*t).stack, (*t).off_class, ns);
                }
                close_off_phase(t, ts);
                (*t).off_since = ts;
                (*t).off_class = TimeClass::RunQueue as u32;
            }
        }
    }
    0
}

// TP_PROTO(struct task_struct *parent, struct task_struct *child); fires for processes
// and threads alike, in the parent's context.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> i32 {
    let Some(parent) = TASKS.get_ptr(current_tid()) else {
        return 0;
    };
    let armed = unsafe { (*parent).armed };
    let Some(child) = task_tid(ctx.arg::<u64>(1)) else {
        return 0;
    };
    // A new task is runnable until it first runs.
    let state = TaskState {
        off_since: now(),
        off_class: TimeClass::RunQueue as u32,
        armed,
        ..TaskState::default()
    };
    if TASKS.insert(child, state, 0).is_err() {
        lost(Lost::TaskTableFull);
    } else {
        count(Counter::TasksForked);
    }
    0
}
