//! The filesystem's own tracepoints (xfs:*, ext4:*, jbd2:*, btrfs:*, writeback:*, iomap:*):
//! one raw-tracepoint program attached to each event that exists, with the event's index as
//! its BPF cookie. Raw tracepoints detach without the RCU grace period a perf tracepoint
//! event costs, and hand over the event's kernel pointers: the device is found by
//! following them (offsets from BTF), so only the filesystem under test counts.
//!
//! Safety (see main.rs): kernel memory (the event's pointers, followed at BTF offsets) and
//! map values.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::generated::bpf_get_attach_cookie,
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::RawTracePointContext,
};
use fsprof_common::{
    FS_MAX_DEREF, FS_NO_ARG, FS_PAIR_SLOTS, FS_PENDING_SLOTS, FsEventCfg, HistKind, Lost,
    MAX_FS_DEVS, MAX_FS_EVENTS, MAX_FS_PAIRS, PendingPair, Program, TimeStats, pending_slot,
};

use fsprof_common::timeline::TimelineKind;

use crate::{
    common::{conf, current_tid, followed, hist_add_row, lost, now, ran, read_kernel, row_at},
    timeline,
};

/// Event index (the cookie) → its config; filled by userspace.
#[map]
static FS_EVENT_CFG: Array<FsEventCfg> = Array::with_max_entries(MAX_FS_EVENTS, 0);

#[map]
static FS_COUNTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_FS_EVENTS, 0);

/// Pair instances begun and not yet ended, each in the slot its (pair, key) hashes to: an
/// end that never comes only holds a slot until another instance takes it.
#[map]
static FS_PENDING: Array<PendingPair> = Array::with_max_entries(FS_PENDING_SLOTS, 0);

/// Filesystems whose events count (superblock dev_t), when no single one is set in CONFIG:
/// seeded by userspace, and with CONFIG.fs_learn joined by every filesystem a followed
/// thread fires an event on.
#[map]
static FS_DEVS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_FS_DEVS, 0);

/// Per pair: completed instances and their summed latency.
#[map]
static FS_PAIRS: PerCpuArray<TimeStats> = PerCpuArray::with_max_entries(MAX_FS_PAIRS, 0);

/// Argument `i` of the tracepoint. Read through bpf_probe_read_kernel: a direct context
/// load would make the verifier require that many arguments of every tracepoint the
/// program is attached to.
#[inline(always)]
fn arg(ctx: &RawTracePointContext, i: u32) -> Option<u64> {
    let base = ctx.as_ptr() as u64;
    match i {
        0 => read_kernel::<u64>(base, 0),
        1 => read_kernel::<u64>(base, 8),
        2 => read_kernel::<u64>(base, 16),
        3 => read_kernel::<u64>(base, 24),
        4 => read_kernel::<u64>(base, 32),
        5 => read_kernel::<u64>(base, 40),
        _ => None,
    }
}

/// The dev_t the event's device path leads to.
#[inline(always)]
fn event_dev(ctx: &RawTracePointContext, cfg: &FsEventCfg) -> Option<u32> {
    let mut p = arg(ctx, cfg.dev_arg)?;
    if cfg.dev_is_arg != 0 {
        return Some(p as u32);
    }
    for i in 0..FS_MAX_DEREF {
        if (i as u32) < cfg.nderef {
            p = read_kernel::<u64>(p, cfg.derefs[i])?;
        }
    }
    read_kernel::<u32>(p, cfg.dev_off)
}

#[inline(always)]
fn begin_pair(pair: u32, key: u64, ts: u64) {
    let Some(p) = FS_PENDING.get_ptr_mut(pending_slot(pair, key)) else {
        return;
    };
    unsafe {
        if (*p).start != 0 && ((*p).pair != pair || (*p).key != key) {
            lost(Lost::FsPairSlotTaken);
        }
        // Free while it changes hands, so an end on another CPU sees an old start or none;
        // volatile keeps every store, in this order.
        core::ptr::write_volatile(&raw mut (*p).start, 0);
        core::ptr::write_volatile(&raw mut (*p).pair, pair);
        core::ptr::write_volatile(&raw mut (*p).key, key);
        core::ptr::write_volatile(&raw mut (*p).start, ts);
    }
}

#[inline(always)]
fn end_pair(pair: u32, key: u64, ts: u64) {
    let Some(p) = FS_PENDING.get_ptr_mut(pending_slot(pair, key)) else {
        return;
    };
    let start = unsafe {
        let start = (*p).start;
        if start == 0 || (*p).pair != pair || (*p).key != key {
            return;
        }
        (*p).start = 0;
        start
    };
    let lat = ts.saturating_sub(start);
    if let Some(s) = FS_PAIRS.get_ptr_mut(pair) {
        unsafe {
            (*s).total_ns += lat;
            (*s).episodes += 1;
        }
    }
    let row = row_at(conf!(rows_fs_pairs), pair.wrapping_sub(1));
    hist_add_row(row, HistKind::FsPairLatency, 0, pair, lat);
    timeline::span(TimelineKind::FsPair, pair, start, 0);
}

/// The last filesystem found in FS_DEVS on this CPU: a filesystem never leaves FS_DEVS, and
/// consecutive events are nearly always the same filesystem's, so most skip the hash.
#[map]
static LAST_WATCHED: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Whether events of filesystem `dev` count.
#[inline(always)]
fn watched(dev: u32) -> bool {
    let fixed = conf!(fs_dev);
    if fixed != 0 {
        return dev == fixed;
    }
    let last = LAST_WATCHED.get_ptr_mut(0);
    if let Some(l) = last
        && dev != 0
        && unsafe { *l } == dev
    {
        return true;
    }
    if FS_DEVS.get_ptr(dev).is_some() {
        if let Some(l) = last {
            unsafe { *l = dev };
        }
        return true;
    }
    // The target works on this filesystem: from now on its background work counts too.
    conf!(fs_learn) != 0
        && followed(current_tid()).is_some()
        && FS_DEVS.insert(dev, 1, BPF_NOEXIST as u64).is_ok()
}

#[raw_tracepoint]
pub fn fs_event(ctx: RawTracePointContext) -> i32 {
    ran(Program::FsEvent);
    let index = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let Some(cfg) = FS_EVENT_CFG.get(index) else {
        return 0;
    };
    let cfg = *cfg;
    if cfg.dev_arg != FS_NO_ARG && !event_dev(&ctx, &cfg).is_some_and(watched) {
        return 0;
    }
    if let Some(n) = FS_COUNTS.get_ptr_mut(index) {
        unsafe { *n += 1 };
    }
    if cfg.begins[0] == 0 && cfg.ends[0] == 0 {
        return 0;
    }
    let key = if cfg.key_arg == FS_NO_ARG {
        current_tid() as u64
    } else {
        match arg(&ctx, cfg.key_arg) {
            Some(k) => k,
            None => return 0,
        }
    };
    let ts = now();
    for i in 0..FS_PAIR_SLOTS {
        if cfg.ends[i] != 0 {
            end_pair(cfg.ends[i], key, ts);
        }
    }
    for i in 0..FS_PAIR_SLOTS {
        if cfg.begins[i] != 0 {
            begin_pair(cfg.begins[i], key, ts);
        }
    }
    0
}
