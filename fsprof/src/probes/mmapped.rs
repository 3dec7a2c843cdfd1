//! BPF_F_MMAPABLE arrays seen through a memory mapping: the unwinder writes its tables so
//! (one copy, no syscall per row), and the block probes' INFLIGHT array is read so at the
//! end of a trace (32k entries would be 32k lookups).

use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Result, bail};
use aya::maps::MapData;

/// `len` `T`s of a map's memory, unmapped on drop.
struct Region<T> {
    ptr: *mut T,
    len: usize,
}

impl<T: Copy> Region<T> {
    fn map(map: &MapData, name: &str, len: u32, prot: i32) -> Result<Region<T>> {
        let len = len as usize;
        // SAFETY: the map holds `len` elements of T; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * size_of::<T>(),
                prot,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!("mapping {name}: {}", std::io::Error::last_os_error());
        }
        Ok(Region {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl<T> Drop for Region<T> {
    fn drop(&mut self) {
        // SAFETY: the region `map` mapped; nothing uses it after its owner is gone.
        unsafe { libc::munmap(self.ptr.cast(), self.len * size_of::<T>()) };
    }
}

/// A BPF_F_MMAPABLE array of `len` `T`s mapped into this process for writing.
pub struct Mmapped<T> {
    region: Region<T>,
    /// Kept open: programs are loaded after the maps are taken, by their fds.
    _map: MapData,
}

// SAFETY: the mapping is process-wide memory; its owner serializes writes (the unwind
// Loader's mutex).
unsafe impl<T> Send for Mmapped<T> {}

impl<T: Copy> Mmapped<T> {
    pub fn new(map: MapData, name: &str, len: u32) -> Result<Mmapped<T>> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        Ok(Mmapped {
            region: Region::map(&map, name, len, prot)?,
            _map: map,
        })
    }

    /// Writes `items` at `at`; false when they do not fit.
    pub fn write(&mut self, at: usize, items: &[T]) -> bool {
        if at + items.len() > self.region.len {
            return false;
        }
        // SAFETY: in bounds (checked above); the kernel reads these elements only after
        // the program's own tables name them.
        unsafe {
            std::ptr::copy_nonoverlapping(items.as_ptr(), self.region.ptr.add(at), items.len())
        };
        true
    }
}

/// A copy of the `len` `T`s of a BPF_F_MMAPABLE array, as they are now.
pub fn read<T: Copy>(map: &MapData, name: &str, len: u32) -> Result<Vec<T>> {
    let r = Region::<T>::map(map, name, len, libc::PROT_READ)?;
    // SAFETY: `len` elements are mapped; volatile, as programs may be writing meanwhile.
    Ok((0..r.len)
        .map(|i| unsafe { std::ptr::read_volatile(r.ptr.add(i)) })
        .collect())
}
