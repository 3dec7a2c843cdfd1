//! The end of following: every map read afterwards stops at the same instant.

use anyhow::Result;
use fsprof_common::MapName;

use super::{Probes, map_mut};

impl Probes {
    /// Stops following every thread before the maps are read, so that the time classes,
    /// the stacks, the samples and the timeline all end at one instant, `frozen_at`. Read
    /// live, a thread still alive (a daemon the command left, a -p target) closes phases
    /// between the reads: the classes, read first, had its open interval up to then, and
    /// the stacks, read later, had it again in the whole phase (200 ms of a PostgreSQL
    /// background writer's sleep counted twice once in CI). Every program looks a thread
    /// up through `followed` (fsprof-ebpf common), which refuses all once FROZEN is set;
    /// one already past it still runs: an RCU grace period lets it end (its event stamped
    /// a few µs after `frozen_at` at most). Open intervals end at `frozen_at`, and so does
    /// the timeline. The thread table stays, for `followed`.
    pub fn freeze(&mut self) -> Result<()> {
        if self.frozen_at.is_some() {
            return Ok(());
        }
        let at = crate::os::monotonic_ns();
        let mut frozen: aya::maps::Array<_, u32> =
            aya::maps::Array::try_from(map_mut(&mut self.ebpf, MapName::Frozen)?)?;
        frozen.set(0, 1, 0)?;
        crate::os::bpf_programs_settle()?;
        self.frozen_at = Some(at);
        Ok(())
    }
}
