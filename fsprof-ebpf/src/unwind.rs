//! User stacks unwound from DWARF call-frame information (see fsprof_common::unwind): from
//! the thread's saved user registers, frame by frame, each through the rows userspace
//! compiled from its file's .eh_frame. Nothing is guessed: a frame is an address inside an
//! executable mapping, and a walk that cannot go on ends in a marker saying why.
//!
//! Mappings are looked up with bpf_find_vma, which in a context with interrupts off (the
//! scheduler, the sampling interrupt) succeeds once until its deferred unlock has run, so
//! each process image's code mappings are remembered (USER_MAPPINGS) and looked up there
//! first: a stack spans a handful of files, met again and again.
//!
//! x86-64 only: the registers are rip, rsp and rbp of `struct pt_regs`.
//!
//! Safety (see main.rs): kernel memory (the saved user registers), user memory
//! (`bpf_probe_read_user`, which fails instead of faulting), helpers (`bpf_find_vma`) and
//! map values (the unwind rows).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC, BPF_NOEXIST, task_struct},
    helpers::{bpf_get_current_task, bpf_probe_read_user, generated},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use fsprof_common::{
    Counter, USTACK_DEPTH, UserStackKey,
    unwind::{
        FileKey, FileTable, INDEX_SHIFT, ImageKey, MAX_PROCESSES, MAX_UNWIND_FILES,
        MAX_UNWIND_INDEX, MAX_UNWIND_MISSES, MAX_UNWIND_ROWS, Mapping, PROCESS_MAPPINGS,
        ProcessMappings, RULE_END, RULE_PLT, RULE_RBP, RULE_RSP, SEARCH_STEPS, StackEnd,
        UNWIND_WAKE_BYTES, UnwindMiss, UnwindRow, VM_EXEC,
    },
};

use crate::common::{conf, count, count_n, now, read_into, read_kernel};

/// Written by userspace through a memory mapping (fsprof::probes::unwind).
#[map]
static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(MAX_UNWIND_ROWS, BPF_F_MMAPABLE);

/// See FileTable; written by userspace through a memory mapping too.
#[map]
static UNWIND_INDEX: Array<[u32; 2]> = Array::with_max_entries(MAX_UNWIND_INDEX, BPF_F_MMAPABLE);

#[map]
static UNWIND_FILES: HashMap<FileKey, FileTable> = HashMap::with_max_entries(MAX_UNWIND_FILES, 0);

#[map]
static UNWIND_MISSES: HashMap<FileKey, UnwindMiss> =
    HashMap::with_max_entries(MAX_UNWIND_MISSES, 0);

/// Wakes userspace's loader for each new miss, and at each exec of a followed process.
#[map]
static UNWIND_WAKE: RingBuf = RingBuf::with_byte_size(UNWIND_WAKE_BYTES, 0);

/// Not preallocated (16 MB that most traces never touch, 40 ms of start-up): an insert that
/// finds the kernel's element cache empty fails, and the next stack of that process looks
/// the mapping up again.
#[map]
static USER_MAPPINGS: HashMap<ImageKey, ProcessMappings> =
    HashMap::with_max_entries(MAX_PROCESSES, BPF_F_NO_PREALLOC);

/// Never written: the zeroed value a new USER_MAPPINGS entry starts from (1 KB, more than
/// the BPF stack holds).
#[map]
static NO_MAPPINGS: Array<ProcessMappings> = Array::with_max_entries(1, 0);

/// 1 while userspace serves unwind tables (stacks are on). A map, not CONFIG: the verifier
/// folds CONFIG's constants and drops code they rule out, and with stacks off it dropped the
/// walk's callbacks but not every reference to them ("verifier bug: No program to jit").
#[map]
static UNWIND_ON: Array<u32> = Array::with_max_entries(1, 0);

/// Whether user stacks are being unwound (see UNWIND_ON).
#[inline(always)]
pub fn on() -> bool {
    UNWIND_ON.get(0).is_some_and(|v| *v != 0)
}

/// Capture contexts that may interleave on one CPU (see fsprof-ebpf stacks): each walks in
/// its own slot.
pub const SLOTS: u32 = 4;

/// A walk in progress: the registers of the frame being unwound, and the mapping it is in.
#[repr(C)]
struct Walk {
    pc: u64,
    sp: u64,
    bp: u64,
    n: u32,
    /// 0 while walking; then 1 (reached the entry) or the StackEnd written last.
    done: u32,
    image: ImageKey,
    map: Mapping,
    table: FileTable,
    /// Whether `map`'s file has an entry in UNWIND_FILES (a table, or none to be had).
    loaded: u32,
    _pad: u32,
    /// When the walk began, and a word read from the kernel on its way to a field.
    t0: u64,
    scratch: u64,
}

/// A mapping lookup's scan and bpf_find_vma's answer, per slot. Off the BPF stack, whose
/// frames the walk shares with every caller's (see `walk`), and out of the walk record: the
/// walk holds that as `&mut`, and the compiler may then assume the callbacks' writes to it
/// never happened (it did: every lookup came back empty).
#[repr(C)]
struct Lookup {
    scan: Scan,
    vma: VmaInfo,
    /// The row search in progress and a missing table's request: off the stack too, which
    /// leaves the frame step's 192 bytes.
    search: Search,
    miss: UnwindMiss,
}

#[map]
static LOOKUPS: PerCpuArray<Lookup> = PerCpuArray::with_max_entries(SLOTS, 0);

#[map]
static WALKS: PerCpuArray<Walk> = PerCpuArray::with_max_entries(SLOTS, 0);
#[map]
static USER_KEYS: PerCpuArray<UserStackKey> = PerCpuArray::with_max_entries(SLOTS, 0);

// struct pt_regs on x86-64 (arch/x86/include/asm/ptrace.h), a stable ABI.
const REGS_BP: u32 = 32;
const REGS_IP: u32 = 128;
const REGS_SP: u32 = 152;

/// What bpf_find_vma's callback reads out of the vma.
#[repr(C)]
#[derive(Default)]
struct VmaInfo {
    start: u64,
    end: u64,
    flags: u64,
    pgoff: u64,
    file: FileKey,
}

/// The current thread's user stack, unwound into scratch slot `slot`: frames leaf first,
/// zero-filled, ending in a StackEnd marker unless the walk reached the program's entry.
/// None when there is no user context.
#[inline(always)]
pub fn user_stack(slot: u32, tgid: u32) -> Option<*const UserStackKey> {
    if walk_user_stack(slot, tgid) == 0 {
        return None;
    }
    USER_KEYS.get_ptr(slot)
}

/// `user_stack`'s walk, a global BPF function: the verifier checks it once per program,
/// apart from its callers' states (inlined, it was walked again per caller state: 134 of
/// sched_switch's 165 ms of verification). 1 when USER_KEYS[slot] holds the stack.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn walk_user_stack(slot: u32, tgid: u32) -> u32 {
    walk(slot, tgid).is_some() as u32
}

/// The walk. Its stack frame counts in 6.1's 512 bytes under every caller's (see
/// fsprof::probes::frames), so what it reads goes straight into the walk record, held by a
/// raw pointer: the frame callbacks write the record too (a `&mut` would let the compiler
/// assume they do not).
#[inline(always)]
fn walk(slot: u32, tgid: u32) -> Option<()> {
    let key = USER_KEYS.get_ptr_mut(slot)?;
    let w = WALKS.get_ptr_mut(slot)?;
    let task = unsafe { bpf_get_current_task() };
    let task_btf = unsafe { generated::bpf_get_current_task_btf() };
    let regs = unsafe { generated::bpf_task_pt_regs(task_btf) } as u64;
    unsafe {
        // A thread past exit_mm has registers but no user memory: nothing to unwind (below).
        read_into(&mut (*w).scratch, task, conf!(task_mm))?;
        (*w).image = ImageKey {
            tgid,
            image: ImageKey::image_of((*w).scratch),
        };
        read_into(&mut (*w).pc, regs, REGS_IP)?;
        if (*w).pc == 0 || (*w).pc >= 1 << 47 {
            return None; // a kernel thread, or no user state
        }
        read_into(&mut (*w).sp, regs, REGS_SP)?;
        read_into(&mut (*w).bp, regs, REGS_BP)?;
        (*w).t0 = now();
        (*w).n = 0;
        (*w).done = 0;
        (*w).map = Mapping::default();
        (*w).loaded = 0;
        (*key).tgid = tgid;
        (*key).image = (*w).image.image;
        (*key).user = [0; USTACK_DEPTH];
        if (*w).scratch == 0 {
            end_with(w, key, StackEnd::NoUserCode);
            return Some(());
        }
    }
    let depth = conf!(user_depth).min(USTACK_DEPTH as u32);
    let mut ctx = slot as u64;
    unsafe {
        generated::bpf_loop(
            depth.saturating_sub(1),
            step as *mut c_void,
            (&mut ctx as *mut u64).cast(),
            0,
        );
        if (*w).done == 0 {
            end_with(w, key, StackEnd::TooDeep);
        }
        count(Counter::UserStacksUnwound);
        count_n(Counter::UserFramesUnwound, u64::from((*w).n));
        count_n(Counter::UserUnwindNs, now().saturating_sub((*w).t0));
    }
    Some(())
}

/// Process `tgid` has exec'd: userspace loads its program's and libraries' tables.
#[inline(always)]
pub fn exec_seen(tgid: u32) {
    let miss = UnwindMiss {
        tgid,
        _pad: 0,
        start: 0,
        end: 0,
        file: FileKey::default(),
    };
    let _ = UNWIND_WAKE.output::<UnwindMiss>(&miss, 0);
}

/// Ends the walk with marker `why` as its last frame.
#[inline(always)]
unsafe fn end_with(w: *mut Walk, key: *mut UserStackKey, why: StackEnd) {
    unsafe {
        let n = (*w).n as usize;
        if n < USTACK_DEPTH {
            (*key).user[n] = why as u64;
        }
        (*w).done = why as u32;
    }
}

/// One frame: records `pc` and moves the registers to the caller's frame. Returns 1 to
/// stop (the walk ended), 0 to go on.
unsafe extern "C" fn step(index: u32, ctx: *mut c_void) -> i64 {
    let slot = unsafe { *(ctx as *const u64) } as u32;
    let (Some(w), Some(key)) = (WALKS.get_ptr_mut(slot), USER_KEYS.get_ptr_mut(slot)) else {
        return 1;
    };
    match unsafe { frame(w, key, slot, index) } {
        Ok(true) => 0,
        Ok(false) => {
            unsafe { (*w).done = 1 };
            1
        }
        Err(why) => {
            unsafe { end_with(w, key, why) };
            1
        }
    }
}

/// Ok(true): the caller's registers are in `w`; Ok(false): this was the outermost frame.
#[inline(always)]
unsafe fn frame(
    w: *mut Walk,
    key: *mut UserStackKey,
    slot: u32,
    index: u32,
) -> Result<bool, StackEnd> {
    let w = unsafe { &mut *w };
    let pc = w.pc;
    if !(w.map.start <= pc && pc < w.map.end) {
        find_mapping(w, slot, pc)?;
    }
    let n = w.n as usize;
    if n >= USTACK_DEPTH {
        return Err(StackEnd::TooDeep);
    }
    unsafe { (*key).user[n] = pc };
    w.n += 1;
    if w.loaded == 0 {
        return Err(StackEnd::NotLoaded);
    }
    // A caller's pc is a return address: its call instruction is the byte before.
    let at = pc - u64::from(index > 0) - w.map.start + w.map.offset;
    let row = search(slot, w.table, at).ok_or(StackEnd::NoUnwindInfo)?;
    let cfa = match row.rule {
        RULE_END => return Ok(false),
        RULE_RSP => w.sp + u64::from(row.cfa),
        RULE_RBP => w.bp + u64::from(row.cfa),
        RULE_PLT => w.sp + 8 + if pc & 15 >= 11 { 8 } else { 0 },
        _ => return Err(StackEnd::NoUnwindInfo),
    };
    let ra = read_user(cfa - 8)?;
    if row.rbp != 0 {
        w.bp = read_user(cfa.wrapping_add((row.rbp as i64 * 8) as u64))?;
    }
    w.sp = cfa;
    w.pc = ra;
    Ok(ra != 0)
}

#[inline(always)]
fn read_user(addr: u64) -> Result<u64, StackEnd> {
    unsafe { bpf_probe_read_user(addr as *const u64) }.map_err(|_| StackEnd::ReadFailed)
}

/// A binary search in progress: the answer is in rows [lo, hi).
#[repr(C)]
struct Search {
    lo: u32,
    hi: u32,
    at: u64,
}

/// The row that covers file offset `at`: the last one starting at or below it. The halving
/// runs in bpf_loop: as a plain loop inside the frame loop the verifier follows every
/// path of every iteration (over its million-instruction limit).
#[inline(always)]
fn search(slot: u32, table: FileTable, at: u64) -> Option<UnwindRow> {
    let first = UNWIND_ROWS.get(table.first)?;
    if table.len == 0 || u64::from(first.pc) > at || at >= 1 << 32 {
        return None;
    }
    let block = ((at >> INDEX_SHIFT) as u32).checked_sub(table.block0)?;
    if block >= table.blocks {
        return None; // past the last row's block: no CFI there
    }
    let [lo, hi] = *UNWIND_INDEX.get(table.index + block)?;
    let hi = (hi + 1).min(table.len);
    if hi <= lo {
        return None;
    }
    let l = LOOKUPS.get_ptr_mut(slot)?;
    unsafe {
        (*l).search = Search {
            lo: table.first + lo,
            hi: table.first + hi,
            at,
        };
    }
    let mut ctx = slot as u64;
    unsafe {
        generated::bpf_loop(
            SEARCH_STEPS,
            halve as *mut c_void,
            (&mut ctx as *mut u64).cast(),
            0,
        );
    }
    let (lo, hi) = unsafe { ((*l).search.lo, (*l).search.hi) };
    (hi - lo == 1).then_some(())?;
    UNWIND_ROWS.get(lo).copied()
}

/// One halving step of `slot`'s search; 1 when done.
unsafe extern "C" fn halve(_index: u32, ctx: *mut c_void) -> i64 {
    let slot = unsafe { *(ctx as *const u64) } as u32;
    let Some(l) = LOOKUPS.get_ptr_mut(slot) else {
        return 1;
    };
    let s = unsafe { &mut (*l).search };
    if s.hi - s.lo <= 1 {
        return 1;
    }
    let mid = s.lo + (s.hi - s.lo) / 2;
    match UNWIND_ROWS.get(mid) {
        Some(r) if u64::from(r.pc) <= s.at => s.lo = mid,
        Some(_) => s.hi = mid,
        None => return 1,
    }
    0
}

/// Makes the mapping that holds `pc` the walk's. At the leaf, a pc in no mapping is not a
/// stack at all: the thread is between two programs (execve) or jumped nowhere.
#[inline(always)]
fn find_mapping(w: &mut Walk, slot: u32, pc: u64) -> Result<(), StackEnd> {
    let map = match lookup(slot, w.image, pc) {
        Err(StackEnd::Unmapped) if w.n == 0 => return Err(StackEnd::NoUserCode),
        m => m?,
    };
    w.map = map;
    (w.table, w.loaded) = table_of(slot, w.image, &map);
    Ok(())
}

/// The code mapping that holds `pc` in process image `image`: remembered, or looked up
/// (and remembered); `slot`'s lookup record holds the search.
#[inline(always)]
fn lookup(slot: u32, image: ImageKey, pc: u64) -> Result<Mapping, StackEnd> {
    let l = LOOKUPS.get_ptr_mut(slot).ok_or(StackEnd::Unmapped)?;
    unsafe {
        (*l).scan = Scan {
            image,
            pc,
            found: PROCESS_MAPPINGS as u32,
            _pad: 0,
        };
    }
    let mut ctx = slot as u64;
    unsafe {
        generated::bpf_loop(
            PROCESS_MAPPINGS as u32,
            scan_step as *mut c_void,
            (&mut ctx as *mut u64).cast(),
            0,
        );
    }
    let found = unsafe { (*l).scan.found } as usize;
    if found < PROCESS_MAPPINGS
        && let Some(m) = unsafe { USER_MAPPINGS.get(&image) }
    {
        return Ok(m.maps[found & (PROCESS_MAPPINGS - 1)]);
    }
    unsafe { (*l).vma = VmaInfo::default() };
    let task = unsafe { generated::bpf_get_current_task_btf() };
    let ret = unsafe {
        generated::bpf_find_vma(
            task,
            pc,
            vma_found as *mut c_void,
            (&mut ctx as *mut u64).cast(),
            0,
        )
    };
    match ret {
        0 => {}
        -16 => return Err(StackEnd::LookupBusy), // EBUSY
        _ => return Err(StackEnd::Unmapped),
    }
    let v = unsafe { &(*l).vma };
    if v.flags & VM_EXEC == 0 || v.end <= pc {
        return Err(StackEnd::Unmapped);
    }
    let map = Mapping {
        start: v.start,
        end: v.end,
        offset: v.pgoff << 12,
        file: v.file,
    };
    remember(image, map);
    Ok(map)
}

/// A scan of an image's remembered mappings for the one holding `pc`.
#[repr(C)]
struct Scan {
    image: ImageKey,
    pc: u64,
    /// Index of the mapping found; PROCESS_MAPPINGS: none.
    found: u32,
    _pad: u32,
}

/// One remembered mapping; 1 when found (or there are none). In bpf_loop, as the halving:
/// a plain loop of 32 inside the frame step made loading take ~0.2 s of verification.
unsafe extern "C" fn scan_step(i: u32, ctx: *mut c_void) -> i64 {
    let slot = unsafe { *(ctx as *const u64) } as u32;
    let Some(l) = LOOKUPS.get_ptr_mut(slot) else {
        return 1;
    };
    let scan = unsafe { &mut (*l).scan };
    let Some(m) = (unsafe { USER_MAPPINGS.get(&scan.image) }) else {
        return 1;
    };
    // bpf_loop runs i below PROCESS_MAPPINGS; the mask says so to the verifier.
    let map = &m.maps[i as usize & (PROCESS_MAPPINGS - 1)];
    if map.start <= scan.pc && scan.pc < map.end {
        scan.found = i;
        return 1;
    }
    0
}

/// The current task's process image.
#[inline(always)]
fn current_image(tgid: u32) -> Option<ImageKey> {
    let task = unsafe { bpf_get_current_task() };
    let mm = read_kernel::<u64>(task, conf!(task_mm))?;
    Some(ImageKey {
        tgid,
        image: ImageKey::image_of(mm),
    })
}

/// Learns the code mapping at `addr` of the current process ahead of its first stack, so
/// that stacks taken where only one lookup succeeds (see the module doc) find it remembered
/// and its table loaded: called where interrupts are on, at an mmap's return (the loader
/// mapping a library) and at exec (the program and the loader, which the kernel maps).
#[inline(always)]
pub fn learn_mapping(slot: u32, tgid: u32, addr: u64) {
    if let Some(image) = current_image(tgid)
        && let Ok(map) = lookup(slot, image, addr)
    {
        table_of(slot, image, &map);
    }
}

/// The user address range of the current process's program text (mm->start_code).
#[inline(always)]
pub fn program_text() -> Option<u64> {
    let task = unsafe { bpf_get_current_task() };
    let mm = read_kernel::<u64>(task, conf!(task_mm))?;
    read_kernel::<u64>(mm, conf!(mm_start_code))
}

/// The pc of the current thread's user context.
#[inline(always)]
pub fn user_pc() -> Option<u64> {
    let task_btf = unsafe { generated::bpf_get_current_task_btf() };
    let regs = unsafe { generated::bpf_task_pt_regs(task_btf) } as u64;
    read_kernel::<u64>(regs, REGS_IP)
}

/// Appends `map` to its image's mappings (the oldest goes when they are full).
#[inline(always)]
fn remember(image: ImageKey, map: Mapping) {
    let mut m = USER_MAPPINGS.get_ptr_mut(&image);
    if m.is_none()
        && let Some(zero) = NO_MAPPINGS.get(0)
    {
        let _ = USER_MAPPINGS.insert(&image, zero, BPF_NOEXIST as u64);
        m = USER_MAPPINGS.get_ptr_mut(&image);
    }
    match m {
        Some(m) => unsafe {
            let i = (*m).n as usize & (PROCESS_MAPPINGS - 1);
            (*m).maps[i] = map;
            (*m).n += 1;
        },
        None => count(Counter::UserMappingsFull),
    }
}

/// `map`'s file's table and whether it has an entry (a table, or none to be had); asks
/// userspace for it when it has none yet.
#[inline(always)]
fn table_of(slot: u32, image: ImageKey, map: &Mapping) -> (FileTable, u32) {
    if let Some(t) = unsafe { UNWIND_FILES.get(&map.file) } {
        return (*t, 1);
    }
    // Anonymous code (JIT, the vDSO) has no file to load a table from.
    if map.file.ino == 0 {
        return (FileTable::default(), 1);
    }
    let Some(l) = LOOKUPS.get_ptr_mut(slot) else {
        return (FileTable::default(), 0);
    };
    let miss = unsafe { &mut (*l).miss };
    *miss = UnwindMiss {
        tgid: image.tgid,
        _pad: 0,
        start: map.start,
        end: map.end,
        file: map.file,
    };
    if UNWIND_MISSES
        .insert(&map.file, &*miss, BPF_NOEXIST as u64)
        .is_ok()
    {
        let _ = UNWIND_WAKE.output::<UnwindMiss>(&*miss, 0);
    }
    (FileTable::default(), 0)
}

/// bpf_find_vma's callback: the vma's range, flags and file.
unsafe extern "C" fn vma_found(_task: *mut task_struct, vma: *mut c_void, ctx: *mut c_void) -> i64 {
    let slot = unsafe { *(ctx as *const u64) } as u32;
    let Some(l) = LOOKUPS.get_ptr_mut(slot) else {
        return 0;
    };
    let info = unsafe { &mut (*l).vma };
    let vma = vma as u64;
    info.start = read_kernel::<u64>(vma, conf!(vma_start)).unwrap_or(0);
    info.end = read_kernel::<u64>(vma, conf!(vma_end)).unwrap_or(0);
    info.flags = read_kernel::<u64>(vma, conf!(vma_flags)).unwrap_or(0);
    info.pgoff = read_kernel::<u64>(vma, conf!(vma_pgoff)).unwrap_or(0);
    let file = read_kernel::<u64>(vma, conf!(vma_file)).unwrap_or(0);
    let inode = read_kernel::<u64>(file, conf!(file_inode)).unwrap_or(0);
    let sb = read_kernel::<u64>(inode, conf!(inode_sb)).unwrap_or(0);
    info.file = FileKey {
        dev: read_kernel::<u32>(sb, conf!(sb_dev)).unwrap_or(0),
        _pad: 0,
        ino: read_kernel::<u64>(inode, conf!(inode_ino)).unwrap_or(0),
    };
    0
}
