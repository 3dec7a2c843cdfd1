//! The result of `fsprof crash`: filesystem × update pattern × crash point, each cell the
//! outcomes of independent trials on fresh filesystems, with recovery and fsck times.

use std::{collections::BTreeMap, path::Path};

use anyhow::Result;
use clap::ValueEnum;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strum::IntoStaticStr;

use crate::{
    trace::TraceResult,
    workload::crash::{Outcome, Pattern},
};

/// Version of the crash JSON (docs/json.md). Bump on any breaking change.
pub const CRASH_SCHEMA_VERSION: u32 = 1;

/// When, after the update returned, the filesystem is crashed.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, IntoStaticStr, ValueEnum,
)]
#[strum(serialize_all = "kebab-case")]
#[serde(rename_all = "kebab-case")]
pub enum CrashPoint {
    /// Right after the update's last call returned.
    Now,
    /// After the filesystem's commit interval (ext4 `commit=`, 5 s by default; xfs
    /// `xfssyncd_centisecs`, 30 s) and one second more.
    AfterCommit,
}

impl CrashPoint {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CrashStudy {
    pub schema_version: u32,
    /// Random id: the history records a study once however often it is imported.
    #[serde(default)]
    pub study_id: String,
    /// A name for the study in the history and the results (a kernel patch, a setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub fsprof_version: String,
    pub kernel: String,
    /// `uname -v` of the kernel the filesystems ran on.
    pub kernel_build: String,
    pub host: String,
    /// Unix time the study started.
    pub started: u64,
    /// Trials per cell asked for (a cell of an interrupted study may have fewer).
    pub trials: u32,
    /// False while running and when interrupted: the file is still valid, just partial.
    pub complete: bool,
    pub cells: Vec<CrashCell>,
    /// What each pattern costs the application, traced without a crash.
    #[serde(default)]
    pub costs: Vec<CrashCost>,
    /// The VM whose power was cut (`--kernel`); null on the host.
    #[serde(default)]
    pub vm: Option<crate::results::VmFacts>,
}

/// One pattern's updates traced on a fresh filesystem: what the application waits for
/// (writeback it leaves for later is not in it).
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CrashCost {
    pub fs: String,
    pub mkfs_opts: String,
    pub mount_opts: String,
    pub pattern: Pattern,
    /// Updates traced, each of its own file in its own directory.
    pub updates: u32,
    /// The time they took as the application measured it (its start and exit left out).
    pub updates_ns: u64,
    /// The trace of the process making them.
    pub trace: TraceResult,
}

/// Events that mark a journal commit or a log force, by filesystem family.
pub const COMMIT_EVENTS: &[&str] = &[
    "jbd2:jbd2_start_commit",
    "xfs:xfs_log_force",
    "btrfs:btrfs_transaction_commit",
];

impl CrashCost {
    /// Time per update, ns.
    pub fn per_update_ns(&self) -> u64 {
        self.updates_ns / u64::from(self.updates.max(1))
    }

    /// Latency of the pattern's syncs (fsync and fdatasync), if it made any.
    pub fn sync_latency(&self) -> Option<&crate::aggregate::histogram::Summary> {
        let rows = &self.trace.profile.syscalls;
        rows.iter()
            .filter(|r| r.name == "fsync" || r.name == "fdatasync")
            .max_by_key(|r| r.count)
            .map(|r| &r.latency)
    }

    /// Journal commits or log forces while it ran.
    pub fn commits(&self) -> u64 {
        let Some(f) = &self.trace.profile.fs_events else {
            return 0;
        };
        f.events
            .iter()
            .filter(|e| COMMIT_EVENTS.contains(&e.name.as_str()))
            .map(|e| e.count)
            .sum()
    }

    /// Bytes written to the device, and cache flushes.
    pub fn written_and_flushes(&self) -> (u64, u64) {
        let block = &self.trace.profile.block;
        let sum = |class: &str, f: fn(&crate::aggregate::block::BlockRow) -> u64| {
            block
                .iter()
                .filter(|b| b.class == class)
                .map(f)
                .sum::<u64>()
        };
        (sum("write", |b| b.bytes), sum("flush", |b| b.issued))
    }
}

impl CrashStudy {
    /// Several studies of one configuration as one (`compare --past`): each cell's trials
    /// summed (they are independent draws of the same cell), the newest study's facts and
    /// costs (one traced pass each, shown and not tested).
    pub fn pool(studies: &[CrashStudy]) -> Option<CrashStudy> {
        let (newest, _) = studies.split_last()?;
        let mut out = CrashStudy {
            cells: Vec::new(),
            trials: studies.iter().map(|s| s.trials).sum(),
            complete: studies.iter().all(|s| s.complete),
            ..newest.clone()
        };
        for c in studies.iter().flat_map(|s| &s.cells) {
            match out.cells.iter_mut().find(|o| o.same_cell(c)) {
                Some(o) => o.absorb(c),
                None => out.cells.push(c.clone()),
            }
        }
        Some(out)
    }

    /// Writes the study atomically: an interrupted write leaves the previous file.
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::os::write_atomic(path, &(serde_json::to_string_pretty(self)? + "\n"))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CrashCell {
    pub fs: String,
    pub mkfs_opts: String,
    pub mount_opts: String,
    /// How the filesystem was crashed (`shutdown-ioctl`); cells of different methods are
    /// never compared.
    pub method: String,
    pub pattern: Pattern,
    pub point: CrashPoint,
    /// Time between the update's return and the crash, ns.
    pub wait_ns: u64,
    /// POSIX (or SQLite, for sqlite-wal) promises the new content after this pattern.
    pub durable: bool,
    /// Trials by what the application found.
    pub outcomes: BTreeMap<Outcome, u32>,
    /// The mount after each crash (journal or log replay), ns.
    pub recovery_ns: Vec<u64>,
    /// The read-only fsck after each recovery, ns (empty when the filesystem has none).
    pub fsck_ns: Vec<u64>,
    /// Trials whose fsck found something to repair, and its first complaint.
    pub fsck_unclean: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsck_detail: Option<String>,
    /// Why the first trial with an `error` outcome found one (a filesystem that does not
    /// mount after the crash, a database that does not open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_detail: Option<String>,
    /// Trials whose log replay (by the filesystem's tool: jfs's fsck.jfs -a) said something
    /// failed, and what it said the first time.
    #[serde(default)]
    pub recovery_unclean: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_detail: Option<String>,
}

impl CrashCell {
    /// The same filesystem, options, crash method, pattern and crash point.
    fn same_cell(&self, o: &CrashCell) -> bool {
        (&self.fs, &self.mkfs_opts, &self.mount_opts, &self.method)
            == (&o.fs, &o.mkfs_opts, &o.mount_opts, &o.method)
            && (self.pattern, self.point) == (o.pattern, o.point)
    }

    /// Adds the trials of another study's same cell.
    fn absorb(&mut self, o: &CrashCell) {
        for (&k, &n) in &o.outcomes {
            *self.outcomes.entry(k).or_default() += n;
        }
        self.wait_ns = self.wait_ns.max(o.wait_ns);
        self.recovery_ns.extend(&o.recovery_ns);
        self.fsck_ns.extend(&o.fsck_ns);
        self.fsck_unclean += o.fsck_unclean;
        self.recovery_unclean += o.recovery_unclean;
        // One example of each is kept: the first met.
        for (mine, theirs) in [
            (&mut self.fsck_detail, &o.fsck_detail),
            (&mut self.error_detail, &o.error_detail),
            (&mut self.recovery_detail, &o.recovery_detail),
        ] {
            if mine.is_none() {
                mine.clone_from(theirs);
            }
        }
    }

    /// Each outcome's share of the trials is the same in both cells.
    pub fn same_shares(&self, o: &CrashCell) -> bool {
        let (t, ot) = (u64::from(self.trials()), u64::from(o.trials()));
        Outcome::ALL.iter().all(|k| {
            let n = |c: &CrashCell| u64::from(c.outcomes.get(k).copied().unwrap_or(0));
            n(self) * ot == n(o) * t
        })
    }

    pub fn trials(&self) -> u32 {
        self.outcomes.values().sum()
    }

    /// A durable pattern that lost the new content: a filesystem bug, or fsprof's.
    pub fn broken_promise(&self) -> bool {
        self.durable && self.outcomes.keys().any(|&o| o != Outcome::New)
    }
}
