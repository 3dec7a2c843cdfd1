//! The syscall boundary (fsprof-ebpf `syscalls.rs`): count, errors, bytes and latency per
//! syscall the target made.

use std::collections::HashMap as StdHashMap;

use anyhow::Result;
use aya::Ebpf;
use fsprof_common::{HistKind, MapName, SyscallStats};
use serde::{Deserialize, Serialize};

use super::{HistId, histogram::Summary, sum, summary};
use crate::syscall_table;

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SyscallRow {
    pub nr: u32,
    pub name: String,
    /// VFS operation group (open, read, write, …) or "other".
    pub op: String,
    pub count: u64,
    pub errors: u64,
    /// Bytes transferred, for syscalls that move data; null otherwise.
    pub bytes: Option<u64>,
    pub total_ns: u64,
    /// Latency in ns.
    pub latency: Summary,
}

/// One row per syscall made, longest total time first.
pub(super) fn collect(
    ebpf: &Ebpf,
    hists: &StdHashMap<HistId, Vec<(u32, u64)>>,
) -> Result<Vec<SyscallRow>> {
    let mut rows = Vec::new();
    let all = crate::probes::batch::entries(
        crate::probes::map(ebpf, MapName::Syscalls)?,
        |nr: u32, per_cpu: Vec<SyscallStats>| {
            let s = sum(&per_cpu, |a: SyscallStats, b| SyscallStats {
                count: a.count + b.count,
                errors: a.errors + b.errors,
                ret_sum: a.ret_sum.wrapping_add(b.ret_sum),
                total_ns: a.total_ns + b.total_ns,
            });
            (nr, s)
        },
    )?;
    for (nr, s) in all {
        if s.count == 0 {
            continue;
        }
        let name = syscall_table::name(nr);
        rows.push(SyscallRow {
            nr,
            op: syscall_table::op_of(&name).to_string(),
            bytes: syscall_table::moves_bytes(&name).then_some(s.ret_sum),
            name,
            count: s.count,
            errors: s.errors,
            total_ns: s.total_ns,
            latency: summary(hists, HistKind::SyscallLatency, 0, nr),
        });
    }
    rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.nr.cmp(&b.nr)));

    Ok(rows)
}
