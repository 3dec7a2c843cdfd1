//! Addresses → function names with blazesym: kernel frames from /proc/kallsyms, user
//! frames from the ELF files' symbols, found by the build id the kernel recorded (so a
//! process that has exited is still symbolized). A frame that cannot be resolved keeps its
//! module and offset, or its address; it is never dropped.

use std::{
    cell::RefCell,
    collections::HashMap,
    path::{Path, PathBuf},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Kernel, Process, Source},
};
use fsprof_common::{BUILD_ID_VALID, BuildIdFrame};

/// Build id → the ELF file that has it. Filled from the files fsprof knows (the target's
/// executable, the libraries fsprof itself maps) and, on a miss, by scanning the usual
/// binary and library directories lazily, most likely first, until the id turns up: over a
/// VM's 9p root every file read is a round trip, and most misses are libc's or a tool's in
/// /usr/bin.
struct BuildIdIndex {
    paths: HashMap<Vec<u8>, PathBuf>,
    /// A stack of what is still to look at: (file, 0) or (directory, levels to list).
    pending: Vec<(PathBuf, u32)>,
    /// Files whose build id was read (a directory may be listed twice, shallow first).
    read: std::collections::HashSet<PathBuf>,
}

/// Scanned in this order (depth below each).
const SCAN_DIRS: &[(&str, u32)] = &[
    ("/usr/lib/x86_64-linux-gnu", 0),
    ("/usr/lib/aarch64-linux-gnu", 0),
    ("/usr/bin", 0),
    ("/usr/sbin", 0),
    ("/usr/lib64", 0),
    ("/usr/local/bin", 0),
    ("/usr/lib/x86_64-linux-gnu", 2),
    ("/usr/lib/aarch64-linux-gnu", 2),
    ("/usr/lib", 2),
    ("/usr/local/lib", 2),
    ("/usr/lib/postgresql", 3),
];

/// The kernel stores build ids in a 20-byte field, zero-padded.
fn key(id: &[u8]) -> Vec<u8> {
    let mut k = id[..id.len().min(20)].to_vec();
    while k.last() == Some(&0) {
        k.pop();
    }
    k
}

fn is_elf_candidate(e: &std::fs::DirEntry) -> bool {
    let exec = e
        .metadata()
        .is_ok_and(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0);
    exec || e.file_name().to_string_lossy().contains(".so")
}

impl BuildIdIndex {
    fn new() -> BuildIdIndex {
        let mut index = BuildIdIndex {
            paths: HashMap::new(),
            pending: SCAN_DIRS
                .iter()
                .rev()
                .map(|&(d, depth)| (PathBuf::from(d), depth + 1))
                .collect(),
            read: Default::default(),
        };
        index.add_own_mappings();
        index
    }

    fn add(&mut self, path: &Path) {
        if !self.read.insert(path.to_path_buf()) {
            return;
        }
        if let Ok(Some(id)) = blazesym::helper::read_elf_build_id(path) {
            self.paths
                .entry(key(&id))
                .or_insert_with(|| path.to_path_buf());
        }
    }

    /// The ELF files this process maps (libc, the loader, …): the target most likely
    /// maps the same ones.
    fn add_own_mappings(&mut self) {
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return;
        };
        for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
            if path.starts_with('/') {
                self.add(Path::new(path));
            }
        }
    }

    fn find(&mut self, id: &[u8]) -> Option<PathBuf> {
        let k = key(id);
        while !self.paths.contains_key(&k) {
            let (path, depth) = self.pending.pop()?;
            if depth == 0 {
                self.add(&path);
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&path) else {
                continue;
            };
            let (mut dirs, mut files) = (Vec::new(), Vec::new());
            for e in entries.flatten() {
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_dir() && depth > 1 {
                    dirs.push((e.path(), depth - 1));
                } else if ft.is_file() && is_elf_candidate(&e) {
                    files.push((e.path(), 0));
                }
            }
            // A stack: this directory's files are looked at before its subdirectories.
            self.pending.append(&mut dirs);
            self.pending.append(&mut files);
        }
        self.paths.get(&k).cloned()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Process-wide symbol state: blazesym caches parsed files, and `fsprof run` symbolizes
/// hundreds of cells.
pub struct Symbols {
    symbolizer: Symbolizer,
    kernel: HashMap<u64, String>,
    user: HashMap<(PathBuf, u64), String>,
    index: BuildIdIndex,
    file_lens: HashMap<[u8; 20], Option<u64>>,
}

thread_local! {
    static SYMBOLS: RefCell<Symbols> = RefCell::new(Symbols::new());
}

/// Runs `f` with this thread's symbol state (blazesym's symbolizer is not Send).
pub fn with<R>(f: impl FnOnce(&mut Symbols) -> R) -> R {
    SYMBOLS.with(|s| f(&mut s.borrow_mut()))
}

fn name_of(s: &Symbolized) -> Option<String> {
    s.as_sym().map(|sym| sym.name.to_string())
}

impl Symbols {
    fn new() -> Symbols {
        let index = BuildIdIndex::new();
        Symbols {
            symbolizer: Symbolizer::builder().enable_code_info(false).build(),
            kernel: HashMap::new(),
            user: HashMap::new(),
            index,
            file_lens: HashMap::new(),
        }
    }

    /// Makes `path`'s build id known (the target's executable, say).
    pub fn know_file(&mut self, path: &Path) {
        self.index.add(path);
    }

    /// Length of the file with this build id, if one is known.
    pub fn file_len(&mut self, build_id: &[u8; 20]) -> Option<u64> {
        if let Some(len) = self.file_lens.get(build_id) {
            return *len;
        }
        let len = self
            .index
            .find(build_id)
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.len());
        self.file_lens.insert(*build_id, len);
        len
    }

    /// Names of kernel addresses, in order; unknown ones as hex addresses.
    pub fn kernel(&mut self, addrs: &[u64]) -> Vec<String> {
        let missing: Vec<u64> = {
            let mut m: Vec<u64> = addrs
                .iter()
                .copied()
                .filter(|a| !self.kernel.contains_key(a))
                .collect();
            m.sort_unstable();
            m.dedup();
            m
        };
        if !missing.is_empty() {
            let src = Source::Kernel(Kernel {
                vmlinux: blazesym::MaybeDefault::None,
                debug_syms: false,
                ..Kernel::default()
            });
            let names = self
                .symbolizer
                .symbolize(&src, Input::AbsAddr(&missing))
                .unwrap_or_default();
            for (i, a) in missing.iter().enumerate() {
                let n = names
                    .get(i)
                    .and_then(name_of)
                    .unwrap_or_else(|| format!("0x{a:x}"));
                self.kernel.insert(*a, n);
            }
        }
        addrs.iter().map(|a| self.kernel[a].clone()).collect()
    }

    fn elf_offset(&mut self, path: &Path, offset: u64) -> String {
        if let Some(n) = self.user.get(&(path.to_path_buf(), offset)) {
            return n.clone();
        }
        let src = Source::Elf(Elf::new(path));
        let name = self
            .symbolizer
            .symbolize_single(&src, Input::FileOffset(offset))
            .ok()
            .as_ref()
            .and_then(name_of)
            .unwrap_or_else(|| format!("{}+0x{offset:x}", file_name(path)));
        self.user.insert((path.to_path_buf(), offset), name.clone());
        name
    }

    /// Names of user frames (leaf first). `build_ids` (when the kernel recorded them) give
    /// file and offset; otherwise the live process's maps are used, if it still runs.
    pub fn user(
        &mut self,
        tgid: u32,
        ips: &[u64],
        build_ids: Option<&[BuildIdFrame]>,
    ) -> Vec<String> {
        let mut out = Vec::with_capacity(ips.len());
        for (i, &ip) in ips.iter().enumerate() {
            // Callers' frames are return addresses: look up the call instruction.
            let adj = u64::from(i > 0);
            let frame = build_ids
                .and_then(|b| b.get(i))
                .filter(|f| f.status == BUILD_ID_VALID);
            let by_id = frame.map(|f| match self.index.find(&f.build_id) {
                Some(p) => self.elf_offset(&p, f.offset_or_ip.saturating_sub(adj)),
                None => {
                    let k = key(&f.build_id);
                    format!(
                        "[build-id {}]+0x{:x}",
                        hex(&k[..k.len().min(4)]),
                        f.offset_or_ip
                    )
                }
            });
            let name = by_id.unwrap_or_else(|| {
                let src = Source::Process(Process::new(tgid.into()));
                self.symbolizer
                    .symbolize_single(&src, Input::AbsAddr(ip.saturating_sub(adj)))
                    .ok()
                    .as_ref()
                    .and_then(name_of)
                    .unwrap_or_else(|| format!("[unknown] 0x{ip:x}"))
            });
            out.push(name);
        }
        out
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_symbols_resolve() {
        let Ok(text) = std::fs::read_to_string("/proc/kallsyms") else {
            return;
        };
        let Some(line) = text.lines().find(|l| l.ends_with(" io_schedule")) else {
            return;
        };
        let addr = u64::from_str_radix(line.split(' ').next().unwrap(), 16).unwrap();
        if addr == 0 {
            return; // kptr_restrict hides addresses from this user
        }
        with(|s| {
            assert_eq!(s.kernel(&[addr + 1]), ["io_schedule"]);
            assert_eq!(s.kernel(&[1]), ["0x1"]);
        });
    }

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(7)
    }

    /// File offset of `addr` in this process, from the mapping that holds it.
    fn file_offset(addr: u64) -> u64 {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for l in maps.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (lo, hi) = f[0].split_once('-').unwrap();
            let (lo, hi) = (
                u64::from_str_radix(lo, 16).unwrap(),
                u64::from_str_radix(hi, 16).unwrap(),
            );
            if (lo..hi).contains(&addr) {
                return addr - lo + u64::from_str_radix(f[2], 16).unwrap();
            }
        }
        panic!("0x{addr:x} in no mapping");
    }

    #[test]
    fn own_functions_resolve_by_build_id_and_by_process() {
        assert_eq!(a_function_to_find(), 7);
        let addr = a_function_to_find as *const () as u64;
        let me = std::env::current_exe().unwrap();
        let id: [u8; 20] = blazesym::helper::read_elf_build_id(&me)
            .unwrap()
            .expect("test binary has no build id")
            .as_ref()
            .try_into()
            .unwrap();
        let frame = BuildIdFrame {
            status: BUILD_ID_VALID,
            build_id: id,
            offset_or_ip: file_offset(addr + 1),
        };
        let want = "a_function_to_find";
        with(|s| {
            // The leaf frame is looked up as is; an address inside the function resolves too.
            let by_id = s.user(0, &[addr + 1], Some(&[frame]));
            assert!(by_id[0].ends_with(want), "{by_id:?}");
            let by_pid = s.user(std::process::id(), &[addr + 1], None);
            assert!(by_pid[0].ends_with(want), "{by_pid:?}");
        });
    }
}
