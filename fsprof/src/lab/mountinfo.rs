//! /proc/self/mountinfo, parsed once here for everything that asks what is mounted where.

use std::path::{Path, PathBuf};

use fsprof_common::kdev;

#[derive(Clone, Debug)]
pub struct MountEntry {
    /// Superblock dev_t, kernel encoding (st_dev differs on btrfs subvolumes).
    pub dev: u32,
    pub point: PathBuf,
    pub fstype: String,
    pub source: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && let Some(oct) = s.get(i + 1..i + 4)
            && let Ok(v) = u8::from_str_radix(oct, 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    // id parent major:minor root point options [optional…] - fstype source superoptions
    let f: Vec<&str> = line.split(' ').collect();
    let (ma, mi) = f.get(2)?.split_once(':')?;
    let sep = f.iter().position(|x| *x == "-")?;
    Some(MountEntry {
        dev: kdev::make(ma.parse().ok()?, mi.parse().ok()?),
        point: PathBuf::from(unescape(f.get(4)?)),
        fstype: f.get(sep + 1)?.to_string(),
        source: unescape(f.get(sep + 2)?),
    })
}

pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

/// This process's mounts; empty when mountinfo cannot be read.
pub fn read() -> Vec<MountEntry> {
    parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// The mount holding `path` (canonical): the one with the longest mount point prefix, the
/// last mounted on ties.
pub fn holding(mounts: &[MountEntry], path: &Path) -> Option<MountEntry> {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.point))
        .fold(None::<&MountEntry>, |best, m| match best {
            Some(b) if b.point.as_os_str().len() > m.point.as_os_str().len() => Some(b),
            _ => Some(m),
        })
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_escapes_and_optional_fields() {
        let t = "36 35 7:0 / /mnt/a\\040b rw,noatime shared:1 master:2 - xfs /dev/loop0 rw\n\
                 22 1 254:1 / / rw - ext4 /dev/vda1 rw\n";
        let m = parse(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].point, PathBuf::from("/mnt/a b"));
        assert_eq!(m[0].fstype, "xfs");
        assert_eq!(m[0].dev, kdev::make(7, 0));
        assert_eq!(m[1].source, "/dev/vda1");
        let h = holding(&m, Path::new("/mnt/a b/x")).unwrap();
        assert_eq!(h.fstype, "xfs");
        assert_eq!(holding(&m, Path::new("/etc")).unwrap().fstype, "ext4");
    }
}
