//! Kernel struct layout from BTF. Rust eBPF cannot emit CO-RE relocations, so we resolve the
//! few field offsets the probes need here and hand them over in `ProbeConfig`.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use btf_rs::{Btf, Type};
use fsprof_common::ProbeConfig;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Bit offset and bitfield size (None for a plain member) of `field` in `struct name`.
struct Field {
    bit_offset: u32,
    bitfield_size: Option<u32>,
}

fn find_struct(btf: &Btf, name: &str) -> Result<btf_rs::Struct> {
    for t in btf.resolve_types_by_name(name)? {
        if let Type::Struct(s) = t
            && !s.members.is_empty()
        {
            return Ok(s);
        }
    }
    bail!("struct {name} not found in kernel BTF")
}

/// Searches `s` for `field`, descending into anonymous structs and unions (the kernel
/// wraps many fields in them, e.g. under randomized layout or `struct_group`).
fn find_member(btf: &Btf, s: &btf_rs::Struct, field: &str, base: u32) -> Option<Field> {
    for m in &s.members {
        let name = btf.resolve_name(m).unwrap_or_default();
        if name == field {
            return Some(Field {
                bit_offset: base + m.bit_offset(),
                bitfield_size: m.bitfield_size().filter(|&b| b != 0),
            });
        }
        if name.is_empty() {
            let mut t = btf.resolve_chained_type(m).ok()?;
            // Skip qualifiers and typedefs down to the aggregate.
            while let Type::Typedef(_) | Type::Const(_) | Type::Volatile(_) = t {
                t = btf.resolve_chained_type(t.as_btf_type()?).ok()?;
            }
            if let Type::Struct(inner) | Type::Union(inner) = t
                && let Some(f) = find_member(btf, &inner, field, base + m.bit_offset())
            {
                return Some(f);
            }
        }
    }
    None
}

fn field(btf: &Btf, strukt: &str, field: &str) -> Result<Field> {
    let s = find_struct(btf, strukt)?;
    find_member(btf, &s, field, 0)
        .ok_or_else(|| anyhow!("{strukt}.{field} not found in kernel BTF"))
}

/// Byte offset of a whole (non-bitfield) member.
fn byte_offset(btf: &Btf, strukt: &str, name: &str) -> Result<u32> {
    let f = field(btf, strukt, name)?;
    if f.bitfield_size.is_some() || f.bit_offset % 8 != 0 {
        bail!("{strukt}.{name} is a bitfield; expected a plain member");
    }
    Ok(f.bit_offset / 8)
}

/// Reads every offset the probes use. Fails with a message naming the missing piece.
pub fn probe_config(btf_path: &Path) -> Result<ProbeConfig> {
    // One read into memory: parsing straight from the file costs thousands of small reads.
    let bytes = std::fs::read(btf_path)
        .with_context(|| format!("cannot read kernel BTF at {}", btf_path.display()))?;
    let btf = Btf::from_bytes(&bytes).with_context(|| {
        format!(
            "cannot read kernel BTF at {} (the kernel needs CONFIG_DEBUG_INFO_BTF=y)",
            btf_path.display()
        )
    })?;
    let iowait = field(&btf, "task_struct", "in_iowait")?;
    // A 1-bit bitfield: read the byte holding it and test the bit (little-endian layout).
    if iowait.bitfield_size.unwrap_or(8) != 1 && iowait.bitfield_size.is_some() {
        bail!("task_struct.in_iowait has an unexpected width");
    }
    let (iowait_byte, iowait_mask) = match iowait.bitfield_size {
        Some(_) => (iowait.bit_offset / 8, 1u32 << (iowait.bit_offset % 8)),
        None => (iowait.bit_offset / 8, 0xff),
    };
    Ok(ProbeConfig {
        task_pid: byte_offset(&btf, "task_struct", "pid")?,
        task_in_iowait_byte: iowait_byte,
        task_in_iowait_mask: iowait_mask,
        request_q: byte_offset(&btf, "request", "q")?,
        queue_disk: byte_offset(&btf, "request_queue", "disk")?,
        disk_major: byte_offset(&btf, "gendisk", "major")?,
        disk_first_minor: byte_offset(&btf, "gendisk", "first_minor")?,
        request_data_len: byte_offset(&btf, "request", "__data_len")?,
        request_cmd_flags: byte_offset(&btf, "request", "cmd_flags")?,
        filter_devices: 0,
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
