//! The kernel's internal dev_t encoding (include/linux/kdev_t.h: MINORBITS = 20), which
//! kernel structures hold (`super_block.s_dev`, `block_device.bd_dev`) and the probes key
//! devices by; userspace's dev_t (glibc's makedev) is a different encoding.

#[inline(always)]
pub const fn make(major: u32, minor: u32) -> u32 {
    (major << 20) | minor
}

/// (major, minor) of a kernel dev_t.
pub const fn split(dev: u32) -> (u32, u32) {
    (dev >> 20, dev & 0xfffff)
}
