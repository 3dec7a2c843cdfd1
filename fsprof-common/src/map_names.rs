//! The names of the eBPF object's maps, for userspace: each written once. The eBPF side
//! names a map by its static's identifier; `fsprof`'s test
//! `probes::tests::object_has_every_name_userspace_uses` checks the two agree both ways.

/// Every map of the eBPF object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum MapName {
    BackgroundPids,
    Block,
    BlockSlots,
    DenseHists,
    Devices,
    DevCache,
    Events,
    FollowHint,
    FsCounts,
    FsDevs,
    FsEventCfg,
    FsPairs,
    FsPending,
    Hists,
    Inflight,
    KeyScratch,
    LastWatched,
    Lookups,
    Lost,
    NoMappings,
    OnCpu,
    PendingKeys,
    ProgramRuns,
    Requests,
    SampledExec,
    StackIds,
    StackSeq,
    StackWeights,
    Syscalls,
    SyscallRow,
    Tasks,
    Times,
    Timeline,
    TimelineLost,
    UnwindFiles,
    UnwindIndex,
    UnwindMisses,
    UnwindOn,
    UnwindRows,
    UnwindWake,
    UserKeys,
    UserMappings,
    UserStackIds,
    WakeWeights,
    Walks,
}

impl MapName {
    /// The map's name in the object (its static's identifier).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_statics() {
        assert_eq!(MapName::Tasks.name(), "TASKS");
        assert_eq!(MapName::FsEventCfg.name(), "FS_EVENT_CFG");
        assert_eq!(MapName::UserStackIds.name(), "USER_STACK_IDS");
    }
}
