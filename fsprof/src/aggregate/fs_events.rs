//! Counts of the filesystem's own tracepoints and latencies of their begin/end pairs.

use anyhow::Result;
use aya::maps::PerCpuArray;
use fsprof_common::MapName;
use fsprof_common::{HistKind, TimeStats, kdev};
use serde::{Deserialize, Serialize};

use super::{HistId, histogram::Summary, summary};
use crate::{
    lab::mountinfo,
    probes::{Probes, fs_events::watched_devs},
};

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FsEventCount {
    /// subsystem:event
    pub name: String,
    pub count: u64,
    /// False when no argument of the event leads to a device: then it counts every
    /// filesystem's.
    pub filtered: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FsPairRow {
    pub name: String,
    pub count: u64,
    pub total_ns: u64,
    pub latency: Summary,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FsEventsProfile {
    pub subsystems: Vec<String>,
    /// Tracepoints attached / that exist but could not be attached.
    pub attached: usize,
    pub failed: usize,
    /// Events that fired, most frequent first.
    pub events: Vec<FsEventCount>,
    pub pairs: Vec<FsPairRow>,
    /// Events the kernel did not deliver because the program was already running on that
    /// CPU (an event in an interrupt nested in one in task context).
    #[serde(default)]
    pub lost_nested: u64,
    /// Every event of the subsystems (the census), not the curated set.
    #[serde(default)]
    pub census: bool,
    /// The filesystems whose events counted: set, or those the target fired events on.
    #[serde(default)]
    pub watched: Vec<WatchedFs>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WatchedFs {
    /// Superblock "major:minor".
    pub dev: String,
    /// From mountinfo; empty when no longer mounted.
    pub fstype: String,
    pub source: String,
    pub mountpoint: String,
}

impl WatchedFs {
    pub fn describe(&self) -> String {
        if self.fstype.is_empty() {
            return format!("device {}", self.dev);
        }
        format!("{} {} at {}", self.fstype, self.source, self.mountpoint)
    }
}

fn watched(devs: &[u32]) -> Vec<WatchedFs> {
    let mounts = mountinfo::read();
    devs.iter()
        .map(|&d| {
            let (ma, mi) = kdev::split(d);
            let m = mounts.iter().find(|m| m.dev == d);
            WatchedFs {
                dev: format!("{ma}:{mi}"),
                fstype: m.map(|m| m.fstype.clone()).unwrap_or_default(),
                source: m.map(|m| m.source.clone()).unwrap_or_default(),
                mountpoint: m.map(|m| m.point.display().to_string()).unwrap_or_default(),
            }
        })
        .collect()
}

pub fn collect(
    probes: &Probes,
    hists: &std::collections::HashMap<HistId, Vec<(u32, u64)>>,
) -> Result<Option<FsEventsProfile>> {
    let Some(att) = &probes.fs_events else {
        return Ok(None);
    };
    let ebpf = &probes.ebpf;
    let counts: PerCpuArray<_, u64> =
        PerCpuArray::try_from(crate::probes::map(ebpf, MapName::FsCounts)?)?;
    let mut out = FsEventsProfile {
        subsystems: att.subsystems.clone(),
        attached: att.attached(),
        failed: att.failed.len(),
        census: att.census,
        watched: watched(&watched_devs(ebpf, probes.fs_dev)?),
        ..Default::default()
    };
    for (index, name, filtered) in &att.events {
        let n: u64 = counts.get(index, 0)?.iter().sum();
        if n > 0 {
            out.events.push(FsEventCount {
                name: name.clone(),
                count: n,
                filtered: *filtered,
            });
        }
    }
    out.events
        .sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
    let pairs: PerCpuArray<_, TimeStats> =
        PerCpuArray::try_from(crate::probes::map(ebpf, MapName::FsPairs)?)?;
    for (id, name) in &att.pairs {
        let (count, total) = pairs
            .get(id, 0)?
            .iter()
            .fold((0, 0), |(c, t), s| (c + s.episodes, t + s.total_ns));
        if count > 0 {
            out.pairs.push(FsPairRow {
                name: name.clone(),
                count,
                total_ns: total,
                latency: summary(hists, HistKind::FsPairLatency, 0, *id),
            });
        }
    }
    Ok(Some(out))
}
