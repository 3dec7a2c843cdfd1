//! Kernel struct layout from BTF. Rust eBPF cannot emit CO-RE relocations, so we resolve the
//! few field offsets the probes need here and hand them over in `ProbeConfig`.

use std::path::Path;

use anyhow::{Result, bail};
use btf_rs::Btf;
use fsprof_common::ProbeConfig;

use super::btf::field;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Byte offset of a whole (non-bitfield) member.
pub(crate) fn byte_offset(btf: &Btf, strukt: &str, name: &str) -> Result<u32> {
    let f = field(btf, strukt, name)?;
    if f.bitfield_size.is_some() || f.bit_offset % 8 != 0 {
        bail!("{strukt}.{name} is a bitfield; expected a plain member");
    }
    Ok(f.bit_offset / 8)
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
        task_exec_id: byte_offset(btf, "task_struct", "self_exec_id")?,
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

    #[test]
    fn offsets_of_running_kernel() {
        if !Path::new(VMLINUX_BTF).exists() {
            eprintln!("skipped: no {VMLINUX_BTF}");
            return;
        }
        let c = probe_config(Path::new(VMLINUX_BTF)).unwrap();
        // pid sits well inside task_struct; in_iowait is one bit.
        assert!(c.task_pid > 64, "{c:?}");
        assert_eq!(c.task_in_iowait_mask.count_ones(), 1, "{c:?}");
        assert_ne!(c.disk_major, c.disk_first_minor);
    }
}
