//! Unpacking the real kernel: Debian's linux-source package ships the tarball we extract
//! natively (tar + xz), like the `tar xjf linux-*.tar.bz2` step of the classic tests.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use super::tree::TreeTotals;

/// /usr/src/linux-source-*.tar.xz, when the linux-source package is installed.
pub fn kernel_tarball() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir("/usr/src")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap_or_default().to_string_lossy();
            n.starts_with("linux-source-") && n.ends_with(".tar.xz")
        })
        .collect();
    found.sort();
    found.pop()
}

pub fn extract(tarball: &Path, dest: &Path) -> Result<TreeTotals> {
    fs::create_dir_all(dest)?;
    let file = fs::File::open(tarball).with_context(|| format!("opening {}", tarball.display()))?;
    let mut archive = tar::Archive::new(xz2::read::XzDecoder::new(std::io::BufReader::new(file)));
    let mut totals = TreeTotals::default();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            totals.dirs += 1;
        } else if kind.is_file() {
            totals.files += 1;
            totals.bytes += entry.size();
        }
        entry.unpack_in(dest).context("unpacking kernel tarball")?;
    }
    Ok(totals)
}
