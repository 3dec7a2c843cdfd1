//! Boots a kernel in qemu through virtme-ng and runs one shell script in it: the host's root
//! is the guest's (read-only), `share` is writable from both sides, the test disk is
//! /dev/vda. Ctrl-C or SIGTERM stops the VM.

use std::{
    io::{Read, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result, bail};

use super::GuestKernel;
use crate::signals;

/// How qemu runs the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// Software emulation: works everywhere, times are only comparable within TCG.
    Tcg,
    /// Hardware virtualization (/dev/kvm).
    Kvm,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Accel::Tcg => "tcg",
            Accel::Kvm => "kvm",
        }
    }
}

#[derive(Clone, Debug)]
pub struct VmConfig {
    pub cpus: u32,
    pub memory_bytes: u64,
    pub accel: Accel,
}

/// The test disk's qemu drive options: virtio-blk, host page cache off so the guest's I/O
/// reaches the disk.
pub const DISK_CACHE: &str = "none";
/// The guest's name for the test disk.
pub const GUEST_DISK: &str = "/dev/vda";

/// The guest's name for the `i`th disk given to `run` (virtio-blk, in command-line order).
pub fn guest_disk(i: usize) -> String {
    format!("/dev/vd{}", (b'a' + i as u8) as char)
}

pub struct GuestRun {
    pub status: Option<i32>,
    /// From starting qemu to the first line of the script (the boot).
    pub boot: Option<Duration>,
    pub wall: Duration,
    /// The guest asked for its power to be cut and was killed.
    pub power_cut: bool,
}

/// A guest that prints nothing for this long is taken as hung and stopped: a Debian 6.1
/// guest under TCG has been seen to stop whole after a cell (both vCPUs spinning, no
/// output, no file written), rarely (under qemu 10 too: 1 boot in ~70 of the crash test;
/// docs/design.md); `run` and `crash` boot it again once. fsprof in the guest prints a line per step, and a NUL
/// byte every `HEARTBEAT` while it runs (the relay drops NULs), so a step may be silent for
/// hours while a hung guest is stopped within minutes. `FSPROF_VM_STALL_SECONDS` sets
/// another limit.
fn stall_limit() -> Duration {
    std::env::var("FSPROF_VM_STALL_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(5 * 60), Duration::from_secs)
}

/// Set in the guest's environment: fsprof there writes a NUL byte to stderr this often.
const HEARTBEAT_ENV: &str = "FSPROF_HEARTBEAT_SECONDS";
const HEARTBEAT: Duration = Duration::from_secs(20);

/// In a guest (`HEARTBEAT_ENV` set), a thread that shows the host this fsprof is alive.
/// Only the fsprof the guest started has it: the variable goes before any child is made,
/// so no process fsprof traces (a built-in step is `fsprof workload`) carries a thread of
/// fsprof's asleep for the whole step (every VM cell showed ~50 % sleep before).
pub fn heartbeat_if_asked() {
    let Some(every) = std::env::var(HEARTBEAT_ENV)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return;
    };
    // SAFETY: called first in main, before fsprof starts any thread.
    unsafe { std::env::remove_var(HEARTBEAT_ENV) };
    thread::spawn(move || {
        loop {
            thread::sleep(Duration::from_secs(every.max(1)));
            let _ = std::io::stderr().write_all(b"\0");
        }
    });
}

/// The guest printed nothing for this long and was stopped.
#[derive(Debug)]
pub struct Stalled(Duration);

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the VM printed nothing for {} s and was stopped as hung",
            self.0.as_secs()
        )
    }
}

impl std::error::Error for Stalled {}

/// Where the script's start is stamped, to measure the boot.
const STARTED: &str = ".fsprof-guest-started";

/// Says once per process when qemu's emulator is one that hangs guests: qemu 7.2's TCG
/// stopped a Debian 6.1 guest whole when its kernel patched a static key in code another
/// vCPU was running (both vCPUs between the int3 and the patched site in bpf_trace_run2; 2
/// of 2 boots), which attaching probes does; qemu 10.0.2 did not (0 of 3 boots).
fn warn_of_old_qemu(accel: Accel) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if accel != Accel::Tcg {
        return;
    }
    ONCE.call_once(|| {
        if let Some((major, minor)) = qemu_version().filter(|(major, _)| *major < 10) {
            eprintln!(
                "fsprof: warning: qemu {major}.{minor}'s emulator hangs 6.1 guests now and then                  (their kernel patching code another vCPU runs); qemu 10 does not:                  `cargo xtask setup` installs it from bookworm-backports"
            );
        }
    });
}

/// qemu's version, from "QEMU emulator version 7.2.22 (…)".
fn qemu_version() -> Option<(u32, u32)> {
    let out = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()?;
    parse_qemu_version(&String::from_utf8_lossy(&out.stdout))
}

fn parse_qemu_version(text: &str) -> Option<(u32, u32)> {
    let version = text.split_whitespace().nth(3)?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// A copy of this fsprof in `share` for the guest to run. The guest would read the host's
/// file through 9p page by page, and a guest workload died of SIGSEGV in the minute cargo
/// relinked it. /proc/self/exe is the file this process started from.
pub fn own_copy(share: &Path) -> Result<PathBuf> {
    let to = share.join("fsprof");
    std::fs::copy("/proc/self/exe", &to)
        .with_context(|| format!("copying fsprof into the VM's share {}", share.display()))?;
    Ok(to)
}

/// Runs `script` (sh) in a VM with `kernel`; its cwd is the first of `shares` (host
/// directories the guest may write); `disks` are its virtio-blk disks (`guest_disk`). When
/// the file `power_cut` appears, the VM is killed at once (SIGKILL to qemu): the guest's
/// memory is lost, and what its disks acknowledged (cache=none: written by the host,
/// which does not crash) stays.
pub fn run(
    kernel: &GuestKernel,
    cfg: &VmConfig,
    shares: &[&Path],
    disks: &[&Path],
    power_cut: Option<&Path>,
    script: &str,
) -> Result<GuestRun> {
    signals::install();
    warn_of_old_qemu(cfg.accel);
    let share = shares.first().context("no share")?;
    let stamp = share.join(STARTED);
    let _ = std::fs::remove_file(&stamp);
    let share_s = share.to_str().context("share path is not UTF-8")?;
    let full = format!(
        "cd {q} && : > {STARTED} && export {HEARTBEAT_ENV}={} && {script}",
        HEARTBEAT.as_secs(),
        q = shlex::try_quote(share_s)?
    );
    let mut cmd = vng_command(kernel, cfg, shares, disks, &full)?;
    if let Some(cut) = power_cut {
        let _ = std::fs::remove_file(cut);
    }
    let started = Instant::now();
    let t0 = SystemTime::now();
    // Both through pipes: vng reopens /dev/stderr, which would truncate a log file our
    // stderr was redirected to.
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting virtme-ng (vng); `cargo xtask setup` installs it")?;
    // Milliseconds from `started` to the VM's last output.
    let last = Arc::new(AtomicU64::new(0));
    let out = child
        .stdout
        .take()
        .map(|o| relay_in_thread(o, &last, started));
    let err = child
        .stderr
        .take()
        .map(|e| relay_in_thread(e, &last, started));
    // Under KVM a guest that boots at all starts the script in seconds.
    let boot_limit = (cfg.accel == Accel::Kvm).then_some((KVM_BOOT_LIMIT, stamp.as_path()));
    let status = wait(&mut child, &last, started, boot_limit, power_cut);
    for relay in [out, err].into_iter().flatten() {
        let _ = relay.join();
    }
    let (status, power_cut) = status?;
    let boot = std::fs::metadata(&stamp)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|m| m.duration_since(t0).ok());
    let _ = std::fs::remove_file(&stamp);
    // qemu may also refuse KVM at once (seen here: "failed to set MSR 0x10a"): the VM ends
    // before the script starts, which no later step would explain.
    if boot.is_none() && !power_cut {
        let status = status.map_or("a signal".to_string(), |c| format!("status {c}"));
        match cfg.accel {
            Accel::Kvm => bail!("{}", kvm_no_boot(&format!("(qemu ended with {status})"))),
            Accel::Tcg => bail!("the VM ended with {status} before its script started"),
        }
    }
    Ok(GuestRun {
        status,
        boot,
        wall: started.elapsed(),
        power_cut,
    })
}

/// virtme-ng booting `kernel` to run `script` (see `run`).
fn vng_command(
    kernel: &GuestKernel,
    cfg: &VmConfig,
    shares: &[&Path],
    disks: &[&Path],
    script: &str,
) -> Result<Command> {
    let mut cmd = vng();
    cmd.arg("--run")
        .arg(&kernel.vmlinuz)
        .args(["--cpus", &cfg.cpus.to_string()])
        .args(["--memory", &format!("{}M", cfg.memory_bytes >> 20)])
        .args(shares.iter().map(|d| format!("--rwdir={}", d.display())))
        // The guest loads its own modules (filesystems, virtio-blk) from the host's copy.
        .arg(format!("--rodir=/lib/modules={}", kernel.modules.display()))
        .args(["--exec", script])
        .current_dir("/")
        // Its own group, so stopping it reaches qemu however vng started it.
        .process_group(0);
    if cfg.accel == Accel::Tcg {
        cmd.arg("--disable-kvm");
    }
    for d in disks {
        cmd.arg(format!(
            "--qemu-opts=-drive file={},if=virtio,cache={DISK_CACHE},format=raw",
            d.display()
        ));
    }
    cmd.args(extra_vng_args()?);
    Ok(cmd)
}

/// `FSPROF_VM_VNG_ARGS`: more arguments for virtme-ng, shell-quoted, to look into a guest
/// (`--append nokaslr --qemu-opts='-monitor unix:mon.sock,server,nowait'`: a hung guest's
/// registers, placed with its System.map).
fn extra_vng_args() -> Result<Vec<String>> {
    let Ok(extra) = std::env::var("FSPROF_VM_VNG_ARGS") else {
        return Ok(Vec::new());
    };
    shlex::split(&extra).with_context(|| format!("FSPROF_VM_VNG_ARGS is not shell words: {extra}"))
}

/// `relay` on a thread of its own.
fn relay_in_thread(
    from: impl Read + Send + 'static,
    last: &Arc<AtomicU64>,
    started: Instant,
) -> thread::JoinHandle<()> {
    let last = last.clone();
    thread::spawn(move || relay(from, &last, started))
}

/// The VM's output to our stderr (our stdout is the command's answer), without the NUL
/// bytes the serial console starts with; `last` gets the time of each (see `stall_limit`).
fn relay(mut from: impl Read, last: &AtomicU64, started: Instant) {
    let mut buf = [0u8; 8192];
    let mut err = std::io::stderr();
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        let text: Vec<u8> = buf[..n].iter().copied().filter(|&b| b != 0).collect();
        let _ = err.write_all(&text);
    }
}

/// virtme-ng's entry point through the Python that has it, so a PATH without pip's
/// script directory still finds it.
fn vng() -> Command {
    let mut c = Command::new("python3");
    c.args([
        "-c",
        "import sys; from virtme_ng.run import main; sys.argv[0] = 'vng'; sys.exit(main())",
    ]);
    c
}

/// How long a KVM guest may take to reach the script (a KVM boot takes 1–3 s where KVM
/// works; TCG ~50 s).
const KVM_BOOT_LIMIT: Duration = Duration::from_secs(30);

/// Why a KVM guest did not boot (`how`: within the limit, or qemu ended), and what to do
/// instead.
fn kvm_no_boot(how: &str) -> String {
    let why = if Path::new("/sys/module/kvm_pvm").exists() {
        "this host's KVM is PVM (module kvm_pvm), which boots only PVM-enabled guest kernels"
    } else if !Path::new("/dev/kvm").exists() {
        "this host has no /dev/kvm (no hardware virtualization here)"
    } else {
        "the guest kernel does not boot under this host's KVM"
    };
    format!("the VM did not boot {how} with --vm-accel kvm: {why}; use --vm-accel tcg")
}

/// Waits for the VM; on a signal, when it has printed nothing for `stall_limit`, or when
/// `boot_limit` passed without the script's stamp, stops its whole process group (TERM,
/// then KILL); when `power_cut` appears, kills it at once. Returns its exit status and
/// whether its power was cut.
fn wait(
    child: &mut Child,
    last: &AtomicU64,
    started: Instant,
    boot_limit: Option<(Duration, &Path)>,
    power_cut: Option<&Path>,
) -> Result<(Option<i32>, bool)> {
    let group = rustix::process::Pid::from_raw(child.id() as i32).context("child pid")?;
    let limit = stall_limit();
    let stop = |child: &mut Child| -> Result<()> {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait()?.is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = child.wait();
        Ok(())
    };
    loop {
        if power_cut.is_some_and(Path::exists) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            let _ = child.wait();
            return Ok((None, true));
        }
        if let Some(st) = child.try_wait()? {
            // Nothing of the VM may outlive it (qemu may run under vng's pid or beside it).
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            return Ok((st.code(), false));
        }
        if let Some(sig) = signals::received() {
            stop(child)?;
            bail!("interrupted by signal {sig}; the VM was stopped");
        }
        // Saturating: a relay may stamp `last` after this read of the clock.
        let silent =
            (started.elapsed().as_millis() as u64).saturating_sub(last.load(Ordering::Relaxed));
        if silent > limit.as_millis() as u64 {
            stop(child)?;
            return Err(Stalled(limit).into());
        }
        if let Some((limit, stamp)) = boot_limit
            && started.elapsed() > limit
            && !stamp.exists()
        {
            stop(child)?;
            bail!(
                "{}",
                kvm_no_boot(&format!("within {} s", KVM_BOOT_LIMIT.as_secs()))
            );
        }
        // Often enough that a power cut follows the guest's request within milliseconds.
        thread::sleep(Duration::from_millis(if power_cut.is_some() {
            5
        } else {
            100
        }));
    }
}

/// The share directory and disk image of a VM started by this process, under `dir`; their
/// names carry the pid so `fsprof cleanup` knows them when it dies.
pub fn scratch_paths(dir: &Path) -> (PathBuf, PathBuf) {
    let id = std::process::id();
    (
        dir.join(format!("fsprof-{id}-vm")),
        dir.join(format!("fsprof-{id}-vm.img")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_versions_parse() {
        let debian = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright";
        assert_eq!(parse_qemu_version(debian), Some((7, 2)));
        let backports = "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)";
        assert_eq!(parse_qemu_version(backports), Some((10, 0)));
        assert_eq!(parse_qemu_version("qemu: unknown"), None);
    }
}
