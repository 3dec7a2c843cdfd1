//! Off-CPU stacks: which waits of a followed thread get a stack, and how their time is
//! attributed so that stack weights add up to the time classes exactly.
//!
//! Unwinding a kernel stack costs 3–6 µs here (ORC through module text), a user stack of
//! a binary without frame pointers ~2 µs; a stack for each of rm's 18k short waits on xfs
//! made it 10 % slower. So, with a period P (`off_cpu_period_ns`): a phase of at least P
//! gets its own stack; shorter ones add up per thread and class, and the one that brings
//! the sum to P takes it (picked with a chance proportional to its length, as an on-CPU
//! sample picks code), as does the first of each class. The kernel stack is unwound only
//! for picked phases, when the thread switches back in (it is still in place then);
//! the user stack of a wait inside a syscall is taken when the thread next runs in its
//! own context (its next switch-out or its syscall exit), since the user stack of a
//! sleeping thread cannot be read. P = 0: every phase, with the stack taken at switch-out
//! as it happens (scheduler frames included).
//!
//! Safety (see main.rs): map values (the followed thread's `TaskState`, this CPU's scratch)
//! and helpers (stacks).

use aya_ebpf::{bindings::task_struct, macros::map, maps::HashMap};
use fsprof_common::{Counter, StackKey, TIME_CLASSES, TaskState};

use crate::{
    common::{conf, count, now},
    stacks::{add_wake, add_weight, key_id, task_key},
    timeline,
};

/// Kernel halves of stacks waiting for their user half, by thread. Few threads are ever
/// between a picked switch-in and their next kernel exit at once.
#[map]
static PENDING_KEYS: HashMap<u32, StackKey> = HashMap::with_max_entries(4096, 0);

const CLASSES: usize = TIME_CLASSES as usize;

/// Whether a phase of `ns` in `class` gets a stack; Some((ns, phases)) to attribute, the
/// time and phases accumulated since the last one included.
#[inline(always)]
pub unsafe fn pick(t: *mut TaskState, class: u32, ns: u64) -> Option<(u64, u32)> {
    let c = class as usize;
    if c >= CLASSES {
        return None;
    }
    unsafe {
        let period = conf!(off_cpu_period_ns);
        let acc = (*t).short_ns[c] + ns;
        if ns < period && acc < period && (*t).last_stack[c] != 0 {
            defer(t, class, ns);
            return None;
        }
        let n = (*t).short_n[c] + 1;
        (*t).short_ns[c] = 0;
        (*t).short_n[c] = 0;
        Some((acc, n))
    }
}

/// Adds a phase to the time its class has not yet attributed (the next picked phase of
/// the class, or at exit its last stack, takes it).
#[inline(always)]
pub unsafe fn defer(t: *mut TaskState, class: u32, ns: u64) {
    let c = class as usize;
    if c < CLASSES {
        unsafe {
            (*t).short_ns[c] += ns;
            (*t).short_n[c] += 1;
        }
    }
}

/// At a switch-in: the phases picked (the blocked one chosen at its wakeup, and `ended`,
/// the one that ends now) get the stack the thread slept in. Returns true when that
/// stack waits for its user half (`complete`).
#[inline(always)]
pub unsafe fn switch_in(
    t: *mut TaskState,
    tid: u32,
    task: *mut task_struct,
    ended: Option<(u32, u64, u32)>,
) -> bool {
    unsafe {
        if (*t).pend_ns == 0 && ended.is_none() {
            return false;
        }
        let mut mask = 0;
        if (*t).pend_ns != 0 {
            (*t).aw_class[0] = (*t).pend_class;
            (*t).aw_ns[0] = (*t).pend_ns;
            (*t).aw_n[0] = (*t).pend_n;
            (*t).aw_waker = (*t).pend_waker;
            (*t).pend_ns = 0;
            mask |= 1;
        }
        if let Some((class, ns, n)) = ended {
            (*t).aw_class[1] = class;
            (*t).aw_ns[1] = ns;
            (*t).aw_n[1] = n;
            mask |= 2;
        }
        (*t).aw_mask = mask;
        if conf!(off_cpu_period_ns) == 0 {
            attribute(t, tid, (*t).ep_stack, (*t).on_since);
            return false;
        }
        let Some(key) = task_key(task, (*t).ep_user) else {
            attribute(t, tid, 0, (*t).on_since);
            return false;
        };
        if (*t).ep_user != 0 || (*t).ep_in_syscall == 0 {
            attribute(t, tid, key_id(&*key), (*t).on_since);
            return false;
        }
        if PENDING_KEYS.insert(&tid, &*key, 0).is_err() {
            count(Counter::UserStackFailed);
            attribute(t, tid, key_id(&*key), (*t).on_since);
            return false;
        }
        true
    }
}

/// The thread runs in its own context again: its pending stack gets user stack `user`;
/// `since` is when it last switched in (when the phases it waits with ended).
#[inline(always)]
pub unsafe fn complete(t: *mut TaskState, tid: u32, user: u32, since: u64) {
    unsafe {
        let mut id = 0;
        if let Some(key) = PENDING_KEYS.get_ptr_mut(&tid) {
            (*key).user = user;
            id = key_id(&*key);
            let _ = PENDING_KEYS.remove(&tid);
        }
        attribute(t, tid, id, since);
    }
}

/// Whether `t` has phases waiting for their user stack.
#[inline(always)]
pub unsafe fn awaiting(t: *const TaskState) -> bool {
    unsafe { (*t).aw_mask != 0 }
}

/// Adds the phases waiting in `t` (thread `tid`) to `stack` (the blocked one also to its
/// waker edge); they ended at `since`, its last switch-in.
#[inline(always)]
unsafe fn attribute(t: *mut TaskState, tid: u32, stack: u32, since: u64) {
    unsafe {
        let mask = (*t).aw_mask;
        if mask & 1 != 0 {
            let (class, ns, n, waker) =
                ((*t).aw_class[0], (*t).aw_ns[0], (*t).aw_n[0], (*t).aw_waker);
            add_weight(stack, class, ns, n);
            add_wake(waker, stack, class, ns, n);
            remember(t, class, stack, waker);
            timeline::off_cpu_stack(since, tid, class, stack, ns);
        }
        if mask & 2 != 0 {
            let (class, ns, n) = ((*t).aw_class[1], (*t).aw_ns[1], (*t).aw_n[1]);
            add_weight(stack, class, ns, n);
            remember(t, class, stack, 0);
            timeline::off_cpu_stack(since, tid, class, stack, ns);
        }
        (*t).aw_mask = 0;
    }
}

#[inline(always)]
unsafe fn remember(t: *mut TaskState, class: u32, stack: u32, waker: u32) {
    let c = class as usize;
    if c < CLASSES {
        unsafe {
            (*t).last_stack[c] = stack;
            (*t).last_waker[c] = waker;
        }
    }
}

/// At exit, time not yet attributed goes to the last stack of its class (and its waker):
/// stack weights then add up to the class totals exactly.
#[inline(always)]
pub unsafe fn flush(t: *mut TaskState, tid: u32) {
    unsafe {
        if awaiting(t) {
            complete(t, tid, 0, now());
        }
        // A blocked phase whose wakeup came too late for the last switch-in (seen once in
        // tens of traces: a parent's wait4 while its child exits) joins its class's rest.
        if (*t).pend_ns != 0 {
            let c = (*t).pend_class as usize;
            if c < CLASSES {
                (*t).short_ns[c] += (*t).pend_ns;
                (*t).short_n[c] += (*t).pend_n;
                (*t).last_waker[c] = (*t).pend_waker;
            }
            (*t).pend_ns = 0;
        }
        for c in 1..CLASSES {
            let ns = (*t).short_ns[c];
            if ns != 0 {
                let (stack, n, waker) = ((*t).last_stack[c], (*t).short_n[c], (*t).last_waker[c]);
                add_weight(stack, c as u32, ns, n);
                timeline::off_cpu_stack(now(), tid, c as u32, stack, ns);
                if waker != 0 {
                    add_wake(waker, stack, c as u32, ns, n);
                }
            }
        }
    }
}
