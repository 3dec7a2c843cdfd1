//! Built-in workloads. They run as `fsprof workload NAME DIR` in a child process, so the
//! tracer follows exactly the workload and nothing of fsprof itself.

pub mod rng;
pub mod tree;

use std::path::Path;

use anyhow::{Result, bail};

pub const NAMES: &[&str] = &["small-tree"];

/// The demo: a small tree of 2,000 files created, synced, read back and deleted.
fn small_tree(dir: &Path, seed: u64) -> Result<()> {
    let spec = tree::TreeSpec {
        dirs: 40,
        files_per_dir: 50,
        min_size: 1024,
        max_size: 64 * 1024,
        seed,
    };
    let root = dir.join("small-tree");
    let made = tree::create(&root, &spec)?;
    unsafe { libc::sync() };
    let read = tree::read_all(&root)?;
    if read != made.bytes {
        bail!("read back {read} bytes, wrote {}", made.bytes);
    }
    tree::delete(&root)
}

pub fn run(name: &str, dir: &Path, seed: u64) -> Result<()> {
    match name {
        "small-tree" => small_tree(dir, seed),
        _ => bail!("unknown workload {name:?}; known: {}", NAMES.join(", ")),
    }
}
