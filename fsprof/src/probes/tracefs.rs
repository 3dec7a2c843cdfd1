//! Which tracepoints this kernel has, by subsystem: the names of tracefs's `events/SUB/`
//! directories. tracefs is often not mounted (it is not on these machines): then it is
//! mounted privately for the listing and unmounted at once; raw tracepoints attach by name.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use anyhow::{Context, Result, bail};
use rustix::mount::{MountFlags, UnmountFlags, mount, unmount};

/// A tracepoint, `subsystem:name`.
#[derive(Clone, Debug)]
pub struct Event {
    pub subsystem: String,
    pub name: String,
}

impl Event {
    pub fn full_name(&self) -> String {
        format!("{}:{}", self.subsystem, self.name)
    }
}

fn read_events(root: &Path, subsystems: &[&str]) -> BTreeMap<String, Vec<Event>> {
    let mut out = BTreeMap::new();
    for &sub in subsystems {
        let mut events: Vec<Event> = fs::read_dir(root.join("events").join(sub))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| Event {
                subsystem: sub.to_string(),
                name: e.file_name().to_string_lossy().into_owned(),
            })
            .collect();
        events.sort_by(|a, b| a.name.cmp(&b.name));
        out.insert(sub.to_string(), events);
    }
    out
}

/// Subsystems fsprof may count (`fsprof list` and the docs name the same).
pub const SUBSYSTEMS: &[&str] = &["xfs", "ext4", "jbd2", "btrfs", "writeback", "iomap", "fuse"];

/// Unmounts (and removes) a private tracefs mount when dropped.
struct PrivateMount(PathBuf);

impl Drop for PrivateMount {
    fn drop(&mut self) {
        let _ = unmount(&self.0, UnmountFlags::DETACH);
        let _ = fs::remove_dir(&self.0);
    }
}

fn mount_private() -> Result<PrivateMount> {
    // Named like the lab's mounts, so `fsprof cleanup` removes it after a SIGKILL.
    let dir = PathBuf::from(format!(
        "{}/{}{}-tracefs",
        crate::lab::MOUNT_ROOT,
        crate::lab::loopdev::IMAGE_PREFIX,
        std::process::id()
    ));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if let Err(e) = mount("nodev", &dir, "tracefs", MountFlags::empty(), None) {
        let _ = fs::remove_dir(&dir);
        bail!("cannot mount tracefs: {e}");
    }
    Ok(PrivateMount(dir))
}

/// Every tracepoint of `SUBSYSTEMS` this kernel has, read once per process.
pub fn events() -> Result<&'static BTreeMap<String, Vec<Event>>, String> {
    static EVENTS: OnceLock<Result<BTreeMap<String, Vec<Event>>, String>> = OnceLock::new();
    EVENTS
        .get_or_init(|| {
            for known in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
                if Path::new(known).join("events").is_dir() {
                    return Ok(read_events(Path::new(known), SUBSYSTEMS));
                }
            }
            let mount = mount_private().map_err(|e| format!("{e:#}"))?;
            Ok(read_events(&mount.0, SUBSYSTEMS))
        })
        .as_ref()
        .map_err(Clone::clone)
}
