//! Kernel struct layout from BTF. Rust eBPF cannot emit CO-RE relocations, so we resolve the
//! few field offsets the probes need here and hand them over in `ProbeConfig`.

use std::path::Path;

use anyhow::{Result, bail};
use btf_rs::Btf;
use fsprof_common::ProbeConfig;

use super::{
    btf::field,
    kept::{self, Kept},
};

/// Byte offset of a whole (non-bitfield) member.
pub(crate) fn byte_offset(btf: &Btf, strukt: &str, name: &str) -> Result<u32> {
    let f = field(btf, strukt, name)?;
    if f.bitfield_size.is_some() || f.bit_offset % 8 != 0 {
        bail!("{strukt}.{name} is a bitfield; expected a plain member");
    }
    Ok(f.bit_offset / 8)
}

/// The offsets from a copy kept for this boot and this fsprof build (`kept`), else read
/// from BTF and kept: then btf_rs's parse of the kernel's BTF runs beside the load instead
/// of before it.
pub fn probe_config_kept(btf_path: &Path) -> Result<ProbeConfig> {
    let kept = Kept::of(kept::OFFSETS);
    if let Some(c) = kept.as_ref().and_then(|k| from_bytes(&k.read()?)) {
        return Ok(c);
    }
    let c = probe_config(btf_path)?;
    if let Some(k) = kept {
        k.write(as_bytes(&c));
    }
    Ok(c)
}

fn from_bytes(bytes: &[u8]) -> Option<ProbeConfig> {
    (bytes.len() == size_of::<ProbeConfig>())
        // SAFETY: ProbeConfig is plain integers (aya::Pod) and `bytes` holds exactly one.
        .then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ProbeConfig>()) })
}

fn as_bytes(c: &ProbeConfig) -> &[u8] {
    // SAFETY: ProbeConfig is plain integers with no padding (see its definition).
    unsafe {
        std::slice::from_raw_parts(
            (c as *const ProbeConfig).cast::<u8>(),
            size_of::<ProbeConfig>(),
        )
    }
}

/// Reads every offset the probes use. Fails with a message naming the missing piece.
pub fn probe_config(btf_path: &Path) -> Result<ProbeConfig> {
    let btf = super::btf::load(btf_path)?;
    let btf = &btf;
    let iowait = field(btf, "task_struct", "in_iowait")?;
    // A 1-bit bitfield: read the byte holding it and test the bit (little-endian layout).
    if iowait.bitfield_size.unwrap_or(8) != 1 && iowait.bitfield_size.is_some() {
        bail!("task_struct.in_iowait has an unexpected width");
    }
    let (iowait_byte, iowait_mask) = match iowait.bitfield_size {
        Some(_) => (iowait.bit_offset / 8, 1u32 << (iowait.bit_offset % 8)),
        None => (iowait.bit_offset / 8, 0xff),
    };
    Ok(ProbeConfig {
        task_pid: byte_offset(btf, "task_struct", "pid")?,
        task_in_iowait_byte: iowait_byte,
        task_in_iowait_mask: iowait_mask,
        request_q: byte_offset(btf, "request", "q")?,
        queue_disk: byte_offset(btf, "request_queue", "disk")?,
        disk_major: byte_offset(btf, "gendisk", "major")?,
        disk_first_minor: byte_offset(btf, "gendisk", "first_minor")?,
        request_data_len: byte_offset(btf, "request", "__data_len")?,
        request_cmd_flags: byte_offset(btf, "request", "cmd_flags")?,
        request_start_time_ns: byte_offset(btf, "request", "start_time_ns")?,
        request_tag: byte_offset(btf, "request", "tag")?,
        request_mq_hctx: byte_offset(btf, "request", "mq_hctx")?,
        hctx_queue_num: byte_offset(btf, "blk_mq_hw_ctx", "queue_num")?,
        task_flags: byte_offset(btf, "task_struct", "flags")?,
        task_tgid: byte_offset(btf, "task_struct", "tgid")?,
        task_comm: byte_offset(btf, "task_struct", "comm")?,
        vma_start: byte_offset(btf, "vm_area_struct", "vm_start")?,
        vma_end: byte_offset(btf, "vm_area_struct", "vm_end")?,
        vma_flags: byte_offset(btf, "vm_area_struct", "vm_flags")?,
        vma_pgoff: byte_offset(btf, "vm_area_struct", "vm_pgoff")?,
        vma_file: byte_offset(btf, "vm_area_struct", "vm_file")?,
        file_inode: byte_offset(btf, "file", "f_inode")?,
        inode_ino: byte_offset(btf, "inode", "i_ino")?,
        inode_sb: byte_offset(btf, "inode", "i_sb")?,
        sb_dev: byte_offset(btf, "super_block", "s_dev")?,
        task_mm: byte_offset(btf, "task_struct", "mm")?,
        mm_start_code: byte_offset(btf, "mm_struct", "start_code")?,
        task_sum_exec: byte_offset(btf, "task_struct", "se")?
            + byte_offset(btf, "sched_entity", "sum_exec_runtime")?,
        request_sector: byte_offset(btf, "request", "__sector")?,
        task_prio: byte_offset(btf, "task_struct", "prio")?,
        ..ProbeConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::kept::VMLINUX_BTF;

    #[test]
    fn offsets_of_running_kernel() {
        let btf = Path::new(VMLINUX_BTF).exists();
        if !crate::test_support::needs("offsets_of_running_kernel", VMLINUX_BTF, btf) {
            return;
        }
        let c = probe_config(Path::new(VMLINUX_BTF)).unwrap();
        // pid sits well inside task_struct; in_iowait is one bit.
        assert!(c.task_pid > 64, "{c:?}");
        assert_eq!(c.task_in_iowait_mask.count_ones(), 1, "{c:?}");
        assert_ne!(c.disk_major, c.disk_first_minor);
    }

    #[test]
    fn offsets_read_back_whole_and_nothing_else() {
        let c = ProbeConfig {
            task_pid: 2456,
            task_sum_exec: 312,
            ..ProbeConfig::default()
        };
        let back = from_bytes(as_bytes(&c)).expect("whole");
        assert_eq!((back.task_pid, back.task_sum_exec), (2456, 312));
        assert!(from_bytes(&[0u8; 7]).is_none(), "a short file is no copy");
    }
}
