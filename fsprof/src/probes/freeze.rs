//! The end of following: every map read afterwards stops at the same instant.

use std::collections::HashSet;

use anyhow::Result;
use fsprof_common::{MapName, follow_hint_slot};

use super::{Probes, map_mut};

impl Probes {
    /// Stops following every thread before the maps are read, so that the time classes,
    /// the stacks, the samples and the syscalls all end at one instant, `frozen_at`. Read
    /// live, a thread still alive (a daemon the command left, a -p target) closes phases
    /// between the reads: the classes, read first, had its open interval up to then, and
    /// the stacks, read later, had it again in the whole phase (200 ms of a PostgreSQL
    /// background writer's sleep counted twice once in CI). Every program looks a thread
    /// up through its hint slot first (fsprof-ebpf common::followed): clearing the slots
    /// of the followed threads stops them, with no change to the programs. One already
    /// past the lookup still runs: an RCU grace period lets it end, and a thread it
    /// followed meanwhile (a fork) has its slot cleared in the next pass. A thread's own
    /// time then ends at its last event if that came after `frozen_at` (`aggregate::sched`),
    /// and open intervals end at `frozen_at`; the timeline goes on (its block requests are
    /// the block table's, read later). The thread table stays, for `followed`.
    pub fn freeze(&mut self) -> Result<()> {
        if self.frozen_at.is_some() {
            return Ok(());
        }
        self.frozen_at = Some(crate::os::monotonic_ns());
        let mut cleared = HashSet::new();
        loop {
            let new: Vec<u32> = (self.followed()?.into_iter())
                .filter(|&t| cleared.insert(t))
                .collect();
            if new.is_empty() {
                return Ok(());
            }
            let mut hint: aya::maps::Array<_, u32> =
                aya::maps::Array::try_from(map_mut(&mut self.ebpf, MapName::FollowHint)?)?;
            for tid in new {
                hint.set(follow_hint_slot(tid), 0, 0)?;
            }
            crate::os::bpf_programs_settle()?;
        }
    }
}
