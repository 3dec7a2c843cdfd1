//! Block I/O per device and request class, from the block probes (fsprof-ebpf `block`):
//! requests, bytes, sizes and latencies, and the requests whose completion was not seen.

use fsprof_common::MapName;
use std::collections::{BTreeMap, HashMap as StdHashMap};

use anyhow::{Result, bail};
use aya::maps::{HashMap, Map, PerCpuArray};
use fsprof_common::{
    BLOCK_CLASSES, BlockClass, BlockKey, BlockStats, HistKind, MAX_INFLIGHT_SLOTS, RequestTimes,
    kdev,
};
use serde::{Deserialize, Serialize};

use super::{HistId, histogram::Summary, sum, summary};
use crate::probes::{Probes, mmapped, monotonic_ns};

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BlockRow {
    /// "major:minor"
    pub dev: String,
    /// Kernel name (loop0, vda) when /sys/dev/block knows it.
    pub name: String,
    pub class: String,
    pub issued: u64,
    pub completions: u64,
    /// Requests issued during the trace whose completion the probes missed: their tag was
    /// issued again first, or they were still in the in-flight tables a second after
    /// their issue when the figures were read. Their bytes are not in `bytes`.
    #[serde(default)]
    pub unseen: u64,
    /// Requests issued less than a second before the figures were read and not yet seen
    /// completing: in flight (a live snapshot, or another program's I/O at the end).
    #[serde(default)]
    pub in_flight: u64,
    pub bytes: u64,
    /// Bytes completed of the requests issued during the trace (`bytes` also counts
    /// completions of requests issued before it): the sizes at issue add up to it.
    #[serde(default)]
    pub issued_bytes: u64,
    /// Request size at issue, bytes.
    pub size: Summary,
    /// Arrival (the kernel's own `start_time_ns`, iostat's) → issue, ns.
    pub queue_latency: Summary,
    /// Issue → completion of its last part, ns: one per request.
    pub device_latency: Summary,
}

/// The lost-event counter of the requests never seen completing (the sum of `unseen`).
pub const LOST_UNSEEN: &str = "block_completions_unseen";

/// A request not seen completing this long after its issue counts as missed; a younger
/// one as in flight (a healthy device completes in milliseconds).
const IN_FLIGHT_NS: u64 = 1_000_000_000;

fn add(a: BlockStats, b: &BlockStats) -> BlockStats {
    BlockStats {
        completions: a.completions + b.completions,
        bytes: a.bytes + b.bytes,
        issued: a.issued + b.issued,
        queue_ns: a.queue_ns + b.queue_ns,
        device_ns: a.device_ns + b.device_ns,
        unseen: a.unseen + b.unseen,
        issued_bytes: a.issued_bytes + b.issued_bytes,
    }
}

/// The rows, by device name, dev and class.
pub fn collect(
    probes: &Probes,
    hists: &StdHashMap<HistId, Vec<(u32, u64)>>,
) -> Result<Vec<BlockRow>> {
    let mut blocks = stats(probes)?;
    let mut in_flight: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    let now = monotonic_ns();
    for t in unfinished(probes)? {
        if now.saturating_sub(t.issue) < IN_FLIGHT_NS {
            *in_flight.entry((t.dev, t.class)).or_default() += 1;
            blocks.entry((t.dev, t.class)).or_default();
        } else {
            blocks.entry((t.dev, t.class)).or_default().unseen += 1;
        }
    }
    let mut rows: Vec<BlockRow> = blocks
        .into_iter()
        .map(|((dev, class), s)| {
            let (major, minor) = kdev::split(dev);
            BlockRow {
                dev: format!("{major}:{minor}"),
                name: dev_name(major, minor),
                class: BlockClass::from_u32(class).name().to_string(),
                issued: s.issued,
                completions: s.completions,
                unseen: s.unseen,
                in_flight: in_flight.get(&(dev, class)).copied().unwrap_or(0),
                bytes: s.bytes,
                issued_bytes: s.issued_bytes,
                size: summary(hists, HistKind::BlockSize, class, dev),
                queue_latency: summary(hists, HistKind::BlockQueueLatency, class, dev),
                device_latency: summary(hists, HistKind::BlockDeviceLatency, class, dev),
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.name, &a.dev, &a.class).cmp(&(&b.name, &b.dev, &b.class)));
    Ok(rows)
}

/// The counters by (dev, class). Devices with a slot count in a per-CPU array, the others
/// in the hash.
fn stats(probes: &Probes) -> Result<BTreeMap<(u32, u32), BlockStats>> {
    let ebpf = &probes.ebpf;
    let mut blocks: BTreeMap<(u32, u32), BlockStats> = BTreeMap::new();
    for (k, v) in crate::probes::cpu_keyed::<BlockKey, BlockStats>(ebpf, MapName::Block)? {
        let e = blocks.entry((k.dev, k.class)).or_default();
        *e = add(*e, &v);
    }
    let slotted: PerCpuArray<_, BlockStats> =
        PerCpuArray::try_from(crate::probes::map(ebpf, MapName::BlockSlots)?)?;
    for (slot, &dev) in probes.dense.slots.iter().enumerate() {
        for class in 0..BLOCK_CLASSES {
            let s = sum(
                &slotted.get(&(slot as u32 * BLOCK_CLASSES + class), 0)?,
                add,
            );
            if s.issued + s.completions + s.unseen > 0 {
                let e = blocks.entry((dev, class)).or_default();
                *e = add(*e, &s);
            }
        }
    }
    Ok(blocks)
}

/// Requests issued during the trace that are still in the in-flight tables: their
/// completion has not been seen.
fn unfinished(probes: &Probes) -> Result<Vec<RequestTimes>> {
    let Map::Array(inflight) = crate::probes::map(&probes.ebpf, MapName::Inflight)? else {
        bail!("{} is not an array map", MapName::Inflight.name());
    };
    let mut out: Vec<RequestTimes> =
        mmapped::read::<RequestTimes>(inflight, MapName::Inflight.name(), MAX_INFLIGHT_SLOTS)?
            .into_iter()
            .filter(|t| t.rq != 0)
            .collect();
    let hashed: HashMap<_, u64, RequestTimes> =
        HashMap::try_from(crate::probes::map(&probes.ebpf, MapName::Requests)?)?;
    // A failed read is an error, not a request quietly left out of `unseen`.
    for item in hashed.iter() {
        out.push(item?.1);
    }
    Ok(out)
}

pub(crate) fn dev_name(major: u32, minor: u32) -> String {
    std::fs::read_link(format!("/sys/dev/block/{major}:{minor}"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

/// The disk ("major:minor") a block device node is on: itself, or a partition's disk.
fn disk_of(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = std::os::unix::fs::MetadataExt::rdev(&meta);
    let (ma, mi) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
    let sys = std::path::PathBuf::from(format!("/sys/dev/block/{ma}:{mi}"));
    if !sys.join("partition").exists() {
        return Some(format!("{ma}:{mi}"));
    }
    crate::os::read_trimmed(sys.join("../dev"))
}

/// Splits `rows` into the target's and the rest: the target's are on the disks that hold
/// the filesystems it used (`sources`: mountinfo's device paths); with none known, all are.
pub fn split_by_disk(rows: Vec<BlockRow>, sources: &[String]) -> (Vec<BlockRow>, Vec<BlockRow>) {
    let disks: Vec<String> = (sources.iter())
        .filter_map(|s| disk_of(std::path::Path::new(s)))
        .collect();
    if disks.is_empty() {
        return (rows, Vec::new());
    }
    rows.into_iter().partition(|r| disks.contains(&r.dev))
}
