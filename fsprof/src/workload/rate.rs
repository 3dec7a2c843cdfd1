//! A step's rate, as the tools the steps stand for report their results: pgbench's
//! transactions per second; bonnie++'s K/sec, files/sec and seeks/sec; iozone's kB/sec
//! (both count 1024 bytes). A cell keeps it in its `metrics` under the unit's key.

use std::collections::BTreeMap;

use super::{Ctx, Step, bonnie, iozone};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Unit {
    /// The key in a cell's `metrics`.
    pub key: &'static str,
    /// As the reports print it.
    pub shown: &'static str,
    /// The step's time is fixed (pgbench's `-T`): the rate is its result, not its wall.
    pub is_result: bool,
}

const fn unit(key: &'static str, shown: &'static str, is_result: bool) -> Unit {
    Unit {
        key,
        shown,
        is_result,
    }
}

pub const TPS: Unit = unit("tps", "tps", true);
pub const KIB_PER_S: Unit = unit("kib_per_s", "KiB/s", false);
pub const FILES_PER_S: Unit = unit("files_per_s", "files/s", false);
pub const SEEKS_PER_S: Unit = unit("seeks_per_s", "seeks/s", false);
const UNITS: [Unit; 4] = [TPS, KIB_PER_S, FILES_PER_S, SEEKS_PER_S];

/// The unit of `step`'s rate and the work one run of it does (all its jobs), as bonnie++ and
/// iozone count it; None for a step judged by its time alone.
pub fn work(step: Step, ctx: &Ctx) -> Option<(Unit, f64)> {
    use Step::*;
    let kib = |bytes: u64| bytes as f64 / 1024.0;
    let (unit, per_job) = match step {
        BonniePutc | BonnieWrite | BonnieRewrite | BonnieGetc | BonnieRead => {
            (KIB_PER_S, kib(ctx.bonnie_size))
        }
        BonnieSeeks => (SEEKS_PER_S, bonnie::SEEKS_DONE as f64),
        BonnieSeqCreate | BonnieSeqStat | BonnieSeqDelete | BonnieRandCreate | BonnieRandStat
        | BonnieRandDelete => (FILES_PER_S, ctx.bonnie_files as f64),
        IozoneWrite | IozoneRewrite | IozoneRead | IozoneReread | IozoneRandRead
        | IozoneRandWrite => (KIB_PER_S, kib(iozone::bytes_per_test(ctx.iozone_max_file))),
        IozoneLarge => (KIB_PER_S, kib(iozone::large_bytes(ctx.iozone_large))),
        _ => return None,
    };
    Some((unit, per_job * ctx.jobs.max(1) as f64))
}

/// The rate a cell's metrics hold, with its unit.
pub fn of(metrics: &BTreeMap<String, f64>) -> Option<(Unit, f64)> {
    UNITS
        .into_iter()
        .find_map(|u| metrics.get(u.key).map(|v| (u, *v)))
}

/// The rate a cell's metrics hold when that rate is the step's result (pgbench's tps).
pub fn result_of(metrics: &BTreeMap<String, f64>) -> Option<(Unit, f64)> {
    of(metrics).filter(|(u, _)| u.is_result)
}
