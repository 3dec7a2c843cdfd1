//! fsprof's kernel side. Everything is aggregated here, in per-CPU maps; userspace only
//! reads totals and histogram buckets after (or during) a run. Hooks are raw tracepoints:
//! they need no tracefs, work without kprobes, and pass kernel pointers whose fields we
//! read at offsets userspace found in BTF. sched_switch is a BTF tracepoint, whose typed
//! `next` lets bpf_get_task_stack unwind a thread that is about to run again.
//!
//! # Safety
//! The `unsafe` blocks here are of four kinds, each sound for the reason given; each module
//! says which it uses.
//! - **Map values** (`get_ptr_mut`, `common::entry`): a pointer into a map value lives as
//!   long as the program's run (the kernel frees no value a running program holds, and
//!   checks every access against the value's size). Per-CPU values are this CPU's: a
//!   program runs with migration disabled, and one that can interrupt another on its CPU
//!   (the cpu-clock sampler, in a hard interrupt) has scratch slots of its own
//!   (`stacks::SLOT_*`).
//!   Values shared across CPUs (TASKS, the hashes) hold counters and stamps whose racy
//!   updates the module documents where they matter (`sched_waking` reads `off_since` once).
//! - **Kernel memory**: read through `bpf_probe_read_kernel` (`read_kernel`, which fails
//!   instead of faulting), or as plain loads from a BTF tracepoint's typed arguments, which
//!   the verifier types; offsets come from the running kernel's BTF.
//! - **Helpers** (`bpf_get_current_task`, `bpf_get_stack`, `bpf_find_vma`, ring buffer
//!   reserve/submit): foreign calls whose arguments the verifier checks at load.
//! - **Globals** (`#[unsafe(no_mangle)]` configuration and BPF global functions): written
//!   by userspace before load, read-only while the programs run.
#![no_std]
#![no_main]

mod block;
mod common;
mod floor;
mod fs_events;
mod offcpu;
mod sched;
mod stacks;
mod syscalls;
mod timeline;
mod unwind;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
