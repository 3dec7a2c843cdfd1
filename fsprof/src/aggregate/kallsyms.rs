//! The kernel's text symbols, sorted by address, as one block of bytes that a lookup
//! searches in place: the copy kept for the boot is mapped, not parsed. blazesym parsed
//! its text copy (~121k lines) at every start, 15–40 ms of a CPU that aya's BTF parse
//! needed at the same time (timestamps through a start).
//!
//! Layout, native-endian: MAGIC, the count n, where the kernel image's entries end, n
//! addresses (u64, ascending; equal ones in
//! /proc/kallsyms' order), n name ends (u32 offsets into the names), then the names. An
//! empty name is a hole: kallsyms has no sizes, so a function ends at the next entry, and
//! where code ends (a section's end, a module's end) a hole says so: an address past
//! the last function of a region is named by nothing, never by that function.

use std::path::Path;

const MAGIC: &[u8; 16] = b"fsprof-ksyms-v2\n";
const HEADER: usize = MAGIC.len() + 16;

/// What a kallsyms line puts in the table: a function starting at an address, or a hole
/// (from there on, until the next function, no function is known).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    Function(u64, &'a str),
    Hole(u64),
}

impl Entry<'_> {
    fn addr(&self) -> u64 {
        match *self {
            Entry::Function(a, _) | Entry::Hole(a) => a,
        }
    }
}

/// The entry of a kallsyms line: code symbols (types t, T, w, W) are functions but for
/// the linker's boundary marks, which, like data symbols, only end the function before
/// them. BPF programs' lines are left out: they come and go, and are looked up live
/// (`probes::prog_symbols`) with their sizes. None for lines without an address.
pub fn entry(line: &str) -> Option<Entry<'_>> {
    if line.ends_with("[bpf]") {
        return None;
    }
    let mut t = line.split_ascii_whitespace();
    let (addr, kind, name) = (t.next()?, t.next()?, t.next()?);
    let addr = u64::from_str_radix(addr, 16).ok().filter(|a| *a != 0)?;
    let code = matches!(kind, "t" | "T" | "w" | "W") && !is_boundary(name);
    Some(match code {
        true => Entry::Function(addr, name),
        false => Entry::Hole(addr),
    })
}

/// The address and name of a kallsyms line that names a function.
pub fn code_symbol(line: &str) -> Option<(u64, &str)> {
    match entry(line)? {
        Entry::Function(a, n) => Some((a, n)),
        Entry::Hole(_) => None,
    }
}

/// Symbols the linker script puts at the bounds of a text section: code symbols by type,
/// but no function is there (`_einittext` is the last one of the core kernel, and named
/// every BPF program's address when a lookup took the last symbol before an address).
pub fn is_boundary(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "_text",
        "_stext",
        "_etext",
        "_sinittext",
        "_einittext",
        "__pi__text",
        "_end",
        "_edata",
        "_sdata",
        "__init_begin",
        "__init_end",
        "__bss_start",
    ];
    let section_mark =
        name.starts_with("__") && (name.ends_with("_text_start") || name.ends_with("_text_end"));
    EXACT.contains(&name) || section_mark
}

/// A loaded module's code ends where its memory does (/proc/modules: name, size, …, address).
fn module_ends(modules: &str) -> impl Iterator<Item = u64> + '_ {
    modules.lines().filter_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let size: u64 = f.get(1)?.parse().ok()?;
        let base = u64::from_str_radix(f.last()?.trim_start_matches("0x"), 16).ok()?;
        (base != 0).then_some(base + size)
    })
}

/// Code outside the kernel image and modules (ftrace's and kprobes' trampolines, listed
/// under `[__builtin__…]`) is held to the page it starts in.
const PAGE: u64 = 4096;

fn builtin_end(line: &str, addr: u64) -> Option<u64> {
    line.contains("[__builtin__")
        .then(|| (addr | (PAGE - 1)) + 1)
}

/// The symbols' bytes: a mapped kept copy, or made in memory when none can be kept.
pub enum KernelSymbols {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl KernelSymbols {
    /// Maps the copy at `path`; None when it is not one of ours.
    pub fn map(path: &Path) -> Option<KernelSymbols> {
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: kept copies are replaced by rename, never written in place, so the
        // mapped file does not change under us.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let syms = KernelSymbols::Mapped(map);
        syms.valid().then_some(syms)
    }

    /// From /proc/kallsyms' text and /proc/modules': functions, and holes where code
    /// ends (boundary marks, data, a module's end, a trampoline's page). A hole's name is
    /// empty.
    pub fn from_text(text: &str, modules: &str) -> KernelSymbols {
        let mut syms: Vec<(u64, &str)> = Vec::new();
        let mut image_end = 0;
        for line in text.lines() {
            if !line.ends_with(']') {
                image_end = image_end.max(entry(line).map_or(0, |e| e.addr()));
            }
            match entry(line) {
                Some(Entry::Function(a, n)) => {
                    syms.push((a, n));
                    syms.extend(builtin_end(line, a).map(|e| (e, "")));
                }
                Some(Entry::Hole(a)) => syms.push((a, "")),
                None => {}
            }
        }
        syms.extend(module_ends(modules).map(|e| (e, "")));
        syms.sort_by_key(|(a, _)| *a);
        let mut b = Vec::with_capacity(HEADER + syms.len() * 40);
        b.extend(MAGIC);
        b.extend((syms.len() as u64).to_ne_bytes());
        b.extend(image_end.to_ne_bytes());
        b.extend(syms.iter().flat_map(|(a, _)| a.to_ne_bytes()));
        let mut end = 0u32;
        for (_, name) in &syms {
            end += name.len() as u32;
            b.extend(end.to_ne_bytes());
        }
        b.extend(syms.iter().flat_map(|(_, n)| n.bytes()));
        KernelSymbols::Owned(b)
    }
    pub fn bytes(&self) -> &[u8] {
        match self {
            KernelSymbols::Mapped(m) => m,
            KernelSymbols::Owned(v) => v,
        }
    }

    /// Ours and whole: a kept copy that is not is read again.
    fn valid(&self) -> bool {
        let b = self.bytes();
        if b.len() < HEADER || &b[..MAGIC.len()] != MAGIC {
            return false;
        }
        let n = self.len();
        n <= (b.len() - HEADER) / 12
            && b.len() - self.names_at() == n.checked_sub(1).map_or(0, |i| self.name_end(i))
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_ne_bytes(self.bytes()[at..at + 8].try_into().expect("8 bytes"))
    }

    fn len(&self) -> usize {
        self.u64_at(MAGIC.len()) as usize
    }

    /// Whether `addr` is past the kernel image (in a module, a trampoline, a BPF program).
    pub fn past_image(&self, addr: u64) -> bool {
        addr >= self.u64_at(MAGIC.len() + 8)
    }

    fn addr(&self, i: usize) -> u64 {
        self.u64_at(HEADER + i * 8)
    }

    fn names_at(&self) -> usize {
        HEADER + self.len() * 12
    }

    /// Where name `i` ends in the names.
    fn name_end(&self, i: usize) -> usize {
        let at = HEADER + self.len() * 8 + i * 4;
        u32::from_ne_bytes(self.bytes()[at..at + 4].try_into().expect("4 bytes")) as usize
    }

    fn name(&self, i: usize) -> &str {
        let start = i.checked_sub(1).map_or(0, |p| self.name_end(p));
        let (names, end) = (self.names_at(), self.name_end(i));
        let b = self.bytes().get(names + start..names + end).unwrap_or(b"?");
        std::str::from_utf8(b).unwrap_or("?")
    }

    /// The function `addr` is in: the last entry starting at or before it, the first
    /// function of those that start at the same address (blazesym's choice among
    /// aliases) that is not a `__pi_` copy for the early boot code; None when that is a
    /// hole.
    pub fn find(&self, addr: u64) -> Option<&str> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.addr(mid) <= addr {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let start = self.addr(lo.checked_sub(1)?);
        let group = (0..lo).rev().take_while(|&i| self.addr(i) == start);
        let names: Vec<&str> = group.map(|i| self.name(i)).collect();
        let mut functions = names.into_iter().rev().filter(|n| !n.is_empty());
        let first = functions.next()?;
        match first.starts_with("__pi_") {
            true => Some(functions.find(|n| !n.starts_with("__pi_")).unwrap_or(first)),
            false => Some(first),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
0000000000000000 T hidden
ffffffff81000000 T _stext
ffffffff81000000 T first_fn
ffffffff81000100 t alias_a
ffffffff81000100 T alias_b
ffffffff81000180 T __pi_early
ffffffff81000180 T early
ffffffff81000200 d some_data
ffffffff81000300 W weak_fn
ffffffff81000400 T __sched_text_start
ffffffff81000500 T sched_fn
ffffffff81000600 T _etext
ffffffffc0000000 t mod_fn\t[ext4]
ffffffffc0001000 t bpf_prog_x\t[bpf]
ffffffffc0201000 t ftrace_trampoline\t[__builtin__ftrace]
";
    const MODULES: &str = "ext4 8192 1 - Live 0xffffffffc0000000\n";

    #[test]
    fn lookups_pick_the_function_an_address_is_in() {
        let s = KernelSymbols::from_text(TEXT, MODULES);
        assert!(s.valid());
        assert_eq!(s.find(0xffffffff80ffffff), None);
        // A boundary mark at a function's address names nothing; the function does.
        assert_eq!(s.find(0xffffffff81000000), Some("first_fn"));
        assert_eq!(s.find(0xffffffff810000ff), Some("first_fn"));
        // Aliases: the first listed.
        assert_eq!(s.find(0xffffffff81000100), Some("alias_a"));
        assert_eq!(s.find(0xffffffff81000181), Some("early"));
        // Data ends the function before it.
        assert_eq!(s.find(0xffffffff81000250), None);
        assert_eq!(s.find(0xffffffff81000300), Some("weak_fn"));
        // A section mark ends a function too, and names nothing itself.
        assert_eq!(s.find(0xffffffff81000450), None);
        assert_eq!(s.find(0xffffffff81000550), Some("sched_fn"));
        // Past the kernel's text nothing is named, least of all by _etext.
        assert_eq!(s.find(0xffffffff81000600), None);
        assert_eq!(s.find(0xffffffffa0000000), None);
        // A module's function within the module, not past its end.
        assert_eq!(s.find(0xffffffffc0001fff), Some("mod_fn"));
        assert_eq!(s.find(0xffffffffc0002000), None);
        // A trampoline within its page only.
        assert_eq!(s.find(0xffffffffc0201ff0), Some("ftrace_trampoline"));
        assert_eq!(s.find(0xffffffffc0202000), None);
    }

    #[test]
    fn boundary_marks_are_not_functions() {
        for b in [
            "_einittext",
            "_stext",
            "__entry_text_end",
            "__static_call_text_start",
        ] {
            assert!(is_boundary(b), "{b}");
        }
        // Real functions whose names only look like marks.
        for f in [
            "__start_tty",
            "__end_swap_bio_write",
            "__blk_freeze_queue_start",
        ] {
            assert!(!is_boundary(f), "{f}");
        }
    }

    #[test]
    fn a_copy_that_is_not_whole_is_refused() {
        let KernelSymbols::Owned(mut b) = KernelSymbols::from_text(TEXT, MODULES) else {
            unreachable!()
        };
        b.pop();
        assert!(!KernelSymbols::Owned(b).valid());
        assert!(!KernelSymbols::Owned(b"not ours".to_vec()).valid());
        assert!(KernelSymbols::from_text("", "").valid());
    }
}
