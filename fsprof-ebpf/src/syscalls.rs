//! Syscall boundary: count, errors, bytes and latency per syscall number, for followed
//! threads only. The per-CPU `OnCpuTask` says whether a followed thread runs here (every
//! traced switch sets or clears it), so a followed thread's syscall costs no hash lookup:
//! one clock read per hook on top of what any program on these hooks costs. Elsewhere
//! each hook asks the follow hint (a pid helper call and one array load), which also
//! catches a followed thread whose switch-in the kernel did not trace.
//!
//! Safety (see main.rs): map values (the task table, this CPU's `OnCpuTask`).

use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::{Array, PerCpuArray},
    programs::RawTracePointContext,
};
use fsprof_common::{
    HistKind, Lost, MAX_SYSCALLS, NO_ROW, Program, SyscallStats, timeline::TimelineKind,
};

use crate::{
    common::{
        adopt_current, conf, current_tgid, current_tid, followed, hist_add_row, lost, now, on_cpu,
        ran,
    },
    offcpu,
    stacks::{SLOT_SYSCALL, capture_user},
    timeline, unwind,
};

/// mmap on x86-64: its return is where the loader put a library's code (see
/// unwind::learn_mapping).
const SYS_MMAP: u32 = 9;

#[map]
static SYSCALLS: PerCpuArray<SyscallStats> = PerCpuArray::with_max_entries(MAX_SYSCALLS, 0);

/// Syscall number → 1 + its dense histogram row (0: none), set by userspace for the
/// syscalls filesystem work makes most.
#[map]
static SYSCALL_ROW: Array<u32> = Array::with_max_entries(MAX_SYSCALLS, 0);

#[inline(always)]
fn add_latency(nr: u32, latency: u64) {
    let row = match SYSCALL_ROW.get(nr) {
        Some(r) if *r != 0 => *r - 1,
        _ => NO_ROW,
    };
    hist_add_row(row, HistKind::SyscallLatency, 0, nr, latency);
}

// TP_PROTO(struct pt_regs *regs, long id)
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> i32 {
    ran(Program::SysEnter);
    let Some(c) = on_cpu() else {
        return 0;
    };
    unsafe {
        if (*c).tid == 0 && !adopt_current(c) {
            return 0;
        }
        (*c).sc_nr = ctx.arg::<u64>(1) as u32;
        (*c).ustack = 0;
        (*c).sc_start = now();
    }
    0
}

/// A stack picked while the thread slept in this syscall takes its user half: the user
/// stack is the syscall's, still in place until it returns.
#[inline(always)]
fn complete_user(tid: u32, cached: u32) {
    let Some(t) = followed(tid) else {
        return;
    };
    let user = if cached != 0 {
        cached
    } else {
        capture_user(SLOT_SYSCALL, current_tgid())
    };
    unsafe { offcpu::complete(t, tid, user, (*t).on_since) };
}

// TP_PROTO(struct pt_regs *regs, long ret)
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    ran(Program::SysExit);
    let Some(c) = on_cpu() else {
        return 0;
    };
    let (nr, start, armed) = unsafe {
        if (*c).tid == 0 && !adopt_current(c) {
            return 0;
        }
        let tid = (*c).tid;
        if (*c).await_user != 0 {
            (*c).await_user = 0;
            complete_user(tid, (*c).ustack);
        }
        ((*c).sc_nr, (*c).sc_start, (*c).armed)
    };
    if start == 0 {
        return 0;
    }
    unsafe { (*c).sc_start = 0 };
    // Entered before exec, finished after it: execve itself counts, nothing earlier does.
    if armed == 0 {
        return 0;
    }
    let latency = now().saturating_sub(start);
    let ret = ctx.arg::<i64>(1);
    if nr == SYS_MMAP && ret > 0 && unwind::on() {
        unwind::learn_mapping(SLOT_SYSCALL, current_tgid(), ret as u64);
    }
    if nr >= MAX_SYSCALLS {
        lost(Lost::SyscallOutOfRange);
        return 0;
    }
    if let Some(s) = SYSCALLS.get_ptr_mut(nr) {
        unsafe {
            (*s).count += 1;
            if ret < 0 {
                (*s).errors += 1;
            } else {
                (*s).ret_sum = (*s).ret_sum.wrapping_add(ret as u64);
            }
            (*s).total_ns += latency;
        }
    }
    add_latency(nr, latency);
    if latency >= conf!(timeline_syscall_ns) {
        timeline::span(TimelineKind::Syscall, nr, start, ret);
    }
    0
}

// TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm): the held
// child became the target command; from here on its syscalls count.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec(_ctx: RawTracePointContext) -> i32 {
    ran(Program::SchedProcessExec);
    let tid = current_tid();
    if let Some(t) = followed(tid) {
        unsafe { (*t).armed = 1 };
        if unwind::on() {
            // The kernel mapped the program and its loader; the loader maps the rest.
            let tgid = current_tgid();
            unwind::exec_seen(tgid);
            if let Some(pc) = unwind::user_pc() {
                unwind::learn_mapping(SLOT_SYSCALL, tgid, pc);
            }
            if let Some(text) = unwind::program_text() {
                unwind::learn_mapping(SLOT_SYSCALL, tgid, text);
            }
        }
        if let Some(c) = on_cpu()
            && unsafe { (*c).tid } == tid
        {
            unsafe { (*c).armed = 1 };
        }
    }
    0
}
