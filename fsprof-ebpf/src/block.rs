//! Block layer, per device and request class: requests, bytes, size, queue latency
//! (arrival → issue) and device latency (issue → complete). A request in flight on a device
//! with a slot is found by its hardware queue and tag (INFLIGHT), others by their
//! `struct request *` (REQUESTS). BTF tracepoints: the request's fields are plain loads.
//! Devices userspace gave a slot keep their statistics and histograms in per-CPU arrays;
//! others (a disk that appeared during the trace) in the hashes.
//!
//! Safety (see main.rs): map values (per-CPU rows and the request hashes) and kernel memory
//! (the request's fields).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    helpers::generated,
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use fsprof_common::{
    BLOCK_CLASSES, BlockKey, BlockStats, CpuKey, HistKind, INFLIGHT_TAGS, Lost, MAX_BLOCK_KEYS,
    MAX_BLOCK_SLOTS, MAX_FILTER_DEVS, MAX_INFLIGHT_REQUESTS, MAX_INFLIGHT_SLOTS, NO_ROW, Program,
    RequestTimes, block_row, inflight_index,
};

use crate::{
    common::{
        btf_read, class_of, conf, data_len, entry_or_lost, hist_add_row_global, lost, now, ran,
        read_kernel, read_or_zero, row_at,
    },
    timeline,
};

#[map]
static BLOCK: HashMap<CpuKey<BlockKey>, BlockStats> = HashMap::with_max_entries(MAX_BLOCK_KEYS, 0);

/// Statistics of the devices with a slot, by `slot * BLOCK_CLASSES + class`.
#[map]
static BLOCK_SLOTS: PerCpuArray<BlockStats> =
    PerCpuArray::with_max_entries(MAX_BLOCK_SLOTS * BLOCK_CLASSES, 0);

/// Requests in flight on devices with a slot, at `inflight_index`. An entry whose request
/// was never seen to complete is counted as unseen when the tag's next request takes it;
/// userspace reads what is left at the end through a mapping.
#[map]
static INFLIGHT: Array<RequestTimes> = Array::with_max_entries(MAX_INFLIGHT_SLOTS, BPF_F_MMAPABLE);

/// The other requests issued and not yet completed or requeued: every one leaves again,
/// so the table needs no LRU (whose inserts cost twice a plain hash's).
#[map]
static REQUESTS: HashMap<u64, RequestTimes> = HashMap::with_max_entries(MAX_INFLIGHT_REQUESTS, 0);

/// Kernel dev_t → its slot (NO_ROW: none), set by userspace before attaching: the devices
/// to watch when CONFIG.filter_devices is set, else the disks present at start.
#[map]
static DEVICES: HashMap<u32, u32> = HashMap::with_max_entries(MAX_FILTER_DEVS, 0);

/// Per CPU, the devices last looked up in DEVICES, direct-mapped by dev_t, each as
/// `dev << 32 | slot` (one store, so a completion interrupting an issue on this CPU never
/// sees half an entry): a request's issue and completion each skip the hash (~120 ns).
#[map]
static DEV_CACHE: PerCpuArray<u64> = PerCpuArray::with_max_entries(DEV_CACHE_WAYS, 0);
const DEV_CACHE_WAYS: u32 = 8;

/// Slot of a device that does not count (CONFIG.filter_devices, not in DEVICES).
const FILTERED: u32 = NO_ROW - 1;

#[inline(always)]
fn slot_of(dev: u32) -> u32 {
    let cache = DEV_CACHE.get_ptr_mut((dev ^ (dev >> 20)) % DEV_CACHE_WAYS);
    if let Some(c) = cache {
        let e = unsafe { *c };
        // dev_t 0 has no disk, so a zeroed entry never matches.
        if (e >> 32) as u32 == dev {
            return e as u32;
        }
    }
    let slot = match unsafe { DEVICES.get(dev) } {
        Some(slot) => *slot,
        None if conf!(filter_devices) != 0 => FILTERED,
        None => NO_ROW,
    };
    if let Some(c) = cache {
        unsafe { *c = (dev as u64) << 32 | slot as u64 };
    }
    slot
}

/// The request's device: its kernel dev_t and slot, or None when it is filtered out.
#[inline(always)]
pub(crate) fn watched_dev(rq: *const u8) -> Option<(u32, u32)> {
    let q = read_or_zero::<u64>(rq as u64, conf!(request_q));
    let disk = read_or_zero::<u64>(q, conf!(queue_disk));
    if disk == 0 {
        return None;
    }
    let major = read_or_zero::<i32>(disk, conf!(disk_major)) as u32;
    let minor = read_or_zero::<i32>(disk, conf!(disk_first_minor)) as u32;
    let dev = fsprof_common::kdev::make(major, minor);
    let slot = slot_of(dev);
    (slot != FILTERED).then_some((dev, slot))
}

/// Where a request in flight is kept: INFLIGHT's entry (and the driver tag it is at), or
/// the hash.
enum Place {
    Array(*mut RequestTimes, i32),
    Hash,
}

/// The request's INFLIGHT entry when its device has a slot and its queue and tag fit the
/// array, else the hash. Both stay as they were from issue to completion or requeue.
#[inline(always)]
fn place_of(rq: *const u8, slot: u32) -> Place {
    if slot == NO_ROW {
        return Place::Hash;
    }
    let hctx = read_or_zero::<u64>(rq as u64, conf!(request_mq_hctx));
    if hctx == 0 {
        return Place::Hash;
    }
    let queue = read_or_zero::<u32>(hctx, conf!(hctx_queue_num));
    let tag = btf_read::<i32>(rq, conf!(request_tag));
    match inflight_index(slot, queue, tag).and_then(|i| INFLIGHT.get_ptr_mut(i)) {
        Some(e) => Place::Array(e, tag),
        None => Place::Hash,
    }
}

/// The issue time and class of `rq` at `place`, if its issue was seen.
#[inline(always)]
fn issued(rq: *const u8, place: &Place) -> Option<RequestTimes> {
    match place {
        Place::Array(e, _) => {
            let t = unsafe { **e };
            (t.rq == rq as u64).then_some(t)
        }
        Place::Hash => unsafe { REQUESTS.get(rq as u64) }.copied(),
    }
}

#[inline(always)]
fn forget(rq: *const u8, place: &Place) {
    match place {
        Place::Array(e, _) => unsafe {
            if (**e).rq == rq as u64 {
                (**e).rq = 0;
            }
        },
        Place::Hash => {
            let _ = REQUESTS.remove(rq as u64);
        }
    }
}

#[inline(always)]
fn stats(dev: u32, slot: u32, class: u32) -> Option<*mut BlockStats> {
    if slot != NO_ROW {
        return BLOCK_SLOTS.get_ptr_mut(slot * BLOCK_CLASSES + class);
    }
    let key = BlockKey { dev, class };
    entry_or_lost(&BLOCK, key, Lost::BlockKeysFull)
}

/// Adds `value` to block histogram `kind` of a device and class.
#[inline(always)]
fn add(kind: HistKind, dev: u32, slot: u32, class: u32, value: u64) {
    let row = if slot == NO_ROW {
        NO_ROW
    } else {
        row_at(conf!(rows_block), block_row(slot, class, kind))
    };
    hist_add_row_global(row, kind as u32, class, dev, value);
}

/// Whether `before`, the request last issued at `tag`, was never seen completing: it
/// still holds the tag. A request gives its tag back by completing, or by a requeue, which
/// with an I/O scheduler happens before the requeue tracepoint fires, so another CPU can
/// issue at the tag first: then `before` no longer holds it (no tag, or another one).
#[inline(always)]
fn missed(before: u64, rq: *const u8, tag: i32) -> bool {
    before != 0
        && before != rq as u64
        && read_kernel::<i32>(before, conf!(request_tag)) == Some(tag)
}

// TP_PROTO(struct request *rq). Queue time runs from the kernel's own stamp of the
// request's arrival (`start_time_ns`, set for I/O statistics or a scheduler), so no program
// needs to run, and no table entry to live, before the issue.
#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue(ctx: BtfTracePointContext) -> i32 {
    ran(Program::BlockRqIssue);
    let rq = ctx.arg::<*const u8>(0);
    let Some((dev, slot)) = watched_dev(rq) else {
        return 0;
    };
    timeline::block(rq, dev, true, data_len(rq));
    let ts = now();
    let class = class_of(rq) as u32;
    let Some(s) = stats(dev, slot, class) else {
        return 0;
    };
    unsafe { (*s).issued += 1 };
    add(HistKind::BlockSize, dev, slot, class, data_len(rq) as u64);
    let start = btf_read::<u64>(rq, conf!(request_start_time_ns));
    if start != 0 && start <= ts {
        let q = ts - start;
        unsafe { (*s).queue_ns += q };
        add(HistKind::BlockQueueLatency, dev, slot, class, q);
    }
    let times = RequestTimes {
        rq: rq as u64,
        issue: ts,
        class,
        dev,
    };
    match place_of(rq, slot) {
        // The driver sees the request only after this returns: its completion, on any
        // CPU, finds the entry whole.
        Place::Array(e, tag) => unsafe {
            let before = *e;
            if missed(before.rq, rq, tag)
                && let Some(s) = stats(before.dev, slot, before.class)
            {
                (*s).unseen += 1;
            }
            *e = times
        },
        Place::Hash => {
            if REQUESTS.insert(rq as u64, times, 0).is_err() {
                lost(Lost::RequestTableFull);
            }
        }
    }
    0
}

// TP_PROTO(struct request *rq, blk_status_t error, unsigned int nr_bytes); also fires for
// each part of a partially completed request.
#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_rq_complete(ctx: BtfTracePointContext) -> i32 {
    ran(Program::BlockRqComplete);
    let rq = ctx.arg::<*const u8>(0);
    let ts = now();
    let nr_bytes = ctx.arg::<u64>(2) & 0xffff_ffff;
    let Some((dev, slot)) = watched_dev(rq) else {
        return 0;
    };
    timeline::block(rq, dev, false, nr_bytes as u32);
    let place = place_of(rq, slot);
    let times = issued(rq, &place);
    // Not seen: issued before the trace began.
    let class = times.map_or_else(|| class_of(rq) as u32, |t| t.class);
    let Some(s) = stats(dev, slot, class) else {
        return 0;
    };
    unsafe {
        (*s).completions += 1;
        (*s).bytes += nr_bytes;
        if times.is_some() {
            (*s).issued_bytes += nr_bytes;
        }
    }
    // Device latency once per request, at its last part (a loop device completes many
    // requests in parts), as the kernel's own accounting counts it.
    if let Some(t) = times
        && nr_bytes >= data_len(rq) as u64
    {
        let d = ts.saturating_sub(t.issue);
        unsafe { (*s).device_ns += d };
        add(HistKind::BlockDeviceLatency, dev, slot, class, d);
        forget(rq, &place);
    }
    0
}

// TP_PROTO(struct request *rq): it goes back to the queue and will be issued again,
// perhaps with another tag.
#[btf_tracepoint(function = "block_rq_requeue")]
pub fn block_rq_requeue(ctx: BtfTracePointContext) -> i32 {
    ran(Program::BlockRqRequeue);
    let rq = ctx.arg::<*const u8>(0);
    if let Some((_, slot)) = watched_dev(rq) {
        let place = place_of(rq, slot);
        if matches!(place, Place::Hash) && slot != NO_ROW {
            forget_untagged(rq, slot);
        }
        forget(rq, &place);
    }
    0
}

/// A request of a queue with an I/O scheduler has given its driver tag back before the
/// requeue tracepoint fires (`__blk_mq_requeue_request`), so its INFLIGHT entry is found
/// by scanning its queue's (requeues are rare). Left in place, the entry counted as an
/// unseen completion when the tag was next issued.
#[inline(always)]
fn forget_untagged(rq: *const u8, slot: u32) {
    let hctx = read_or_zero::<u64>(rq as u64, conf!(request_mq_hctx));
    if hctx == 0 || btf_read::<i32>(rq, conf!(request_tag)) >= 0 {
        return;
    }
    let queue = read_or_zero::<u32>(hctx, conf!(hctx_queue_num));
    let Some(first) = inflight_index(slot, queue, 0) else {
        return;
    };
    let mut scan = Scan {
        rq: rq as u64,
        first,
    };
    unsafe {
        generated::bpf_loop(
            INFLIGHT_TAGS,
            forget_at as *mut c_void,
            (&mut scan as *mut Scan).cast(),
            0,
        );
    }
}

/// The scan of one queue's entries for a request.
struct Scan {
    rq: u64,
    first: u32,
}

/// Entry `tag` of the scanned queue; 1 (stop) when it was the request's.
unsafe extern "C" fn forget_at(tag: u32, ctx: *mut c_void) -> i64 {
    let s = unsafe { &*(ctx as *const Scan) };
    match INFLIGHT.get_ptr_mut(s.first + tag) {
        Some(e) if unsafe { (*e).rq } == s.rq => {
            unsafe { (*e).rq = 0 };
            1
        }
        _ => 0,
    }
}
