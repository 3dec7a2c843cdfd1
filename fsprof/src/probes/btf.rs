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
    let _ = load(Path::new(super::offsets::VMLINUX_BTF));
}

/// aya's own parse of the running kernel's BTF, which attaching a BTF tracepoint needs: one
/// parse for all of them (each took ~30 ms).
pub fn aya_kernel() -> Result<&'static aya::Btf> {
    static BTF: OnceLock<Result<aya::Btf, String>> = OnceLock::new();
    BTF.get_or_init(|| {
        aya::Btf::from_sys_fs().map_err(|e| format!("reading the kernel's BTF: {e}"))
    })
    .as_ref()
    .map_err(|e| anyhow!("{e}"))
}

/// aya's loader, made ahead: `EbpfLoader::new` parses the kernel's BTF once more (~20 ms;
/// aya has no constructor without it, and no way to lend that parse to `aya_kernel`), so a
/// start makes it on a helper thread (`make_loader_ahead`) while other work runs.
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
        .resolve_types_by_name(&format!("btf_trace_{name}"))
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
