//! Counts of the filesystem's own tracepoints and latencies of their begin/end pairs.

use anyhow::Result;
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
    // Summed over CPUs, by index (an array's entries come in key order).
    let counts = crate::probes::batch::entries(
        crate::probes::map(ebpf, MapName::FsCounts)?,
        |_: u32, per_cpu: Vec<u64>| per_cpu.iter().sum::<u64>(),
    )?;
    let mut out = FsEventsProfile {
        subsystems: att.subsystems.clone(),
        attached: att.attached(),
        failed: att.failed.len(),
        census: att.census,
        watched: watched(&watched_devs(ebpf, probes.fs_dev)?),
        ..Default::default()
    };
    for (index, name, filtered) in &att.events {
        let n = counts.get(*index as usize).copied().unwrap_or(0);
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
    let pairs = crate::probes::batch::entries(
        crate::probes::map(ebpf, MapName::FsPairs)?,
        |_: u32, per_cpu: Vec<TimeStats>| {
            (per_cpu.iter()).fold((0, 0), |(c, t), s| (c + s.episodes, t + s.total_ns))
        },
    )?;
    for (id, name) in &att.pairs {
        let (count, total) = pairs.get(*id as usize).copied().unwrap_or((0, 0));
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
