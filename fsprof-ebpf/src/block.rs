//! Block layer, per device and request class: requests, bytes, size, queue latency
//! (arrival → issue) and device latency (issue → complete). Requests are keyed by
//! their `struct request *`. BTF tracepoints: the request's fields are plain loads.
//! Devices userspace gave a slot keep their statistics and histograms in per-CPU arrays;
//! others (a disk that appeared during the trace) in the hashes.

use aya_ebpf::{
    macros::{btf_tracepoint, map},
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use fsprof_common::{
    BLOCK_CLASSES, BlockClass, BlockKey, BlockStats, HistKind, Lost, MAX_BLOCK_KEYS,
    MAX_BLOCK_SLOTS, MAX_FILTER_DEVS, MAX_INFLIGHT_REQUESTS, NO_ROW, Program, RequestTimes,
    block_row,
};

use crate::common::{btf_read, conf, entry_or_lost, hist_add_row, lost, now, ran, row_at};

#[map]
static BLOCK: PerCpuHashMap<BlockKey, BlockStats> =
    PerCpuHashMap::with_max_entries(MAX_BLOCK_KEYS, 0);

/// Statistics of the devices with a slot, by `slot * BLOCK_CLASSES + class`.
#[map]
static BLOCK_SLOTS: PerCpuArray<BlockStats> =
    PerCpuArray::with_max_entries(MAX_BLOCK_SLOTS * BLOCK_CLASSES, 0);

/// Requests issued and not yet completed or requeued: every one leaves again, so the
/// table needs no LRU (whose inserts cost twice a plain hash's).
#[map]
static REQUESTS: HashMap<u64, RequestTimes> = HashMap::with_max_entries(MAX_INFLIGHT_REQUESTS, 0);

/// Kernel dev_t → its slot (NO_ROW: none), set by userspace: the devices to watch when
/// CONFIG.filter_devices is set, else the disks present at start.
#[map]
static DEVICES: HashMap<u32, u32> = HashMap::with_max_entries(MAX_FILTER_DEVS, 0);

/// The request's device: its kernel dev_t and slot, or None when it is filtered out.
#[inline(always)]
fn watched_dev(rq: *const u8) -> Option<(u32, u32)> {
    let q = btf_read::<*const u8>(rq, conf!(request_q));
    let disk = btf_read::<*const u8>(q, conf!(queue_disk));
    if disk.is_null() {
        return None;
    }
    let major = btf_read::<i32>(disk, conf!(disk_major)) as u32;
    let minor = btf_read::<i32>(disk, conf!(disk_first_minor)) as u32;
    let dev = fsprof_common::kdev::make(major, minor);
    match unsafe { DEVICES.get(dev) } {
        Some(slot) => Some((dev, *slot)),
        None if conf!(filter_devices) != 0 => None,
        None => Some((dev, NO_ROW)),
    }
}

#[inline(always)]
fn stats(dev: u32, slot: u32, class: u32) -> Option<*mut BlockStats> {
    if slot != NO_ROW {
        return BLOCK_SLOTS.get_ptr_mut(slot * BLOCK_CLASSES + class);
    }
    let key = BlockKey { dev, class };
    entry_or_lost(&BLOCK, &key, Lost::BlockKeysFull)
}

/// Adds `value` to block histogram `kind` of a device and class.
#[inline(always)]
fn add(kind: HistKind, dev: u32, slot: u32, class: u32, value: u64) {
    let row = if slot == NO_ROW {
        NO_ROW
    } else {
        row_at(conf!(rows_block), block_row(slot, class, kind))
    };
    hist_add_row(row, kind, class, dev, value);
}

#[inline(always)]
fn class_of(rq: *const u8) -> BlockClass {
    BlockClass::from_cmd_flags(btf_read::<u32>(rq, conf!(request_cmd_flags)))
}

#[inline(always)]
fn data_len(rq: *const u8) -> u32 {
    btf_read::<u32>(rq, conf!(request_data_len))
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
        issue: ts,
        dev,
        class,
        slot,
        _pad: 0,
    };
    if REQUESTS.insert(rq as u64, times, 0).is_err() {
        lost(Lost::RequestTableFull);
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
    let r = REQUESTS.get_ptr_mut(rq as u64);
    let (dev, slot, class) = match r {
        Some(r) => unsafe { ((*r).dev, (*r).slot, (*r).class) },
        None => {
            // Issued before the trace began.
            let Some((dev, slot)) = watched_dev(rq) else {
                return 0;
            };
            (dev, slot, class_of(rq) as u32)
        }
    };
    let Some(s) = stats(dev, slot, class) else {
        return 0;
    };
    unsafe {
        (*s).completions += 1;
        (*s).bytes += nr_bytes;
    }
    // Device latency once per request, at its last part (a loop device completes many
    // requests in parts), as the kernel's own accounting counts it.
    if let Some(r) = r
        && nr_bytes >= data_len(rq) as u64
    {
        let d = ts.saturating_sub(unsafe { (*r).issue });
        unsafe { (*s).device_ns += d };
        add(HistKind::BlockDeviceLatency, dev, slot, class, d);
        let _ = REQUESTS.remove(rq as u64);
    }
    0
}

// TP_PROTO(struct request *rq): it goes back to the queue and will be issued again.
#[btf_tracepoint(function = "block_rq_requeue")]
pub fn block_rq_requeue(ctx: BtfTracePointContext) -> i32 {
    ran(Program::BlockRqRequeue);
    let _ = REQUESTS.remove(ctx.arg::<u64>(0));
    0
}
