//! Directory trees: create (deterministic names and sizes), read back, and delete.

use std::{
    fs,
    io::{Read, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use super::rng::Rng;

#[derive(Clone, Debug)]
pub struct TreeSpec {
    pub dirs: u32,
    pub files_per_dir: u32,
    pub min_size: u64,
    pub max_size: u64,
    pub seed: u64,
}

/// What a tree holds; `create` returns it and tests check the filesystem against it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeTotals {
    pub dirs: u64,
    pub files: u64,
    pub bytes: u64,
}

fn file_path(root: &Path, d: u32, f: u32) -> PathBuf {
    root.join(format!("d{d:04}")).join(format!("f{f:05}.dat"))
}

pub fn create(root: &Path, spec: &TreeSpec) -> Result<TreeTotals> {
    let mut rng = Rng::new(spec.seed);
    let mut totals = TreeTotals::default();
    let mut buf = vec![0u8; spec.max_size as usize];
    for d in 0..spec.dirs {
        let dir = root.join(format!("d{d:04}"));
        fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        totals.dirs += 1;
        for f in 0..spec.files_per_dir {
            let size = rng.range(spec.min_size, spec.max_size) as usize;
            rng.fill(&mut buf[..size]);
            let path = file_path(root, d, f);
            fs::File::create(&path)
                .and_then(|mut h| h.write_all(&buf[..size]))
                .with_context(|| format!("writing {}", path.display()))?;
            totals.files += 1;
            totals.bytes += size as u64;
        }
    }
    Ok(totals)
}

/// Reads every regular file under `root`; returns the bytes read.
pub fn read_all(root: &Path) -> Result<u64> {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 20];
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let ft = entry.file_type()?;
            if ft.is_dir() {
                stack.push(entry.path());
            } else if ft.is_file() {
                let mut f = fs::File::open(entry.path())?;
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
            }
        }
    }
    Ok(total)
}

pub fn delete(root: &Path) -> Result<()> {
    fs::remove_dir_all(root).with_context(|| format!("deleting {}", root.display()))
}
