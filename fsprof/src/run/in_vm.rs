//! `fsprof run --kernel`: the same fsprof binary runs the same suite inside a VM booted
//! with that kernel, on a raw virtio-blk disk; its results file comes back with the VM's
//! facts added.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use super::{Outcome, RunOptions};
use crate::{
    aggregate::pprof::PPROF_EXT,
    results::{self, RunResult, StepRun, VmFacts, VmKernel},
    signals,
    vm::{GuestKernel, VmConfig, guest},
};

/// Options of the host's command line that the guest gets its own values for.
const HOST_ONLY_VALUED: &[&str] = &[
    "--kernel",
    "--vm-cpus",
    "--vm-memory",
    "--vm-accel",
    "--json",
    "--dir",
    "--device",
    "--flames",
    "--timeline",
    "--pprof",
    "--passes",
    "--history",
];
const HOST_ONLY_FLAGS: &[&str] = &["--force", "--no-history"];

/// The `fsprof run` arguments for the guest: the host's, minus what names host paths.
pub fn guest_args(host: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = host.iter();
    while let Some(a) = it.next() {
        let name = a.split('=').next().unwrap_or_default();
        if HOST_ONLY_VALUED.contains(&name) {
            if !a.contains('=') {
                it.next();
            }
        } else if !HOST_ONLY_FLAGS.contains(&a.as_str()) {
            out.push(a.clone());
        }
    }
    out
}

/// Removes the VM's scratch share and disk however the run ends.
struct Scratch {
    share: PathBuf,
    disk: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.share);
        let _ = fs::remove_file(&self.disk);
    }
}

/// One boot: a kernel and the passes it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Round {
    kernel: usize,
    first_pass: u32,
    passes: u32,
}

/// One kernel: a single boot runs every pass. Several: a boot per pass and kernel,
/// interleaved (A B A B), so drift over the run spreads over every kernel alike.
fn rounds(kernels: usize, passes: u32) -> Vec<Round> {
    if kernels == 1 {
        return vec![Round {
            kernel: 0,
            first_pass: 1,
            passes,
        }];
    }
    (1..=passes)
        .flat_map(|p| {
            (0..kernels).map(move |k| Round {
                kernel: k,
                first_pass: p,
                passes: 1,
            })
        })
        .collect()
}

/// Names on the kernel axis: the releases, numbered where one repeats.
fn labels(kernels: &[GuestKernel]) -> Vec<String> {
    kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let same = kernels[..i]
                .iter()
                .filter(|o| o.release == k.release)
                .count();
            if same == 0 {
                k.release.clone()
            } else {
                format!("{}_{}", k.release, same + 1)
            }
        })
        .collect()
}

pub fn run(opts: &RunOptions, kernels: &[GuestKernel], cfg: &VmConfig, args: &[String]) -> Outcome {
    let mut result = None;
    let error = run_into(opts, kernels, cfg, args, &mut result).err();
    Outcome { result, error }
}

/// Checks what a VM run cannot do; returns the results file's stem and the flame graphs'
/// home.
fn preflight(opts: &RunOptions) -> Result<(String, std::path::PathBuf)> {
    check_tools()?;
    if opts.device.is_some() {
        bail!("--device with --kernel: the VM's test disk is a fresh image under --dir");
    }
    let stem = opts
        .results
        .file_stem()
        .context("results file name")?
        .to_string_lossy()
        .into_owned();
    // The CLI's own default beside the results file (`r.flames` for `r.json`), compared
    // as absolute paths: a relative --json is not taken for a --flames elsewhere.
    let flames_home = std::path::absolute(super::flames::default_dir(&opts.results))?;
    if opts.stacks.is_some() && std::path::absolute(&opts.flames_dir)? != flames_home {
        bail!(
            "--flames with --kernel: flame graphs go beside the results file ({})",
            flames_home.display()
        );
    }
    Ok((stem, flames_home))
}

/// What the results say about the VMs.
pub(super) fn vm_facts(kernels: &[GuestKernel], labels: &[String], cfg: &VmConfig) -> VmFacts {
    VmFacts {
        kernels: kernels
            .iter()
            .zip(labels)
            .map(|(k, l)| VmKernel {
                spec: k.spec.clone(),
                release: k.release.clone(),
                label: l.clone(),
                boot_s: Vec::new(),
                hung_boots: 0,
            })
            .collect(),
        accel: cfg.accel.name().into(),
        emulated: cfg.accel == crate::vm::Accel::Tcg,
        cpus: cfg.cpus,
        memory_bytes: cfg.memory_bytes,
        disk: "raw image on virtio-blk".into(),
        disk_cache: guest::DISK_CACHE.into(),
        host_kernel: crate::os::kernel_release(),
    }
}

/// One boot's results file and where it belongs.
struct Guest<'a> {
    json: &'a Path,
    kernel: &'a GuestKernel,
    /// Its index in the run's kernels, and label.
    index: usize,
    label: &'a String,
    first_pass: u32,
    boot: Option<std::time::Duration>,
}

/// What every boot's results merge into: the run's identity and places.
struct Merger<'a> {
    opts: &'a RunOptions,
    flames_home: &'a Path,
    labels: &'a [String],
    started: u64,
    run_id: String,
}

/// Merges what the guest finished (also when it stopped early) into `out` and saves it;
/// returns whether the guest's run was complete with failed cells.
fn absorb(
    m: &Merger,
    guest: &Guest,
    vm: &mut VmFacts,
    out: &mut Option<RunResult>,
) -> Result<bool> {
    let (opts, flames_home, labels) = (m.opts, m.flames_home, m.labels);
    let (guest_json, kernel, label) = (guest.json, guest.kernel, guest.label);
    let axis = labels.len() > 1;
    let mut cells_failed = false;
    if guest_json.exists() {
        let mut part = RunResult::load(guest_json)?;
        cells_failed = part.complete && !part.failures().is_empty();
        let mut columns = std::mem::take(&mut part.filesystems);
        for f in &mut columns {
            f.kernel = axis.then(|| label.clone());
            for p in &mut f.passes {
                p.pass += guest.first_pass - 1;
                for s in &mut p.steps {
                    let pprof = opts.pprof_dir.as_ref().map(|d| d.join(label));
                    let flames = flames_home.join("passes").join(label);
                    keep_pass_flames(s, &flames, pprof.as_deref(), &f.fs, p.pass)?;
                    if let Some(dir) = &opts.timeline_dir {
                        keep_timeline(s, &dir.join(label), &f.fs, p.pass)?;
                    }
                }
            }
        }
        let merged = out.get_or_insert_with(|| RunResult {
            kernel: if axis {
                labels.join(", ")
            } else {
                kernel.release.clone()
            },
            passes: opts.passes,
            started: m.started,
            run_id: m.run_id.clone(),
            host: crate::os::hostname(),
            label: opts.label.clone(),
            ..part.clone()
        });
        merge(merged, columns);
        if let Some(why) = part.interrupted {
            merged.interrupted = Some(why);
        }
        if let Some(b) = guest.boot {
            vm.kernels[guest.index].boot_s.push(b.as_secs_f64());
        }
        merged.vm = Some(vm.clone());
        merged.complete = false;
        merged.save(&opts.results)?;
    }
    Ok(cells_failed)
}

fn run_into(
    opts: &RunOptions,
    kernels: &[GuestKernel],
    cfg: &VmConfig,
    args: &[String],
    out: &mut Option<RunResult>,
) -> Result<()> {
    let (stem, flames_home) = preflight(opts)?;
    let scale = opts.scale.unwrap_or(opts.suite.default_scale);
    let mut ctx = opts.suite.ctx(scale, opts.seed, opts.jobs);
    ctx.src = opts.image_dir.join("sources");
    let size = opts.size.unwrap_or_else(|| opts.suite.image_size(&ctx));
    // The guest's disk, its copy of fsprof and its share go there.
    crate::lab::workdir::WorkDir::secure(&opts.image_dir)?;
    let (share, disk) = guest::scratch_paths(&opts.image_dir);
    let scratch = Scratch { share, disk };
    // Made natively here and shared: under an emulated CPU making a kernel-sized tree
    // would take longer than the steps that use it.
    super::prepare_sources(opts, &ctx)?;
    let _ = fs::remove_dir_all(&flames_home);

    let labels = labels(kernels);
    let mut vm = vm_facts(kernels, &labels, cfg);
    let merger = Merger {
        opts,
        flames_home: &flames_home,
        labels: &labels,
        started: super::unix_now(),
        run_id: crate::os::random_id(),
    };
    for round in rounds(kernels.len(), opts.passes) {
        signals::check()?;
        let kernel = &kernels[round.kernel];
        let label = &labels[round.kernel];
        let guest_json = scratch.share.join(format!("{stem}.json"));
        let mut ran = boot(opts, kernel, cfg, args, &scratch, &stem, size, round.passes);
        if let Err(e) = &ran
            && e.is::<guest::Stalled>()
        {
            // A hung guest is the emulator's fault, not the workload's: its passes run
            // again, once, on a fresh disk and share; what it finished is dropped.
            eprintln!("fsprof: {e} ({label}); booting it again, once");
            vm.kernels[round.kernel].hung_boots += 1;
            ran = boot(opts, kernel, cfg, args, &scratch, &stem, size, round.passes);
        }
        // What the guest finished counts even when it stopped early.
        let guest = Guest {
            json: &guest_json,
            kernel,
            index: round.kernel,
            label,
            first_pass: round.first_pass,
            boot: ran.as_ref().ok().and_then(|r| r.boot),
        };
        let cells_failed = absorb(&merger, &guest, &mut vm, out)?;
        guest_ended(&ran?, &guest_json, label, cells_failed)?;
    }
    let result = out.as_mut().context("no round ran")?;
    result.complete = true;
    result.interrupted = None;
    if opts.stacks.is_some() {
        match super::flames::draw(result, &flames_home, results::dir_of(&opts.results)) {
            Ok(f) => result.flames = f,
            Err(e) => eprintln!("fsprof: warning: flame graphs not drawn: {e:#}"),
        }
    }
    result.save(&opts.results)
}

/// Whether a guest's run ended as a run should: its results file written (then removed,
/// its cells taken) and fsprof's exit status 0, or 1 for cells that failed.
fn guest_ended(
    ran: &guest::GuestRun,
    guest_json: &Path,
    label: &str,
    cells_failed: bool,
) -> Result<()> {
    if !guest_json.exists() {
        bail!(
            "the VM ({label}) ended (status {}) without a results file; its kernel log is above",
            ran.status.map_or("killed".into(), |s| s.to_string())
        );
    }
    fs::remove_file(guest_json)?;
    match ran.status {
        Some(0) => Ok(()),
        // Its run went on past failed cells, which the results show.
        Some(1) if cells_failed => Ok(()),
        Some(s) => bail!("fsprof in the VM ({label}) exited with status {s}"),
        None => bail!("the VM ({label}) was killed"),
    }
}

/// Boots `kernel` once to run `passes` passes of the suite, on a fresh disk image.
#[allow(clippy::too_many_arguments)]
fn boot(
    opts: &RunOptions,
    kernel: &GuestKernel,
    cfg: &VmConfig,
    args: &[String],
    scratch: &Scratch,
    stem: &str,
    size: u64,
    passes: u32,
) -> Result<guest::GuestRun> {
    let _ = fs::remove_dir_all(&scratch.share);
    fs::create_dir_all(&scratch.share)?;
    let _ = fs::remove_file(&scratch.disk);
    fs::File::create(&scratch.disk)
        .and_then(|f| f.set_len(size))
        .with_context(|| format!("creating the VM's disk {}", scratch.disk.display()))?;
    let me = guest::own_copy(&scratch.share)?;
    let share = scratch.share.to_str().context("--dir is not UTF-8")?;
    let mut cmd: Vec<String> = vec![me.to_string_lossy().into_owned(), "run".into()];
    cmd.extend(args.iter().cloned());
    cmd.extend([
        // The host records the run, once, with every boot's passes.
        "--no-history".into(),
        "--no-cell-graphs".into(),
        "--passes".into(),
        passes.to_string(),
        "--device".into(),
        guest::GUEST_DISK.into(),
        "--dir".into(),
        opts.image_dir.to_string_lossy().into_owned(),
        "--json".into(),
        format!("{share}/{stem}.json"),
    ]);
    if opts.timeline_dir.is_some() {
        cmd.extend(["--timeline".into(), format!("{share}/{GUEST_TIMELINES}")]);
    }
    if opts.pprof_dir.is_some() {
        cmd.extend(["--pprof".into(), format!("{share}/{GUEST_PPROF}")]);
    }
    // The guest's summary is the host's to print; its progress (stderr) shows live.
    let script = format!(
        "{} > guest-stdout.txt",
        shlex::try_join(cmd.iter().map(String::as_str))?
    );
    eprintln!(
        "fsprof: booting {} ({}) in qemu/{} with {} CPUs, {} MiB for {passes} pass{}; test disk {} on virtio-blk, cache={}",
        kernel.spec,
        kernel.release,
        cfg.accel.name(),
        cfg.cpus,
        cfg.memory_bytes >> 20,
        if passes == 1 { "" } else { "es" },
        crate::units::bytes(size),
        guest::DISK_CACHE
    );
    guest::run(
        kernel,
        cfg,
        &[&scratch.share, &opts.image_dir],
        &[&scratch.disk],
        None,
        &script,
    )
}

/// Copies a cell's per-pass stack files out of the VM's share (gone after the boot) to
/// `dir`/pass<N>/<step>/<fs>.<kind>, and its pprof profiles (with --pprof) to
/// `pprof`/<step>/<fs>-pass<N>.<kind> as the host lays them out; points the cell at them.
/// The guest's own names (`<fs>-pass1.<kind>`) number passes per boot, not per run.
fn keep_pass_flames(
    s: &mut StepRun,
    dir: &Path,
    pprof: Option<&Path>,
    fs: &str,
    pass: u32,
) -> Result<()> {
    let to = dir.join(format!("pass{pass}")).join(&s.step);
    for path in s.trace.flames.values_mut() {
        let from = PathBuf::from(&*path);
        let name = from
            .file_name()
            .context("flame file name")?
            .to_string_lossy();
        let kind = name.split_once('.').map_or(&*name, |(_, k)| k);
        let dest = match pprof.filter(|_| kind.ends_with(PPROF_EXT)) {
            Some(p) => p.join(&s.step).join(format!("{fs}-pass{pass}.{kind}")),
            None => to.join(format!("{fs}.{kind}")),
        };
        fs::create_dir_all(dest.parent().context("a file's directory")?)?;
        fs::copy(&from, &dest)
            .with_context(|| format!("keeping {} as {}", from.display(), dest.display()))?;
        *path = dest.display().to_string();
    }
    Ok(())
}

/// Where the guest writes its timelines and pprof profiles, in the VM's share.
const GUEST_TIMELINES: &str = "timeline";
const GUEST_PPROF: &str = "pprof";

/// Copies a cell's timeline out of the VM's share to `dir`/<step>/<fs>-pass<N>.perfetto-trace
/// (`dir` is the kernel's under --timeline: the host's layout with the kernel above it) and
/// points the cell at it.
fn keep_timeline(s: &mut StepRun, dir: &Path, fs: &str, pass: u32) -> Result<()> {
    let Some(t) = s.trace.timeline.as_mut() else {
        return Ok(());
    };
    let to = dir.join(&s.step);
    fs::create_dir_all(&to)?;
    let dest = to.join(format!("{fs}-pass{pass}.{}", crate::trace::TIMELINE_EXT));
    fs::copy(&t.path, &dest)
        .with_context(|| format!("keeping {} as {}", t.path, dest.display()))?;
    t.path = dest.display().to_string();
    Ok(())
}

/// Adds a boot's filesystems to the run: passes of a column already there join it; a new
/// column goes after the last of its filesystem, so kernels of one filesystem sit together.
fn merge(into: &mut RunResult, columns: Vec<crate::results::FsRun>) {
    for f in columns {
        if let Some(have) = into
            .filesystems
            .iter_mut()
            .find(|h| h.fs == f.fs && h.kernel == f.kernel)
        {
            have.passes.extend(f.passes);
        } else if let Some(i) = into.filesystems.iter().rposition(|h| h.fs == f.fs) {
            into.filesystems.insert(i + 1, f);
        } else {
            into.filesystems.push(f);
        }
    }
}

fn check_tools() -> Result<()> {
    if !Path::new("/usr/bin/qemu-system-x86_64").exists() {
        bail!(
            "qemu-system-x86_64 not found; `cargo xtask setup` installs it (apt-get install qemu-system-x86)"
        );
    }
    let has_vng = std::process::Command::new("python3")
        .args(["-c", "import virtme_ng"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_vng {
        bail!(
            "virtme-ng not found; `cargo xtask setup` installs it (python3 -m pip install virtme-ng)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_args_drop_host_paths_and_vm_options() {
        let host: Vec<String> = [
            "--fs",
            "jfs",
            "--kernel",
            "deb:linux-image-amd64",
            "--json=r.json",
            "--dir",
            "/var/tmp/x",
            "--passes",
            "2",
            "--seed",
            "3",
            "--vm-cpus",
            "2",
            "--force",
            "--only",
            "extract-tree",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            guest_args(&host),
            ["--fs", "jfs", "--seed", "3", "--only", "extract-tree"]
        );
    }

    #[test]
    fn several_kernels_alternate_pass_by_pass() {
        let r = |kernel, first_pass, passes| Round {
            kernel,
            first_pass,
            passes,
        };
        assert_eq!(rounds(1, 3), [r(0, 1, 3)]);
        assert_eq!(
            rounds(2, 2),
            [r(0, 1, 1), r(1, 1, 1), r(0, 2, 1), r(1, 2, 1)]
        );
    }

    #[test]
    fn merged_columns_group_by_filesystem_and_repeated_releases_get_numbers() {
        let k = |release: &str| GuestKernel {
            spec: "deb:x".into(),
            release: release.into(),
            vmlinuz: PathBuf::new(),
            modules: PathBuf::new(),
        };
        assert_eq!(
            labels(&[k("6.1"), k("6.12"), k("6.1")]),
            ["6.1", "6.12", "6.1_2"]
        );
        let col = |fs: &str, kernel: &str, pass| crate::results::FsRun {
            fs: fs.into(),
            kernel: Some(kernel.into()),
            passes: vec![crate::results::PassRun {
                pass,
                ..Default::default()
            }],
            ..Default::default()
        };
        let part = |kernel, pass| vec![col("jfs", kernel, pass), col("ext4", kernel, pass)];
        let mut all = RunResult::default();
        for (kernel, pass) in [("a", 1), ("b", 1), ("a", 2), ("b", 2)] {
            merge(&mut all, part(kernel, pass));
        }
        let cols: Vec<(String, Vec<u32>)> = all
            .filesystems
            .iter()
            .map(|f| (f.column(), f.passes.iter().map(|p| p.pass).collect()))
            .collect();
        assert_eq!(
            cols,
            [
                ("jfs@a".to_string(), vec![1, 2]),
                ("jfs@b".to_string(), vec![1, 2]),
                ("ext4@a".to_string(), vec![1, 2]),
                ("ext4@b".to_string(), vec![1, 2]),
            ]
        );
    }
}
