//! Unwind tables for the kernel's DWARF unwinder (fsprof-ebpf `unwind`): each ELF file's
//! .eh_frame compiled into rows sorted by file offset, written into UNWIND_ROWS (mapped into
//! fsprof's memory: one copy, no syscall per row) and announced in UNWIND_FILES under the
//! file's (device, inode). The target's program and the libraries it links are loaded
//! before it runs; any other file the kernel meets (a dlopen'd library, a child's program)
//! is reported in UNWIND_MISSES and loaded by a thread within milliseconds, its first
//! stacks ending in "[stack ends: unwind table not loaded yet]".

use fsprof_common::MapName;
use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    os::fd::OwnedFd,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use super::{
    kept::{self, Kept},
    mmapped::Mmapped,
};
use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::{HashMap, Map, MapData, RingBuf},
};
use fsprof_common::{
    kdev,
    unwind::{
        FileKey, FileTable, INDEX_SHIFT, MAX_UNWIND_INDEX, MAX_UNWIND_ROWS, RULE_END, RULE_NONE,
        RULE_PLT, RULE_RBP, RULE_RSP, UnwindMiss, UnwindRow,
    },
};
use gimli::{CfaRule, RegisterRule, UnwindSection, X86_64};
use object::{Object, ObjectSection, ObjectSegment};

/// The loader wakes on the kernel's ring (UNWIND_WAKE) and, in case the ring overflowed,
/// looks at UNWIND_MISSES this often.
const MISS_POLL: Duration = Duration::from_millis(10);

/// The kernel's key of the file at `path` (stat's device in the kernel's dev_t encoding).
pub fn file_key(path: &Path) -> Result<FileKey> {
    let m = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    let dev = m.dev();
    Ok(FileKey {
        dev: kdev::make(libc::major(dev), libc::minor(dev)),
        _pad: 0,
        ino: m.ino(),
    })
}

/// The unwind rows of an ELF file, sorted by file offset, covering only what its CFI
/// covers (a RULE_NONE row ends each function's range).
pub fn compile(path: &Path) -> Result<Vec<UnwindRow>> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let elf = object::File::parse(&*data).with_context(|| format!("parsing {}", path.display()))?;
    let Some(section) = elf.section_by_name(".eh_frame") else {
        bail!("no .eh_frame");
    };
    let eh = gimli::EhFrame::new(section.data()?, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    if let Some(s) = elf.section_by_name(".text") {
        bases = bases.set_text(s.address());
    }
    if let Some(s) = elf.section_by_name(".got") {
        bases = bases.set_got(s.address());
    }
    let layout = Layout::of(&elf);
    let mut raw = cfi_rows(&eh, &bases, &layout)?;
    end_at_entry(&mut raw, &elf, &layout);
    crt_frames(&mut raw, &elf, &layout);
    if raw.iter().any(|(off, _, _)| *off >= 1 << 32) {
        bail!("code beyond 4 GiB into the file");
    }
    Ok(merged(raw))
}

/// Where an ELF file's code is: its PLT sections and its segments' addresses in the file.
struct Layout {
    plt: Vec<(u64, u64)>,
    segments: Vec<(u64, u64, u64)>,
}

impl Layout {
    fn of(elf: &object::File) -> Layout {
        Layout {
            plt: elf
                .sections()
                .filter(|s| s.name().is_ok_and(|n| n.starts_with(".plt")))
                .map(|s| (s.address(), s.address() + s.size()))
                .collect(),
            segments: elf
                .segments()
                .map(|s| (s.address(), s.size(), s.file_range().0))
                .collect(),
        }
    }

    /// The file offset of virtual address `vaddr`.
    fn offset(&self, vaddr: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(a, size, _)| (*a..a + size).contains(&vaddr))
            .map(|(a, _, off)| vaddr - a + off)
    }

    fn in_plt(&self, vaddr: u64) -> bool {
        self.plt.iter().any(|(a, b)| (*a..*b).contains(&vaddr))
    }
}

/// A row at a file offset, and whether it is a real rule: a function's range end loses to
/// a row starting at the same place.
type RawRow = (u64, bool, UnwindRow);

/// Every FDE's rows, and a RULE_NONE row at each FDE's end.
fn cfi_rows<R: gimli::Reader>(
    eh: &gimli::EhFrame<R>,
    bases: &gimli::BaseAddresses,
    layout: &Layout,
) -> Result<Vec<RawRow>> {
    let mut raw = Vec::new();
    let mut ctx = gimli::UnwindContext::new();
    let mut entries = eh.entries(bases);
    while let Some(entry) = entries.next()? {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
            continue;
        };
        let in_plt = layout.in_plt(fde.initial_address());
        let Ok(mut rows) = fde.rows(eh, bases, &mut ctx) else {
            continue;
        };
        while let Ok(Some(row)) = rows.next_row() {
            if let Some(off) = layout.offset(row.start_address()) {
                let mut r = rule_of(row, in_plt);
                r.pc = off as u32;
                raw.push((off, r.rule != RULE_NONE, r));
            }
        }
        if let Some(end) = layout.offset(fde.end_address()) {
            let none = UnwindRow {
                pc: end as u32,
                ..UnwindRow::default()
            };
            raw.push((end, false, none));
        }
    }
    Ok(raw)
}

/// The loader's entry point (ld.so's _start) has no CFI: it is the outermost frame.
fn end_at_entry(raw: &mut Vec<RawRow>, elf: &object::File, layout: &Layout) {
    let Some(entry) = layout.offset(elf.entry()).filter(|_| elf.entry() != 0) else {
        return;
    };
    if !covered(raw, entry) {
        let end = UnwindRow {
            pc: entry as u32,
            rule: RULE_END,
            ..UnwindRow::default()
        };
        raw.push((entry, true, end));
    }
}

/// Whether a real rule covers file offset `off`.
fn covered(raw: &[RawRow], off: u64) -> bool {
    raw.iter()
        .filter(|(o, _, _)| *o <= off)
        .max_by_key(|(o, real, _)| (*o, *real))
        .is_some_and(|(_, real, _)| *real)
}

/// Rows for crti's `_init` and `_fini` (`.init`, `.fini`), which have no CFI. A process's
/// exit runs every library's `_fini`, and on a cold cache its first instruction faults its
/// page in: 5–12 ms of I/O wait a library in a quick suite, each a stack that ended at
/// "no unwind info" (1.3–2.4 % of the off-CPU weight, near the test's bound). Their code
/// is crti's fixed frame, checked byte for byte: [endbr64] `sub $8,%rsp` … `add $8,%rsp;
/// ret`.
fn crt_frames(raw: &mut Vec<RawRow>, elf: &object::File, layout: &Layout) {
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    const SUB8: [u8; 4] = [0x48, 0x83, 0xec, 0x08];
    const ADD8_RET: [u8; 5] = [0x48, 0x83, 0xc4, 0x08, 0xc3];
    for name in [".init", ".fini"] {
        let Some(s) = elf.section_by_name(name) else {
            continue;
        };
        let (Ok(code), Some(start)) = (s.data(), layout.offset(s.address())) else {
            continue;
        };
        let skip = if code.starts_with(&ENDBR64) { 4 } else { 0 };
        if !code[skip..].starts_with(&SUB8) || !code.ends_with(&ADD8_RET) || covered(raw, start) {
            continue;
        }
        let end = start + code.len() as u64;
        let row = |off: u64, cfa: u16| {
            let r = UnwindRow {
                pc: off as u32,
                rule: RULE_RSP,
                cfa,
                rbp: 0,
            };
            (off, true, r)
        };
        raw.extend([
            row(start, 8),
            row(start + skip as u64 + 4, 16),
            row(end - 1, 8),
        ]);
        let none = UnwindRow {
            pc: end as u32,
            ..UnwindRow::default()
        };
        raw.push((end, false, none));
    }
}

/// Sorted by offset, one row per offset (the real rule wins), repeats of a rule dropped.
fn merged(mut raw: Vec<RawRow>) -> Vec<UnwindRow> {
    raw.sort_by_key(|(off, real, _)| (*off, *real));
    let mut rows: Vec<UnwindRow> = Vec::with_capacity(raw.len());
    for (_, _, r) in raw {
        match rows.last_mut() {
            Some(last) if last.pc == r.pc => *last = r,
            Some(last) if (last.rule, last.cfa, last.rbp) == (r.rule, r.cfa, r.rbp) => {}
            _ => rows.push(r),
        }
    }
    rows
}

/// One CFI row in the kernel's form; RULE_NONE for what the kernel cannot follow.
fn rule_of<T: gimli::ReaderOffset, S: gimli::UnwindContextStorage<T>>(
    row: &gimli::UnwindTableRow<T, S>,
    in_plt: bool,
) -> UnwindRow {
    let none = UnwindRow::default();
    if matches!(row.register(X86_64::RA), Some(RegisterRule::Undefined)) {
        return UnwindRow {
            rule: RULE_END,
            ..none
        };
    }
    let (rule, cfa) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let rule = match *register {
                X86_64::RSP => RULE_RSP,
                X86_64::RBP => RULE_RBP,
                _ => return none,
            };
            match u16::try_from(*offset) {
                Ok(cfa) => (rule, cfa),
                Err(_) => return none,
            }
        }
        CfaRule::Expression(_) if in_plt => (RULE_PLT, 8),
        CfaRule::Expression(_) => return none,
    };
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => 0,
        Some(RegisterRule::Offset(o)) if o % 8 == 0 && (-1024..0).contains(&o) => (o / 8) as i8,
        Some(_) => return none,
    };
    UnwindRow {
        pc: 0,
        rule,
        rbp,
        cfa,
    }
}

/// The index of sorted `rows` (see FileTable): per block of code from the first row's to
/// the last row's, the rows covering the block's start and the next block's.
pub fn index(rows: &[UnwindRow]) -> Vec<[u32; 2]> {
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return Vec::new();
    };
    let covering = |b: u32| {
        let start = u64::from(b) << INDEX_SHIFT;
        rows.partition_point(|r| u64::from(r.pc) <= start)
            .saturating_sub(1) as u32
    };
    (first.pc >> INDEX_SHIFT..=last.pc >> INDEX_SHIFT)
        .map(|b| [covering(b), covering(b + 1)])
        .collect()
}

/// Compiled tables by (file, size, mtime): `fsprof run` traces hundreds of cells with the
/// same few programs.
type Compiled = Arc<Result<(Vec<UnwindRow>, Vec<[u32; 2]>), String>>;
static COMPILED: Mutex<BTreeMap<(FileKey, u64, i64), Compiled>> = Mutex::new(BTreeMap::new());

fn compiled(path: &Path, key: FileKey) -> Compiled {
    let m = std::fs::metadata(path);
    let id = (
        key,
        m.as_ref().map_or(0, |m| m.len()),
        m.as_ref().map_or(0, |m| m.mtime()),
    );
    if let Some(c) = COMPILED.lock().unwrap().get(&id) {
        return c.clone();
    }
    let c = Arc::new(kept_or_compiled(path, &id).map_err(|e| format!("{e:#}")));
    COMPILED.lock().unwrap().insert(id, c.clone());
    c
}

/// `compile`'s rows and their index, from a copy kept for this boot and this fsprof build
/// (`kept`: a start compiles fsprof's own ~14 MB program, ~30 ms, for the child it forks),
/// else compiled and kept. One copy per file: a changed file replaces its copy.
fn kept_or_compiled(
    path: &Path,
    id: &(FileKey, u64, i64),
) -> Result<(Vec<UnwindRow>, Vec<[u32; 2]>)> {
    let (key, len, mtime) = id;
    let prefix = format!("{}{:x}-{}-", kept::UNWIND, key.dev, key.ino);
    let kept = Kept::of_with(&prefix, &format!("{len} {mtime}"));
    if let Some(t) = kept.as_ref().and_then(Kept::read).and_then(|b| decode(&b)) {
        return Ok(t);
    }
    let rows = compile(path)?;
    let index = index(&rows);
    if let Some(k) = kept {
        k.write(&encode(&rows, &index));
        kept::trim(kept::UNWIND, KEPT_TABLES_BYTES);
    }
    Ok((rows, index))
}

/// At most this much of /run (memory) for kept tables; the oldest go first.
const KEPT_TABLES_BYTES: u64 = 64 << 20;

/// Rows then index, little-endian, after their counts.
fn encode(rows: &[UnwindRow], index: &[[u32; 2]]) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + 8 * (rows.len() + index.len()));
    b.extend((rows.len() as u32).to_le_bytes());
    b.extend((index.len() as u32).to_le_bytes());
    for r in rows {
        b.extend(r.pc.to_le_bytes());
        b.extend([r.rule, r.rbp as u8]);
        b.extend(r.cfa.to_le_bytes());
    }
    for [a, z] in index {
        b.extend(a.to_le_bytes());
        b.extend(z.to_le_bytes());
    }
    b
}

fn decode(b: &[u8]) -> Option<(Vec<UnwindRow>, Vec<[u32; 2]>)> {
    let word = |at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let (nrows, nindex) = (word(0)? as usize, word(4)? as usize);
    if b.len() != 8 + 8 * (nrows + nindex) {
        return None;
    }
    let (rows, index) = b[8..].split_at(8 * nrows);
    let rows = rows
        .chunks_exact(8)
        .map(|c| UnwindRow {
            pc: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            rule: c[4],
            rbp: c[5] as i8,
            cfa: u16::from_le_bytes([c[6], c[7]]),
        })
        .collect();
    let index = index
        .chunks_exact(8)
        .map(|c| {
            [
                u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            ]
        })
        .collect();
    Some((rows, index))
}

struct Loader {
    rows: Mmapped<UnwindRow>,
    next_row: usize,
    index: Mmapped<[u32; 2]>,
    next_index: usize,
    files: HashMap<MapData, FileKey, FileTable>,
    misses: HashMap<MapData, FileKey, UnwindMiss>,
    paths: BTreeMap<FileKey, PathBuf>,
}

impl Loader {
    /// Loads `path`'s table under `key` (once).
    fn load(&mut self, key: FileKey, path: &Path) -> Result<()> {
        if self.paths.contains_key(&key) {
            return Ok(());
        }
        let path = &std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        self.paths.insert(key, path.clone());
        let table = match &*compiled(path, key) {
            Ok((rows, index))
                if self.rows.write(self.next_row, rows)
                    && self.index.write(self.next_index, index) =>
            {
                let table = FileTable {
                    first: self.next_row as u32,
                    len: rows.len() as u32,
                    index: self.next_index as u32,
                    blocks: index.len() as u32,
                    block0: rows.first().map_or(0, |r| r.pc >> INDEX_SHIFT),
                    _pad: 0,
                };
                self.next_row += rows.len();
                self.next_index += index.len();
                table
            }
            // No room left, or no usable CFI: its stacks end in "no unwind info".
            Ok(_) | Err(_) => FileTable::default(),
        };
        self.files.insert(key, table, 0)?;
        Ok(())
    }

    /// Loads the files the kernel met without a table.
    fn serve_misses(&mut self) -> Result<()> {
        let missed: Vec<UnwindMiss> = self
            .misses
            .iter()
            .filter_map(|r| r.ok())
            .map(|(_, m)| m)
            .collect();
        for miss in missed {
            self.serve(miss)?;
        }
        Ok(())
    }

    /// Loads the file of one miss, or a program that has just exec'd and its libraries.
    fn serve(&mut self, miss: UnwindMiss) -> Result<()> {
        if miss.start == 0 {
            let exe = PathBuf::from(format!("/proc/{}/exe", miss.tgid));
            if let Ok(path) = std::fs::read_link(&exe) {
                self.load_with_libraries(&path);
            }
            return Ok(());
        }
        let key = miss.file;
        let link = format!(
            "/proc/{}/map_files/{:x}-{:x}",
            miss.tgid, miss.start, miss.end
        );
        match std::fs::read_link(&link) {
            Ok(path) => {
                self.load(key, &path)?;
            }
            Err(_) if !self.paths.contains_key(&key) => {
                // The process is gone: its file stays without a table this trace.
                let path = PathBuf::from(format!("[dev {:x} inode {}]", key.dev, key.ino));
                self.paths.insert(key, path);
                self.files.insert(key, FileTable::default(), 0)?;
            }
            Err(_) => {}
        }
        let _ = self.misses.remove(&key);
        Ok(())
    }

    fn load_with_libraries(&mut self, program: &Path) {
        for path in with_libraries(program) {
            if let Ok(key) = file_key(&path) {
                let _ = self.load(key, &path);
            }
        }
    }
}

/// Compiles, or reads the kept copies of, the tables of `programs` and the libraries they
/// link, for `UnwindTables::preload` to copy: a start does it while the kernel makes the
/// maps on another CPU (~10 ms for fsprof's own and `true`'s, timestamps through a start).
pub fn warm(programs: &[PathBuf]) {
    for path in programs.iter().flat_map(|p| with_libraries(p)) {
        if let Ok(key) = file_key(&path) {
            compiled(&path, key);
        }
    }
}

/// The tables of one trace and the thread that loads them on demand; stops with Drop.
pub struct UnwindTables {
    loader: Arc<Mutex<Loader>>,
    /// A pipe's write end: closing it wakes the thread at once to stop (an end that waited
    /// out the thread's poll took up to `MISS_POLL` of every trace's tear-down).
    stop: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    /// Held, not read: closing the last descriptor of a map the programs use before they
    /// are verified fails their load.
    _on: aya::maps::Array<MapData, u32>,
}

/// The unwinder's maps, taken out of the object before its programs are verified, so the
/// tables start beside the verifier (mapping 24 MB and copying fsprof's own tables, ~5 ms
/// that came between the maps' creation and the verification).
pub struct UnwindMaps {
    rows: Map,
    index: Map,
    files: Map,
    misses: Map,
    wake: Map,
    on: Map,
}

impl UnwindMaps {
    pub fn take(ebpf: &mut Ebpf) -> Result<UnwindMaps> {
        let mut take = |m: MapName| {
            ebpf.take_map(m.name())
                .with_context(|| format!("map {} missing from the eBPF object", m.name()))
        };
        Ok(UnwindMaps {
            rows: take(MapName::UnwindRows)?,
            index: take(MapName::UnwindIndex)?,
            files: take(MapName::UnwindFiles)?,
            misses: take(MapName::UnwindMisses)?,
            wake: take(MapName::UnwindWake)?,
            on: take(MapName::UnwindOn)?,
        })
    }
}

fn mmapped<T: Copy>(map: Map, m: MapName, len: u32) -> Result<Mmapped<T>> {
    let Map::Array(map) = map else {
        bail!("no array map {}", m.name());
    };
    Mmapped::new(map, m.name(), len)
}

impl UnwindTables {
    /// Maps the tables, turns the unwinder on and starts the on-demand loader.
    pub fn start(maps: UnwindMaps) -> Result<UnwindTables> {
        let loader = Loader {
            rows: mmapped(maps.rows, MapName::UnwindRows, MAX_UNWIND_ROWS)?,
            next_row: 0,
            index: mmapped(maps.index, MapName::UnwindIndex, MAX_UNWIND_INDEX)?,
            next_index: 0,
            files: HashMap::try_from(maps.files)?,
            misses: HashMap::try_from(maps.misses)?,
            paths: BTreeMap::new(),
        };
        let loader = Arc::new(Mutex::new(loader));
        // Close-on-exec (os::pipe): a command given the end would keep the thread, and
        // fsprof, waiting for as long as anything it left running lives.
        let (stopped, stop) = crate::os::pipe()?;
        let wake: RingBuf<MapData> = RingBuf::try_from(maps.wake)?;
        let mut on = aya::maps::Array::<_, u32>::try_from(maps.on)?;
        on.set(0, 1, 0)?;
        let thread = {
            let loader = loader.clone();
            std::thread::Builder::new()
                .name("fsprof-unwind".into())
                .spawn(move || {
                    if let Err(e) = serve(&loader, &stopped, wake) {
                        eprintln!("fsprof: warning: loading unwind tables: {e:#}");
                    }
                })?
        };
        let tables = UnwindTables {
            loader,
            stop: Some(stop),
            thread: Some(thread),
            _on: on,
        };
        // A child fsprof forks runs fsprof's own code until it execs.
        if let Ok(me) = std::env::current_exe() {
            tables.preload(&me);
        }
        Ok(tables)
    }

    /// Loads the tables of `program` and of everything it links, before it runs.
    pub fn preload(&self, program: &Path) {
        self.loader.lock().unwrap().load_with_libraries(program);
    }

    /// Paths of the files the kernel met, by key.
    pub fn finish(&self) -> BTreeMap<FileKey, PathBuf> {
        let mut loader = self.loader.lock().unwrap();
        let _ = loader.serve_misses();
        loader.paths.clone()
    }
}

/// The loader thread: serves the kernel's wakeups until `stopped` (a pipe's read end)
/// sees its write end closed.
fn serve(loader: &Mutex<Loader>, stopped: &OwnedFd, mut wake: RingBuf<MapData>) -> Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        let mut pfds = [wake.as_raw_fd(), stopped.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two valid pollfds.
        unsafe { libc::poll(pfds.as_mut_ptr(), 2, MISS_POLL.as_millis() as i32) };
        if pfds[1].revents != 0 {
            return Ok(());
        }
        let mut events = Vec::new();
        while let Some(item) = wake.next() {
            if item.len() >= size_of::<UnwindMiss>() {
                // SAFETY: the kernel wrote an UnwindMiss; read unaligned from the ring.
                events
                    .push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<UnwindMiss>()) });
            }
        }
        let mut l = loader.lock().unwrap();
        for miss in events {
            l.serve(miss)?;
        }
        if pfds[0].revents == 0 {
            l.serve_misses()?;
        }
    }
}

impl Drop for UnwindTables {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where the dynamic loader looks for libraries on Debian (ld.so.conf.d), in order.
const LIBRARY_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
];

/// `program`, its interpreter and the libraries it needs, transitively.
fn with_libraries(program: &Path) -> Vec<PathBuf> {
    let mut out = vec![program.to_path_buf()];
    let mut seen: StdHashMap<String, ()> = StdHashMap::new();
    let mut i = 0;
    while i < out.len() {
        // Only the headers and two small sections are read: fsprof's own program is ~14 MB.
        let Ok(file) = std::fs::File::open(&out[i]) else {
            i += 1;
            continue;
        };
        let data = object::ReadCache::new(file);
        let Ok(elf) = object::File::parse(&data) else {
            i += 1;
            continue;
        };
        let mut wanted = needed(&elf);
        if let Some(interp) = interpreter(&elf) {
            wanted.push(interp);
        }
        for name in wanted {
            if seen.insert(name.clone(), ()).is_some() {
                continue;
            }
            let found = if name.starts_with('/') {
                Some(PathBuf::from(&name))
            } else {
                LIBRARY_DIRS
                    .iter()
                    .map(|d| Path::new(d).join(&name))
                    .find(|p| p.exists())
            };
            out.extend(found);
        }
        i += 1;
    }
    out
}

fn interpreter<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Option<String> {
    let s = elf.section_by_name(".interp")?;
    let d = s.data().ok()?;
    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
    Some(String::from_utf8_lossy(&d[..end]).into_owned())
}

/// DT_NEEDED entries of a 64-bit little-endian ELF file.
fn needed<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Vec<String> {
    let (Some(dynamic), Some(dynstr)) = (
        elf.section_by_name(".dynamic"),
        elf.section_by_name(".dynstr"),
    ) else {
        return Vec::new();
    };
    let (Ok(d), Ok(strs)) = (dynamic.data(), dynstr.data()) else {
        return Vec::new();
    };
    const DT_NEEDED: u64 = 1;
    d.chunks_exact(16)
        .filter_map(|e| {
            let tag = u64::from_le_bytes(e[..8].try_into().ok()?);
            let val = u64::from_le_bytes(e[8..].try_into().ok()?) as usize;
            (tag == DT_NEEDED).then_some(())?;
            let s = strs.get(val..)?;
            let end = s.iter().position(|&b| b == 0)?;
            Some(String::from_utf8_lossy(&s[..end]).into_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_entries_cover_their_block_start() {
        let row = |pc| UnwindRow {
            pc,
            rule: RULE_RSP,
            ..UnwindRow::default()
        };
        // Blocks of 1 KiB: rows at 0x500, 0x600 (block 1), none in block 2, 0xc10 (block 3).
        let rows = [row(0x500), row(0x600), row(0xc10)];
        assert_eq!(index(&rows), [[0, 1], [1, 1], [1, 2]]);
        // A lookup at 0xc00 (block 3) halves over rows [1, 2]: 0x600 covers it.
        assert!(index(&[]).is_empty());
    }

    fn library_of_ls(name: &str) -> PathBuf {
        (with_libraries(Path::new("/bin/ls")).into_iter())
            .find(|p| p.to_string_lossy().contains(name))
            .unwrap_or_else(|| panic!("ls links {name}"))
    }

    #[test]
    fn crti_frames_are_unwound() {
        // libselinux's `_fini`: `sub $8,%rsp; add $8,%rsp; ret`, no CFI of its own.
        let lib = library_of_ls("libselinux");
        let data = std::fs::read(&lib).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        let fini = elf.section_by_name(".fini").unwrap();
        let at = Layout::of(&elf).offset(fini.address()).unwrap() as u32;
        let rows = compile(&lib).unwrap();
        let rule = |pc: u32| {
            rows.iter()
                .rev()
                .find(|r| r.pc <= pc)
                .map(|r| (r.rule, r.cfa))
        };
        assert_eq!(rule(at), Some((RULE_RSP, 8)));
        assert_eq!(rule(at + fini.size() as u32 - 5), Some((RULE_RSP, 16)));
        assert_eq!(rule(at + fini.size() as u32 - 1), Some((RULE_RSP, 8)));
    }

    #[test]
    fn libc_table_has_rules_and_ends() {
        let libc = library_of_ls("libc.so");
        let rows = compile(&libc).unwrap();
        assert!(rows.len() > 5000, "{} rows", rows.len());
        // A kept copy reads back as compiled; a cut one is no copy.
        let kept = encode(&rows, &index(&rows));
        assert_eq!(decode(&kept), Some((rows.clone(), index(&rows))));
        assert_eq!(decode(&kept[..kept.len() - 8]), None);
        assert!(rows.windows(2).all(|w| w[0].pc < w[1].pc));
        // _start-like entries (clone3, the thread start) mark the outermost frame.
        assert!(rows.iter().any(|r| r.rule == RULE_END));
        let rsp = rows.iter().filter(|r| r.rule == RULE_RSP).count();
        assert!(
            rsp > rows.len() / 2,
            "{rsp} of {} rows are rsp-based",
            rows.len()
        );
    }
}
