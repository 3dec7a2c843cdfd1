//! Sparse backing images attached as loop devices with direct I/O, so the page cache of
//! the filesystem under test is the only one in the way.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

/// Image file names start with this; `fsprof cleanup` relies on it.
pub const IMAGE_PREFIX: &str = "fsprof-";

/// A sparse file, removed on drop.
pub struct Image {
    pub path: PathBuf,
}

impl Image {
    pub fn create(dir: &Path, tag: &str, size: u64) -> Result<Image> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{IMAGE_PREFIX}{}-{tag}.img", std::process::id()));
        let f = fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let image = Image { path };
        f.set_len(size)
            .with_context(|| format!("sizing {} to {size} bytes", image.path.display()))?;
        Ok(image)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// An attached loop device, detached on drop.
pub struct LoopDevice {
    pub path: PathBuf,
}

impl LoopDevice {
    pub fn attach(image: &Path) -> Result<LoopDevice> {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(image)
            .output()
            .context("running losetup (util-linux)")?;
        if !out.status.success() {
            bail!(
                "losetup {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(LoopDevice { path })
    }

    pub fn detach(path: &Path) -> Result<()> {
        let out = Command::new("losetup").arg("-d").arg(path).output()?;
        if !out.status.success() {
            bail!(
                "losetup -d {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = LoopDevice::detach(&self.path);
    }
}
