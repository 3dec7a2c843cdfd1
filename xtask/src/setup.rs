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
    "postgresql",        // the pgbench step's server
    "bonnie++",          // an external workload the studies used
    "chromium",          // headless, to test that the HTML report renders
    "golang-go",         // `go tool pprof`: reads the pprof profiles fsprof writes, in the tests
    "protobuf-compiler", // protoc: the tests' Perfetto schema crate generates its decoder
    // `fsprof run --kernel`: virtme-ng's initramfs needs busybox and its guest needs udevd
    // for its script channel (virtio-serial ports); qemu itself is QEMU below.
    "busybox-static",
    "udev",
];
/// From PyPI, pinned: virtme-ng, whose command line and guest init `run --kernel` drives;
/// Perfetto's Python package, whose compiled trace schema (v59, with the stack samples the
/// tests' Rust schema crate predates) reads the timelines fsprof writes in the tests.
const PYPI: &[&str] = &["virtme-ng==1.42", "perfetto==0.59.1"];
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
    // Setup adds to the machine, never takes away: a package whose install would remove or
    // downgrade another (the image's qemu-utils 10 from bookworm-backports against
    // bookworm's qemu-system-x86 7.2) comes from backports, or setup stops and says so.
    if removals(&missing, None)?.is_empty() {
        return run(apt_get_install(&missing, None).args(["-y", "-qq"]));
    }
    let mut clean = Vec::new();
    let mut conflicting = Vec::new();
    for &p in &missing {
        match removals(&[p], None)?.as_slice() {
            [] => clean.push(p),
            removed => conflicting.push((p, removed.join(", "))),
        }
    }
    if !clean.is_empty() {
        run(apt_get_install(&clean, None).args(["-y", "-qq"]))?;
    }
    ensure_backports()?;
    let names: Vec<&str> = conflicting.iter().map(|c| c.0).collect();
    if !removals(&names, Some(BACKPORTS))?.is_empty() {
        let what: Vec<String> = conflicting
            .iter()
            .map(|(p, r)| format!("{p} would remove or downgrade {r}"))
            .collect();
        bail!(
            "{} (from bookworm and from {BACKPORTS} alike): install compatible versions by hand",
            what.join("; ")
        );
    }
    for (p, removed) in &conflicting {
        eprintln!(
            "xtask: from bookworm, {p} would remove or downgrade {removed}; taking it from {BACKPORTS}"
        );
    }
    run(apt_get_install(&names, Some(BACKPORTS)).args(["-y", "-qq"]))
}

const BACKPORTS: &str = "bookworm-backports";

/// qemu boots the `--kernel` guests. From backports (10.x) even where bookworm's 7.2 would
/// install cleanly: 7.2's emulator (TCG) hangs a 6.1 guest when the kernel patches a
/// static key in code another vCPU runs (2 of 2 boots; 10.0.2: 0 of 3, docs/design.md).
const QEMU: &str = "qemu-system-x86";

/// Installs QEMU from backports unless some qemu-system-x86 is installed already.
fn ensure_qemu() -> Result<()> {
    if installed(QEMU) {
        return Ok(());
    }
    ensure_backports()?;
    let removed = removals(&[QEMU], Some(BACKPORTS))?;
    if !removed.is_empty() {
        bail!(
            "{QEMU} from {BACKPORTS} would remove or downgrade {}: install qemu 10 by hand",
            removed.join(", ")
        );
    }
    eprintln!("xtask: installing {QEMU} from {BACKPORTS}");
    run(apt_get_install(&[QEMU], Some(BACKPORTS)).args(["-y", "-qq"]))
}

/// `apt-get install` of `pkgs` (from `release` if given), without recommends.
fn apt_get_install(pkgs: &[&str], release: Option<&str>) -> Command {
    let mut c = Command::new("apt-get");
    c.env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "--no-install-recommends"]);
    if let Some(r) = release {
        c.args(["-t", r]);
    }
    c.args(pkgs);
    c
}

/// Installed packages that installing `pkgs` would remove or downgrade (apt's simulation:
/// `Remv` lines, and `Inst` lines of an installed package to a lower version).
fn removals(pkgs: &[&str], release: Option<&str>) -> Result<Vec<String>> {
    let out = apt_get_install(pkgs, release)
        .arg("-s")
        .output()
        .context("running apt-get -s")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // Unsatisfiable from this release: as bad as a removal.
        return Ok(pkgs
            .iter()
            .map(|p| format!("{p} (unsatisfiable)"))
            .collect());
    }
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("Remv"), Some(p), _) => Some(p.to_string()),
                // `Inst pkg [installed] (new …)`: a downgrade when the new one is lower.
                (Some("Inst"), Some(p), Some(old)) if old.starts_with('[') => {
                    let new = l.split('(').nth(1)?.split_whitespace().next()?;
                    let old = old.trim_matches(|c| c == '[' || c == ']');
                    downgrade(old, new).then(|| format!("{p} {old} → {new}"))
                }
                _ => None,
            }
        })
        .collect())
}

fn downgrade(old: &str, new: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", new, "lt", old])
        .status()
        .is_ok_and(|s| s.success())
}

/// Adds Debian's bookworm-backports suite as an apt source if no source has it.
fn ensure_backports() -> Result<()> {
    let listed = std::fs::read_dir("/etc/apt/sources.list.d")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .chain([Path::new("/etc/apt/sources.list").to_path_buf()])
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .any(|t| t.contains(BACKPORTS));
    if listed {
        return Ok(());
    }
    std::fs::write(
        "/etc/apt/sources.list.d/fsprof-backports.sources",
        format!(
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {BACKPORTS}\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        ),
    )
    .context("adding bookworm-backports to apt's sources")?;
    run(Command::new("apt-get").args(["update", "-qq"]))
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
    ensure_qemu()?;
    let llvm = rustc_llvm_major()?;
    apt_install(&[&format!("llvm-{llvm}-dev")])?;
    ensure_bpf_linker(&llvm)?;
    PYPI.iter().try_for_each(|p| pip_install(p))?;
    ensure_toolchain_link()
}

/// `pinned` (name==version) from PyPI, unless that version is installed.
fn pip_install(pinned: &str) -> Result<()> {
    let (name, want) = pinned.split_once("==").unwrap_or((pinned, ""));
    let have = output(Command::new("python3").args([
        "-c",
        &format!("import importlib.metadata as m; print(m.version('{name}'))"),
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
        pinned,
    ]))
}
