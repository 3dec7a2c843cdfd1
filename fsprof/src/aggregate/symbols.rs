//! Addresses → function names with blazesym: kernel frames from /proc/kallsyms, user
//! frames from the ELF files' symbols by file offset (the unwinder recorded each frame's
//! file, so a process that has exited is still symbolized). A frame that cannot be named
//! keeps its file and offset; it is never dropped.

use std::{
    cell::RefCell,
    collections::HashMap,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Kernel, Source},
};
use fsprof_common::unwind::FileKey;

use crate::probes::{
    kept::{self, Kept},
    unwind::file_key,
};

/// (device, inode) → path, for files the unwind tables did not name (their process was
/// gone before fsprof looked): the usual binary and library directories are scanned
/// lazily, most likely first, until the file turns up.
struct FileIndex {
    paths: HashMap<FileKey, PathBuf>,
    /// A stack of what is still to look at: (file, 0) or (directory, levels to list).
    pending: Vec<(PathBuf, u32)>,
}

/// Scanned in this order (depth below each).
const SCAN_DIRS: &[(&str, u32)] = &[
    ("/usr/lib/x86_64-linux-gnu", 0),
    ("/usr/bin", 0),
    ("/usr/sbin", 0),
    ("/usr/lib64", 0),
    ("/usr/local/bin", 0),
    ("/usr/lib/x86_64-linux-gnu", 2),
    ("/usr/lib", 2),
    ("/usr/local/lib", 2),
    ("/usr/lib/postgresql", 3),
];

impl FileIndex {
    fn new() -> FileIndex {
        let mut pending: Vec<(PathBuf, u32)> = SCAN_DIRS
            .iter()
            .rev()
            .map(|&(d, depth)| (PathBuf::from(d), depth + 1))
            .collect();
        // The files fsprof maps itself (its program, libc, the loader) first: a child it
        // forks runs them before it execs.
        if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
            let own = maps.lines().filter_map(|l| l.split_whitespace().nth(5));
            pending.extend(
                own.filter(|p| p.starts_with('/'))
                    .map(|p| (PathBuf::from(p), 0)),
            );
        }
        FileIndex {
            paths: HashMap::new(),
            pending,
        }
    }

    fn find(&mut self, key: FileKey) -> Option<PathBuf> {
        while !self.paths.contains_key(&key) {
            let (path, depth) = self.pending.pop()?;
            if depth == 0 {
                if let Ok(k) = file_key(&path) {
                    self.paths.entry(k).or_insert(path);
                }
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
                } else if ft.is_file() {
                    files.push((e.path(), 0));
                }
            }
            // A stack: this directory's files are looked at before its subdirectories.
            self.pending.append(&mut dirs);
            self.pending.append(&mut files);
        }
        self.paths.get(&key).cloned()
    }
}

/// The kernel's text symbols, copied from /proc/kallsyms once a boot (`probes::kept`):
/// blazesym reads the copy in ~12 ms where /proc/kallsyms takes ~45 ms of kernel time to
/// print. The copy depends on the modules loaded, which are part of its key, and on
/// nothing of fsprof's, so every fsprof of the boot shares it. It is kept open and named to
/// blazesym by its descriptor: blazesym opens it again at every lookup, and another
/// fsprof may replace it meanwhile (the modules changed). BPF programs' symbols (`[bpf]`)
/// are left out, as are data symbols: programs come and go, and an address in one loaded
/// since would be named by a stale neighbour.
fn kept_kallsyms() -> Option<(std::fs::File, PathBuf)> {
    // A kernel without module support has no /proc/modules.
    let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
    // Name, size and address: the reference count changes while a module stays.
    let loaded: Vec<String> = modules
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            [f.first(), f.get(1), f.last()]
                .map(|x| *x.unwrap_or(&""))
                .join(" ")
        })
        .collect();
    let kept = Kept::of_boot(kept::KALLSYMS, &loaded.join("\n"))?;
    if !kept.exists() {
        let all = std::fs::read_to_string("/proc/kallsyms").ok()?;
        let text: String = all
            .lines()
            .filter(|l| is_text_symbol(l) && !l.ends_with("[bpf]"))
            .flat_map(|l| [l, "\n"])
            .collect();
        kept.write(text.as_bytes());
    }
    let file = std::fs::File::open(kept.path()).ok()?;
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    Some((file, path))
}

/// A kallsyms line of a code symbol (type t, T, w or W).
fn is_text_symbol(line: &str) -> bool {
    matches!(line.split_whitespace().nth(1), Some("t" | "T" | "w" | "W"))
}

/// A kernel-half address: naming it makes blazesym read the kernel's symbols.
const KERNEL_PROBE_ADDR: u64 = 0xffff_ffff_8100_0000;

/// Process-wide symbol state: blazesym caches parsed files, and `fsprof run` symbolizes
/// hundreds of cells.
pub struct Symbols {
    symbolizer: Symbolizer,
    /// The kept copy of the kernel's text symbols, open, and its name through the
    /// descriptor; None: /proc/kallsyms itself.
    kallsyms: Option<(std::fs::File, PathBuf)>,
    kernel: HashMap<u64, String>,
    user: HashMap<(PathBuf, u64), String>,
    index: FileIndex,
}

thread_local! {
    /// Never dropped: freeing the kernel's ~120k symbols took 6 ms of every exit, and a
    /// thread's symbols serve it to the end.
    static SYMBOLS: std::mem::ManuallyDrop<RefCell<Symbols>> =
        std::mem::ManuallyDrop::new(RefCell::new(Symbols::new()));
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
        Symbols {
            symbolizer: Symbolizer::builder().enable_code_info(false).build(),
            kallsyms: kept_kallsyms(),
            kernel: HashMap::new(),
            user: HashMap::new(),
            index: FileIndex::new(),
        }
    }

    /// Makes the paths the unwind tables were loaded from known.
    pub fn know_files(&mut self, paths: &std::collections::BTreeMap<FileKey, PathBuf>) {
        for (k, p) in paths {
            if p.is_absolute() {
                self.index.paths.insert(*k, p.clone());
            }
        }
    }

    /// Reads the kernel's symbols now (blazesym keeps them), so naming the first stack later
    /// does not wait ~45 ms for /proc/kallsyms.
    pub fn read_kernel_symbols(&mut self) {
        self.kernel(&[KERNEL_PROBE_ADDR]);
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
            let kallsyms = match &self.kallsyms {
                Some((_, p)) => blazesym::MaybeDefault::Some(p.clone()),
                None => blazesym::MaybeDefault::Default,
            };
            let src = Source::Kernel(Kernel {
                kallsyms,
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
        // Debug information first (a separate debug file under /usr/lib/debug, by build id
        // or .gnu_debuglink, names static functions too), then the file's own symbols:
        // blazesym's DWARF path finds nothing when the debug file is not installed.
        let name = [true, false]
            .into_iter()
            .find_map(|debug_syms| {
                let mut elf = Elf::new(path);
                elf.debug_syms = debug_syms;
                self.symbolizer
                    .symbolize_single(&Source::Elf(elf), Input::FileOffset(offset))
                    .ok()
                    .as_ref()
                    .and_then(name_of)
            })
            .unwrap_or_else(|| format!("{}+0x{offset:x}", file_name(path)));
        self.user.insert((path.to_path_buf(), offset), name.clone());
        name
    }

    /// The path of a file frames are in, where one is known.
    pub fn path_of(&mut self, file: FileKey) -> Option<PathBuf> {
        self.index.find(file)
    }

    /// The name of the code at file offset `offset` of `file` (a caller's frame points
    /// after its call instruction: `leaf` false looks up the byte before).
    pub fn user(&mut self, file: FileKey, offset: u64, leaf: bool) -> String {
        let offset = offset.saturating_sub(u64::from(!leaf));
        match self.index.find(file) {
            Some(path) => self.elf_offset(&path, offset),
            None => format!("[dev {:x} inode {}]+0x{offset:x}", file.dev, file.ino),
        }
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

    /// A stripped library with a .gnu_debuglink whose debug file is not installed (libc on
    /// Debian) is still named from its dynamic symbols.
    #[test]
    fn stripped_library_functions_resolve_by_dynamic_symbols() {
        let libc = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("libc.so"))
            .map(PathBuf::from)
            .expect("libc mapped");
        let key = file_key(&libc).unwrap();
        let at = file_offset(libc_read_address());
        with(|s| {
            s.know_files(&[(key, libc.clone())].into_iter().collect());
            let name = s.user(key, at + 4, true);
            assert!(name.ends_with("read"), "{name}");
        });
    }

    fn libc_read_address() -> u64 {
        libc::read as *const () as u64
    }

    #[test]
    fn own_functions_resolve_by_file_and_offset() {
        assert_eq!(a_function_to_find(), 7);
        let addr = a_function_to_find as *const () as u64;
        let me = std::env::current_exe().unwrap();
        let key = file_key(&me).unwrap();
        let want = "a_function_to_find";
        with(|s| {
            s.know_files(&[(key, me.clone())].into_iter().collect());
            // The leaf frame is looked up as is, a caller's one byte before.
            let leaf = s.user(key, file_offset(addr + 1), true);
            assert!(leaf.ends_with(want), "{leaf:?}");
            let caller = s.user(key, file_offset(addr + 2), false);
            assert!(caller.ends_with(want), "{caller:?}");
            let nowhere = FileKey {
                dev: 0,
                _pad: 0,
                ino: 1,
            };
            assert!(s.user(nowhere, 16, true).starts_with("[dev 0 inode 1]"));
        });
    }
}
