//! SIGINT/SIGTERM handling: fsprof never dies half-way with a mount or loop device left
//! behind. The handler only records the signal (and forwards it to the traced child);
//! the main path notices, stops at the next safe point and cleans up through `Drop`.

use std::sync::atomic::{AtomicI32, Ordering};

static RECEIVED: AtomicI32 = AtomicI32::new(0);
static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    RECEIVED.store(sig, Ordering::SeqCst);
    let child = CHILD.load(Ordering::SeqCst);
    // SIGINT from a terminal already reaches the child through its process group; SIGTERM
    // (from kill or a CI timeout) does not, so pass it on. kill(2) is async-signal-safe.
    if sig == libc::SIGTERM
        && let Some(pid) = rustix::process::Pid::from_raw(child)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
}

/// Installs the handlers; idempotent.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: sigaction is plain data (zeroes are valid, then filled in); the handler
        // only stores to atomics and makes the async-signal-safe kill(2).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The signal received so far, if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Fails with a one-line error when a signal arrived: call at safe points.
pub fn check() -> anyhow::Result<()> {
    match received() {
        None => Ok(()),
        Some(s) => anyhow::bail!("interrupted by signal {s}; cleaned up"),
    }
}

/// The process to forward SIGTERM to while it runs (0: none).
pub fn set_child(pid: i32) {
    CHILD.store(pid, Ordering::SeqCst);
}
