//! Counting the filesystem's own tracepoints during a trace, only those of the filesystem
//! under test, and timing begin/end pairs of them. One raw-tracepoint program is attached to
//! every event of the subsystems that concern the filesystem, through BPF_RAW_TRACEPOINT_OPEN
//! with the event's index as cookie (aya's raw-tracepoint attach has no cookie). Each event's
//! arguments are looked up in BTF: the first pointer from which a chain of members leads to
//! a superblock's dev_t gives the device filter.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result, bail};
use aya::{Ebpf, maps::Array, programs::RawTracePoint};
use btf_rs::Btf;
use fsprof_common::{
    FS_MAX_DEREF, FS_NO_ARG, FS_PAIR_SLOTS, FsEventCfg, MAX_FS_EVENTS, MAX_FS_PAIRS,
};

use super::{
    btf,
    offsets::VMLINUX_BTF,
    tracefs::{self, Event},
};

/// The filesystem whose events count.
#[derive(Clone, Debug, Default)]
pub struct FsTarget {
    /// ext4, xfs, btrfs, ntfs, … (selects the tracepoint subsystems).
    pub kind: String,
    /// Kernel-encoded dev_t of its superblock (s_dev, as /proc/self/mountinfo shows it).
    pub dev: u32,
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
    /// Events that exist but could not be attached.
    pub failed: Vec<String>,
    /// The links carrying the program; closing them detaches it.
    links: Vec<OwnedFd>,
}

impl FsEventsAttached {
    pub fn attached(&self) -> usize {
        self.links.len()
    }
}

/// The device filter of one event: first argument with a path to a dev_t.
fn device_of(btf: &Btf, e: &Event) -> Option<(u32, Vec<u32>, u32)> {
    let args = btf::tracepoint_args(btf, &e.name)?;
    args.iter().enumerate().take(6).find_map(|(i, t)| {
        let s = btf::pointee_struct(btf, t)?;
        let (derefs, dev) = dev_path(btf, &s, 0)?;
        Some((i as u32, derefs, dev))
    })
}

/// `union bpf_attr` for BPF_RAW_TRACEPOINT_OPEN; `cookie` since Linux 6.10.
#[repr(C)]
struct RawTracepointOpen {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
}
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;

/// Attaches `prog_fd` to raw tracepoint `name` with `cookie`.
fn attach_raw(prog_fd: i32, name: &str, cookie: u64) -> std::io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name)?;
    let attr = RawTracepointOpen {
        name: cname.as_ptr() as u64,
        prog_fd: prog_fd as u32,
        _pad: 0,
        cookie,
    };
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_RAW_TRACEPOINT_OPEN,
            &attr as *const RawTracepointOpen,
            std::mem::size_of::<RawTracepointOpen>() as u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Configures and attaches the fs_event program for `target`'s subsystems.
pub fn attach(ebpf: &mut Ebpf, target: &FsTarget) -> Result<FsEventsAttached> {
    let all = tracefs::events().map_err(|e| anyhow::anyhow!(e))?;
    let btf = btf::load(std::path::Path::new(VMLINUX_BTF))?;
    let subsystems = subsystems_for(&target.kind);
    let events: Vec<&Event> = subsystems
        .iter()
        .filter_map(|s| all.get(*s))
        .flatten()
        .take(MAX_FS_EVENTS as usize)
        .collect();
    if events.is_empty() {
        bail!("no tracepoints of {} in this kernel", subsystems.join(", "));
    }
    let mut out = FsEventsAttached {
        subsystems: subsystems
            .iter()
            .filter(|s| all.get(**s).is_some_and(|v| !v.is_empty()))
            .map(|s| s.to_string())
            .collect(),
        ..Default::default()
    };
    let mut cfgs: Vec<FsEventCfg> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let mut cfg = FsEventCfg {
            dev_arg: FS_NO_ARG,
            key_arg: FS_NO_ARG,
            ..Default::default()
        };
        if let Some((arg, derefs, dev)) = device_of(btf, e) {
            cfg.dev_arg = arg;
            cfg.nderef = derefs.len() as u32;
            cfg.derefs[..derefs.len()].copy_from_slice(&derefs);
            cfg.dev_off = dev;
        }
        if std::env::var_os("FSPROF_DEBUG_EVENTS").is_some() {
            eprintln!("{} {:?}", e.full_name(), cfg);
        }
        out.events
            .push((i as u32, e.full_name(), cfg.dev_arg != FS_NO_ARG));
        cfgs.push(cfg);
    }
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
    {
        let mut map: Array<_, FsEventCfg> =
            Array::try_from(ebpf.map_mut("FS_EVENT_CFG").context("FS_EVENT_CFG map")?)?;
        for (i, cfg) in cfgs.iter().enumerate() {
            map.set(i as u32, cfg, 0)?;
        }
    }
    let prog: &mut RawTracePoint = ebpf
        .program_mut("fs_event")
        .context("program fs_event missing from the eBPF object")?
        .try_into()?;
    prog.load().context("loading fs_event")?;
    let prog_fd = prog.fd()?.as_fd().as_raw_fd();
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
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_paths_from_btf() {
        let Ok(btf) = btf::load(std::path::Path::new(VMLINUX_BTF)) else {
            return;
        };
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
