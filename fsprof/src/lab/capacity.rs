//! Usable capacity, as statvfs(2) (and so df) reports it.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Capacity {
    /// Size of the filesystem's data area (df "1B-blocks").
    pub total_bytes: u64,
    /// Free to an unprivileged user (df "Available").
    pub avail_bytes: u64,
    /// Allocated (df "Used" = total - free).
    pub used_bytes: u64,
    pub files_total: u64,
    pub files_free: u64,
}

impl Capacity {
    pub fn of(path: &Path) -> Result<Capacity> {
        let s = rustix::fs::statvfs(path)
            .map_err(std::io::Error::from)
            .with_context(|| format!("statvfs {}", path.display()))?;
        let b = s.f_frsize;
        Ok(Capacity {
            total_bytes: s.f_blocks as u64 * b,
            avail_bytes: s.f_bavail as u64 * b,
            used_bytes: (s.f_blocks - s.f_bfree) as u64 * b,
            files_total: s.f_files as u64,
            files_free: s.f_ffree as u64,
        })
    }

    /// Usable share of a device of `device_bytes`: what a user can fill on an empty fs.
    pub fn usable_percent(&self, device_bytes: u64) -> f64 {
        if device_bytes == 0 {
            return 0.0;
        }
        100.0 * self.avail_bytes as f64 / device_bytes as f64
    }
}
