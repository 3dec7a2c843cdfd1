//! Attaching a loaded program to a raw tracepoint by name with a BPF cookie, through
//! BPF_RAW_TRACEPOINT_OPEN (aya's raw-tracepoint attach takes no cookie, and attaches a
//! program once: the fs events and the floor attach one program to many tracepoints).

use std::os::fd::{FromRawFd, OwnedFd};

/// `union bpf_attr` for BPF_RAW_TRACEPOINT_OPEN; `cookie` since Linux 6.10.
#[repr(C)]
struct RawTracepointOpen {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
}
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;

/// Attaches `prog_fd` to raw tracepoint `name` with `cookie`.
pub fn attach_raw(prog_fd: i32, name: &str, cookie: u64) -> std::io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name)?;
    let attr = RawTracepointOpen {
        name: cname.as_ptr() as u64,
        prog_fd: prog_fd as u32,
        _pad: 0,
        cookie,
    };
    // No rustix or aya call does BPF_RAW_TRACEPOINT_OPEN with a cookie. SAFETY: `attr` is
    // a bpf_attr prefix of the size passed, and `cname` outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_RAW_TRACEPOINT_OPEN,
            &attr as *const RawTracepointOpen,
            std::mem::size_of::<RawTracepointOpen>() as u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
