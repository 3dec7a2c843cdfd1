//! Where each process's code was mapped, learned from the user frames the kernel resolved to
//! (build id, file offset). The kernel resolves only the first user stack whose leaf is in
//! each code page (see USER_BUILD_IDS in fsprof-ebpf); the frames of every other stack are placed
//! here, as a /proc/PID/maps lookup would, after the process is gone.

use std::collections::HashMap;

use fsprof_common::{BUILD_ID_VALID, BuildIdFrame};

/// A file mapped so that address = bias + file offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mapping {
    bias: u64,
    build_id: [u8; 20],
}

#[derive(Debug, Default)]
pub struct UserMaps {
    by_tgid: HashMap<u32, Vec<Mapping>>,
}

impl UserMaps {
    /// Learns from one captured stack: `ips` and the kernel's resolution of the same frames.
    pub fn learn(&mut self, tgid: u32, ips: &[u64], frames: &[BuildIdFrame]) {
        let maps = self.by_tgid.entry(tgid).or_default();
        for (&ip, f) in ips.iter().zip(frames) {
            if f.status != BUILD_ID_VALID || f.offset_or_ip > ip {
                continue;
            }
            let m = Mapping {
                bias: ip - f.offset_or_ip,
                build_id: f.build_id,
            };
            if !maps.contains(&m) {
                maps.push(m);
            }
        }
    }

    /// The frame of `ip` in `tgid`: in the known mapping nearest below it, if the offset
    /// falls inside that file (`file_len`, None when the file is not found). Addresses in
    /// no known file (heap, stack, garbage of frame-pointer-less code) stay unplaced.
    pub fn place(
        &self,
        tgid: u32,
        ip: u64,
        mut file_len: impl FnMut(&[u8; 20]) -> Option<u64>,
    ) -> Option<BuildIdFrame> {
        let m = self
            .by_tgid
            .get(&tgid)?
            .iter()
            .filter(|m| m.bias <= ip)
            .max_by_key(|m| m.bias)?;
        let offset = ip - m.bias;
        (offset < file_len(&m.build_id)?).then_some(BuildIdFrame {
            status: BUILD_ID_VALID,
            build_id: m.build_id,
            offset_or_ip: offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: u8, offset: u64) -> BuildIdFrame {
        BuildIdFrame {
            status: BUILD_ID_VALID,
            build_id: [id; 20],
            offset_or_ip: offset,
        }
    }

    #[test]
    fn places_frames_by_the_nearest_mapping_below_and_inside_its_file() {
        const LIBC: u64 = 0x7f00_0000_0000;
        const EXE: u64 = 0x5555_0000_0000;
        let mut maps = UserMaps::default();
        maps.learn(
            7,
            &[LIBC + 0x1_2345, EXE + 0x4321],
            &[frame(1, 0x1_2345), frame(2, 0x4321)],
        );
        let len = |id: &[u8; 20]| Some(if id[0] == 1 { 0x20_0000 } else { 0x2_0000 });
        let libc = maps.place(7, LIBC + 0x9_0000, len).unwrap();
        assert_eq!((libc.build_id[0], libc.offset_or_ip), (1, 0x9_0000));
        let exe = maps.place(7, EXE + 0x100, len).unwrap();
        assert_eq!((exe.build_id[0], exe.offset_or_ip), (2, 0x100));
        // The heap lies above the executable but past its end.
        assert!(maps.place(7, EXE + 0x100_0000, len).is_none());
        // Below every mapping, another process, a file that is not found.
        assert!(maps.place(7, 0x1000, len).is_none());
        assert!(maps.place(8, LIBC + 0x10, len).is_none());
        assert!(maps.place(7, LIBC + 0x10, |_| None).is_none());
    }
}
