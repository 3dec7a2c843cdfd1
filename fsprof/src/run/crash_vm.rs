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
    fs::create_dir_all(&opts.lab.image_dir)?;
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
    let mut waits: Vec<Duration> = Vec::new();
    for trial in 0..=opts.trials {
        signals::check()?;
        let plan = GuestPlan {
            fs: kind.name().into(),
            mkfs_opts: opts.lab.mkfs_opts.clone(),
            mount_opts: opts.lab.mount_opts.clone(),
            patterns: opts.patterns.clone(),
            check: trial > 0,
            cost_updates: if trial == 0 { cost_updates } else { 0 },
            crash_at: (trial < opts.trials).then_some(point),
        };
        let share = &lab.scratch.share;
        let ran = boot(lab, &plan)?;
        if let (Some(b), Some(facts)) = (ran.boot, sink.out.vm.as_mut()) {
            facts.kernels[0].boot_s.push(b.as_secs_f64());
        }
        if plan.check {
            let found: Vec<Trial> = read_json(&share.join(FOUND))?;
            let label = format!("{} trial {trial}/{} (power cut)", point.name(), opts.trials);
            sink.record(first, found, &waits, &|j| {
                format!("{kind} {} {label}", opts.patterns[j].name())
            });
        }
        if plan.cost_updates > 0 {
            let costs: Vec<CrashCost> = read_json(&share.join(COSTS))?;
            sink.out.costs.extend(costs);
        }
        if plan.crash_at.is_some() {
            if !ran.power_cut {
                bail!(
                    "the VM ended (status {}) before asking for its power cut; its kernel log is above",
                    ran.status.map_or("killed".into(), |s| s.to_string())
                );
            }
            waits = read_json(&share.join(WAITS))?;
        } else if ran.status != Some(0) {
            bail!("fsprof in the VM exited with status {:?}", ran.status);
        }
        (sink.save)(sink.out)?;
    }
    Ok(())
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
