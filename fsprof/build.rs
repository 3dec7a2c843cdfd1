//! Builds fsprof-ebpf for bpfel-unknown-none and leaves the object in OUT_DIR for
//! `include_bytes_aligned!`. Two toolchains work:
//! - `fsprof-bpf`: Debian's rustc-web linked into rustup by `cargo xtask setup`. It ships a
//!   precompiled `core` for the BPF target, so no build-std; RUSTC_BOOTSTRAP lets only
//!   aya_ebpf use its unstable bits.
//! - `nightly` with rust-src (a usual developer laptop): aya-build's standard route.
use std::{path::PathBuf, process::Command};

fn has_toolchain(name: &str) -> bool {
    Command::new("rustup")
        .args(["run", name, "rustc", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn nightly_has_rust_src() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
                .join("lib/rustlib/src/rust/library/core")
                .exists()
        })
        .unwrap_or(false)
}

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=FSPROF_BPF_TOOLCHAIN");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest.join("../fsprof-ebpf").canonicalize()?;
    let common_dir = manifest.join("../fsprof-common").canonicalize()?;
    println!("cargo:rerun-if-changed={}", common_dir.display());

    let toolchain = match std::env::var("FSPROF_BPF_TOOLCHAIN") {
        Ok(t) => t,
        Err(_) if has_toolchain("fsprof-bpf") => "fsprof-bpf".to_string(),
        Err(_) if nightly_has_rust_src() => "nightly".to_string(),
        Err(_) => anyhow::bail!(
            "no Rust toolchain that can build eBPF: run `cargo xtask setup` (installs Debian's \
             rustc-web with a BPF core and bpf-linker), or install rustup nightly with rust-src"
        ),
    };
    if toolchain != "nightly" {
        // SAFETY: build scripts are single-threaded; the child cargo inherits this.
        unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "aya_ebpf") };
    }
    let root = ebpf_dir.to_str().expect("utf-8 path");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "fsprof-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}
