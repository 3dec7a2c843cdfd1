//! Programs that do nothing but count their runs (as every fsprof program does), attached
//! to the same hooks as the real ones by `--floor`: what any BPF program on those hooks
//! costs (the tracepoints' enabled branches, the syscall slow path, the dispatch), measured
//! beside fsprof's own cost.

use aya_ebpf::{
    macros::{perf_event, raw_tracepoint},
    programs::{PerfEventContext, RawTracePointContext},
};
use fsprof_common::Program;

use crate::common::ran;

#[raw_tracepoint]
pub fn floor_tp(_ctx: RawTracePointContext) -> i32 {
    ran(Program::FloorTp);
    0
}

#[perf_event]
pub fn floor_sample(_ctx: PerfEventContext) -> u32 {
    ran(Program::FloorSample);
    0
}
