//! Running fsprof inside a VM booted with another kernel: the kernel (a path or a Debian
//! package unpacked once into a cache) and the guest (qemu through virtme-ng, the host's
//! root shared read-only, a raw test disk on virtio-blk with host caching off).

pub mod guest;
pub mod kernel;

pub use guest::{Accel, GuestRun, VmConfig};
pub use kernel::{GuestKernel, KernelSpec};

use std::path::Path;

use crate::lab::{self, FsKind};

/// `kind.check_available()`; when the host kernel lacks the driver, the error also names
/// the way that works: Debian's kernel in a VM (`dir`: fsprof's directory, kernels cached
/// under it).
pub fn check_fs_available(kind: FsKind, dir: &Path) -> anyhow::Result<()> {
    kind.check_available().map_err(|e| {
        if lab::fs_kind::kernel_supports(kind.kernel_name()) {
            e
        } else {
            let remedy = kernel::missing_driver_remedy(kind.kernel_name(), &dir.join("kernels"));
            anyhow::anyhow!("{e}; {remedy}")
        }
    })
}
