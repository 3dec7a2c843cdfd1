//! The timeline's event stream (`--timeline`): what the `timeline_*` programs write into
//! the TIMELINE ring buffer, one record per event, in the order each CPU saw them. Every
//! record starts with a `TimelineHeader`, whose `kind` says which struct it is.

/// Bytes of the TIMELINE ring buffer when the timeline is on (a power of two of pages): at
/// ~80 bytes a record, ~400k events may wait for the consumer, which drains it every few
/// milliseconds. Off, the map is created with one page.
pub const TIMELINE_BYTES: u32 = 32 << 20;
pub const TIMELINE_OFF_BYTES: u32 = 4096;

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(strum::VariantArray, strum::IntoStaticStr),
    strum(serialize_all = "snake_case")
)]
pub enum TimelineKind {
    Switch = 1,
    Waking = 2,
    Fork = 3,
    BlockIssue = 4,
    BlockComplete = 5,
    FsPair = 6,
    Syscall = 7,
    Blocked = 8,
    OffCpuStack = 9,
}

#[cfg(feature = "user")]
impl TimelineKind {
    pub fn from_u32(v: u32) -> Option<TimelineKind> {
        <TimelineKind as strum::VariantArray>::VARIANTS
            .iter()
            .copied()
            .find(|k| *k as u32 == v)
    }

    /// The snake_case name the summary counts records by.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelineHeader {
    pub kind: u32,
    pub cpu: u32,
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC), as every other fsprof time.
    pub ts: u64,
    /// Records this CPU could not write since its last record (ring buffer full): the
    /// consumer marks the gap here.
    pub lost_before: u64,
}

/// A thread as the scheduler names it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelineTask {
    pub tid: u32,
    pub tgid: u32,
    pub prio: u32,
    pub _pad: u32,
    pub comm: [u8; 16],
}

/// Value of `TimelineSwitch::prev_class` for a thread that exits (TASK_DEAD): its last
/// switch-out. Other values are a `TimeClass`.
pub const TIMELINE_DEAD: u32 = 0xff;

/// A context switch where a followed thread leaves or takes a CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelineSwitch {
    pub head: TimelineHeader,
    pub prev: TimelineTask,
    pub next: TimelineTask,
    /// `prev`'s task state as the tracepoint passed it (`__state`: TASK_* bits).
    pub prev_state: u32,
    /// The off-CPU class `prev` goes into as fsprof counts it (`TimeClass`), or
    /// TIMELINE_DEAD.
    pub prev_class: u32,
    /// Non-zero: `prev` was preempted (it stays runnable).
    pub preempt: u32,
    /// Non-zero when `prev` is followed, and so is `next`.
    pub prev_followed: u32,
    pub next_followed: u32,
    pub _pad: u32,
}

/// A followed thread woken (sched_waking, in the waker's context).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelineWaking {
    pub head: TimelineHeader,
    pub woken: TimelineTask,
    pub waker_tid: u32,
    pub _pad: u32,
}

/// A followed thread forked a thread or process, runnable from here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelineFork {
    pub head: TimelineHeader,
    pub child: TimelineTask,
    pub parent_tid: u32,
    pub _pad: u32,
}

/// A block request issued to a watched device, or a part of it completed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelineBlock {
    pub head: TimelineHeader,
    /// The request (`struct request *`): pairs its issue with its completion.
    pub rq: u64,
    /// Issue: when the block layer took the request in (0: not known); completion: 0.
    pub arrived: u64,
    pub sector: u64,
    pub dev: u32,
    /// `BlockClass`.
    pub class: u32,
    /// Issue: the request's bytes; completion: the bytes this part completed.
    pub bytes: u32,
    /// Completion: the request's bytes not yet completed before this part (this part is
    /// its last when `bytes >= left`).
    pub left: u32,
}

/// Something a thread did from `start` to the header's `ts`: a filesystem begin/end pair
/// (`id`: the pair, as `fs_events` numbers them; the end's thread) or a syscall (`id`: its
/// number; `value`: its return value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelineSpan {
    pub head: TimelineHeader,
    pub start: u64,
    pub value: i64,
    pub tid: u32,
    pub tgid: u32,
    pub id: u32,
    pub _pad: u32,
}

/// Kernel frames kept of a thread that blocks uninterruptibly: past the tracepoint's own
/// frames and the scheduler's (`__schedule`, `schedule`, `io_schedule`, …) to the function
/// that waited.
pub const TIMELINE_BLOCKED_FRAMES: usize = 16;

/// A thread that just switched out in D state: where in the kernel it blocked (the record
/// follows its switch's, on the same CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelineBlocked {
    pub head: TimelineHeader,
    pub tid: u32,
    /// Non-zero: it waits for I/O (`in_iowait`).
    pub io_wait: u32,
    /// Its kernel stack at the switch, leaf first, zero-filled.
    pub frames: [u64; TIMELINE_BLOCKED_FRAMES],
}

/// Off-CPU time of a followed thread given a stack, as the stack weights get it: a wait
/// that took a stack (with the shorter ones of its class since the last, see
/// fsprof-ebpf `offcpu`), or at exit what its class had not yet attributed. The header's
/// `ts` is when the wait ended (the thread's switch-in; at exit, the exit).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TimelineStack {
    pub head: TimelineHeader,
    pub ns: u64,
    pub tid: u32,
    /// `TimeClass`.
    pub class: u32,
    /// The stack's id (STACK_IDS); 0: none could be had.
    pub stack: u32,
    pub _pad: u32,
}

// Read by userspace as plain bytes: no implicit padding anywhere.
const _: () = {
    assert!(core::mem::size_of::<TimelineHeader>() == 24);
    assert!(core::mem::size_of::<TimelineTask>() == 32);
    assert!(core::mem::size_of::<TimelineSwitch>() == 24 + 64 + 24);
    assert!(core::mem::size_of::<TimelineWaking>() == 24 + 32 + 8);
    assert!(core::mem::size_of::<TimelineFork>() == 24 + 32 + 8);
    assert!(core::mem::size_of::<TimelineBlock>() == 24 + 24 + 16);
    assert!(core::mem::size_of::<TimelineSpan>() == 24 + 16 + 16);
    assert!(core::mem::size_of::<TimelineStack>() == 24 + 8 + 16);
    assert!(core::mem::size_of::<TimelineBlocked>() == 24 + 8 + 8 * TIMELINE_BLOCKED_FRAMES);
};
