//! Which tracepoints this kernel has, and their record layouts, read from tracefs. tracefs
//! is often not mounted (it is not on these machines): then it is mounted privately for
//! the read and unmounted at once; the perf events opened later need only the ids.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use anyhow::{Context, Result, bail};

/// One field of a tracepoint record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// The C declaration, e.g. "dev_t dev" or "char name[32]".
    pub decl: String,
    pub offset: u32,
    pub size: u32,
}

/// A tracepoint: `subsystem:name`, its perf event id and its fields.
#[derive(Clone, Debug)]
pub struct Event {
    pub subsystem: String,
    pub name: String,
    pub id: u64,
    pub fields: Vec<Field>,
}

impl Event {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
    pub fn full_name(&self) -> String {
        format!("{}:{}", self.subsystem, self.name)
    }
}

/// Parses a tracefs `format` file's field lines.
pub fn parse_format(text: &str) -> Vec<Field> {
    let mut fields = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut decl = "";
        let mut offset = None;
        let mut size = None;
        for (i, part) in rest.split(';').enumerate() {
            let part = part.trim();
            if i == 0 {
                decl = part;
            } else if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        // The name is the last identifier of the declaration, before any array suffix.
        let name = decl
            .split('[')
            .next()
            .unwrap_or("")
            .rsplit([' ', '*'])
            .next()
            .unwrap_or("")
            .to_string();
        if let (Some(offset), Some(size)) = (offset, size)
            && !name.is_empty()
        {
            fields.push(Field {
                name,
                decl: decl.to_string(),
                offset,
                size,
            });
        }
    }
    fields
}

fn read_events(root: &Path, subsystems: &[&str]) -> BTreeMap<String, Vec<Event>> {
    let mut out = BTreeMap::new();
    for &sub in subsystems {
        let mut events = Vec::new();
        let dir = root.join("events").join(sub);
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let (Ok(id), Ok(format)) = (
                fs::read_to_string(path.join("id")),
                fs::read_to_string(path.join("format")),
            ) else {
                continue;
            };
            let Ok(id) = id.trim().parse() else {
                continue;
            };
            events.push(Event {
                subsystem: sub.to_string(),
                name: entry.file_name().to_string_lossy().into_owned(),
                id,
                fields: parse_format(&format),
            });
        }
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
        let c = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap_or_default();
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
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
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    let r = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_format_fields() {
        let text = "name: x\nID: 7\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                    \tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;\n\
                    \tfield:char name[32];\toffset:12;\tsize:32;\tsigned:0;\n\
                    \tfield:const void * buf_ops;\toffset:56;\tsize:8;\tsigned:0;\n";
        let f = parse_format(text);
        let names: Vec<_> = f
            .iter()
            .map(|f| (f.name.as_str(), f.offset, f.size))
            .collect();
        assert_eq!(
            names,
            [
                ("common_type", 0, 2),
                ("dev", 8, 4),
                ("name", 12, 32),
                ("buf_ops", 56, 8)
            ]
        );
    }
}
