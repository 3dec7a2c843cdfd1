//! fsprof's kernel side. Everything is aggregated here, in per-CPU maps; userspace only
//! reads totals and histogram buckets after (or during) a run. Hooks are raw tracepoints:
//! they need no tracefs, work without kprobes, and pass kernel pointers whose fields we
//! read at offsets userspace found in BTF. sched_switch is a BTF tracepoint, whose typed
//! `next` lets bpf_get_task_stack unwind a thread that is about to run again.
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
