//! Counting the filesystem's own tracepoints during a trace, only those of the filesystem
//! under test, and timing begin/end pairs of them. One raw-tracepoint program is attached to
//! every event of the subsystems that concern the filesystem, through BPF_RAW_TRACEPOINT_OPEN
//! with the event's index as cookie (aya's raw-tracepoint attach has no cookie). Each event's
//! arguments are looked up in BTF: the first pointer from which a chain of members leads to
//! a superblock's dev_t gives the device filter.

use fsprof_common::MapName;
use fsprof_common::Program;
use std::{
    collections::BTreeMap,
    os::fd::{AsFd, AsRawFd, OwnedFd},
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::{Array, HashMap},
    programs::RawTracePoint,
};
use btf_rs::Btf;
use fsprof_common::{
    FS_MAX_DEREF, FS_NO_ARG, FS_PAIR_SLOTS, FsEventCfg, MAX_FS_EVENTS, MAX_FS_PAIRS,
};

use super::{
    btf,
    kept::{self, Kept, VMLINUX_BTF},
    raw_tracepoint::attach_raw,
    tracefs::{self, Event},
};

/// Which filesystems' events count, and which events.
#[derive(Clone, Debug, Default)]
pub struct FsTarget {
    /// Filesystem kinds (ext4, xfs, btrfs, ntfs, …): they select the tracepoint subsystems.
    pub kinds: Vec<String>,
    /// Superblock dev_ts (kernel encoding, as /proc/self/mountinfo shows them) whose events
    /// count from the start.
    pub devs: Vec<u32>,
    /// Also count every filesystem a followed thread fires an event on (and from then on
    /// its kernel threads' events): the filesystems the target works on.
    pub learn: bool,
    /// Every event of the subsystems (the census) rather than the curated set.
    pub census: bool,
}

/// Tracepoint subsystems that belong to a filesystem kind.
pub fn subsystems_for(kind: &str) -> &'static [&'static str] {
    match kind {
        "ext2" | "ext3" | "ext4" => &["ext4", "jbd2", "writeback", "iomap"],
        "xfs" => &["xfs", "writeback", "iomap"],
        "btrfs" => &["btrfs", "writeback", "iomap"],
        "ntfs" | "fuse" | "fuseblk" => &["fuse", "writeback"],
        _ => &["writeback"],
    }
}

/// The default set: events that mark a wait, a throttle, a commit, a flush or a unit of
/// background work. They fire per operation that costs milliseconds, not per page, inode
/// or buffer, so counting them costs nothing measurable; the census (every event of the
/// subsystems, `--all-fs-events`) fires millions of times on a tree delete (1.2–1.5× wall).
/// The begin/end pairs below are all in it but ext4_truncate and ext4_ext_remove_space,
/// which fire per unlinked file.
pub const CURATED: &[&str] = &[
    "ext4:ext4_sync_file_enter",
    "ext4:ext4_sync_file_exit",
    "ext4:ext4_sync_fs",
    "ext4:ext4_fc_commit_start",
    "ext4:ext4_fc_commit_stop",
    "ext4:ext4_es_shrink",
    "jbd2:jbd2_start_commit",
    "jbd2:jbd2_commit_locking",
    "jbd2:jbd2_commit_flushing",
    "jbd2:jbd2_commit_logging",
    "jbd2:jbd2_end_commit",
    "jbd2:jbd2_run_stats",
    "jbd2:jbd2_checkpoint",
    "jbd2:jbd2_checkpoint_stats",
    "jbd2:jbd2_lock_buffer_stall",
    "jbd2:jbd2_update_log_tail",
    "jbd2:jbd2_write_superblock",
    "xfs:xfs_buf_iowait",
    "xfs:xfs_buf_iowait_done",
    "xfs:xfs_log_force",
    "xfs:xfs_log_cil_wait",
    "xfs:xfs_log_grant_sleep",
    "xfs:xfs_log_grant_wake",
    "xfs:xfs_ail_push",
    "xfs:xfs_inodegc_flush",
    "xfs:xfs_inodegc_push",
    "xfs:xfs_inodegc_throttle",
    "xfs:xfs_inodegc_worker",
    "xfs:xfs_inodegc_shrinker_scan",
    "xfs:xfs_blockgc_worker",
    "xfs:xfs_blockgc_flush_all",
    "xfs:xfs_file_fsync",
    "xfs:xfs_dir_fsync",
    "btrfs:btrfs_transaction_commit",
    "btrfs:btrfs_sync_file",
    "btrfs:btrfs_sync_fs",
    "btrfs:btrfs_flush_space",
    "btrfs:btrfs_reserve_ticket",
    "btrfs:btrfs_trigger_flush",
    "writeback:writeback_start",
    "writeback:writeback_written",
    "writeback:writeback_wait",
    "writeback:writeback_queue",
    "writeback:writeback_exec",
    "writeback:writeback_pages_written",
    "writeback:writeback_wake_background",
    "writeback:balance_dirty_pages",
    "fuse:fuse_request_send",
    "fuse:fuse_request_end",
];

/// How to get from a struct to a superblock's dev_t: follow `member` to `next`, or (None)
/// read `member` as the dev_t.
const HOPS: &[(&str, &str, Option<&str>)] = &[
    ("super_block", "s_dev", None),
    ("block_device", "bd_dev", None),
    ("inode", "i_sb", Some("super_block")),
    ("file", "f_inode", Some("inode")),
    ("dentry", "d_sb", Some("super_block")),
    ("address_space", "host", Some("inode")),
    ("kiocb", "ki_filp", Some("file")),
    ("folio", "mapping", Some("address_space")),
    ("iomap_iter", "inode", Some("inode")),
    ("xfs_mount", "m_super", Some("super_block")),
    ("xfs_inode", "i_mount", Some("xfs_mount")),
    ("xfs_buf", "b_mount", Some("xfs_mount")),
    ("xfs_trans", "t_mountp", Some("xfs_mount")),
    ("xfs_buftarg", "bt_mount", Some("xfs_mount")),
    ("xlog", "l_mp", Some("xfs_mount")),
    ("xfs_cil", "xc_log", Some("xlog")),
    ("xfs_btree_cur", "bc_mp", Some("xfs_mount")),
    ("xfs_da_args", "dp", Some("xfs_inode")),
    ("xfs_group", "xg_mount", Some("xfs_mount")),
    ("journal_s", "j_fs_dev", Some("block_device")),
    ("btrfs_fs_info", "sb", Some("super_block")),
    ("btrfs_root", "fs_info", Some("btrfs_fs_info")),
    ("btrfs_inode", "root", Some("btrfs_root")),
    ("btrfs_trans_handle", "fs_info", Some("btrfs_fs_info")),
    ("btrfs_transaction", "fs_info", Some("btrfs_fs_info")),
    ("extent_buffer", "fs_info", Some("btrfs_fs_info")),
    ("btrfs_block_group", "fs_info", Some("btrfs_fs_info")),
    ("btrfs_ordered_extent", "inode", Some("btrfs_inode")),
    ("fuse_req", "fm", Some("fuse_mount")),
    ("fuse_mount", "sb", Some("super_block")),
];

/// (pointer hops, dev_t offset) from a `strukt *` to its superblock's dev_t.
fn dev_path(btf: &Btf, strukt: &str, depth: usize) -> Option<(Vec<u32>, u32)> {
    let &(_, member, next) = HOPS.iter().find(|(s, _, _)| *s == strukt)?;
    let f = btf::field(btf, strukt, member).ok()?;
    if f.bitfield_size.is_some() {
        return None;
    }
    let off = f.bit_offset / 8;
    match next {
        None => Some((Vec::new(), off)),
        Some(n) if depth < FS_MAX_DEREF => {
            let (mut rest, dev) = dev_path(btf, n, depth + 1)?;
            rest.insert(0, off);
            Some((rest, dev))
        }
        Some(_) => None,
    }
}

/// What keys a pair instance: the thread, or the value of argument N (e.g. the
/// transaction pointer both ends of a jbd2 commit carry).
enum PairKeyDef {
    Tid,
    Arg(u32),
}

/// Pair ids run from 1 to at most this.
pub const PAIR_COUNT: u32 = PAIRS.len() as u32;

/// begin/end pairs worth a latency: (name, begin event, end event, key).
const PAIRS: &[(&str, &str, &str, PairKeyDef)] = &[
    (
        "ext4_sync_file",
        "ext4:ext4_sync_file_enter",
        "ext4:ext4_sync_file_exit",
        PairKeyDef::Tid,
    ),
    (
        "ext4_truncate",
        "ext4:ext4_truncate_enter",
        "ext4:ext4_truncate_exit",
        PairKeyDef::Tid,
    ),
    (
        "ext4_fallocate",
        "ext4:ext4_fallocate_enter",
        "ext4:ext4_fallocate_exit",
        PairKeyDef::Tid,
    ),
    (
        "ext4_ext_remove_space",
        "ext4:ext4_ext_remove_space",
        "ext4:ext4_ext_remove_space_done",
        PairKeyDef::Tid,
    ),
    (
        "jbd2_commit",
        "jbd2:jbd2_start_commit",
        "jbd2:jbd2_end_commit",
        PairKeyDef::Arg(1),
    ),
    (
        "jbd2_commit_flushing",
        "jbd2:jbd2_commit_flushing",
        "jbd2:jbd2_commit_logging",
        PairKeyDef::Arg(1),
    ),
    (
        "jbd2_commit_logging",
        "jbd2:jbd2_commit_logging",
        "jbd2:jbd2_end_commit",
        PairKeyDef::Arg(1),
    ),
    (
        "xfs_buf_iowait",
        "xfs:xfs_buf_iowait",
        "xfs:xfs_buf_iowait_done",
        PairKeyDef::Tid,
    ),
    (
        "writeback",
        "writeback:writeback_start",
        "writeback:writeback_written",
        PairKeyDef::Arg(1),
    ),
    (
        "fuse_request",
        "fuse:fuse_request_send",
        "fuse:fuse_request_end",
        PairKeyDef::Arg(0),
    ),
];

/// What was attached: events by counter index, pairs by id.
#[derive(Default)]
pub struct FsEventsAttached {
    /// (index, "subsystem:name", filtered to the fs under test).
    pub events: Vec<(u32, String, bool)>,
    /// (1-based pair id, name).
    pub pairs: Vec<(u32, String)>,
    pub subsystems: Vec<String>,
    /// Every event of the subsystems, not the curated set.
    pub census: bool,
    /// Events that exist but could not be attached.
    pub failed: Vec<String>,
    /// The links carrying the program; closing them detaches it.
    links: Vec<OwnedFd>,
}

impl FsEventsAttached {
    pub fn attached(&self) -> usize {
        self.links.len()
    }

    pub fn into_links(self) -> Vec<OwnedFd> {
        self.links
    }
}

/// The device filter of one event: first argument with a path to a dev_t.
fn device_of(btf: &Btf, e: &Event) -> Option<(u32, DevArg)> {
    let args = btf::tracepoint_args(btf, &e.name)?;
    args.iter().enumerate().take(6).find_map(|(i, t)| {
        if btf::is_typedef(btf, t, "dev_t") {
            return Some((i as u32, DevArg::Value));
        }
        let s = btf::pointee_struct(btf, t)?;
        let (derefs, dev) = dev_path(btf, &s, 0)?;
        Some((i as u32, DevArg::Path { derefs, dev }))
    })
}

/// The device filter of each of `events` (by full name), from a copy kept for this boot
/// when it has them all (`kept`), else from BTF, and then kept with those added.
fn device_filters(events: &[Event]) -> Result<BTreeMap<String, Option<(u32, DevArg)>>> {
    let kept = Kept::of(kept::FS_EVENTS);
    let mut filters: BTreeMap<String, Option<(u32, DevArg)>> = kept
        .as_ref()
        .and_then(Kept::read)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if events.iter().all(|e| filters.contains_key(&e.full_name())) {
        return Ok(filters);
    }
    let btf = btf::load(std::path::Path::new(VMLINUX_BTF))?;
    for e in events {
        filters
            .entry(e.full_name())
            .or_insert_with(|| device_of(btf, e));
    }
    if let Some(k) = kept {
        k.write(&serde_json::to_vec(&filters)?);
    }
    Ok(filters)
}

/// How an event's argument gives its filesystem's dev_t.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
enum DevArg {
    /// It is one (jbd2's statistics events carry the journal's device).
    Value,
    /// Through pointer hops to a dev_t member (see `dev_path`).
    Path { derefs: Vec<u32>, dev: u32 },
}

/// How many events `select` may pick for `target`: the room of the per-CPU counters, whose
/// every entry is an allocation (all MAX_FS_EVENTS took 6 ms to create).
pub fn room(target: &FsTarget) -> u32 {
    if target.census {
        MAX_FS_EVENTS
    } else {
        CURATED.len() as u32
    }
}

/// The subsystems (those this kernel has) and events `target` selects.
fn select(target: &FsTarget) -> Result<(Vec<String>, Vec<Event>)> {
    let all = tracefs::events().map_err(|e| anyhow::anyhow!(e))?;
    let mut subsystems: Vec<&str> = Vec::new();
    for k in &target.kinds {
        for s in subsystems_for(k) {
            if !subsystems.contains(s) {
                subsystems.push(s);
            }
        }
    }
    let events: Vec<Event> = subsystems
        .iter()
        .filter_map(|s| all.get(*s))
        .flatten()
        .filter(|e| target.census || CURATED.contains(&e.full_name().as_str()))
        .take(room(target) as usize)
        .cloned()
        .collect();
    if events.is_empty() {
        bail!("no tracepoints of {} in this kernel", subsystems.join(", "));
    }
    let present = subsystems
        .iter()
        .filter(|s| events.iter().any(|e| e.subsystem == **s))
        .map(|s| s.to_string())
        .collect();
    Ok((present, events))
}

/// Attaches program `prog` to every event, event i with cookie i.
fn attach_all(
    ebpf: &mut Ebpf,
    p: Program,
    events: &[Event],
    out: &mut FsEventsAttached,
) -> Result<()> {
    let prog = p.name();
    let program: &mut RawTracePoint = super::program_mut(ebpf, p)?.try_into()?;
    if program.fd().is_err() {
        program.load().with_context(|| format!("loading {prog}"))?;
    }
    let prog_fd = program.fd()?.as_fd().as_raw_fd();
    for (i, e) in events.iter().enumerate() {
        match attach_raw(prog_fd, &e.name, i as u64) {
            Ok(fd) => out.links.push(fd),
            Err(err) => out.failed.push(format!("{}: {err}", e.full_name())),
        }
    }
    if out.links.is_empty() {
        bail!(
            "no fs tracepoint could be attached ({})",
            out.failed.first().map(String::as_str).unwrap_or("")
        );
    }
    Ok(())
}

/// The floor: the do-nothing program on the same events.
pub fn attach_floor(ebpf: &mut Ebpf, target: &FsTarget) -> Result<FsEventsAttached> {
    let (subsystems, events) = select(target)?;
    let mut out = FsEventsAttached {
        subsystems,
        census: target.census,
        ..Default::default()
    };
    attach_all(ebpf, Program::FloorTp, &events, &mut out)?;
    Ok(out)
}

/// What to attach for a target, worked out while the object loads (tracefs' listing, the
/// device filters, ~2 ms): `attach` then only writes the maps and attaches.
pub struct FsEventsPlan {
    out: FsEventsAttached,
    events: Vec<Event>,
    cfgs: Vec<FsEventCfg>,
    devs: Vec<u32>,
}

/// The events of `target`'s subsystems, each configured, and their pairs.
pub fn plan(target: &FsTarget) -> Result<FsEventsPlan> {
    let (subsystems, events) = select(target)?;
    let filters = device_filters(&events)?;
    let mut out = FsEventsAttached {
        subsystems,
        census: target.census,
        ..Default::default()
    };
    let mut cfgs: Vec<FsEventCfg> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let cfg = configured(filters.get(&e.full_name()).cloned().flatten());
        if std::env::var_os("FSPROF_DEBUG_EVENTS").is_some() {
            eprintln!("{} {:?}", e.full_name(), cfg);
        }
        out.events
            .push((i as u32, e.full_name(), cfg.dev_arg != FS_NO_ARG));
        cfgs.push(cfg);
    }
    pair_up(&events, &mut cfgs, &mut out);
    Ok(FsEventsPlan {
        out,
        events,
        cfgs,
        devs: target.devs.clone(),
    })
}

/// An event's configuration with its device filter, before pairing.
fn configured(filter: Option<(u32, DevArg)>) -> FsEventCfg {
    let mut cfg = FsEventCfg {
        dev_arg: FS_NO_ARG,
        key_arg: FS_NO_ARG,
        ..Default::default()
    };
    match filter {
        Some((arg, DevArg::Value)) => {
            cfg.dev_arg = arg;
            cfg.dev_is_arg = 1;
        }
        Some((arg, DevArg::Path { derefs, dev })) => {
            cfg.dev_arg = arg;
            cfg.nderef = derefs.len() as u32;
            cfg.derefs[..derefs.len()].copy_from_slice(&derefs);
            cfg.dev_off = dev;
        }
        None => {}
    }
    cfg
}

/// Marks the begin and end events of each of PAIRS present, while pair ids and slots last.
fn pair_up(events: &[Event], cfgs: &mut [FsEventCfg], out: &mut FsEventsAttached) {
    let find = |full: &str| events.iter().position(|e| e.full_name() == full);
    for (name, begin, end, key) in PAIRS {
        let (Some(b), Some(e)) = (find(begin), find(end)) else {
            continue;
        };
        let pair = out.pairs.len() as u32 + 1;
        if pair >= MAX_FS_PAIRS {
            break;
        }
        let key_arg = match key {
            PairKeyDef::Tid => FS_NO_ARG,
            PairKeyDef::Arg(n) => *n,
        };
        let free = |arr: &[u32; FS_PAIR_SLOTS]| arr.iter().position(|s| *s == 0);
        let (Some(bs), Some(es)) = (free(&cfgs[b].begins), free(&cfgs[e].ends)) else {
            continue;
        };
        cfgs[b].begins[bs] = pair;
        cfgs[e].ends[es] = pair;
        cfgs[b].key_arg = key_arg;
        cfgs[e].key_arg = key_arg;
        out.pairs.push((pair, name.to_string()));
    }
}

/// Configures and attaches the fs_event program as `plan` says.
pub fn attach(ebpf: &mut Ebpf, plan: FsEventsPlan) -> Result<FsEventsAttached> {
    let FsEventsPlan {
        mut out,
        events,
        cfgs,
        devs,
    } = plan;
    let mut map: Array<_, FsEventCfg> =
        Array::try_from(crate::probes::map_mut(ebpf, MapName::FsEventCfg)?)?;
    for (i, cfg) in cfgs.iter().enumerate() {
        map.set(i as u32, cfg, 0)?;
    }
    let mut fs_devs: HashMap<_, u32, u8> =
        HashMap::try_from(crate::probes::map_mut(ebpf, MapName::FsDevs)?)?;
    for dev in &devs {
        fs_devs.insert(dev, 1, 0)?;
    }
    attach_all(ebpf, Program::FsEvent, &events, &mut out)?;
    Ok(out)
}

/// The filesystems whose events counted: the fixed one, or those in FS_DEVS.
pub fn watched_devs(ebpf: &Ebpf, fixed: Option<u32>) -> Result<Vec<u32>> {
    if let Some(d) = fixed {
        return Ok(vec![d]);
    }
    let devs: HashMap<_, u32, u8> = HashMap::try_from(crate::probes::map(ebpf, MapName::FsDevs)?)?;
    let mut v: Vec<u32> = devs.keys().filter_map(|k| k.ok()).collect();
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_paths_from_btf() {
        let loaded = btf::load(std::path::Path::new(VMLINUX_BTF));
        if !crate::test_support::needs("device_paths_from_btf", VMLINUX_BTF, loaded.is_ok()) {
            return;
        }
        let btf = loaded.unwrap();
        let (hops, _) = dev_path(btf, "inode", 0).expect("inode → i_sb → s_dev");
        assert_eq!(hops.len(), 1);
        let (hops, _) = dev_path(btf, "file", 0).expect("file → inode → sb");
        assert_eq!(hops.len(), 2);
        if btf::find_struct(btf, "xfs_inode").is_ok() {
            let (hops, _) = dev_path(btf, "xfs_inode", 0).expect("xfs_inode path");
            assert_eq!(hops.len(), 2);
        }
    }
}
