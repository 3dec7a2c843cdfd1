//! Addresses → function names: kernel frames from /proc/kallsyms (`kallsyms`), user
//! frames with blazesym from the ELF files' symbols by file offset (the unwinder recorded
//! each frame's file, so a process that has exited is still symbolized). A frame that
//! cannot be named keeps its file and offset; it is never dropped.

use std::{
    cell::RefCell,
    collections::HashMap,
    path::{Path, PathBuf},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};
use fsprof_common::unwind::FileKey;

use super::kallsyms::KernelSymbols;
use crate::probes::{
    kept::{self, Kept},
    prog_symbols::{self, ProgFunc, find as find_program},
    unwind::file_key,
};

/// Where a frame's code is, for exports that carry addresses (pprof): a kernel address,
/// an offset in a file, or nowhere (frames fsprof names: markers, the probes' frame).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum At {
    #[default]
    Nowhere,
    Kernel(u64),
    File(FileKey, u64),
}

/// Frames root first with where each one's code is (`at[i]` of `names[i]`; an `at`
/// shorter than `names`, as tests build them, leaves the rest nowhere).
pub fn located<'a>(names: &'a [String], at: &'a [At]) -> impl Iterator<Item = (&'a str, At)> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), at.get(i).copied().unwrap_or_default()))
}

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

/// The kernel's text symbols, kept once a boot (`probes::kept`) in `KernelSymbols`' form
/// and mapped: /proc/kallsyms takes ~45 ms of kernel time to print. The copy depends on
/// the modules loaded, which are part of its key, and on nothing of fsprof's, so every
/// fsprof of the boot shares it; another that finds the modules changed replaces it by a
/// rename, which leaves this one's mapping whole.
fn kernel_symbols(modules: &str) -> KernelSymbols {
    let kept = Kept::of_boot(kept::KALLSYMS, &module_key(modules));
    if let Some(s) = kept.as_ref().and_then(|k| KernelSymbols::map(k.path())) {
        return s;
    }
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let syms = KernelSymbols::from_text(&text, modules);
    if let Some(k) = kept {
        k.write(syms.bytes());
    }
    syms
}

/// /proc/modules' text; empty for a kernel without module support.
fn modules_loaded() -> String {
    std::fs::read_to_string("/proc/modules").unwrap_or_default()
}

/// Each module's name, size and address (its reference count changes while it stays).
fn module_key(modules: &str) -> String {
    let loaded: Vec<String> = modules
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            [f.first(), f.get(1), f.last()]
                .map(|x| *x.unwrap_or(&""))
                .join(" ")
        })
        .collect();
    loaded.join("\n")
}

/// Process-wide symbol state: blazesym caches parsed files, and `fsprof run` symbolizes
/// hundreds of cells.
pub struct Symbols {
    symbolizer: Symbolizer,
    /// The kernel's text symbols, read at the first kernel address, and the modules
    /// they were read with.
    kallsyms: Option<(KernelSymbols, String)>,
    /// Names from `kallsyms` (None: in no function), valid while its modules stay.
    kernel: HashMap<u64, Option<String>>,
    /// The BPF programs' functions, read once a trace at the first address they may hold
    /// (programs come and go, and their addresses are used again).
    programs: Option<Vec<ProgFunc>>,
    /// Kernel addresses of this trace that no function holds.
    unnamed: std::collections::BTreeSet<u64>,
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

/// How a kernel address no function holds is shown: never by a neighbour's name.
pub const UNNAMED_KERNEL: &str = "[kernel]";

impl Symbols {
    fn new() -> Symbols {
        Symbols {
            symbolizer: Symbolizer::builder().enable_code_info(false).build(),
            kallsyms: None,
            kernel: HashMap::new(),
            programs: None,
            unnamed: Default::default(),
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

    /// Reads the kernel's symbols now, so naming the first stack later does not wait.
    pub fn read_kernel_symbols(&mut self) -> &KernelSymbols {
        &self
            .kallsyms
            .get_or_insert_with(|| {
                let modules = modules_loaded();
                (kernel_symbols(&modules), modules)
            })
            .0
    }

    /// A new trace's addresses follow: the BPF programs are read again when needed, and
    /// the unnamed addresses counted afresh.
    pub fn new_trace(&mut self) {
        self.programs = None;
        self.unnamed.clear();
    }

    /// Kernel addresses of this trace that no function holds, shown as `[kernel] 0x…`.
    pub fn unnamed_kernel(&self) -> u64 {
        self.unnamed.len() as u64
    }

    /// Names of kernel addresses, in order: the function that holds each (a BPF program's
    /// as the kernel names it), else `[kernel] 0x…`.
    pub fn kernel(&mut self, addrs: &[u64]) -> Vec<String> {
        addrs.iter().map(|&a| self.kernel_name(a)).collect()
    }

    fn kernel_name(&mut self, a: u64) -> String {
        let past_image = self.read_kernel_symbols().past_image(a);
        if past_image && let Some(f) = find_program(self.programs(), a) {
            return f.name.clone();
        }
        if let Some(name) = self.kallsyms_name(a) {
            return name;
        }
        // A module loaded since the table was read (mkfs and mount load them).
        if past_image
            && self
                .kallsyms
                .as_ref()
                .is_some_and(|k| k.1 != modules_loaded())
        {
            self.kallsyms = None;
            self.kernel.clear();
            if let Some(name) = self.kallsyms_name(a) {
                return name;
            }
        }
        self.unnamed.insert(a);
        format!("{UNNAMED_KERNEL} 0x{a:x}")
    }

    fn kallsyms_name(&mut self, a: u64) -> Option<String> {
        if let Some(n) = self.kernel.get(&a) {
            return n.clone();
        }
        let name = self.read_kernel_symbols().find(a).map(String::from);
        self.kernel.insert(a, name.clone());
        name
    }

    /// The id of the BPF program whose code holds `a`.
    pub fn program_at(&mut self, a: u64) -> Option<u32> {
        if !self.read_kernel_symbols().past_image(a) {
            return None;
        }
        find_program(self.programs(), a).map(|f| f.prog_id)
    }

    fn programs(&mut self) -> &[ProgFunc] {
        self.programs
            .get_or_insert_with(|| prog_symbols::loaded().unwrap_or_default())
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
        let Some(text) = kallsyms_for("kernel_symbols_resolve") else {
            return;
        };
        let line = text.lines().find(|l| l.ends_with(" io_schedule"));
        let addr = u64::from_str_radix(line.unwrap().split(' ').next().unwrap(), 16).unwrap();
        with(|s| {
            assert_eq!(s.kernel(&[addr + 1]), ["io_schedule"]);
            assert_eq!(s.kernel(&[1]), ["[kernel] 0x1"]);
        });
    }

    /// The mapped table names code addresses as blazesym's kallsyms reader does (which it
    /// replaced) wherever it names one: every 97th function's start, the byte before and
    /// the byte after. Where it names none, the entry before is a hole (blazesym names the
    /// previous function there, which does not hold the address).
    #[test]
    fn kernel_symbols_name_what_blazesym_names() {
        use super::super::kallsyms::code_symbol;
        use blazesym::symbolize::source::Kernel;
        let Some(text) = kallsyms_for("kernel_symbols_name_what_blazesym_names") else {
            return;
        };
        let ours = KernelSymbols::from_text(&text, &modules_loaded());
        // blazesym reads the lines the table keeps as functions.
        let kept = || text.lines().filter(|l| code_symbol(l).is_some());
        let text_syms: String = kept().flat_map(|l| [l, "\n"]).collect();
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("kallsyms");
        std::fs::write(&copy, &text_syms).unwrap();
        let mut starts: Vec<u64> = kept().filter_map(|l| Some(code_symbol(l)?.0)).collect();
        starts.sort_unstable();
        let addrs: Vec<u64> = starts
            .iter()
            .step_by(97)
            .flat_map(|&a| [a - 1, a, a + 1])
            .collect();
        let src = Source::Kernel(Kernel {
            kallsyms: blazesym::MaybeDefault::Some(copy),
            vmlinux: blazesym::MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        });
        let symbolizer = Symbolizer::new();
        let theirs = symbolizer.symbolize(&src, Input::AbsAddr(&addrs)).unwrap();
        // Aliases (same start) are one function: blazesym takes the first listed but
        // within the first group, where its backward scan runs off the start; we skip
        // `__pi_` copies.
        let start_of: HashMap<&str, u64> = kept()
            .filter_map(code_symbol)
            .map(|(a, n)| (n, a))
            .collect();
        let (mut differ, mut holes) = (0, 0);
        for (a, t) in addrs.iter().zip(&theirs) {
            let theirs = t.as_sym().map(|s| start_of.get(&*s.name));
            match ours.find(*a) {
                None if starts.binary_search(a).is_err() => holes += 1,
                mine if theirs != mine.map(|m| start_of.get(m)) => differ += 1,
                _ => {}
            }
        }
        assert_eq!(differ, 0, "of {} addresses", addrs.len());
        // A hole is rare: before a function that follows data or a section's end.
        assert!(
            holes * 20 < addrs.len(),
            "{holes} of {} in holes",
            addrs.len()
        );
    }

    /// /proc/kallsyms when it shows addresses (root, or kptr_restrict 0).
    fn readable_kallsyms() -> Option<String> {
        let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
        text.lines()
            .any(|l| code_symbol_addr(l) != 0)
            .then_some(text)
    }

    /// /proc/kallsyms for `test`, which fails without it (see `test_support::needs`).
    fn kallsyms_for(test: &str) -> Option<String> {
        let text = readable_kallsyms();
        let what = "/proc/kallsyms with addresses (root)";
        match crate::test_support::needs(test, what, text.is_some()) {
            true => text,
            false => None,
        }
    }

    fn code_symbol_addr(l: &str) -> u64 {
        super::super::kallsyms::code_symbol(l).map_or(0, |(a, _)| a)
    }

    /// No address past the kernel image's end is named by `_einittext` (or any boundary
    /// mark): the regression that named every BPF frame so.
    #[test]
    fn no_address_is_named_by_a_boundary_mark() {
        let Some(text) = kallsyms_for("no_address_is_named_by_a_boundary_mark") else {
            return;
        };
        let ours = KernelSymbols::from_text(&text, &modules_loaded());
        let marks = text.lines().filter_map(|l| {
            let mut f = l.split_whitespace();
            let (a, _, n) = (f.next()?, f.next()?, f.next()?);
            super::super::kallsyms::is_boundary(n).then(|| u64::from_str_radix(a, 16).ok())?
        });
        let mut n = 0;
        for a in marks {
            for at in [a, a + 1, a + 0x1000, a + 0x100000] {
                let name = ours.find(at).unwrap_or("");
                assert!(
                    !super::super::kallsyms::is_boundary(name),
                    "0x{at:x}: {name}"
                );
                n += 1;
            }
        }
        assert!(n > 0, "no boundary marks in /proc/kallsyms");
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
