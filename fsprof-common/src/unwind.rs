//! User stacks unwound in the kernel from DWARF call-frame information (.eh_frame), so
//! programs built without frame pointers (Debian's, and fsprof's own) get whole stacks.
//! Userspace compiles each ELF file's CFI into sorted rows (UNWIND_ROWS) keyed by the
//! file's (device, inode) (UNWIND_FILES); the kernel side walks them from the thread's
//! user registers. A stack that cannot go on ends in one marker frame saying why.

/// Rows over all loaded files: libc has 28k, PostgreSQL 77k, fsprof itself 91k.
pub const MAX_UNWIND_ROWS: u32 = 1 << 21;
/// Files with a table (or a "no table" entry) at once.
pub const MAX_UNWIND_FILES: u32 = 4096;
/// Files the kernel met without a table, waiting for userspace to load one.
pub const MAX_UNWIND_MISSES: u32 = 256;
/// Code mappings remembered per process image (executable, libc, loader, a few libraries);
/// a power of two (the kernel side wraps with a mask).
pub const PROCESS_MAPPINGS: usize = 32;
/// Process images whose mappings are remembered per trace (allocated as met).
pub const MAX_PROCESSES: u32 = 16384;
/// Iterations of the binary search over one file's rows: 2^23 rows at most.
pub const SEARCH_STEPS: u32 = 23;
/// Each file's rows are indexed per 2^INDEX_SHIFT bytes of its code (UNWIND_INDEX), so a
/// lookup halves over the ~20 rows of one such block, in a few cache lines, instead of
/// over the whole file (~16 cache misses, 0.5 µs a frame, measured).
pub const INDEX_SHIFT: u32 = 10;
/// Index entries over all loaded files: 1 GiB of code.
pub const MAX_UNWIND_INDEX: u32 = 1 << 20;

/// A file as the kernel knows it: superblock dev_t (kernel encoding) and inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u32,
    pub _pad: u32,
    pub ino: u64,
}

/// Where a file's rows are in UNWIND_ROWS; `len` 0: the file has no usable CFI. Its index
/// is `blocks` entries of UNWIND_INDEX from `index`: entry i holds the rows (counted from
/// `first`) that cover the start of block `block0` + i and of the block after it, between
/// which any address in the block finds its row. (Array map elements are 8-byte aligned,
/// which a pair fills.)
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileTable {
    pub first: u32,
    pub len: u32,
    pub index: u32,
    pub blocks: u32,
    pub block0: u32,
    pub _pad: u32,
}

/// How to find the caller from an address range that starts at file offset `pc` (up to
/// the next row): CFA = (rsp or rbp) + cfa; return address at CFA − 8; rbp saved at
/// CFA + 8·rbp when `rbp` is not 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    pub rule: u8,
    pub rbp: i8,
    pub cfa: u16,
}

/// No CFI covers the range (a gap between functions, or a rule fsprof cannot follow).
pub const RULE_NONE: u8 = 0;
pub const RULE_RSP: u8 = 1;
pub const RULE_RBP: u8 = 2;
/// A PLT stub: CFA = rsp + 8, + 8 more past the stub's push (its 11th byte).
pub const RULE_PLT: u8 = 3;
/// The return address is undefined: the outermost frame (_start, clone3).
pub const RULE_END: u8 = 4;

/// One code mapping of a process: addresses [start, end) hold `file` from `offset` on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub file: FileKey,
}

/// A process image: (tgid, its memory) — the image changes at exec, the tgid does not.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ImageKey {
    pub tgid: u32,
    /// Bits 6..38 of its `mm_struct`'s address (slab-allocated, 64-byte aligned, in the
    /// direct map): exec gives a process a new one. Not `self_exec_id`, which exec bumps
    /// only after switching to the new memory: a stack taken in between found the old
    /// image's mappings and read its stack in the new memory ("stack not readable").
    pub image: u32,
}

impl ImageKey {
    /// The image id of an `mm_struct` at `mm`.
    pub const fn image_of(mm: u64) -> u32 {
        (mm >> 6) as u32
    }
}

/// The code mappings the unwinder met in one process image, in the order met (the
/// key of USER_MAPPINGS is its ImageKey). Userspace places the frames with them after the
/// process is gone.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    pub n: u32,
    pub _pad: u32,
    pub maps: [Mapping; PROCESS_MAPPINGS],
}

/// A file met without a table: a mapping of it, for userspace to find its path by
/// (/proc/TGID/map_files). `start` 0: process `tgid` has just exec'd (its program and
/// libraries are wanted before the loader maps them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UnwindMiss {
    pub tgid: u32,
    pub _pad: u32,
    pub start: u64,
    pub end: u64,
    pub file: FileKey,
}

/// Bytes of the ring that wakes userspace's loader (UNWIND_WAKE).
pub const UNWIND_WAKE_BYTES: u32 = 1 << 14;

/// Why a user stack ends before the program's entry: stored as the last frame. Real code
/// never sits in the first page, so these values cannot be mistaken for addresses.
#[repr(u64)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackEnd {
    /// The file's unwind table was not loaded yet (userspace loads it when it is met).
    NotLoaded = 1,
    /// The file has no CFI for this address, or a rule fsprof does not follow.
    NoUnwindInfo = 2,
    /// The address is in no executable mapping (no frame is made up from it).
    Unmapped = 3,
    /// The stack memory could not be read (not resident, or the thread is exiting).
    ReadFailed = 4,
    /// More frames than the depth limit.
    TooDeep = 5,
    /// The mapping could not be looked up in this context (mmap lock busy).
    LookupBusy = 6,
    /// The thread has no user code to unwind: its pc is in no mapping (in execve, between
    /// two programs, or a jump to nowhere) or its memory is gone (exiting). Not a user
    /// stack; not counted as cut.
    NoUserCode = 7,
}

impl StackEnd {
    pub const ALL: [StackEnd; 7] = [
        StackEnd::NotLoaded,
        StackEnd::NoUnwindInfo,
        StackEnd::Unmapped,
        StackEnd::ReadFailed,
        StackEnd::TooDeep,
        StackEnd::LookupBusy,
        StackEnd::NoUserCode,
    ];

    /// The marker `frame` stands for, if it is one.
    pub fn of(frame: u64) -> Option<StackEnd> {
        StackEnd::ALL.into_iter().find(|e| *e as u64 == frame)
    }

    /// The frame shown in flame graphs.
    pub fn label(self) -> &'static str {
        match self {
            StackEnd::NotLoaded => "[stack ends: unwind table not loaded yet]",
            StackEnd::NoUnwindInfo => "[stack ends: no unwind info]",
            StackEnd::Unmapped => "[stack ends: address not in code]",
            StackEnd::ReadFailed => "[stack ends: stack not readable]",
            StackEnd::TooDeep => "[stack ends: depth limit]",
            StackEnd::LookupBusy => "[stack ends: mapping lookup busy]",
            StackEnd::NoUserCode => "[no user code: exec or exit]",
        }
    }
}

/// vm_area_struct.vm_flags bit of executable mappings.
pub const VM_EXEC: u64 = 0x4;

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for FileKey {}
    unsafe impl aya::Pod for FileTable {}
    unsafe impl aya::Pod for UnwindRow {}
    unsafe impl aya::Pod for ImageKey {}
    unsafe impl aya::Pod for ProcessMappings {}
    unsafe impl aya::Pod for UnwindMiss {}
}
