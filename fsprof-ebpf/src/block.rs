//! Block layer, per device and request class: requests, bytes, size, queue latency
//! (start or insert → issue) and device latency (issue → complete). Requests are keyed by
//! their `struct request *`, which raw tracepoints hand us directly.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::{map, raw_tracepoint},
    maps::{HashMap, LruHashMap, PerCpuHashMap},
    programs::RawTracePointContext,
};
use fsprof_common::{
    BlockClass, BlockKey, BlockStats, HistKind, Lost, MAX_BLOCK_KEYS, MAX_FILTER_DEVS,
    MAX_INFLIGHT_REQUESTS, RequestTimes,
};

use crate::common::{config, entry_or_lost, hist_add, lost, now, read_kernel};

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
fn watched_dev(rq: u64) -> Option<u32> {
    let cfg = config();
    let q = read_kernel::<u64>(rq, cfg.request_q)?;
    let disk = read_kernel::<u64>(q, cfg.queue_disk)?;
    let major = read_kernel::<i32>(disk, cfg.disk_major)? as u32;
    let minor = read_kernel::<i32>(disk, cfg.disk_first_minor)? as u32;
    let dev = fsprof_common::kdev::make(major, minor);
    if cfg.filter_devices != 0 && DEVICE_FILTER.get_ptr(dev).is_none() {
        return None;
    }
    Some(dev)
}

#[inline(always)]
fn stats(dev: u32, class: BlockClass) -> Option<*mut BlockStats> {
    let key = BlockKey {
        dev,
        class: class as u32,
    };
    entry_or_lost(&BLOCK, &key, Lost::BlockKeysFull)
}

#[inline(always)]
fn class_and_len(rq: u64) -> (BlockClass, u32) {
    let cfg = config();
    let flags = read_kernel::<u32>(rq, cfg.request_cmd_flags).unwrap_or(0);
    let len = read_kernel::<u32>(rq, cfg.request_data_len).unwrap_or(0);
    (BlockClass::from_cmd_flags(flags), len)
}

#[inline(always)]
fn note_start(rq: u64, flags: u64) {
    if watched_dev(rq).is_none() {
        return;
    }
    let times = RequestTimes {
        start: now(),
        issue: 0,
    };
    // EEXIST (an earlier start already recorded) is expected with BPF_NOEXIST.
    if REQUESTS.insert(rq, times, flags).is_err() && flags == 0 {
        lost(Lost::RequestTableFull);
    }
}

// TP_PROTO(struct request *rq): the request is accounted (allocated for a bio).
#[raw_tracepoint(tracepoint = "block_io_start")]
pub fn block_io_start(ctx: RawTracePointContext) -> i32 {
    note_start(ctx.arg::<u64>(0), 0);
    0
}

// TP_PROTO(struct request *rq): goes into a scheduler queue; kernels without
// block_io_start measure queue time from here.
#[raw_tracepoint(tracepoint = "block_rq_insert")]
pub fn block_rq_insert(ctx: RawTracePointContext) -> i32 {
    note_start(ctx.arg::<u64>(0), BPF_NOEXIST as u64);
    0
}

// TP_PROTO(struct request *rq)
#[raw_tracepoint(tracepoint = "block_rq_issue")]
pub fn block_rq_issue(ctx: RawTracePointContext) -> i32 {
    let rq = ctx.arg::<u64>(0);
    let Some(dev) = watched_dev(rq) else {
        return 0;
    };
    let ts = now();
    let (class, len) = class_and_len(rq);
    let Some(s) = stats(dev, class) else {
        return 0;
    };
    unsafe { (*s).issued += 1 };
    hist_add(HistKind::BlockSize, class as u32, dev, len as u64);
    match REQUESTS.get_ptr_mut(rq) {
        Some(r) => unsafe {
            if (*r).start != 0 {
                let q = ts.saturating_sub((*r).start);
                (*s).queue_ns += q;
                hist_add(HistKind::BlockQueueLatency, class as u32, dev, q);
            }
            (*r).issue = ts;
        },
        None => {
            let times = RequestTimes {
                start: 0,
                issue: ts,
            };
            if REQUESTS.insert(rq, times, 0).is_err() {
                lost(Lost::RequestTableFull);
            }
        }
    }
    0
}

// TP_PROTO(struct request *rq, blk_status_t error, unsigned int nr_bytes); also fires for
// each part of a partially completed request.
#[raw_tracepoint(tracepoint = "block_rq_complete")]
pub fn block_rq_complete(ctx: RawTracePointContext) -> i32 {
    let rq = ctx.arg::<u64>(0);
    let Some(dev) = watched_dev(rq) else {
        return 0;
    };
    let ts = now();
    let nr_bytes = ctx.arg::<u64>(2) & 0xffff_ffff;
    let (class, remaining) = class_and_len(rq);
    let Some(s) = stats(dev, class) else {
        return 0;
    };
    unsafe {
        (*s).completions += 1;
        (*s).bytes += nr_bytes;
    }
    if let Some(r) = REQUESTS.get_ptr_mut(rq) {
        let issue = unsafe { (*r).issue };
        if issue != 0 {
            let d = ts.saturating_sub(issue);
            unsafe { (*s).device_ns += d };
            hist_add(HistKind::BlockDeviceLatency, class as u32, dev, d);
        }
        if nr_bytes >= remaining as u64 {
            let _ = REQUESTS.remove(rq);
        }
    }
    0
}

// TP_PROTO(struct request *rq): it goes back to the queue and will be issued again.
#[raw_tracepoint(tracepoint = "block_rq_requeue")]
pub fn block_rq_requeue(ctx: RawTracePointContext) -> i32 {
    let _ = REQUESTS.remove(ctx.arg::<u64>(0));
    0
}
