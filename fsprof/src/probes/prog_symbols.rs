//! The kernel's names for the BPF programs loaded now, with the exact range of each of
//! their functions (`jited_ksyms`, `jited_func_lens`): /proc/kallsyms lists them too but
//! without sizes, and printing it takes ~45 ms. A program's functions are named as the
//! kernel names them: `bpf_prog_<tag>_<name>`, the tag the function's own, the name its
//! BTF function's (the program's name, cut at 15 bytes, when it has no BTF).

use std::{collections::HashMap, os::fd::FromRawFd};

use anyhow::{Result, bail};

/// One JITed function of a loaded program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgFunc {
    pub start: u64,
    pub len: u32,
    pub name: String,
    pub prog_id: u32,
}

/// Every function of every program loaded now, sorted by address. Programs that go away
/// while they are read are left out.
pub fn loaded() -> Result<Vec<ProgFunc>> {
    let mut out = Vec::new();
    let mut btfs: HashMap<u32, Option<btf_rs::Btf>> = HashMap::new();
    let mut id = 0;
    while let Some(next) = next_id(id)? {
        id = next;
        if let Some(fd) = prog_fd(id) {
            out.extend(functions(&fd, id, &mut btfs).unwrap_or_default());
        }
    }
    out.sort_by_key(|f| f.start);
    Ok(out)
}

/// The function of `funcs` (sorted) that holds `addr`.
pub fn find(funcs: &[ProgFunc], addr: u64) -> Option<&ProgFunc> {
    let i = funcs.partition_point(|f| f.start <= addr).checked_sub(1)?;
    let f = &funcs[i];
    (addr < f.start + u64::from(f.len)).then_some(f)
}

const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;

/// The `bpf_attr` of the by-id commands: an id, the next id, open flags.
#[repr(C)]
#[derive(Default)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// The `bpf_attr` of BPF_OBJ_GET_INFO_BY_FD.
#[repr(C)]
struct InfoAttr {
    fd: u32,
    info_len: u32,
    info: u64,
}

/// The start of `struct bpf_btf_info`.
#[repr(C)]
#[derive(Default)]
struct BtfInfo {
    btf: u64,
    btf_size: u32,
    id: u32,
}

fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, writable bpf_attr prefix of the size passed.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, size_of::<A>()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

fn next_id(after: u32) -> Result<Option<u32>> {
    let mut a = IdAttr {
        id: after,
        ..Default::default()
    };
    match bpf(BPF_PROG_GET_NEXT_ID, &mut a) {
        Ok(_) => Ok(Some(a.next_id)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => bail!("listing the loaded BPF programs: {e}"),
    }
}

fn fd_of(cmd: libc::c_long, id: u32) -> Option<std::os::fd::OwnedFd> {
    let mut a = IdAttr {
        id,
        ..Default::default()
    };
    let fd = bpf(cmd, &mut a).ok()?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

fn prog_fd(id: u32) -> Option<std::os::fd::OwnedFd> {
    fd_of(BPF_PROG_GET_FD_BY_ID, id)
}

fn info<T>(fd: &std::os::fd::OwnedFd, info: &mut T) -> Result<()> {
    use std::os::fd::AsRawFd;
    let mut a = InfoAttr {
        fd: fd.as_raw_fd() as u32,
        info_len: size_of::<T>() as u32,
        info: info as *mut T as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    Ok(())
}

type ProgInfo = aya_obj::generated::bpf_prog_info;

/// The program's functions: a first call for the counts, a second for the arrays.
fn functions(
    fd: &std::os::fd::OwnedFd,
    id: u32,
    btfs: &mut HashMap<u32, Option<btf_rs::Btf>>,
) -> Result<Vec<ProgFunc>> {
    // SAFETY: bpf_prog_info is plain integers and arrays, valid when zeroed.
    let mut counts: ProgInfo = unsafe { std::mem::zeroed() };
    info(fd, &mut counts)?;
    let n = counts.nr_jited_ksyms as usize;
    let rec = counts.func_info_rec_size.max(8) as usize;
    let nfi = counts.nr_func_info as usize;
    let (mut ksyms, mut lens) = (vec![0u64; n], vec![0u32; n]);
    let (mut tags, mut finfo) = (vec![[0u8; 8]; n], vec![0u8; nfi * rec]);
    // SAFETY: as above.
    let mut want: ProgInfo = unsafe { std::mem::zeroed() };
    want.nr_jited_ksyms = n as u32;
    want.jited_ksyms = ksyms.as_mut_ptr() as u64;
    want.nr_jited_func_lens = n as u32;
    want.jited_func_lens = lens.as_mut_ptr() as u64;
    want.nr_prog_tags = n as u32;
    want.prog_tags = tags.as_mut_ptr() as u64;
    want.nr_func_info = nfi as u32;
    want.func_info_rec_size = rec as u32;
    want.func_info = finfo.as_mut_ptr() as u64;
    info(fd, &mut want)?;
    let btf = btfs
        .entry(counts.btf_id)
        .or_insert_with(|| program_btf(counts.btf_id));
    let own_name = c_name(&counts.name);
    let names = (0..n).map(|i| {
        let type_id = (i < nfi).then(|| u32_at(&finfo, i * rec + 4));
        func_name(btf.as_ref(), type_id).unwrap_or_else(|| own_name.clone())
    });
    Ok(names
        .enumerate()
        .filter(|&(i, _)| ksyms[i] != 0)
        .map(|(i, name)| ProgFunc {
            start: ksyms[i],
            len: lens[i],
            // The main function goes by the program's tag, as kallsyms lists it; the
            // others by their own.
            name: format!(
                "bpf_prog_{}_{name}",
                hex(if i == 0 { &counts.tag } else { &tags[i] })
            ),
            prog_id: id,
        })
        .collect())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn c_name(name: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn hex(tag: &[u8; 8]) -> String {
    tag.iter().map(|b| format!("{b:02x}")).collect()
}

/// The name of BTF function `type_id`.
fn func_name(btf: Option<&btf_rs::Btf>, type_id: Option<u32>) -> Option<String> {
    let btf = btf?;
    match btf.resolve_type_by_id(type_id?).ok()? {
        btf_rs::Type::Func(f) => btf.resolve_name(&f).ok(),
        _ => None,
    }
}

/// A program's BTF, read from the kernel (programs' BTF stands alone).
fn program_btf(btf_id: u32) -> Option<btf_rs::Btf> {
    if btf_id == 0 {
        return None;
    }
    let fd = fd_of(BPF_BTF_GET_FD_BY_ID, btf_id)?;
    let mut sized = BtfInfo::default();
    info(&fd, &mut sized).ok()?;
    let mut bytes = vec![0u8; sized.btf_size as usize];
    let mut whole = BtfInfo {
        btf: bytes.as_mut_ptr() as u64,
        btf_size: sized.btf_size,
        id: 0,
    };
    info(&fd, &mut whole).ok()?;
    btf_rs::Btf::from_bytes(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_need_an_address_inside_the_function() {
        let f = |start, len, name: &str| ProgFunc {
            start,
            len,
            name: name.into(),
            prog_id: 1,
        };
        let funcs = vec![f(0x1000, 0x40, "a"), f(0x2000, 0x10, "b")];
        assert_eq!(find(&funcs, 0xfff), None);
        assert_eq!(find(&funcs, 0x1000).map(|f| &*f.name), Some("a"));
        assert_eq!(find(&funcs, 0x103f).map(|f| &*f.name), Some("a"));
        assert_eq!(find(&funcs, 0x1040), None);
        assert_eq!(find(&funcs, 0x200f).map(|f| &*f.name), Some("b"));
        assert_eq!(find(&funcs, 0x2010), None);
    }
}
