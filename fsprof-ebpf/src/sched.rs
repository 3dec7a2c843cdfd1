//! Scheduler: splits each followed thread's time into on-CPU and off-CPU classes, and
//! follows forks so the target includes every descendant thread and process.
//!
//! Safety (see main.rs): map values (the task table: a thread's state is written by the CPU
//! it switches on, read by its waker's, see `sched_waking`), kernel memory (the task's
//! fields) and helpers.

use aya_ebpf::{
    EbpfContext,
    bindings::task_struct,
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, RawTracePointContext},
};
use fsprof_common::{
    Counter, HistKind, Lost, OnCpuTask, Program, TIME_CLASSES, TaskState, TimeClass, TimeStats,
    config::TASK_DEAD,
};

use crate::{
    common::{
        btf_read, btf_task_tid, charged, conf, count, count_n, current_tgid, current_tid, follow,
        followed, hist_add_row_global, lost, now, off_class, on_cpu, ran, row_at, run_here,
        task_tid, unfollow,
    },
    offcpu,
    stacks::{SLOT_SCHED, capture, capture_user, capture_waker},
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
    if class != TimeClass::OnCpu as u32 && class != TimeClass::Steal as u32 {
        let row = row_at(conf!(rows_off_cpu), class);
        hist_add_row_global(row, HistKind::OffCpuEpisode as u32, class, 0, ns);
    }
}

/// Ends the current off-CPU phase of `t` at `ts`; returns its class and length.
#[inline(always)]
unsafe fn close_phase(t: *mut TaskState, ts: u64) -> Option<(u32, u64)> {
    unsafe {
        if (*t).off_since == 0 {
            return None;
        }
        let ns = ts.saturating_sub((*t).off_since);
        let class = (*t).off_class;
        add_time(class, ns);
        (*t).off_since = 0;
        Some((class, ns))
    }
}

/// Ends the on-CPU interval of `t` at `ts`, `exec` its `se.sum_exec_runtime` now: what the
/// scheduler charged it is on-CPU time, the rest of the interval was stolen from its CPU.
#[inline(always)]
unsafe fn close_on_cpu(t: *mut TaskState, ts: u64, exec: u64) {
    unsafe {
        let wall = ts.saturating_sub((*t).on_since);
        let ran = charged(t, exec, wall).unwrap_or(wall);
        add_time(TimeClass::OnCpu as u32, ran);
        (*t).on_cpu_ns += ran;
        if wall > ran {
            add_time(TimeClass::Steal as u32, wall - ran);
        }
        (*t).on_since = 0;
    }
}

/// A switch-out of `t` at `ts` whose switch-in was never traced: the kernel runs some
/// switches without a sched_switch event (on these VMs, every switch away from a thread of
/// the VM's agent, PID 1). The time since the last switch-out then holds the rest of that
/// off-CPU phase and an on-CPU interval; `se.sum_exec_runtime` did not move while the
/// thread was off-CPU, so what it charged since then is the on-CPU part.
#[inline(always)]
unsafe fn switch_in_unseen(t: *mut TaskState, ts: u64, exec: u64) {
    unsafe {
        count(Counter::SwitchInsUnseen);
        let span = ts.saturating_sub((*t).off_since);
        let ran = charged(t, exec, span).unwrap_or(0);
        if let Some((class, ns)) = close_phase(t, ts.saturating_sub(ran))
            && conf!(stacks) != 0
        {
            offcpu::defer(t, class, ns);
        }
        add_time(TimeClass::OnCpu as u32, ran);
        (*t).on_cpu_ns += ran;
    }
}

// TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
//          unsigned int prev_state). A BTF tracepoint: `next` must be a typed pointer for
// bpf_get_task_stack, which unwinds the stack a thread slept in when it switches back in.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    ran(Program::SchedSwitch);
    // The tracepoint runs before the switch: current is still `prev`. The clock is read
    // only when a followed thread is involved: most switches are not theirs.
    let prev_tid = btf_task_tid(ctx.arg::<*const u8>(1));
    let cpu = on_cpu();
    let mut ts = 0;
    if let Some(t) = followed(prev_tid) {
        ts = now();
        unsafe { switch_out(&ctx, t, prev_tid, cpu, ts) };
    }
    let Some(c) = cpu else {
        return 0;
    };
    unsafe {
        (*c).tid = 0;
        (*c).sc_start = 0;
        (*c).await_user = 0;
    }
    let next_tid = btf_task_tid(ctx.arg::<*const u8>(2));
    if let Some(t) = followed(next_tid) {
        if ts == 0 {
            ts = now();
        }
        unsafe { switch_in(&ctx, t, next_tid, c, ts) };
    }
    0
}

/// Followed thread `t` (`tid`) leaves the CPU at `ts`: its on-CPU time ends, its syscall
/// in flight and user stack go with it, and it dies or starts an off-CPU phase.
#[inline(always)]
unsafe fn switch_out(
    ctx: &BtfTracePointContext,
    t: *mut TaskState,
    tid: u32,
    cpu: Option<*mut OnCpuTask>,
    ts: u64,
) {
    let (in_syscall, cached_ustack) = unsafe { take_syscall(t, tid, cpu) };
    let state = ctx.arg::<u64>(3) as u32;
    let since = unsafe { (*t).on_since };
    unsafe {
        let exec = btf_read::<u64>(ctx.arg::<*const u8>(1), conf!(task_sum_exec));
        if (*t).on_since != 0 {
            close_on_cpu(t, ts, exec);
        } else if (*t).off_since != 0 {
            switch_in_unseen(t, ts, exec);
        }
        // It does not move until the next switch-in, seen or not.
        (*t).exec_in = exec;
    }
    let stacks = conf!(stacks) != 0;
    let period = conf!(off_cpu_period_ns);
    // Back in its own context: a stack picked at the last switch-in takes its user half;
    // inside a syscall, a new one waits until a stack is picked (the thread's next
    // switch-out or syscall exit takes it).
    let mut user = cached_ustack;
    let awaiting = stacks && unsafe { offcpu::awaiting(t) };
    if stacks && user == 0 && state & TASK_DEAD == 0 && (awaiting || !in_syscall || period == 0) {
        user = capture_user(SLOT_SCHED, current_tgid());
    }
    if awaiting {
        unsafe { offcpu::complete(t, tid, user, since) };
    }
    if state & TASK_DEAD != 0 {
        unsafe { exited(t, tid, stacks, ts) };
        return;
    }
    unsafe {
        // Kept for the next episode of the same syscall only.
        (*t).ustack = if in_syscall { user } else { 0 };
        (*t).ep_user = user;
        (*t).ep_in_syscall = in_syscall as u32;
        (*t).ep_stack = if stacks && period == 0 {
            capture(ctx.as_ptr(), SLOT_SCHED, false, user)
        } else {
            0
        };
        (*t).off_since = ts;
        let preempt = ctx.arg::<u64>(0) & 1 != 0;
        (*t).off_class = off_class(preempt, state, ctx.arg::<u64>(1)) as u32;
    }
}

/// The syscall in flight on this CPU (if any, and `tid`'s) moves from the CPU to thread `t`:
/// whether there is one, and its cached user stack. Plain integers, not an Option: LLVM
/// loads an Option's payload before testing it, and verifiers before 6.4-ish reject that
/// read of an unwritten stack slot.
#[inline(always)]
unsafe fn take_syscall(t: *mut TaskState, tid: u32, cpu: Option<*mut OnCpuTask>) -> (bool, u32) {
    let (mut in_syscall, mut cached_ustack) = (false, 0u32);
    if let Some(c) = cpu
        && unsafe { (*c).tid } == tid
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
    (in_syscall, cached_ustack)
}

/// Followed thread `t` (`tid`) switched out for the last time, at `ts`.
#[inline(always)]
unsafe fn exited(t: *mut TaskState, tid: u32, stacks: bool, ts: u64) {
    unsafe {
        if (*t).followed_at != 0 {
            count_n(Counter::FollowedNs, ts.saturating_sub((*t).followed_at));
        }
        if (*t).sc_start != 0 {
            count(Counter::SyscallsUnfinished);
        }
        if stacks {
            offcpu::flush(t, tid);
        }
    }
    unfollow(tid);
    count(Counter::TasksExited);
}

/// Followed thread `t` (`tid`) gets CPU `c` at `ts`: its off-CPU phase ends (and picks a
/// stack), its on-CPU time starts.
#[inline(always)]
unsafe fn switch_in(
    ctx: &BtfTracePointContext,
    t: *mut TaskState,
    tid: u32,
    c: *mut OnCpuTask,
    ts: u64,
) {
    unsafe {
        let ended = match close_phase(t, ts) {
            Some((class, ns)) if conf!(stacks) != 0 => {
                offcpu::pick(t, class, ns).map(|(w, n)| (class, w, n))
            }
            _ => None,
        };
        let task = ctx.arg::<*mut task_struct>(2);
        // An on-CPU interval still open is a guess that was wrong (a held child that was
        // asleep, see fsprof Probes::follow): its time was no class's, nor is it followed.
        if (*t).on_since != 0 {
            (*t).followed_at += ts.saturating_sub((*t).on_since);
        }
        // Set first: the timeline dates the waits that get a stack by it.
        (*t).on_since = ts;
        (*c).await_user = offcpu::switch_in(t, tid, task, ended) as u32;
        (*t).exec_in = btf_read::<u64>(task.cast(), conf!(task_sum_exec));
        // ... and back to the CPU it runs on now.
        run_here(c, tid, t);
    }
}

// TP_PROTO(struct task_struct *p): a sleeper is being woken; from here on it waits for a
// CPU, which is run-queue time, not sleep. sched_waking, not sched_wakeup: it runs in the
// waker's own context even when the wakeup is queued to another CPU (then sched_wakeup
// fires there, in an IPI), so the waker's stack is what the blocked time waited for. It
// is unwound only for a blocked phase that gets a stack.
#[btf_tracepoint(function = "sched_waking")]
pub fn sched_waking(ctx: BtfTracePointContext) -> i32 {
    ran(Program::SchedWaking);
    if let Some(t) = followed(btf_task_tid(ctx.arg::<*const u8>(0))) {
        unsafe {
            // The wakeup may run on another CPU while the thread's own switch-out is still
            // being traced (its waker waits for it to leave the CPU only after this
            // tracepoint): a clock read before that switch-out's must not start a phase
            // before it, or the time between is counted twice (480 ns once in CI). One
            // read: read twice, the switch-out could set it between the two (0, then its
            // own later stamp), and the phase began before it (45 µs once under a busy
            // neighbour). Wakeups are serialised (p->pi_lock), and the switch-out only
            // sets it from 0, so it holds still from here.
            let since = core::ptr::read_volatile(&raw const (*t).off_since);
            let ts = now().max(since);
            if since != 0 && (*t).off_class != TimeClass::RunQueue as u32 {
                if let Some((class, ns)) = close_phase(t, ts)
                    && conf!(stacks) != 0
                {
                    if (*t).pend_ns != 0 {
                        // A second wakeup before a switch-in (seen once in thousands of
                        // direct-I/O waits on 6.18): its time waits with the short ones.
                        offcpu::defer(t, class, ns);
                    } else if let Some((w, n)) = offcpu::pick(t, class, ns) {
                        (*t).pend_class = class;
                        (*t).pend_ns = w;
                        (*t).pend_n = n;
                        (*t).pend_waker = capture_waker(ctx.as_ptr());
                    }
                }
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
    ran(Program::SchedProcessFork);
    let Some(parent) = followed(current_tid()) else {
        return 0;
    };
    let armed = unsafe { (*parent).armed };
    let Some(child) = task_tid(ctx.arg::<u64>(1)) else {
        return 0;
    };
    // A new task is runnable until it first runs, and then returns from fork (clone) to
    // the parent's user code: the stack of that first wait takes its user half there, at
    // the child's exit from the syscall, as any wait inside a syscall does. Without it, the
    // stack was `ret_from_fork` alone, with no user frames, and it took every short
    // run-queue wait of the task that never added up to a picked one.
    let ts = now();
    let state = TaskState {
        off_since: ts,
        followed_at: ts,
        off_class: TimeClass::RunQueue as u32,
        armed,
        ep_in_syscall: 1,
        ..TaskState::default()
    };
    if follow(child, &state).is_err() {
        lost(Lost::TaskTableFull);
    } else {
        count(Counter::TasksForked);
    }
    0
}
