//! The kernel's text symbols, sorted by address, as one block of bytes that a lookup
//! searches in place: the copy kept for the boot is mapped, not parsed. blazesym parsed
//! its text copy (~121k lines) at every start, 15–40 ms of a CPU that aya's BTF parse
//! needed at the same time (timestamps through a start).
//!
//! Layout, native-endian: MAGIC, the count n, n addresses (u64, ascending; equal ones in
//! /proc/kallsyms' order), n name ends (u32 offsets into the names), then the names.

use std::path::Path;

const MAGIC: &[u8; 16] = b"fsprof-ksyms-v1\n";
const HEADER: usize = MAGIC.len() + 8;

/// The address and name of a kallsyms line that `from_text` keeps; None for any other.
pub fn code_symbol(line: &str) -> Option<(u64, &str)> {
    if line.ends_with("[bpf]") {
        return None;
    }
    let mut t = line.split_ascii_whitespace();
    let (addr, kind, name) = (t.next()?, t.next()?, t.next()?);
    let addr = u64::from_str_radix(addr, 16).ok().filter(|a| *a != 0)?;
    matches!(kind, "t" | "T" | "w" | "W").then_some((addr, name))
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

    /// From /proc/kallsyms' text: its code symbols (types t, T, w, W) but BPF programs',
    /// which come and go (an address in one loaded since would be named by a stale
    /// neighbour).
    pub fn from_text(text: &str) -> KernelSymbols {
        let mut syms: Vec<(u64, &str)> = text.lines().filter_map(code_symbol).collect();
        syms.sort_by_key(|(a, _)| *a);
        let mut b = Vec::with_capacity(HEADER + syms.len() * 40);
        b.extend(MAGIC);
        b.extend((syms.len() as u64).to_ne_bytes());
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

    /// The symbol `addr` is in: the last starting at or before it, the first of those
    /// that start at the same address (blazesym's choice among aliases).
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
        let first = (0..lo)
            .rev()
            .take_while(|&i| self.addr(i) == start)
            .last()?;
        Some(self.name(first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
0000000000000000 T hidden
ffffffff81000000 T _stext
ffffffff81000100 t alias_a
ffffffff81000100 T alias_b
ffffffff81000200 d some_data
ffffffff81000300 W weak_fn
ffffffffc0000000 t mod_fn\t[ext4]
ffffffffc0001000 t bpf_prog_x\t[bpf]
";

    #[test]
    fn lookups_pick_the_symbol_an_address_is_in() {
        let s = KernelSymbols::from_text(TEXT);
        assert!(s.valid());
        assert_eq!(s.find(0xffffffff80ffffff), None);
        assert_eq!(s.find(0xffffffff81000000), Some("_stext"));
        assert_eq!(s.find(0xffffffff810000ff), Some("_stext"));
        // Aliases: the first listed; data symbols are left out.
        assert_eq!(s.find(0xffffffff81000100), Some("alias_a"));
        assert_eq!(s.find(0xffffffff81000250), Some("alias_a"));
        assert_eq!(s.find(0xffffffff81000300), Some("weak_fn"));
        // A module's symbol by its name alone; a BPF program's address is its neighbour's.
        assert_eq!(s.find(0xffffffffc0001008), Some("mod_fn"));
    }

    #[test]
    fn a_copy_that_is_not_whole_is_refused() {
        let KernelSymbols::Owned(mut b) = KernelSymbols::from_text(TEXT) else {
            unreachable!()
        };
        b.pop();
        assert!(!KernelSymbols::Owned(b).valid());
        assert!(!KernelSymbols::Owned(b"not ours".to_vec()).valid());
        assert!(KernelSymbols::from_text("").valid());
    }
}
