//! Machine set-up. Measured facts behind it: rustup toolchains here have no rust-src and
//! cannot fetch it, so the eBPF crate builds with Debian's rustc-web, which ships a
//! precompiled `core` for bpfel-unknown-none, linked into rustup as `fsprof-bpf`; and
//! bpf-linker must be built against the LLVM that rustc uses.

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::run;

const BPF_TOOLCHAIN: &str = "fsprof-bpf";
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages fsprof, its workloads and its tests use (besides the toolchain).
const TOOLS: &[&str] = &[
    "strace",      // syscall counts to cross-check against
    "gcc",         // the unwinder's test builds a C program without frame pointers
    "binutils",    // objcopy/strip: the same program with its symbols in a debug file
    "time",        // GNU /usr/bin/time, to cross-check wall/user/sys
    "util-linux",  // losetup
    "kmod",        // modprobe for filesystem modules
    "e2fsprogs",   // ext2/3/4
    "xfsprogs",    // xfs
    "btrfs-progs", // btrfs
    "ntfs-3g",     // ntfs over FUSE
    // mkfs tools for filesystems this kernel may lack: `fsprof list` then names the kernel,
    // not a missing package, as the reason.
    "jfsutils",
    "reiserfsprogs",
    "f2fs-tools",
    "nilfs-tools",
    "postgresql", // the pgbench step's server
    "bonnie++",   // an external workload the studies used
    "chromium",   // headless, to test that the HTML report renders
    // `fsprof run --kernel`: qemu boots the guest through virtme-ng, whose initramfs needs
    // busybox and whose guest needs udevd for its script channel (virtio-serial ports).
    "qemu-system-x86",
    "busybox-static",
    "udev",
];
/// virtme-ng from PyPI, pinned: its command line and guest init are what fsprof drives.
const VIRTME_NG: &str = "virtme-ng==1.42";
const TOOLCHAIN: &[&str] = &["rustc-web", "cargo-web", "libstd-rust-web-dev-bpf"];

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn installed(pkg: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        .is_some_and(|s| s.contains("install ok installed"))
}

pub fn apt_install(pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!("missing packages {missing:?} and no apt-get: install their equivalents by hand");
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing))
}

/// LLVM major version of Debian's rustc (bpf-linker must match it).
fn rustc_llvm_major() -> Result<String> {
    let v =
        output(Command::new("/usr/bin/rustc").arg("-vV")).context("running /usr/bin/rustc -vV")?;
    let line = v
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .context("rustc -vV printed no LLVM version")?;
    Ok(line.split('.').next().unwrap_or_default().to_string())
}

fn cargo_bin(name: &str) -> std::path::PathBuf {
    let home = std::env::var("CARGO_HOME")
        .map(Into::into)
        .unwrap_or_else(|_| {
            Path::new(&std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cargo")
        });
    home.join("bin").join(name)
}

fn ensure_bpf_linker(llvm: &str) -> Result<()> {
    let linker = cargo_bin("bpf-linker");
    if output(Command::new(&linker).arg("--version"))
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION))
    {
        return Ok(());
    }
    eprintln!("xtask: building bpf-linker {BPF_LINKER_VERSION} against LLVM {llvm}");
    run(Command::new("cargo")
        .env("LLVM_PREFIX", format!("/usr/lib/llvm-{llvm}"))
        .args([
            "install",
            "--locked",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        ])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{llvm}"),
        ]))
}

fn ensure_toolchain_link() -> Result<()> {
    let list = output(Command::new("rustup").args(["toolchain", "list"])).unwrap_or_default();
    if list
        .lines()
        .any(|l| l.split_whitespace().next() == Some(BPF_TOOLCHAIN))
    {
        return Ok(());
    }
    run(Command::new("rustup").args(["toolchain", "link", BPF_TOOLCHAIN, "/usr"]))
}

pub fn ensure() -> Result<()> {
    apt_install(TOOLCHAIN)?;
    apt_install(TOOLS)?;
    let llvm = rustc_llvm_major()?;
    apt_install(&[&format!("llvm-{llvm}-dev")])?;
    ensure_bpf_linker(&llvm)?;
    ensure_virtme_ng()?;
    ensure_toolchain_link()
}

fn ensure_virtme_ng() -> Result<()> {
    let want = VIRTME_NG.split("==").nth(1).unwrap_or_default();
    let have = output(Command::new("python3").args([
        "-c",
        "import importlib.metadata as m; print(m.version('virtme-ng'))",
    ]));
    if have.as_deref().map(str::trim) == Some(want) {
        return Ok(());
    }
    run(Command::new("python3").args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--root-user-action=ignore",
        VIRTME_NG,
    ]))
}
