//! The running kernel's BTF, parsed once per process: struct member offsets for the probes
//! and tracepoint prototypes for the fs events.

use std::{
    path::Path,
    sync::{Mutex, OnceLock},
    thread::JoinHandle,
};

use aya::EbpfLoader;

use anyhow::{Context, Result, anyhow, bail};
use btf_rs::{Btf, Type};

use super::kept::{self, Kept};

/// Parses `path` (the first call's path is the one kept).
pub fn load(path: &Path) -> Result<&'static Btf> {
    static BTF: OnceLock<Result<Btf, String>> = OnceLock::new();
    BTF.get_or_init(|| {
        // One read into memory: parsing straight from the file costs thousands of reads.
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read kernel BTF at {}", path.display()))
            .map_err(|e| format!("{e:#}"))?;
        Btf::from_bytes(&bytes).map_err(|e| {
            format!(
                "cannot read kernel BTF at {} (the kernel needs CONFIG_DEBUG_INFO_BTF=y): {e}",
                path.display()
            )
        })
    })
    .as_ref()
    .map_err(|e| anyhow!("{e}"))
}

/// Parses the running kernel's BTF for the offsets (its outcome is kept for their reader).
pub fn parse_kernel() {
    let _ = load(Path::new(kept::VMLINUX_BTF));
}

/// The BTF that attaching fsprof's BTF tracepoints needs (one for all of them): aya's
/// `BtfTracePoint::load` only looks up each tracepoint's `btf_trace_<name>` typedef id in
/// it, and has no way to be handed the id. Parsing the kernel's whole BTF for that took
/// ~30 ms of CPU at every start; this BTF holds just those typedefs, at their ids in the
/// kernel's BTF (kept for the boot, see `trace_ids`), every id before them a void pointer.
pub fn tracepoints() -> Result<&'static aya::Btf> {
    static BTF: OnceLock<Result<aya::Btf, String>> = OnceLock::new();
    BTF.get_or_init(|| {
        let ids = trace_ids().map_err(|e| format!("{e:#}"))?;
        aya::Btf::parse(&typedefs_at(&ids), aya::Endianness::default())
            .map_err(|e| format!("making the tracepoints' BTF: {e}"))
    })
    .as_ref()
    .map_err(|e| anyhow!("{e}"))
}

/// Each BTF tracepoint's `btf_trace_` typedef and its id in the kernel's BTF, from the copy
/// kept for this boot (`kept::TRACE_IDS`), else from btf_rs's parse (and then kept). A
/// tracepoint this kernel lacks is left out: loading its program then fails alone.
fn trace_ids() -> Result<Vec<(String, u32)>> {
    let kept = Kept::of(kept::TRACE_IDS);
    let read = kept.as_ref().and_then(|k| k.read());
    if let Some(ids) = read.as_deref().and_then(parse_ids) {
        return Ok(ids);
    }
    let btf = load(Path::new(kept::VMLINUX_BTF))?;
    let ids: Vec<(String, u32)> = super::btf_tracepoints()
        .filter_map(|hook| {
            let name = trace_typedef(hook);
            let ids = btf.resolve_ids_by_name(&name).ok()?;
            let id = ids.into_iter().find(|&id| {
                btf.resolve_type_by_id(id)
                    .is_ok_and(|t| is_typedef(btf, &t, &name))
            })?;
            Some((name, id))
        })
        .collect();
    if let Some(k) = kept {
        let text: String = ids.iter().map(|(n, id)| format!("{n} {id}\n")).collect();
        k.write(text.as_bytes());
    }
    Ok(ids)
}

/// The typedef the kernel declares for raw tracepoint `hook`'s prototype.
fn trace_typedef(hook: &str) -> String {
    format!("btf_trace_{hook}")
}

fn parse_ids(bytes: &[u8]) -> Option<Vec<(String, u32)>> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.lines()
        .map(|l| {
            let (name, id) = l.split_once(' ')?;
            Some((name.to_string(), id.parse().ok()?))
        })
        .collect()
}

/// A raw BTF (`struct btf_header`, types, strings) with typedef `name` (of void) at each
/// `id`, and a void pointer at every other id up to the last.
fn typedefs_at(ids: &[(String, u32)]) -> Vec<u8> {
    const KIND_PTR: u32 = 2;
    const KIND_TYPEDEF: u32 = 8;
    let last = ids.iter().map(|&(_, id)| id).max().unwrap_or(0);
    let mut strings = vec![0u8];
    let mut name_at = std::collections::HashMap::new();
    for (name, id) in ids {
        name_at.insert(*id, strings.len() as u32);
        strings.extend(name.as_bytes());
        strings.push(0);
    }
    let mut types = Vec::with_capacity(last as usize * 12);
    for id in 1..=last {
        let (name, kind) = name_at
            .get(&id)
            .map_or((0, KIND_PTR), |&n| (n, KIND_TYPEDEF));
        for word in [name, kind << 24, 0] {
            types.extend(word.to_le_bytes());
        }
    }
    let mut blob = Vec::with_capacity(24 + types.len() + strings.len());
    blob.extend(0xeb9f_u16.to_le_bytes());
    blob.extend([1, 0]); // version, flags
    for word in [
        24,
        0,
        types.len() as u32,
        types.len() as u32,
        strings.len() as u32,
    ] {
        blob.extend(word.to_le_bytes()); // hdr_len, type_off, type_len, str_off, str_len
    }
    blob.extend(types);
    blob.extend(strings);
    blob
}

/// aya's loader, made ahead: `EbpfLoader::new` parses the kernel's BTF (~25–40 ms), which
/// fsprof's object never uses (Rust eBPF has no CO-RE relocations), and aya has no
/// constructor without it; so a start makes it on a helper thread (`make_loader_ahead`)
/// while other work runs.
static LOADER_AHEAD: Mutex<Option<JoinHandle<EbpfLoader<'static>>>> = Mutex::new(None);

/// Starts making the loader `loader` returns.
pub fn make_loader_ahead() {
    *LOADER_AHEAD.lock().expect("loader") = Some(std::thread::spawn(EbpfLoader::default));
}

/// The loader made ahead, else a new one (`default` is `new`).
pub fn loader() -> EbpfLoader<'static> {
    let ahead = LOADER_AHEAD.lock().expect("loader").take();
    ahead.and_then(|h| h.join().ok()).unwrap_or_default()
}

/// Bit offset and bitfield size (None for a plain member) of a field.
pub struct Field {
    pub bit_offset: u32,
    pub bitfield_size: Option<u32>,
    /// The member's type, qualifiers and typedefs stripped.
    pub ty: Option<Type>,
}

/// Follows typedefs and qualifiers.
pub fn strip(btf: &Btf, mut t: Type) -> Option<Type> {
    loop {
        t = match t {
            Type::Typedef(_)
            | Type::Const(_)
            | Type::Volatile(_)
            | Type::Restrict(_)
            | Type::TypeTag(_) => btf.resolve_chained_type(t.as_btf_type()?).ok()?,
            other => return Some(other),
        }
    }
}

pub fn find_struct(btf: &Btf, name: &str) -> Result<btf_rs::Struct> {
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
                ty: btf.resolve_chained_type(m).ok().and_then(|t| strip(btf, t)),
            });
        }
        if name.is_empty() {
            let t = strip(btf, btf.resolve_chained_type(m).ok()?)?;
            if let Type::Struct(inner) | Type::Union(inner) = t
                && let Some(f) = find_member(btf, &inner, field, base + m.bit_offset())
            {
                return Some(f);
            }
        }
    }
    None
}

pub fn field(btf: &Btf, strukt: &str, field: &str) -> Result<Field> {
    let s = find_struct(btf, strukt)?;
    find_member(btf, &s, field, 0)
        .ok_or_else(|| anyhow!("{strukt}.{field} not found in kernel BTF"))
}

/// Name of the struct a pointer type points to (`struct inode *` → "inode").
pub fn pointee_struct(btf: &Btf, t: &Type) -> Option<String> {
    let Type::Ptr(p) = strip(btf, t.clone())? else {
        return None;
    };
    match strip(btf, btf.resolve_chained_type(&p).ok()?)? {
        Type::Struct(s) => btf.resolve_name(&s).ok().filter(|n| !n.is_empty()),
        _ => None,
    }
}

/// Whether `t` is the typedef `name` (e.g. `dev_t`: a value, not a pointer to follow).
pub fn is_typedef(btf: &Btf, t: &Type, name: &str) -> bool {
    matches!(t, Type::Typedef(td) if btf.resolve_name(td).is_ok_and(|n| n == name))
}

/// The argument types of raw tracepoint `name` (without the leading `void *__data`), as
/// declared: typedefs are kept (see `strip`).
pub fn tracepoint_args(btf: &Btf, name: &str) -> Option<Vec<Type>> {
    let t = btf
        .resolve_types_by_name(&trace_typedef(name))
        .ok()?
        .into_iter()
        .next()?;
    let Type::Typedef(td) = t else { return None };
    let Type::Ptr(p) = btf.resolve_chained_type(&td).ok()? else {
        return None;
    };
    let Type::FuncProto(fp) = btf.resolve_chained_type(&p).ok()? else {
        return None;
    };
    Some(
        fp.parameters
            .iter()
            .skip(1)
            .map(|param| btf.resolve_chained_type(param).unwrap_or(Type::Void))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use aya_obj::btf::BtfKind;

    use super::*;

    #[test]
    fn the_tracepoints_btf_holds_each_typedef_at_its_id() {
        let ids = vec![
            ("btf_trace_a".to_string(), 7),
            ("btf_trace_b".to_string(), 3),
        ];
        let btf = aya::Btf::parse(&typedefs_at(&ids), aya::Endianness::default()).unwrap();
        for (name, id) in &ids {
            let found = btf.id_by_type_name_kind(name, BtfKind::Typedef).unwrap();
            assert_eq!(found, *id, "{name}");
        }
        assert!(
            btf.id_by_type_name_kind("btf_trace_c", BtfKind::Typedef)
                .is_err()
        );
    }

    /// The ids agree with aya's own parse of the running kernel's whole BTF, which is what
    /// attaching used before.
    #[test]
    fn the_tracepoints_ids_are_the_kernels() {
        let whole = aya::Btf::from_sys_fs().expect("the kernel's BTF (fsprof needs it)");
        let ids = trace_ids().unwrap();
        assert_eq!(ids.len(), super::super::btf_tracepoints().count());
        for (name, id) in ids {
            let want = whole.id_by_type_name_kind(&name, BtfKind::Typedef).unwrap();
            assert_eq!(id, want, "{name}");
        }
    }
}
