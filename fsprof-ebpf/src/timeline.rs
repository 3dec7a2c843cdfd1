//! The timeline (`--timeline`): every context switch and wakeup on the machine, the
//! target's forks and the watched devices' block requests, streamed through the TIMELINE
//! ring buffer as they happen, for a Perfetto trace. These programs are attached only when
//! a timeline is asked for. What the aggregating programs see themselves (block requests,
//! fs begin/end pairs, slow syscalls, off-CPU time given a stack) they stream through the
//! subprograms here, which are one branch when the timeline is off.
//!
//! Safety (see main.rs): helpers (ring buffer reserve and submit: an event is written only
//! into space reserved for it) and map values.

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE},
    helpers::bpf_get_smp_processor_id,
    macros::{btf_tracepoint, map},
    maps::{PerCpuArray, RingBuf},
    programs::BtfTracePointContext,
};
use fsprof_common::{
    Lost, Program, TimeClass,
    config::TASK_DEAD,
    timeline::{
        TIMELINE_BLOCKED_FRAMES, TIMELINE_DEAD, TIMELINE_OFF_BYTES, TimelineBlock, TimelineBlocked,
        TimelineFork, TimelineHeader, TimelineKind, TimelineSpan, TimelineStack, TimelineSwitch,
        TimelineTask, TimelineWaking,
    },
};

use crate::{
    common::{
        btf_read, btf_task_tid, class_of, conf, current_tgid, current_tid, data_len, followed,
        lost, now, off_class, ran,
    },
    stacks::get_stack,
};

/// Sized by userspace (TIMELINE_BYTES) when the timeline is on.
#[map]
static TIMELINE: RingBuf = RingBuf::with_byte_size(TIMELINE_OFF_BYTES, 0);

/// Per CPU, records lost since this CPU's last one (see `TimelineHeader::lost_before`).
#[map]
static TIMELINE_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn header(kind: TimelineKind) -> TimelineHeader {
    let mut h = TimelineHeader::default();
    unsafe { write_header(&mut h, kind) };
    h
}

/// `header(kind)`, written at `h` (in the ring, not on the stack).
#[inline(always)]
unsafe fn write_header(h: *mut TimelineHeader, kind: TimelineKind) {
    unsafe {
        (*h).kind = kind as u32;
        (*h).cpu = bpf_get_smp_processor_id();
        (*h).ts = now();
        (*h).lost_before = 0;
    }
}

/// Writes `ev` (a timeline record, its `TimelineHeader` first).
#[inline(always)]
fn emit<T: Copy + 'static>(ev: T) {
    emit_with(|p: *mut T| unsafe { p.write(ev) });
}

/// Writes a timeline record that `fill` builds in place (its `TimelineHeader` first). The
/// consumer is not woken per record: it drains on a timer, and is woken only when the ring
/// is half full (a wakeup per record would make fsprof's own thread switch, and so record,
/// all the time).
#[inline(always)]
fn emit_with<T: 'static>(fill: impl FnOnce(*mut T)) {
    let missed = TIMELINE_LOST.get_ptr_mut(0);
    let Some(mut entry) = TIMELINE.reserve::<T>(0) else {
        lost(Lost::TimelineFull);
        if let Some(m) = missed {
            unsafe { *m += 1 };
        }
        return;
    };
    let p = entry.as_mut_ptr();
    fill(p);
    if let Some(m) = missed {
        unsafe {
            (*p.cast::<TimelineHeader>()).lost_before = *m;
            *m = 0;
        }
    }
    let half = TIMELINE.query(BPF_RB_RING_SIZE as u64) / 2;
    let wake = if TIMELINE.query(BPF_RB_AVAIL_DATA as u64) > half {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    entry.submit(wake as u64);
}

/// Streams what the current thread did from `start` until now, when the timeline is on
/// (called by the fs event program for a completed pair, by sys_exit for a slow syscall).
/// A function of its own (a BPF subprogram), written in place: sys_exit's frame plus the
/// unwinder's were 512 bytes, the verifier's limit, and 6.1 refused sys_exit at 544 with
/// this inlined.
#[inline(never)]
pub fn span(kind: TimelineKind, id: u32, start: u64, value: i64) {
    if conf!(timeline) == 0 {
        return;
    }
    emit_with(|s: *mut TimelineSpan| unsafe {
        write_header(&raw mut (*s).head, kind);
        (*s).start = start;
        (*s).value = value;
        (*s).tid = current_tid();
        (*s).tgid = current_tgid();
        (*s).id = id;
        (*s)._pad = 0;
    });
}

/// Streams off-CPU time `ns` of `class` that thread `tid` spent until `ts` and that went
/// to stack `stack`, when the timeline is on (called where the off-CPU stacks are
/// weighted). A subprogram: sched_switch weighs stacks in ten places.
#[inline(never)]
pub fn off_cpu_stack(ts: u64, tid: u32, class: u32, stack: u32, ns: u64) {
    if conf!(timeline) == 0 {
        return;
    }
    emit_with(|s: *mut TimelineStack| unsafe {
        write_header(&raw mut (*s).head, TimelineKind::OffCpuStack);
        // 0: its switch-in was not seen (attached meanwhile); now, then.
        if ts != 0 {
            (*s).head.ts = ts;
        }
        (*s).ns = ns;
        (*s).tid = tid;
        (*s).class = class;
        (*s).stack = stack;
        (*s)._pad = 0;
    });
}

#[inline(always)]
fn task(t: *const u8) -> TimelineTask {
    TimelineTask {
        tid: btf_task_tid(t),
        tgid: btf_read::<i32>(t, conf!(task_tgid)) as u32,
        prio: btf_read::<i32>(t, conf!(task_prio)) as u32,
        _pad: 0,
        comm: btf_read::<[u8; 16]>(t, conf!(task_comm)),
    }
}

// TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
//          unsigned int prev_state): every switch, so each CPU's track and every thread's
// state are whole, not only the target's.
#[btf_tracepoint(function = "sched_switch")]
pub fn timeline_switch(ctx: BtfTracePointContext) -> i32 {
    ran(Program::TimelineSwitch);
    let (prev, next) = (ctx.arg::<*const u8>(1), ctx.arg::<*const u8>(2));
    let state = ctx.arg::<u64>(3) as u32;
    let preempt = ctx.arg::<u64>(0) & 1 != 0;
    let prev_class = if state & TASK_DEAD != 0 {
        TIMELINE_DEAD
    } else {
        off_class(preempt, state, prev as u64) as u32
    };
    let (prev, next) = (task(prev), task(next));
    let blocked = conf!(timeline_blocked) != 0
        && (prev_class == TimeClass::IoWait as u32
            || prev_class == TimeClass::Uninterruptible as u32);
    emit(TimelineSwitch {
        head: header(TimelineKind::Switch),
        prev_followed: followed(prev.tid).is_some() as u32,
        next_followed: followed(next.tid).is_some() as u32,
        prev,
        next,
        prev_state: state,
        prev_class,
        preempt: preempt as u32,
        _pad: 0,
    });
    if blocked {
        emit_with(|b: *mut TimelineBlocked| unsafe {
            write_header(&raw mut (*b).head, TimelineKind::Blocked);
            (*b).tid = prev.tid;
            (*b).io_wait = (prev_class == TimeClass::IoWait as u32) as u32;
            // Current is still `prev`. On failure the helper zeroes the buffer too.
            get_stack(
                ctx.as_ptr(),
                (*b).frames.as_mut_ptr(),
                (8 * TIMELINE_BLOCKED_FRAMES) as u32,
                0,
            );
        });
    }
    0
}

// TP_PROTO(struct task_struct *p), in the waker's context.
#[btf_tracepoint(function = "sched_waking")]
pub fn timeline_waking(ctx: BtfTracePointContext) -> i32 {
    ran(Program::TimelineWaking);
    emit(TimelineWaking {
        head: header(TimelineKind::Waking),
        woken: task(ctx.arg::<*const u8>(0)),
        waker_tid: current_tid(),
        _pad: 0,
    });
    0
}

// TP_PROTO(struct task_struct *parent, struct task_struct *child): a new task is runnable
// from here, and no sched_waking says so.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn timeline_fork(ctx: BtfTracePointContext) -> i32 {
    ran(Program::TimelineFork);
    let parent = btf_task_tid(ctx.arg::<*const u8>(0));
    if followed(parent).is_none() {
        return 0;
    }
    emit(TimelineFork {
        head: header(TimelineKind::Fork),
        child: task(ctx.arg::<*const u8>(1)),
        parent_tid: parent,
        _pad: 0,
    });
    0
}

/// Streams a watched device's block request at its issue, or a part of its completion
/// (`bytes`), when the timeline is on. Called by the core block programs (`block.rs`), not
/// programs of its own: attached apart, a request issued between the attaches was counted
/// without a slice, and the core programs could not attach completion before issue.
#[inline(never)]
pub fn block(rq: *const u8, dev: u32, issue: bool, bytes: u32) {
    if conf!(timeline) == 0 {
        return;
    }
    let kind = if issue {
        TimelineKind::BlockIssue
    } else {
        TimelineKind::BlockComplete
    };
    emit(TimelineBlock {
        head: header(kind),
        rq: rq as u64,
        arrived: if issue {
            btf_read::<u64>(rq, conf!(request_start_time_ns))
        } else {
            0
        },
        sector: btf_read::<u64>(rq, conf!(request_sector)),
        dev,
        class: class_of(rq) as u32,
        bytes,
        left: if issue { 0 } else { data_len(rq) },
    });
}
