//! Running fsprof inside a VM booted with another kernel: the kernel (a path or a Debian
//! package unpacked once into a cache) and the guest (qemu through virtme-ng, the host's
//! root shared read-only, a raw test disk on virtio-blk with host caching off).

pub mod guest;
pub mod kernel;

pub use guest::{Accel, GuestRun, VmConfig};
pub use kernel::{GuestKernel, KernelSpec};
