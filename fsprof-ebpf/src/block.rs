//! Block layer, per device and request class: requests, bytes, size, queue latency
//! (start or insert → issue) and device latency (issue → complete). Requests are keyed by
//! their `struct request *`. BTF tracepoints: the request's fields are plain loads.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::{btf_tracepoint, map},
    maps::{HashMap, LruHashMap, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use fsprof_common::{
    BlockClass, BlockKey, BlockStats, HistKind, Lost, MAX_BLOCK_KEYS, MAX_FILTER_DEVS,
    MAX_INFLIGHT_REQUESTS, RequestTimes,
};

use crate::common::{btf_read, config, entry_or_lost, hist_add, lost, now};

#[map]
static BLOCK: PerCpuHashMap<BlockKey, BlockStats> =
    PerCpuHashMap::with_max_entries(MAX_BLOCK_KEYS, 0);

/// Requests in flight. LRU: a request merged away or lost never fills the table.
#[map]
static REQUESTS: LruHashMap<u64, RequestTimes> =
    LruHashMap::with_max_entries(MAX_INFLIGHT_REQUESTS, 0);

/// Devices to watch (kernel dev_t) when CONFIG.filter_devices is set.
#[map]
static DEVICE_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(MAX_FILTER_DEVS, 0);

/// The kernel dev_t of the request's disk, or None when it is filtered out.
#[inline(always)]
fn watched_dev(rq: *const u8) -> Option<u32> {
    let cfg = config();
    let q = btf_read::<*const u8>(rq, cfg.request_q);
    let disk = btf_read::<*const u8>(q, cfg.queue_disk);
    if disk.is_null() {
        return None;
    }
    let major = btf_read::<i32>(disk, cfg.disk_major) as u32;
    let minor = btf_read::<i32>(disk, cfg.disk_first_minor) as u32;
    let dev = fsprof_common::kdev::make(major, minor);
    if cfg.filter_devices != 0 && DEVICE_FILTER.get_ptr(dev).is_none() {
        return None;
    }
    Some(dev)
}

#[inline(always)]
fn stats(dev: u32, class: u32) -> Option<*mut BlockStats> {
    let key = BlockKey { dev, class };
    entry_or_lost(&BLOCK, &key, Lost::BlockKeysFull)
}

#[inline(always)]
fn class_of(rq: *const u8) -> BlockClass {
    BlockClass::from_cmd_flags(btf_read::<u32>(rq, config().request_cmd_flags))
}

#[inline(always)]
fn data_len(rq: *const u8) -> u32 {
    btf_read::<u32>(rq, config().request_data_len)
}

#[inline(always)]
fn note_start(rq: *const u8, flags: u64) {
    let Some(dev) = watched_dev(rq) else {
        return;
    };
    let times = RequestTimes {
        start: now(),
        issue: 0,
        dev,
        class: class_of(rq) as u32,
    };
    // EEXIST (an earlier start already recorded) is expected with BPF_NOEXIST.
    if REQUESTS.insert(rq as u64, times, flags).is_err() && flags == 0 {
        lost(Lost::RequestTableFull);
    }
}

// TP_PROTO(struct request *rq): the request is accounted (allocated for a bio).
#[btf_tracepoint(function = "block_io_start")]
pub fn block_io_start(ctx: BtfTracePointContext) -> i32 {
    note_start(ctx.arg::<*const u8>(0), 0);
    0
}

// TP_PROTO(struct request *rq): goes into a scheduler queue; kernels without
// block_io_start measure queue time from here.
#[btf_tracepoint(function = "block_rq_insert")]
pub fn block_rq_insert(ctx: BtfTracePointContext) -> i32 {
    note_start(ctx.arg::<*const u8>(0), BPF_NOEXIST as u64);
    0
}

// TP_PROTO(struct request *rq)
#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue(ctx: BtfTracePointContext) -> i32 {
    let rq = ctx.arg::<*const u8>(0);
    let ts = now();
    // Seen at its start: device and class known; a request issued without one (a flush,
    // or started before the trace) is read whole and entered now.
    let (dev, class, r) = match REQUESTS.get_ptr_mut(rq as u64) {
        Some(r) => unsafe { ((*r).dev, (*r).class, Some(r)) },
        None => {
            let Some(dev) = watched_dev(rq) else {
                return 0;
            };
            (dev, class_of(rq) as u32, None)
        }
    };
    let Some(s) = stats(dev, class) else {
        return 0;
    };
    unsafe { (*s).issued += 1 };
    hist_add(HistKind::BlockSize, class, dev, data_len(rq) as u64);
    match r {
        Some(r) => unsafe {
            if (*r).start != 0 {
                let q = ts.saturating_sub((*r).start);
                (*s).queue_ns += q;
                hist_add(HistKind::BlockQueueLatency, class, dev, q);
            }
            (*r).issue = ts;
        },
        None => {
            let times = RequestTimes {
                start: 0,
                issue: ts,
                dev,
                class,
            };
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
    let rq = ctx.arg::<*const u8>(0);
    let ts = now();
    let nr_bytes = ctx.arg::<u64>(2) & 0xffff_ffff;
    let r = REQUESTS.get_ptr_mut(rq as u64);
    let (dev, class) = match r {
        Some(r) => unsafe { ((*r).dev, (*r).class) },
        None => {
            let Some(dev) = watched_dev(rq) else {
                return 0;
            };
            (dev, class_of(rq) as u32)
        }
    };
    let Some(s) = stats(dev, class) else {
        return 0;
    };
    unsafe {
        (*s).completions += 1;
        (*s).bytes += nr_bytes;
    }
    if let Some(r) = r {
        let issue = unsafe { (*r).issue };
        if issue != 0 {
            let d = ts.saturating_sub(issue);
            unsafe { (*s).device_ns += d };
            hist_add(HistKind::BlockDeviceLatency, class, dev, d);
        }
        if nr_bytes >= data_len(rq) as u64 {
            let _ = REQUESTS.remove(rq as u64);
        }
    }
    0
}

// TP_PROTO(struct request *rq): it goes back to the queue and will be issued again.
#[btf_tracepoint(function = "block_rq_requeue")]
pub fn block_rq_requeue(ctx: BtfTracePointContext) -> i32 {
    let _ = REQUESTS.remove(ctx.arg::<u64>(0));
    0
}
