//! `fsprof crash --kernel`: the crash study in a VM, for every filesystem its kernel has,
//! crashed by a real power cut: qemu is killed while the guest waits, its memory lost,
//! its disks keeping what they acknowledged. Every pattern of a trial has a virtio-blk disk
//! of its own; a boot looks at what the last cut left (mount, classify, read-only fsck) and
//! then runs the next trial up to its cut, so N trials take N + 1 boots.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::crash::{CrashOptions, Trial, cost, empty_cell, record, sleep_checked};
use crate::{
    lab::{
        FsKind, LabFs, LabOptions,
        crash::{CrashMethod, commit_interval, fsck, replay},
    },
    results::crash::{CrashCost, CrashPoint, CrashStudy},
    signals,
    vm::{GuestKernel, VmConfig, guest},
    workload::crash::{Outcome, Pattern, classify},
};

/// The VM a study runs in.
#[derive(Clone, Debug)]
pub struct CrashVm {
    pub kernel: GuestKernel,
    pub config: VmConfig,
}

impl CrashVm {
    /// What the study's results say about the VM.
    pub fn facts(&self) -> crate::results::VmFacts {
        let kernel = std::slice::from_ref(&self.kernel);
        let label = std::slice::from_ref(&self.kernel.release);
        super::in_vm::vm_facts(kernel, label, &self.config)
    }
}

/// What one boot of the guest does, in this order; the host writes it to the share.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GuestPlan {
    pub fs: String,
    pub mkfs_opts: Vec<String>,
    pub mount_opts: String,
    /// One per disk, in disk order.
    pub patterns: Vec<Pattern>,
    /// Look at what the last power cut left on the disks.
    pub check: bool,
    /// Trace this many updates of each pattern for its cost (0: none).
    pub cost_updates: u32,
    /// Run a trial on fresh filesystems and ask for the power cut at this point.
    pub crash_at: Option<CrashPoint>,
}

/// Files in the share between host and guest.
const PLAN: &str = "plan.json";
const FOUND: &str = "found.json";
/// The guest creates it before it touches the disks a power cut left.
const LOOKING: &str = "looking";
const COSTS: &str = "costs.json";
const WAITS: &str = "waits.json";
/// The guest creates it when it wants its power cut.
const CUT: &str = "cut";

/// Removes the VM's share and disks however the study ends.
struct Scratch {
    share: PathBuf,
    disks: Vec<PathBuf>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.share);
        for d in &self.disks {
            let _ = fs::remove_file(d);
        }
    }
}

/// What a study in the VM runs on.
struct Lab<'a> {
    opts: &'a CrashOptions,
    vm: &'a CrashVm,
    scratch: Scratch,
}

/// Where the study's results go as trials finish.
struct Sink<'a> {
    out: &'a mut CrashStudy,
    progress: &'a mut dyn FnMut(&str),
    save: &'a mut dyn FnMut(&CrashStudy) -> Result<()>,
}

/// The study in the VM; `progress` and `save` as in `crash::study`.
pub fn study(
    opts: &CrashOptions,
    vm: &CrashVm,
    out: &mut CrashStudy,
    progress: &mut dyn FnMut(&str),
    save: &mut dyn FnMut(&CrashStudy) -> Result<()>,
) -> Result<()> {
    for &kind in &opts.filesystems {
        if !vm.kernel.has_module(kind.kernel_name()) {
            bail!(
                "{kind}: the kernel {} has no {} driver",
                vm.kernel.release,
                kind.kernel_name()
            );
        }
    }
    crate::lab::workdir::WorkDir::secure(&opts.lab.image_dir)?;
    let (share, disk) = guest::scratch_paths(&opts.lab.image_dir);
    let scratch = Scratch {
        disks: (0..opts.patterns.len())
            .map(|i| disk.with_extension(format!("{i}.img")))
            .collect(),
        share,
    };
    let lab = Lab { opts, vm, scratch };
    let mut sink = Sink {
        out,
        progress,
        save,
    };
    for &kind in &opts.filesystems {
        for (i, &point) in opts.points.iter().enumerate() {
            let costs = if i == 0 { opts.cost_updates } else { 0 };
            cell_series(&lab, kind, point, costs, &mut sink)?;
        }
    }
    Ok(())
}

/// The trials of one filesystem and crash point: boot k checks trial k − 1 and runs trial k.
fn cell_series(
    lab: &Lab,
    kind: FsKind,
    point: CrashPoint,
    cost_updates: u32,
    sink: &mut Sink,
) -> Result<()> {
    let opts = lab.opts;
    let first = sink.out.cells.len();
    sink.out.cells.extend(
        opts.patterns
            .iter()
            .map(|&p| empty_cell(opts, kind, CrashMethod::PowerCut, p, point)),
    );
    let mut series = Series {
        kind,
        point,
        first,
        cut: false,
        to_run: opts.trials,
        cost_updates,
        looked: 0,
        hung: false,
        waits: Vec::new(),
    };
    while series.cut || series.to_run > 0 {
        signals::check()?;
        let plan = GuestPlan {
            fs: kind.name().into(),
            mkfs_opts: opts.lab.mkfs_opts.clone(),
            mount_opts: opts.lab.mount_opts.clone(),
            patterns: opts.patterns.clone(),
            check: series.cut,
            cost_updates: series.cost_updates,
            crash_at: (series.to_run > 0).then_some(point),
        };
        let ran = match boot(lab, &plan) {
            // A hung guest is the emulator's fault, not the filesystem's (see
            // `guest::stall_limit`): what it left is taken and the rest runs again, once.
            Err(e) if e.is::<guest::Stalled>() && !series.hung => {
                series.hung = true;
                eprintln!("fsprof: {e}; booting it again, once");
                None
            }
            ran => Some(ran?),
        };
        if let Some(facts) = sink.out.vm.as_mut() {
            let k = &mut facts.kernels[0];
            match ran.as_ref().map(|r| r.boot) {
                Some(Some(b)) => k.boot_s.push(b.as_secs_f64()),
                Some(None) => {}
                None => k.hung_boots += 1,
            }
        }
        series.absorb(lab, &plan, ran.as_ref(), sink)?;
        (sink.save)(sink.out)?;
    }
    Ok(())
}

/// Where the boots of one cell series stand.
struct Series {
    kind: FsKind,
    point: CrashPoint,
    /// The series' first cell in the study.
    first: usize,
    /// A trial was cut on the disks: the next boot looks at what it left.
    cut: bool,
    /// Trials still to run up to their cut.
    to_run: u32,
    /// Updates still to trace for the patterns' costs (0 once traced).
    cost_updates: u32,
    /// Trials looked at so far.
    looked: u32,
    /// A boot hung (and was booted again).
    hung: bool,
    /// From the last trial: how long each pattern's update waited for its cut.
    waits: Vec<Duration>,
}

impl Series {
    /// What a boot left in the share; `ran` is `None` when the guest hung, and then only
    /// what it finished counts. A hung guest that had begun to look at a cut trial may have
    /// replayed its logs: that trial is lost and one more is run in its place.
    fn absorb(
        &mut self,
        lab: &Lab,
        plan: &GuestPlan,
        ran: Option<&guest::GuestRun>,
        sink: &mut Sink,
    ) -> Result<()> {
        let share = &lab.scratch.share;
        let trials = lab.opts.trials;
        if plan.check {
            match read_json_if::<Vec<Trial>>(&share.join(FOUND), ran.is_none())? {
                Some(found) => {
                    self.looked += 1;
                    self.cut = false;
                    let label = format!(
                        "{} trial {}/{trials} (power cut)",
                        self.point.name(),
                        self.looked
                    );
                    let (kind, patterns) = (self.kind, &lab.opts.patterns);
                    sink.record(self.first, found, &self.waits, &|j| {
                        format!("{kind} {} {label}", patterns[j].name())
                    });
                }
                None if share.join(LOOKING).exists() => {
                    eprintln!("fsprof: the trial it was looking at is lost; one more is run");
                    self.cut = false;
                    self.to_run += 1;
                }
                None => {}
            }
        }
        if plan.cost_updates > 0
            && let Some(costs) = read_json_if::<Vec<CrashCost>>(&share.join(COSTS), ran.is_none())?
        {
            sink.out.costs.extend(costs);
            self.cost_updates = 0;
        }
        let Some(ran) = ran else {
            return Ok(());
        };
        if plan.crash_at.is_some() {
            if !ran.power_cut {
                bail!(
                    "the VM ended (status {}) before asking for its power cut; its kernel log is above",
                    ran.status.map_or("killed".into(), |s| s.to_string())
                );
            }
            self.waits = read_json(&share.join(WAITS))?;
            self.cut = true;
            self.to_run -= 1;
        } else if ran.status != Some(0) {
            bail!("fsprof in the VM exited with status {:?}", ran.status);
        }
        Ok(())
    }
}

impl Sink<'_> {
    /// A boot's findings, one per pattern, into the cells from `first` on, with the waits
    /// the boot before measured.
    fn record(
        &mut self,
        first: usize,
        found: Vec<Trial>,
        waits: &[Duration],
        name: &dyn Fn(usize) -> String,
    ) {
        let cells = self.out.cells[first..].iter_mut();
        for (j, ((cell, mut t), wait)) in cells.zip(found).zip(waits).enumerate() {
            t.wait = *wait;
            (self.progress)(&format!("{}: {}", name(j), t.outcome.name()));
            record(cell, &t);
        }
    }
}

/// One boot with a fresh share (the plan in it) and the disks as the last one left them.
fn boot(lab: &Lab, plan: &GuestPlan) -> Result<guest::GuestRun> {
    let (opts, vm, scratch) = (lab.opts, lab.vm, &lab.scratch);
    let _ = fs::remove_dir_all(&scratch.share);
    fs::create_dir_all(&scratch.share)?;
    fs::write(scratch.share.join(PLAN), serde_json::to_string(plan)?)?;
    for d in &scratch.disks {
        if !d.exists() {
            fs::File::create(d)
                .and_then(|f| f.set_len(opts.lab.size))
                .with_context(|| format!("creating the VM's disk {}", d.display()))?;
        }
    }
    let me = guest::own_copy(&scratch.share)?;
    let script = format!(
        "{} crash-guest --plan {PLAN}",
        shlex::try_quote(&me.to_string_lossy())?
    );
    eprintln!(
        "fsprof: booting {} ({}) in qemu/{}: {}{}{}",
        vm.kernel.spec,
        vm.kernel.release,
        vm.config.accel.name(),
        if plan.check {
            "look at the last power cut; "
        } else {
            ""
        },
        if plan.cost_updates > 0 {
            "trace the costs; "
        } else {
            ""
        },
        plan.crash_at.map_or("no new trial".into(), |p| format!(
            "a trial, power cut {}",
            p.name()
        ))
    );
    let disks: Vec<&Path> = scratch.disks.iter().map(PathBuf::as_path).collect();
    guest::run(
        &vm.kernel,
        &vm.config,
        &[&scratch.share],
        &disks,
        Some(&scratch.share.join(CUT)),
        &script,
    )
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = fs::read(path).with_context(|| format!("the VM wrote no {}", path.display()))?;
    Ok(serde_json::from_slice(&text)?)
}

/// `read_json`, where a file a hung guest never wrote is `None` (`hung`) rather than an
/// error.
fn read_json_if<T: serde::de::DeserializeOwned>(path: &Path, hung: bool) -> Result<Option<T>> {
    if hung && !path.exists() {
        return Ok(None);
    }
    read_json(path).map(Some)
}

/// In the guest (`fsprof crash-guest`): does what the plan in the current directory says.
/// With a trial, it does not return: it waits for the host to cut its power.
pub fn guest_boot(plan_path: &Path) -> Result<()> {
    let share = std::env::current_dir()?;
    let plan: GuestPlan = read_json(plan_path)?;
    let kind = FsKind::parse(&plan.fs)?;
    let disks: Vec<PathBuf> = (0..plan.patterns.len())
        .map(|i| PathBuf::from(guest::guest_disk(i)))
        .collect();
    if plan.check {
        fs::write(share.join(LOOKING), "")?;
        let found: Vec<Trial> = plan
            .patterns
            .iter()
            .zip(&disks)
            .map(|(&p, d)| look(kind, p, d, &plan.mount_opts))
            .collect::<Result<_>>()?;
        crate::os::write_atomic(&share.join(FOUND), &serde_json::to_string(&found)?)?;
    }
    if plan.cost_updates > 0 {
        let opts = CrashOptions {
            lab: guest_lab(&plan, &share, &disks[0]),
            cost_updates: plan.cost_updates,
            ..CrashOptions::default()
        };
        let costs: Vec<CrashCost> = plan
            .patterns
            .iter()
            .map(|&p| cost(&opts, kind, p))
            .collect::<Result<_>>()?;
        crate::os::write_atomic(&share.join(COSTS), &serde_json::to_string(&costs)?)?;
    }
    match plan.crash_at {
        Some(point) => run_to_the_cut(&plan, kind, &disks, &share, point),
        None => Ok(()),
    }
}

/// A lab filesystem on the guest's `disk`, made and mounted as the plan says.
fn guest_lab(plan: &GuestPlan, share: &Path, disk: &Path) -> LabOptions {
    LabOptions {
        image_dir: share.to_path_buf(),
        mkfs_opts: plan.mkfs_opts.clone(),
        mount_opts: plan.mount_opts.clone(),
        device: Some(disk.to_path_buf()),
        ..LabOptions::default()
    }
}

/// One trial up to its crash point, on a fresh filesystem per disk; then it asks for the
/// power cut and waits for it (an error is the only way back).
fn run_to_the_cut(
    plan: &GuestPlan,
    kind: FsKind,
    disks: &[PathBuf],
    share: &Path,
    point: CrashPoint,
) -> Result<()> {
    let mut slots = Vec::new();
    for (&p, d) in plan.patterns.iter().zip(disks) {
        let fs = LabFs::create(kind, &guest_lab(plan, share, d))?;
        p.prepare(fs.mountpoint())?;
        fs.syncfs()?;
        slots.push((p, fs));
    }
    let mut updated = Vec::new();
    for (p, fs) in &slots {
        p.update(fs.mountpoint())?;
        updated.push(Instant::now());
    }
    if point == CrashPoint::AfterCommit {
        sleep_checked(commit_interval(kind, &plan.mount_opts) + Duration::from_secs(1))?;
    }
    let waits: Vec<Duration> = updated.iter().map(Instant::elapsed).collect();
    crate::os::write_atomic(&share.join(WAITS), &serde_json::to_string(&waits)?)?;
    // The filesystems stay mounted, their caches unwritten: the power goes while they are.
    std::mem::forget(slots);
    fs::write(share.join(CUT), "")?;
    eprintln!("fsprof: waiting for the power cut");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// What the last power cut left on `disk`: the log replay (the mount's, or fsck's where the
/// kernel does not replay it), what the application finds, the read-only fsck. A
/// filesystem that no longer mounts is an error outcome, its fsck still run.
fn look(kind: FsKind, pattern: Pattern, disk: &Path, mount_opts: &str) -> Result<Trial> {
    let mounted =
        replay(kind, disk).and_then(|r| Ok((r, LabFs::existing(kind, disk, mount_opts)?)));
    match mounted {
        Ok((replayed, mut fs)) => {
            let (outcome, error) = classify(pattern, fs.mountpoint());
            if let Some(c) = &replayed.complaint {
                eprintln!("fsprof: {kind} log replay on {}: {c}", disk.display());
            }
            Ok(Trial {
                outcome,
                wait: Duration::ZERO,
                recovery: Some(replayed.took + fs.mount_time),
                fsck: fs.checked()?,
                error,
                recovery_complaint: replayed.complaint,
            })
        }
        Err(e) => {
            let error = format!("{kind} does not mount after the cut: {e:#}");
            eprintln!("fsprof: {error} ({})", disk.display());
            Ok(Trial {
                outcome: Outcome::Error,
                wait: Duration::ZERO,
                recovery: None,
                fsck: fsck(kind, disk)?,
                error: Some(error),
                recovery_complaint: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::{Accel, GuestKernel};

    fn trial(outcome: Outcome) -> Trial {
        Trial {
            outcome,
            wait: Duration::ZERO,
            recovery: None,
            fsck: None,
            error: None,
            recovery_complaint: None,
        }
    }

    /// A series with trial 1 of 2 looked at and trial 2 cut, after a boot that hung.
    fn cut_series() -> Series {
        Series {
            kind: FsKind::Btrfs,
            point: CrashPoint::Now,
            first: 0,
            cut: true,
            to_run: 0,
            cost_updates: 0,
            looked: 1,
            hung: true,
            waits: vec![Duration::from_millis(3); 2],
        }
    }

    /// What a boot that hung while it looked at a cut trial leaves, by how far it got; and
    /// a boot that ended without hanging must have written what it was asked for.
    #[test]
    fn a_hung_boot_keeps_what_it_finished_and_loses_what_it_touched() {
        let share = std::env::temp_dir().join(format!("fsprof-series-{}", std::process::id()));
        fs::create_dir_all(&share).unwrap();
        let opts = CrashOptions {
            patterns: vec![Pattern::RenameFsyncDir, Pattern::RenameNoFsync],
            trials: 2,
            ..Default::default()
        };
        let vm = CrashVm {
            kernel: GuestKernel {
                spec: "deb:linux-image-amd64".into(),
                release: "6.1.0-57-amd64".into(),
                vmlinuz: PathBuf::new(),
                modules: PathBuf::new(),
            },
            config: VmConfig {
                cpus: 2,
                memory_bytes: 1 << 30,
                accel: Accel::Tcg,
            },
        };
        let scratch = Scratch {
            share: share.clone(),
            disks: Vec::new(),
        };
        let lab = Lab {
            opts: &opts,
            vm: &vm,
            scratch,
        };
        let cells = opts
            .patterns
            .iter()
            .map(|&p| {
                empty_cell(
                    &opts,
                    FsKind::Btrfs,
                    CrashMethod::PowerCut,
                    p,
                    CrashPoint::Now,
                )
            })
            .collect();
        let mut out = CrashStudy {
            cells,
            ..CrashStudy::default()
        };
        let (mut progress, mut save) = (|_: &str| {}, |_: &CrashStudy| Ok(()));
        let mut sink = Sink {
            out: &mut out,
            progress: &mut progress,
            save: &mut save,
        };
        let plan = GuestPlan {
            fs: "btrfs".into(),
            mkfs_opts: Vec::new(),
            mount_opts: String::new(),
            patterns: opts.patterns.clone(),
            check: true,
            cost_updates: 0,
            crash_at: None,
        };
        let state = |s: &Series| (s.cut, s.to_run, s.looked);

        // Hung before it touched the disks: the next boot looks at the same cut.
        let mut s = cut_series();
        s.absorb(&lab, &plan, None, &mut sink).unwrap();
        assert_eq!(state(&s), (true, 0, 1));

        // Hung while it looked (its logs may be replayed): the trial is lost, one more runs.
        fs::write(share.join(LOOKING), "").unwrap();
        let mut s = cut_series();
        s.absorb(&lab, &plan, None, &mut sink).unwrap();
        assert_eq!(state(&s), (false, 1, 1));
        assert!(sink.out.cells.iter().all(|c| c.outcomes.is_empty()));

        // Hung after it looked: what it found counts.
        let found = [trial(Outcome::New), trial(Outcome::Old)];
        fs::write(share.join(FOUND), serde_json::to_string(&found).unwrap()).unwrap();
        let mut s = cut_series();
        s.absorb(&lab, &plan, None, &mut sink).unwrap();
        assert_eq!(state(&s), (false, 0, 2));
        let counts: Vec<_> = sink.out.cells.iter().map(|c| c.outcomes.clone()).collect();
        assert_eq!(counts[0], [(Outcome::New, 1)].into());
        assert_eq!(counts[1], [(Outcome::Old, 1)].into());
        assert_eq!(sink.out.cells[0].wait_ns, 3_000_000);

        // Ended, not hung, without what it was asked to write: an error.
        fs::remove_file(share.join(FOUND)).unwrap();
        let ended = guest::GuestRun {
            status: Some(0),
            boot: None,
            wall: Duration::ZERO,
            power_cut: false,
        };
        let err = cut_series().absorb(&lab, &plan, Some(&ended), &mut sink);
        assert!(format!("{:#}", err.unwrap_err()).contains("wrote no"));
    }
}
