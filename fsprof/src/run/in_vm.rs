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
    results::{self, RunResult, VmFacts},
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
];
const HOST_ONLY_FLAGS: &[&str] = &["--force"];

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

pub fn run(opts: &RunOptions, kernel: &GuestKernel, cfg: &VmConfig, args: &[String]) -> Outcome {
    let mut result = None;
    let error = run_into(opts, kernel, cfg, args, &mut result).err();
    Outcome { result, error }
}

fn run_into(
    opts: &RunOptions,
    kernel: &GuestKernel,
    cfg: &VmConfig,
    args: &[String],
    out: &mut Option<RunResult>,
) -> Result<()> {
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
    let flames_home = results::dir_of(&opts.results).join(format!("{stem}.flames"));
    if opts.stacks.is_some() && opts.flames_dir != flames_home {
        bail!(
            "--flames with --kernel: flame graphs go beside the results file ({})",
            flames_home.display()
        );
    }
    let scale = opts.scale.unwrap_or(opts.suite.default_scale);
    let mut ctx = opts.suite.ctx(scale, opts.seed, opts.jobs);
    ctx.src = opts.image_dir.join("sources");
    let size = opts.size.unwrap_or_else(|| opts.suite.image_size(&ctx));
    fs::create_dir_all(&opts.image_dir)
        .with_context(|| format!("creating {}", opts.image_dir.display()))?;
    let (share, disk) = guest::scratch_paths(&opts.image_dir);
    let scratch = Scratch { share, disk };
    fs::create_dir_all(&scratch.share)?;
    // Made natively here and shared: under an emulated CPU making a kernel-sized tree
    // would take longer than the steps that use it.
    super::prepare_sources(opts, &ctx)?;
    fs::File::create(&scratch.disk)
        .and_then(|f| f.set_len(size))
        .with_context(|| format!("creating the VM's disk {}", scratch.disk.display()))?;

    let me = std::env::current_exe().context("locating the fsprof binary")?;
    let share = scratch.share.to_str().context("--dir is not UTF-8")?;
    let mut cmd: Vec<String> = vec![me.to_string_lossy().into_owned(), "run".into()];
    cmd.extend(args.iter().cloned());
    cmd.extend([
        "--device".into(),
        guest::GUEST_DISK.into(),
        "--dir".into(),
        opts.image_dir.to_string_lossy().into_owned(),
        "--json".into(),
        format!("{share}/{stem}.json"),
    ]);
    // The guest's summary is the host's to print; its progress (stderr) shows live.
    let script = format!(
        "{} > guest-stdout.txt",
        shlex::try_join(cmd.iter().map(String::as_str))?
    );
    eprintln!(
        "fsprof: booting {} ({}) in qemu/{} with {} CPUs, {} MiB; test disk {} on virtio-blk, cache={}",
        kernel.spec,
        kernel.release,
        cfg.accel.name(),
        cfg.cpus,
        cfg.memory_bytes >> 20,
        crate::units::bytes(size),
        guest::DISK_CACHE
    );
    let ran = guest::run(
        kernel,
        cfg,
        &[&scratch.share, &opts.image_dir],
        Some(&scratch.disk),
        &script,
    )?;
    let guest_json = scratch.share.join(format!("{stem}.json"));
    if !guest_json.exists() {
        bail!(
            "the VM ended (status {}) without a results file; its kernel log is above",
            ran.status.map_or("killed".into(), |s| s.to_string())
        );
    }
    let mut result = RunResult::load(&guest_json)?;
    result.vm = Some(VmFacts {
        kernel_spec: kernel.spec.clone(),
        accel: cfg.accel.name().into(),
        emulated: cfg.accel == crate::vm::Accel::Tcg,
        cpus: cfg.cpus,
        memory_bytes: cfg.memory_bytes,
        disk: "raw image on virtio-blk".into(),
        disk_cache: guest::DISK_CACHE.into(),
        boot_s: ran.boot.map(|d| d.as_secs_f64()),
        host_kernel: crate::os::kernel_release(),
    });
    let guest_flames = scratch.share.join(format!("{stem}.flames"));
    if guest_flames.is_dir() {
        let _ = fs::remove_dir_all(&flames_home);
        copy_dir(&guest_flames, &flames_home)?;
    }
    result.save(&opts.results)?;
    let status = ran.status;
    *out = Some(result);
    match status {
        Some(0) => Ok(()),
        Some(s) => bail!("fsprof in the VM exited with status {s}"),
        None => bail!("the VM was killed"),
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

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)?.flatten() {
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dest)?;
        } else {
            fs::copy(e.path(), &dest)?;
        }
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
            ["--fs", "jfs", "--passes", "2", "--only", "extract-tree"]
        );
    }
}
