//! `fsprof crash`: what a crash leaves of an application's update, per filesystem, update
//! pattern and crash point. A trial is one fresh filesystem per pattern: the old version
//! made durable, the update, the crash (at once, or after the commit interval), the mount
//! that replays the journal, what the application finds, the read-only fsck. The patterns
//! of a trial run side by side on their own filesystems, so they wait out a commit
//! interval together and cannot commit each other's metadata.

use std::{
    collections::BTreeMap,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::{
    lab::{
        FsKind, LabFs, LabOptions,
        crash::{CrashMethod, commit_interval},
    },
    probes::FsEventSet,
    results::crash::{CRASH_SCHEMA_VERSION, CrashCell, CrashCost, CrashPoint, CrashStudy},
    signals,
    trace::TraceOptions,
    workload::crash::{Outcome, Pattern, classify, prepare_copies},
};

#[derive(Clone, Debug, Default)]
pub struct CrashOptions {
    pub filesystems: Vec<FsKind>,
    pub patterns: Vec<Pattern>,
    pub points: Vec<CrashPoint>,
    pub trials: u32,
    pub lab: LabOptions,
    /// Updates traced per pattern for its cost (0: no cost pass).
    pub cost_updates: u32,
    /// The study's name in the history and the results.
    pub label: Option<String>,
}

/// One pattern's filesystem in a trial, and when its update returned.
struct Slot {
    pattern: Pattern,
    fs: LabFs,
    updated: Option<Instant>,
}

/// What one pattern's trial found.
#[derive(Serialize, Deserialize)]
pub(super) struct Trial {
    pub outcome: Outcome,
    /// From the update's return to the crash.
    pub wait: Duration,
    /// The mount that replayed the journal; None when it failed.
    pub recovery: Option<Duration>,
    pub fsck: Option<crate::lab::crash::Fsck>,
    /// Why, for an error outcome.
    pub error: Option<String>,
    /// What the log replay said went wrong (a replay by the filesystem's tool).
    #[serde(default)]
    pub recovery_complaint: Option<String>,
}

/// A study's record before its first trial: what it is, where and when.
pub(super) fn begun(opts: &CrashOptions) -> CrashStudy {
    CrashStudy {
        schema_version: CRASH_SCHEMA_VERSION,
        study_id: crate::os::random_id(),
        label: opts.label.clone(),
        fsprof_version: env!("CARGO_PKG_VERSION").into(),
        kernel: crate::os::kernel_release(),
        kernel_build: crate::os::kernel_build(),
        host: crate::os::hostname(),
        started: super::unix_now(),
        trials: opts.trials,
        ..CrashStudy::default()
    }
}

/// The study on the host's kernel, crashed by the shutdown ioctl.
pub(super) fn on_host(
    opts: &CrashOptions,
    out: &mut CrashStudy,
    progress: &mut dyn FnMut(&str),
    save: &mut dyn FnMut(&CrashStudy) -> Result<()>,
) -> Result<()> {
    let methods: Vec<CrashMethod> = opts
        .filesystems
        .iter()
        .map(|&k| {
            k.check_available()?;
            CrashMethod::on_host(k)
        })
        .collect::<Result<_>>()?;
    for (&kind, &method) in opts.filesystems.iter().zip(&methods) {
        for &pattern in opts.patterns.iter().filter(|_| opts.cost_updates > 0) {
            signals::check()?;
            let c = cost(opts, kind, pattern)?;
            progress(&format!(
                "{kind} {} cost: {} per update",
                pattern.name(),
                crate::units::duration_ns(c.per_update_ns())
            ));
            out.costs.push(c);
            save(out)?;
        }
        for &point in &opts.points {
            let first = out.cells.len();
            out.cells.extend(
                opts.patterns
                    .iter()
                    .map(|&p| empty_cell(opts, kind, method, p, point)),
            );
            for trial in 1..=opts.trials {
                signals::check()?;
                let found = run_trial(opts, kind, method, point)?;
                for (cell, (pattern, t)) in out.cells[first..].iter_mut().zip(found) {
                    progress(&format!(
                        "{kind} {} {} trial {trial}/{}: {}",
                        pattern.name(),
                        point.name(),
                        opts.trials,
                        t.outcome.name()
                    ));
                    record(cell, &t);
                }
                save(out)?;
            }
        }
    }
    Ok(())
}

pub(super) fn empty_cell(
    opts: &CrashOptions,
    kind: FsKind,
    method: CrashMethod,
    pattern: Pattern,
    point: CrashPoint,
) -> CrashCell {
    CrashCell {
        fs: kind.name().into(),
        mkfs_opts: opts.lab.mkfs_opts.join(" "),
        mount_opts: opts.lab.mount_opts.clone(),
        method: method.name().into(),
        pattern,
        point,
        wait_ns: 0,
        durable: pattern.durable(),
        outcomes: BTreeMap::new(),
        recovery_ns: Vec::new(),
        fsck_ns: Vec::new(),
        fsck_unclean: 0,
        fsck_detail: None,
        error_detail: None,
        recovery_unclean: 0,
        recovery_detail: None,
    }
}

pub(super) fn record(cell: &mut CrashCell, t: &Trial) {
    *cell.outcomes.entry(t.outcome).or_default() += 1;
    if let Some(e) = &t.error {
        cell.error_detail.get_or_insert_with(|| e.clone());
    }
    if let Some(c) = &t.recovery_complaint {
        cell.recovery_unclean += 1;
        cell.recovery_detail.get_or_insert_with(|| c.clone());
    }
    cell.wait_ns = cell.wait_ns.max(t.wait.as_nanos() as u64);
    if let Some(r) = t.recovery {
        cell.recovery_ns.push(r.as_nanos() as u64);
    }
    if let Some(f) = &t.fsck {
        cell.fsck_ns.push(f.took.as_nanos() as u64);
        if !f.clean {
            cell.fsck_unclean += 1;
            cell.fsck_detail.get_or_insert_with(|| f.detail.clone());
        }
    }
}

/// One trial of every pattern, each on its own fresh filesystem.
fn run_trial(
    opts: &CrashOptions,
    kind: FsKind,
    method: CrashMethod,
    point: CrashPoint,
) -> Result<Vec<(Pattern, Trial)>> {
    let mut slots = Vec::new();
    for &pattern in &opts.patterns {
        let fs = LabFs::create(kind, &opts.lab)?;
        pattern.prepare(fs.mountpoint())?;
        slots.push(Slot {
            pattern,
            fs,
            updated: None,
        });
    }
    // Old versions on the device before any update starts.
    for s in &slots {
        s.fs.syncfs()?;
    }
    let mut found = Vec::new();
    for s in &mut slots {
        s.pattern.update(s.fs.mountpoint())?;
        s.updated = Some(Instant::now());
        if point == CrashPoint::Now {
            found.push((s.pattern, crash_and_look(s, method)?));
        }
    }
    if point == CrashPoint::AfterCommit {
        sleep_checked(commit_interval(kind, &opts.lab.mount_opts) + Duration::from_secs(1))?;
        for s in &mut slots {
            found.push((s.pattern, crash_and_look(s, method)?));
        }
    }
    Ok(found)
}

fn crash_and_look(s: &mut Slot, method: CrashMethod) -> Result<Trial> {
    let wait = s.updated.map_or(Duration::ZERO, |t| t.elapsed());
    let recovery = s.fs.crash_and_remount(method)?;
    let (outcome, error) = classify(s.pattern, s.fs.mountpoint());
    let fsck = s.fs.checked()?;
    Ok(Trial {
        outcome,
        wait,
        recovery: Some(recovery),
        fsck,
        error,
        recovery_complaint: None,
    })
}

/// Traces `cost_updates` updates of `pattern` on a fresh filesystem, each of its own
/// durable old version: what the application waits for. The writeback it leaves behind is
/// not synced into the trace: that is the price the unsafe patterns defer.
pub(super) fn cost(opts: &CrashOptions, kind: FsKind, pattern: Pattern) -> Result<CrashCost> {
    let fs = LabFs::create(kind, &opts.lab)?;
    let dir = fs.mountpoint().to_path_buf();
    prepare_copies(pattern, &dir, opts.cost_updates)?;
    fs.syncfs()?;
    let me = std::env::current_exe()?.to_string_lossy().into_owned();
    // Outside the filesystem under test, so writing it is not in the trace's I/O.
    let elapsed = opts
        .lab
        .image_dir
        .join(format!("fsprof-{}-crash-update-ns", std::process::id()));
    let mut t = TraceOptions {
        command: vec![
            me,
            "crash-update".into(),
            pattern.name().into(),
            "--count".into(),
            opts.cost_updates.to_string(),
            "--elapsed-to".into(),
            elapsed.to_string_lossy().into_owned(),
        ],
        ..TraceOptions::default()
    };
    t.on_lab(&fs, FsEventSet::Curated, false)?;
    t.sync_after = None;
    let trace = crate::trace::run(&t)?;
    let updates_ns = std::fs::read_to_string(&elapsed)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let _ = std::fs::remove_file(&elapsed);
    let (Some(0), Some(updates_ns)) = (trace.exit_code, updates_ns) else {
        bail!("{kind} {}: the traced updates failed", pattern.name());
    };
    Ok(CrashCost {
        fs: kind.name().into(),
        mkfs_opts: opts.lab.mkfs_opts.join(" "),
        mount_opts: opts.lab.mount_opts.clone(),
        pattern,
        updates: opts.cost_updates,
        updates_ns,
        trace,
    })
}

/// Sleeps `d`, stopping at once with an error when a signal arrives.
pub(super) fn sleep_checked(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        signals::check()?;
        thread::sleep(Duration::from_millis(50).min(end - Instant::now()));
    }
    Ok(())
}

/// Refuses a study that would mix crash methods or names nothing to crash.
pub fn validate(opts: &CrashOptions) -> Result<()> {
    if opts.filesystems.is_empty() || opts.patterns.is_empty() || opts.points.is_empty() {
        bail!("nothing to crash: give at least one filesystem, pattern and crash point");
    }
    if opts.trials == 0 {
        bail!("--trials must be at least 1");
    }
    Ok(())
}
