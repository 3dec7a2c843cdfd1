//! The timeline as a Perfetto trace (ui.perfetto.dev, trace_processor): the scheduler's
//! switches, wakeups and forks as ftrace events, from which Perfetto draws every thread's
//! state (Running, Runnable, Sleeping, Uninterruptible with I/O wait) and every CPU's
//! track; the watched devices' block requests as slices (arrival → issue is queued,
//! issue → completion on the device), on as many lanes as were in flight at once, with a
//! counter of requests in flight; the target's processes and threads named. Lost records
//! are marked where the stream resumed.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs,
    path::Path,
};

use anyhow::{Context, Result};
use fsprof_common::{
    BlockClass,
    config::TASK_UNINTERRUPTIBLE,
    timeline::{
        TIMELINE_DEAD, TimelineBlock, TimelineBlocked, TimelineKind, TimelineSpan, TimelineSwitch,
        TimelineTask,
    },
};
use prost::Message;
use serde::{Deserialize, Serialize};

use super::stacks::{NamedStack, OpenInterval, class_label};
use crate::probes::timeline::{Dirty, Record, Stream};

/// The messages of Perfetto's trace format (protos/perfetto/trace/perfetto_trace.proto) that
/// fsprof writes, field numbers as there. A `oneof` is written as its one member set.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Trace {
        #[prost(message, repeated, tag = "1")]
        pub packet: Vec<TracePacket>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TracePacket {
        #[prost(uint64, optional, tag = "8")]
        pub timestamp: Option<u64>,
        #[prost(uint32, optional, tag = "10")]
        pub trusted_packet_sequence_id: Option<u32>,
        #[prost(uint32, optional, tag = "13")]
        pub sequence_flags: Option<u32>,
        #[prost(message, optional, tag = "1")]
        pub ftrace_events: Option<FtraceEventBundle>,
        #[prost(message, optional, tag = "2")]
        pub process_tree: Option<ProcessTree>,
        #[prost(message, optional, tag = "11")]
        pub track_event: Option<TrackEvent>,
        #[prost(message, optional, tag = "45")]
        pub system_info: Option<SystemInfo>,
        #[prost(message, optional, tag = "60")]
        pub track_descriptor: Option<TrackDescriptor>,
        #[prost(message, optional, tag = "12")]
        pub interned_data: Option<InternedData>,
        #[prost(message, optional, tag = "135")]
        pub stack_sample: Option<StackSample>,
    }

    /// A callstack of a thread weighed in a counter's unit (profiling/stack_sample.proto,
    /// Perfetto v58 on): here, off-CPU time.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StackSample {
        #[prost(message, optional, tag = "1")]
        pub task_context: Option<TaskContext>,
        #[prost(message, optional, tag = "5")]
        pub callstack: Option<InlineCallstack>,
        #[prost(message, optional, tag = "9")]
        pub primary_descriptor: Option<SampleCounter>,
        #[prost(uint64, optional, tag = "11")]
        pub primary_weight: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TaskContext {
        #[prost(uint32, optional, tag = "2")]
        pub pid: Option<u32>,
        #[prost(uint32, optional, tag = "3")]
        pub tid: Option<u32>,
    }

    /// StackSample.CounterDescriptor.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SampleCounter {
        #[prost(string, optional, tag = "2")]
        pub name: Option<String>,
        /// StackSample.Unit: 1 nanoseconds.
        #[prost(int32, optional, tag = "3")]
        pub unit: Option<i32>,
    }

    /// Frames bottom (outermost) first (profiling/inline_callstack.proto).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InlineCallstack {
        #[prost(message, repeated, tag = "1")]
        pub frames: Vec<InlineFrame>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InlineFrame {
        #[prost(string, optional, tag = "1")]
        pub function_name: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub source_file: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InternedData {
        #[prost(message, repeated, tag = "26")]
        pub kernel_symbols: Vec<InternedString>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InternedString {
        #[prost(uint64, optional, tag = "1")]
        pub iid: Option<u64>,
        #[prost(bytes = "vec", optional, tag = "2")]
        pub str: Option<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SystemInfo {
        #[prost(message, optional, tag = "1")]
        pub utsname: Option<Utsname>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Utsname {
        #[prost(string, optional, tag = "1")]
        pub sysname: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub release: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub machine: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FtraceEventBundle {
        #[prost(uint32, optional, tag = "1")]
        pub cpu: Option<u32>,
        #[prost(message, repeated, tag = "2")]
        pub event: Vec<FtraceEvent>,
        #[prost(bool, optional, tag = "3")]
        pub lost_events: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FtraceEvent {
        #[prost(uint64, optional, tag = "1")]
        pub timestamp: Option<u64>,
        #[prost(uint32, optional, tag = "2")]
        pub pid: Option<u32>,
        #[prost(message, optional, tag = "4")]
        pub sched_switch: Option<SchedSwitch>,
        #[prost(message, optional, tag = "18")]
        pub sched_blocked_reason: Option<SchedBlockedReason>,
        #[prost(message, optional, tag = "20")]
        pub sched_waking: Option<SchedWaking>,
        #[prost(message, optional, tag = "114")]
        pub sched_wakeup_new: Option<SchedWaking>,
        #[prost(message, optional, tag = "235")]
        pub task_newtask: Option<TaskNewtask>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SchedSwitch {
        #[prost(string, optional, tag = "1")]
        pub prev_comm: Option<String>,
        #[prost(int32, optional, tag = "2")]
        pub prev_pid: Option<i32>,
        #[prost(int32, optional, tag = "3")]
        pub prev_prio: Option<i32>,
        #[prost(int64, optional, tag = "4")]
        pub prev_state: Option<i64>,
        #[prost(string, optional, tag = "5")]
        pub next_comm: Option<String>,
        #[prost(int32, optional, tag = "6")]
        pub next_pid: Option<i32>,
        #[prost(int32, optional, tag = "7")]
        pub next_prio: Option<i32>,
    }

    /// Also SchedWakeupNewFtraceEvent: the same fields and numbers.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SchedWaking {
        #[prost(string, optional, tag = "1")]
        pub comm: Option<String>,
        #[prost(int32, optional, tag = "2")]
        pub pid: Option<i32>,
        #[prost(int32, optional, tag = "3")]
        pub prio: Option<i32>,
        #[prost(int32, optional, tag = "4")]
        pub success: Option<i32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SchedBlockedReason {
        #[prost(int32, optional, tag = "1")]
        pub pid: Option<i32>,
        /// An iid of the packet's `InternedData::kernel_symbols` (as traced writes it with
        /// `symbolize_ksyms`), not an address.
        #[prost(uint64, optional, tag = "2")]
        pub caller: Option<u64>,
        #[prost(uint32, optional, tag = "3")]
        pub io_wait: Option<u32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TaskNewtask {
        #[prost(int32, optional, tag = "1")]
        pub pid: Option<i32>,
        #[prost(string, optional, tag = "2")]
        pub comm: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessTree {
        #[prost(message, repeated, tag = "1")]
        pub processes: Vec<Process>,
        #[prost(message, repeated, tag = "2")]
        pub threads: Vec<Thread>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Process {
        #[prost(int32, optional, tag = "1")]
        pub pid: Option<i32>,
        #[prost(string, repeated, tag = "3")]
        pub cmdline: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Thread {
        #[prost(int32, optional, tag = "1")]
        pub tid: Option<i32>,
        #[prost(string, optional, tag = "2")]
        pub name: Option<String>,
        #[prost(int32, optional, tag = "3")]
        pub tgid: Option<i32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackDescriptor {
        #[prost(uint64, optional, tag = "1")]
        pub uuid: Option<u64>,
        #[prost(string, optional, tag = "2")]
        pub name: Option<String>,
        #[prost(uint64, optional, tag = "5")]
        pub parent_uuid: Option<u64>,
        #[prost(message, optional, tag = "4")]
        pub thread: Option<ThreadDescriptor>,
        #[prost(message, optional, tag = "8")]
        pub counter: Option<CounterDescriptor>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ThreadDescriptor {
        #[prost(int32, optional, tag = "1")]
        pub pid: Option<i32>,
        #[prost(int32, optional, tag = "2")]
        pub tid: Option<i32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CounterDescriptor {
        #[prost(int32, optional, tag = "3")]
        pub unit: Option<i32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackEvent {
        /// Type: 1 slice begin, 2 slice end, 3 instant, 4 counter.
        #[prost(int32, optional, tag = "9")]
        pub r#type: Option<i32>,
        #[prost(uint64, optional, tag = "11")]
        pub track_uuid: Option<u64>,
        #[prost(string, optional, tag = "23")]
        pub name: Option<String>,
        #[prost(int64, optional, tag = "30")]
        pub counter_value: Option<i64>,
        #[prost(message, repeated, tag = "4")]
        pub debug_annotations: Vec<DebugAnnotation>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DebugAnnotation {
        #[prost(string, optional, tag = "10")]
        pub name: Option<String>,
        #[prost(uint64, optional, tag = "3")]
        pub uint_value: Option<u64>,
        #[prost(int64, optional, tag = "4")]
        pub int_value: Option<i64>,
    }
}

use proto::*;

/// What a written timeline holds, for the results and the terminal.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TimelineSummary {
    pub path: String,
    pub bytes: u64,
    /// Records by kind: switch, waking, fork, block_issue, block_complete, fs_pair,
    /// syscall, blocked, off_cpu_stack.
    pub records: BTreeMap<String, u64>,
    /// Block requests drawn as slices (issued during the trace), per device name.
    pub block_requests: BTreeMap<String, u64>,
    /// Slices on the target's and the filesystem's threads: completed fs begin/end pairs
    /// by name, and syscalls at least `syscall_min_ns` long by name.
    pub fs_pairs: BTreeMap<String, u64>,
    pub syscalls: BTreeMap<String, u64>,
    pub syscall_min_ns: u64,
    /// Records the kernel could not write (ring buffer full); marked on the timeline.
    pub lost: u64,
    /// Records fsprof could not decode (a bug; left out).
    #[serde(default)]
    pub undecoded: u64,
    /// The target's threads seen.
    pub threads: u64,
    /// Off-CPU time given a stack, as stack samples of its thread, by class: one per wait
    /// that took a stack (with the shorter ones of its class since), one per remainder at
    /// a thread's exit or still open at the end.
    #[serde(default)]
    pub off_cpu_stacks: BTreeMap<String, u64>,
}

/// The sequence all of fsprof's track events are written on.
const SEQUENCE: u32 = 1;
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
/// TrackEvent.Type.
const SLICE_BEGIN: i32 = 1;
const SLICE_END: i32 = 2;
const INSTANT: i32 = 3;
const COUNTER: i32 = 4;
/// CounterDescriptor.Unit.
const UNIT_COUNT: i32 = 2;
const UNIT_SIZE_BYTES: i32 = 3;
/// StackSample.Unit.
const UNIT_NANOSECONDS: i32 = 1;

/// What names the spans' ids.
pub struct SpanNames {
    /// fs begin/end pair id → name (`FsEventsAttached::pairs`).
    pub pairs: BTreeMap<u32, String>,
    /// Syscalls at least this long were streamed.
    pub syscall_min_ns: u64,
}

/// The target's off-CPU stacks, to put the timeline's stack records on: named by id, and
/// the time still open at the end (`aggregate::collect`).
#[derive(Default)]
pub struct OffCpuStacks<'a> {
    pub named: Option<&'a HashMap<u32, NamedStack>>,
    pub open: &'a [OpenInterval],
}

/// When the target's figures begin (its release, or the last follow of `-p`) and end
/// (`Probes::freeze`); the timeline's records go on either side.
#[derive(Clone, Copy, Default)]
pub struct Following {
    pub began: Option<u64>,
    pub ended: Option<u64>,
}

/// Writes `records` as a Perfetto trace to `path`.
pub fn write(
    path: &Path,
    stream: Stream,
    kernel: &str,
    names: &SpanNames,
    stacks: &OffCpuStacks,
    following: Following,
) -> Result<TimelineSummary> {
    let mut records = stream.records;
    records.sort_by_key(|r| r.head().ts);
    let dirty = dirty_counters(&stream.dirty);
    let mut trace = Trace::default();
    trace.packet.push(system_info(kernel));
    trace
        .packet
        .extend(ftrace_bundles(&records, &BlockedFunctions::of(&records)));
    trace.packet.push(process_tree(&records));
    // The sequence's first packet clears its state: the lost marks' track comes first.
    trace.packet.extend(lost_marks(&records));
    trace
        .packet
        .extend(following_marks(following, stacks.named.is_some()));
    let blocks = block_packets(&records);
    trace.packet.extend(blocks.packets);
    let spans = span_packets(&records, names);
    trace.packet.extend(spans.packets);
    trace.packet.extend(dirty);
    let (samples, off_cpu_stacks) = stack_samples(&records, stacks);
    trace.packet.extend(samples);
    let bytes = trace.encode_to_vec();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(path, &bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(TimelineSummary {
        path: path.display().to_string(),
        bytes: bytes.len() as u64,
        records: count_kinds(&records),
        block_requests: blocks.requests,
        fs_pairs: spans.pairs,
        syscalls: spans.syscalls,
        syscall_min_ns: names.syscall_min_ns,
        lost: records.iter().map(|r| r.head().lost_before).sum(),
        undecoded: stream.undecoded,
        threads: target_threads(&records).len() as u64,
        off_cpu_stacks,
    })
}

fn count_kinds(records: &[Record]) -> BTreeMap<String, u64> {
    let mut n = BTreeMap::new();
    for kind in records
        .iter()
        .filter_map(|r| TimelineKind::from_u32(r.head().kind))
    {
        *n.entry(kind.name().to_string()).or_insert(0) += 1;
    }
    n
}

fn system_info(kernel: &str) -> TracePacket {
    TracePacket {
        system_info: Some(SystemInfo {
            utsname: Some(Utsname {
                sysname: Some("Linux".into()),
                release: Some(kernel.into()),
                machine: Some(std::env::consts::ARCH.into()),
            }),
        }),
        ..Default::default()
    }
}

fn comm(t: &TimelineTask) -> String {
    let end = t.comm.iter().position(|&b| b == 0).unwrap_or(t.comm.len());
    String::from_utf8_lossy(&t.comm[..end]).into_owned()
}

/// The state ftrace's sched_switch reports for `prev` (`__trace_sched_switch_state`): one
/// bit per state letter, as Perfetto reads it for kernels ≥ 4.14: R 0, S 1, D 2, T 4, t 8,
/// X 0x10, Z 0x20, P 0x40, I 0x80, preempted (R+) 0x100. An exiting thread is reported X
/// (the kernel reports X or Z by its exit_state, which fsprof does not read).
pub fn reported_state(s: &TimelineSwitch) -> i64 {
    const TASK_REPORT: u32 = 0x7f;
    const TASK_NOLOAD: u32 = 0x400;
    const TASK_RTLOCK_WAIT: u32 = 0x1000;
    if s.preempt != 0 {
        return 0x100;
    }
    if s.prev_class == TIMELINE_DEAD {
        return 0x10;
    }
    let idle = TASK_UNINTERRUPTIBLE | TASK_NOLOAD;
    let state = if s.prev_state & idle == idle {
        0x80
    } else if s.prev_state & TASK_RTLOCK_WAIT != 0 {
        TASK_UNINTERRUPTIBLE
    } else {
        s.prev_state & TASK_REPORT
    };
    // The highest bit set, as the kernel's fls() picks it.
    match state {
        0 => 0,
        s => 1 << (31 - s.leading_zeros()),
    }
}

/// The ftrace events of one record: a switch, where a thread blocked (and whether it waits
/// for I/O), a wakeup, a fork (a new task, runnable).
fn ftrace_events(r: &Record, callers: &mut Interned) -> Vec<FtraceEvent> {
    let at = |pid: u32| FtraceEvent {
        timestamp: Some(r.head().ts),
        pid: Some(pid),
        ..Default::default()
    };
    match r {
        Record::Switch(s) => {
            vec![FtraceEvent {
                sched_switch: Some(SchedSwitch {
                    prev_comm: Some(comm(&s.prev)),
                    prev_pid: Some(s.prev.tid as i32),
                    prev_prio: Some(s.prev.prio as i32),
                    prev_state: Some(reported_state(s)),
                    next_comm: Some(comm(&s.next)),
                    next_pid: Some(s.next.tid as i32),
                    next_prio: Some(s.next.prio as i32),
                }),
                ..at(s.prev.tid)
            }]
        }
        Record::Blocked(b) => vec![FtraceEvent {
            sched_blocked_reason: Some(SchedBlockedReason {
                pid: Some(b.tid as i32),
                caller: callers.iid(b),
                io_wait: Some(b.io_wait),
            }),
            ..at(b.tid)
        }],
        Record::Waking(w) => vec![FtraceEvent {
            sched_waking: Some(waking(&w.woken)),
            ..at(w.waker_tid)
        }],
        Record::Fork(f) => vec![
            FtraceEvent {
                task_newtask: Some(TaskNewtask {
                    pid: Some(f.child.tid as i32),
                    comm: Some(comm(&f.child)),
                }),
                ..at(f.parent_tid)
            },
            FtraceEvent {
                sched_wakeup_new: Some(waking(&f.child)),
                ..at(f.parent_tid)
            },
        ],
        Record::Block(_) | Record::Span(_) | Record::Stack(_) => Vec::new(),
    }
}

fn waking(t: &TimelineTask) -> SchedWaking {
    SchedWaking {
        comm: Some(comm(t)),
        pid: Some(t.tid as i32),
        prio: Some(t.prio as i32),
        success: Some(1),
    }
}

/// Where each blocked thread waited: its kernel stack's first frame past the scheduler,
/// as the kernel's own `get_wchan` picks it (the frames below `__schedule` are the
/// tracepoint's and fsprof's own), by address, named.
struct BlockedFunctions {
    sched_text: Option<(u64, u64)>,
    names: HashMap<u64, String>,
}

impl BlockedFunctions {
    fn of(records: &[Record]) -> BlockedFunctions {
        let blocked: Vec<_> = records
            .iter()
            .filter_map(|r| match r {
                Record::Blocked(b) => Some(b),
                _ => None,
            })
            .collect();
        let sched_text = if blocked.is_empty() {
            None
        } else {
            sched_text()
        };
        let Some((lo, hi)) = sched_text else {
            return BlockedFunctions {
                sched_text,
                names: HashMap::new(),
            };
        };
        let addrs: Vec<u64> = blocked
            .iter()
            .filter_map(|b| wchan(&b.frames, lo, hi))
            .collect::<BTreeSet<u64>>()
            .into_iter()
            .collect();
        let names = super::symbols::with(|s| s.kernel(&addrs));
        BlockedFunctions {
            sched_text,
            names: addrs.into_iter().zip(names).collect(),
        }
    }

    fn name(&self, b: &TimelineBlocked) -> Option<&String> {
        let (lo, hi) = self.sched_text?;
        self.names.get(&wchan(&b.frames, lo, hi)?)
    }
}

/// The scheduler's code (`__sched` functions), from /proc/kallsyms.
fn sched_text() -> Option<(u64, u64)> {
    let text = fs::read_to_string("/proc/kallsyms").ok()?;
    let find = |name: &str| {
        text.lines()
            .find(|l| l.ends_with(name) && l.split(' ').nth(2) == Some(name))
            .and_then(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
            .filter(|&a| a != 0)
    };
    Some((find("__sched_text_start")?, find("__sched_text_end")?))
}

/// The first frame past the scheduler's, above at least one of them.
fn wchan(frames: &[u64], lo: u64, hi: u64) -> Option<u64> {
    let in_sched = |a: &u64| (lo..hi).contains(a);
    let first = frames.iter().position(in_sched)?;
    frames[first..]
        .iter()
        .copied()
        .find(|a| *a != 0 && !in_sched(a))
}

/// One bundle's kernel symbols, interned as they are first used (ids per bundle, as traced
/// writes them).
struct Interned<'a> {
    functions: &'a BlockedFunctions,
    ids: BTreeMap<String, u64>,
}

impl Interned<'_> {
    fn iid(&mut self, b: &TimelineBlocked) -> Option<u64> {
        let name = self.functions.name(b)?;
        let next = self.ids.len() as u64 + 1;
        Some(*self.ids.entry(name.clone()).or_insert(next))
    }

    fn take(&mut self) -> Option<InternedData> {
        let ids = std::mem::take(&mut self.ids);
        (!ids.is_empty()).then(|| InternedData {
            kernel_symbols: ids
                .into_iter()
                .map(|(name, iid)| InternedString {
                    iid: Some(iid),
                    str: Some(name.into_bytes()),
                })
                .collect(),
        })
    }
}

/// The ftrace bundles of one CPU's sequence (its own, since their interned symbols are).
fn ftrace_sequence(cpu: u32) -> u32 {
    FTRACE_SEQUENCES + cpu
}
const FTRACE_SEQUENCES: u32 = 1000;

/// One bundle per CPU, split where that CPU lost records (the bundle after a gap says so);
/// each packet carries the kernel symbols its blocked reasons name and starts its sequence's
/// state afresh.
fn ftrace_bundles(records: &[Record], functions: &BlockedFunctions) -> Vec<TracePacket> {
    let mut open: BTreeMap<u32, (FtraceEventBundle, Interned)> = BTreeMap::new();
    let mut done = Vec::new();
    for r in records {
        let h = r.head();
        if matches!(r, Record::Block(_) | Record::Span(_) | Record::Stack(_)) {
            continue;
        }
        if h.lost_before > 0
            && let Some(b) = open.remove(&h.cpu)
        {
            done.push(b);
        }
        let (bundle, interned) = open.entry(h.cpu).or_insert_with(|| {
            let bundle = FtraceEventBundle {
                cpu: Some(h.cpu),
                lost_events: (h.lost_before > 0).then_some(true),
                ..Default::default()
            };
            let interned = Interned {
                functions,
                ids: BTreeMap::new(),
            };
            (bundle, interned)
        });
        bundle.event.extend(ftrace_events(r, interned));
    }
    done.extend(open.into_values());
    done.into_iter()
        .map(|(b, mut interned)| TracePacket {
            trusted_packet_sequence_id: b.cpu.map(ftrace_sequence),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE),
            interned_data: interned.take(),
            ftrace_events: Some(b),
            ..Default::default()
        })
        .collect()
}

/// The target's threads (followed at a switch, or forked by a followed one): tid → (tgid,
/// last name seen).
fn target_threads(records: &[Record]) -> BTreeMap<u32, (u32, String)> {
    let mut threads = BTreeMap::new();
    for r in records {
        let (t, followed) = match r {
            Record::Switch(s) if s.prev_followed != 0 => (&s.prev, true),
            Record::Switch(s) => (&s.next, s.next_followed != 0),
            Record::Fork(f) => (&f.child, true),
            _ => continue,
        };
        if followed {
            threads.insert(t.tid, (t.tgid, comm(t)));
        }
    }
    threads
}

fn process_tree(records: &[Record]) -> TracePacket {
    let threads = target_threads(records);
    let processes: BTreeSet<u32> = threads.values().map(|(tgid, _)| *tgid).collect();
    TracePacket {
        process_tree: Some(ProcessTree {
            processes: processes
                .iter()
                .map(|&pid| Process {
                    pid: Some(pid as i32),
                    // Its main thread's name: what Perfetto labels the process with.
                    cmdline: threads
                        .get(&pid)
                        .map(|(_, name)| vec![name.clone()])
                        .unwrap_or_default(),
                })
                .collect(),
            threads: threads
                .iter()
                .map(|(&tid, (tgid, name))| Thread {
                    tid: Some(tid as i32),
                    name: Some(name.clone()),
                    tgid: Some(*tgid as i32),
                })
                .collect(),
        }),
        ..Default::default()
    }
}

/// A block request from its arrival (or issue) to its last part's completion.
struct Request {
    dev: u32,
    class: u32,
    bytes: u32,
    sector: u64,
    arrived: u64,
    issued: u64,
    completed: Option<u64>,
}

/// The requests issued during the trace, in arrival order.
fn requests(records: &[Record]) -> Vec<Request> {
    let mut in_flight: HashMap<u64, usize> = HashMap::new();
    let mut out: Vec<Request> = Vec::new();
    for r in records {
        let Record::Block(b) = r else { continue };
        match TimelineKind::from_u32(b.head.kind) {
            Some(TimelineKind::BlockIssue) => {
                in_flight.insert(b.rq, out.len());
                out.push(issued(b));
            }
            // The last part completes the request (a loop device completes in parts).
            Some(TimelineKind::BlockComplete) if b.bytes >= b.left => {
                if let Some(i) = in_flight.remove(&b.rq) {
                    out[i].completed = Some(b.head.ts);
                }
            }
            _ => {}
        }
    }
    out.sort_by_key(|q| q.arrived);
    out
}

fn issued(b: &TimelineBlock) -> Request {
    let ts = b.head.ts;
    Request {
        dev: b.dev,
        class: b.class,
        bytes: b.bytes,
        sector: b.sector,
        // The kernel's arrival stamp, when it keeps one and it is not after the issue.
        arrived: if b.arrived != 0 && b.arrived <= ts {
            b.arrived
        } else {
            ts
        },
        issued: ts,
        completed: None,
    }
}

/// The lanes of one track: each holds one slice at a time, because slices on a track must
/// nest and these overlap. Slices are placed in order of their start.
#[derive(Default)]
struct Lanes(Vec<u64>);

impl Lanes {
    /// The lane of a slice from `start` to `end`, and whether it is a new one.
    fn place(&mut self, start: u64, end: u64) -> (usize, bool) {
        match self.0.iter().position(|&busy_until| busy_until <= start) {
            Some(l) => {
                self.0[l] = end;
                (l, false)
            }
            None => {
                self.0.push(end);
                (self.0.len() - 1, true)
            }
        }
    }
}

struct BlockPackets {
    packets: Vec<TracePacket>,
    requests: BTreeMap<String, u64>,
}

/// Track uuids: a device's track, its lanes and its in-flight counter.
fn device_uuid(dev: u32) -> u64 {
    1 << 40 | u64::from(dev) << 8
}

/// Each device's requests as slices on lanes (a lane holds one request at a time: slices
/// on one track must nest), and its requests in flight as a counter.
fn block_packets(records: &[Record]) -> BlockPackets {
    let requests = requests(records);
    let mut packets = Vec::new();
    let mut counts = BTreeMap::new();
    let mut lanes: BTreeMap<u32, Lanes> = BTreeMap::new();
    let mut changes: Vec<(u64, u32, i64)> = Vec::new();
    for q in &requests {
        let (major, minor) = fsprof_common::kdev::split(q.dev);
        let name = Some(super::block::dev_name(major, minor))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("{major}:{minor}"));
        let device = lanes.entry(q.dev).or_default();
        if device.0.is_empty() {
            packets.extend(device_tracks(q.dev, &name));
        }
        let (lane, new) = device.place(q.arrived, q.completed.unwrap_or(u64::MAX));
        if new {
            packets.push(descriptor(
                device_uuid(q.dev) + lane as u64 + 2,
                format!("{name} lane {}", lane + 1),
                Some(device_uuid(q.dev)),
            ));
        }
        *counts.entry(name).or_insert(0) += 1;
        packets.extend(request_slices(q, device_uuid(q.dev) + lane as u64 + 2));
        changes.push((q.issued, q.dev, 1));
        if let Some(c) = q.completed {
            changes.push((c, q.dev, -1));
        }
    }
    packets.extend(in_flight_counters(changes));
    BlockPackets {
        packets,
        requests: counts,
    }
}

fn descriptor(uuid: u64, name: String, parent: Option<u64>) -> TracePacket {
    TracePacket {
        track_descriptor: Some(TrackDescriptor {
            uuid: Some(uuid),
            name: Some(name),
            parent_uuid: parent,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A device's parent track and its in-flight counter track (uuid + 1).
fn device_tracks(dev: u32, name: &str) -> Vec<TracePacket> {
    vec![
        descriptor(device_uuid(dev), format!("block {name}"), None),
        counter_track(
            device_uuid(dev) + 1,
            format!("{name} requests in flight"),
            Some(device_uuid(dev)),
            UNIT_COUNT,
        ),
    ]
}

/// A counter track in `unit` (CounterDescriptor.Unit).
fn counter_track(uuid: u64, name: String, parent: Option<u64>, unit: i32) -> TracePacket {
    let mut d = descriptor(uuid, name, parent);
    if let Some(t) = &mut d.track_descriptor {
        t.counter = Some(CounterDescriptor { unit: Some(unit) });
    }
    d
}

/// Counter `track` is `value` from `ts` on.
fn counter_event(ts: u64, track: u64, value: i64) -> TracePacket {
    let mut p = track_event(ts, track, COUNTER, None);
    if let Some(e) = &mut p.track_event {
        e.counter_value = Some(value);
    }
    p
}

fn track_event(ts: u64, track: u64, kind: i32, name: Option<String>) -> TracePacket {
    TracePacket {
        timestamp: Some(ts),
        trusted_packet_sequence_id: Some(SEQUENCE),
        track_event: Some(TrackEvent {
            r#type: Some(kind),
            track_uuid: Some(track),
            name,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The request as a slice named by its class, with the device's part nested inside; a
/// request still in flight at the end has no end.
fn request_slices(q: &Request, track: u64) -> Vec<TracePacket> {
    let class = BlockClass::from_u32(q.class).name();
    let mut begin = track_event(q.arrived, track, SLICE_BEGIN, Some(class.into()));
    if let Some(e) = &mut begin.track_event {
        e.debug_annotations = [
            ("bytes", u64::from(q.bytes)),
            ("sector", q.sector),
            ("queued_ns", q.issued - q.arrived),
        ]
        .into_iter()
        .map(|(n, v)| DebugAnnotation {
            name: Some(n.into()),
            uint_value: Some(v),
            int_value: None,
        })
        .collect();
    }
    let mut out = vec![
        begin,
        track_event(q.issued, track, SLICE_BEGIN, Some("device".into())),
    ];
    if let Some(c) = q.completed {
        out.push(track_event(c, track, SLICE_END, None));
        out.push(track_event(c, track, SLICE_END, None));
    }
    out
}

fn in_flight_counters(mut changes: Vec<(u64, u32, i64)>) -> Vec<TracePacket> {
    changes.sort();
    let mut now: HashMap<u32, i64> = HashMap::new();
    changes
        .into_iter()
        .map(|(ts, dev, d)| {
            let n = now.entry(dev).or_insert(0);
            *n += d;
            counter_event(ts, device_uuid(dev) + 1, *n)
        })
        .collect()
}

struct SpanPackets {
    packets: Vec<TracePacket>,
    pairs: BTreeMap<String, u64>,
    syscalls: BTreeMap<String, u64>,
}

/// A thread's track (lane 0) and its extra lanes.
fn thread_uuid(tid: u32, lane: usize) -> u64 {
    2 << 40 | u64::from(tid) << 8 | lane as u64
}

/// fs begin/end pairs and slow syscalls as slices on their thread's track (the thread that
/// ended the pair: a commit's on jbd2 or xfs-cil, a sync on the target's), on more lanes
/// where they overlap without nesting.
fn span_packets(records: &[Record], names: &SpanNames) -> SpanPackets {
    let mut spans: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Span(s) => Some(s),
            _ => None,
        })
        .collect();
    spans.sort_by_key(|s| s.start);
    let mut out = SpanPackets {
        packets: Vec::new(),
        pairs: BTreeMap::new(),
        syscalls: BTreeMap::new(),
    };
    let mut lanes: HashMap<u32, Lanes> = HashMap::new();
    for s in spans {
        let syscall = s.head.kind == TimelineKind::Syscall as u32;
        let name = if syscall {
            crate::syscall_table::name(s.id)
        } else {
            names
                .pairs
                .get(&s.id)
                .cloned()
                .unwrap_or_else(|| format!("pair {}", s.id))
        };
        let counts = if syscall {
            &mut out.syscalls
        } else {
            &mut out.pairs
        };
        *counts.entry(name.clone()).or_insert(0) += 1;
        let thread = lanes.entry(s.tid).or_default();
        if thread.0.is_empty() {
            out.packets.push(thread_track(s));
        }
        let (lane, new) = thread.place(s.start, s.head.ts);
        if new && lane > 0 {
            out.packets.push(descriptor(
                thread_uuid(s.tid, lane),
                format!("fs and syscalls, lane {}", lane + 1),
                Some(thread_uuid(s.tid, 0)),
            ));
        }
        let track = thread_uuid(s.tid, lane);
        let mut begin = track_event(s.start, track, SLICE_BEGIN, Some(name));
        if syscall && let Some(e) = &mut begin.track_event {
            e.debug_annotations.push(DebugAnnotation {
                name: Some("ret".into()),
                int_value: Some(s.value),
                uint_value: None,
            });
        }
        out.packets.push(begin);
        out.packets
            .push(track_event(s.head.ts, track, SLICE_END, None));
    }
    out
}

fn thread_track(s: &TimelineSpan) -> TracePacket {
    TracePacket {
        track_descriptor: Some(TrackDescriptor {
            uuid: Some(thread_uuid(s.tid, 0)),
            thread: Some(ThreadDescriptor {
                pid: Some(s.tgid as i32),
                tid: Some(s.tid as i32),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Off-CPU time given a stack as stack samples of its thread (Perfetto draws them on the
/// thread's process and weighs an area's flame graph by them): the stack (user frames, then
/// the kernel's) weighed in nanoseconds of its class's counter (`off-CPU: I/O wait`, …),
/// at the end of the wait that took it, or at the end of the trace for time still open.
/// Per class they add up to the stacks' weights, so to the time classes. Also the count
/// per class.
fn stack_samples(
    records: &[Record],
    stacks: &OffCpuStacks,
) -> (Vec<TracePacket>, BTreeMap<String, u64>) {
    let threads = target_threads(records);
    let recorded = records.iter().filter_map(|r| match r {
        Record::Stack(s) => Some((s.head.ts, s.tid, s.class, s.stack, s.ns)),
        _ => None,
    });
    let open = stacks
        .open
        .iter()
        .map(|o| (o.at, o.tid, o.class, o.stack, o.ns));
    let mut counts = BTreeMap::new();
    let mut packets = Vec::new();
    for (ts, tid, class, stack, ns) in recorded.chain(open).filter(|w| w.4 > 0) {
        *counts.entry(class_label(class).to_string()).or_insert(0) += 1;
        let named = stacks.named.and_then(|n| n.get(&stack));
        let pid = threads.get(&tid).map(|t| t.0);
        packets.push(TracePacket {
            timestamp: Some(ts),
            trusted_packet_sequence_id: Some(SEQUENCE),
            stack_sample: Some(StackSample {
                task_context: Some(TaskContext {
                    pid: pid.or(named.map(|n| n.tgid)),
                    tid: Some(tid),
                }),
                callstack: Some(inline_callstack(named)),
                primary_descriptor: Some(SampleCounter {
                    name: Some(stack_counter(class)),
                    unit: Some(UNIT_NANOSECONDS),
                }),
                primary_weight: Some(ns),
            }),
            ..Default::default()
        });
    }
    (packets, counts)
}

/// The counter a stack sample of off-CPU `class` (a TimeClass) is weighed in.
pub fn stack_counter(class: u32) -> String {
    format!("off-CPU: {}", class_label(class))
}

fn inline_callstack(named: Option<&NamedStack>) -> InlineCallstack {
    let frame = |name: &str, file: &str| InlineFrame {
        function_name: Some(name.to_string()),
        source_file: (!file.is_empty()).then(|| file.to_string()),
    };
    InlineCallstack {
        frames: match named {
            Some(n) => n.frames.iter().map(|(f, file)| frame(f, file)).collect(),
            None => vec![frame("[stack unavailable]", "")],
        },
    }
}

/// The page cache's dirty and writeback bytes (machine-wide, read at each drain: every 50
/// ms) as two counters.
fn dirty_counters(samples: &[Dirty]) -> Vec<TracePacket> {
    const DIRTY: u64 = 3 << 40;
    const WRITEBACK: u64 = DIRTY + 1;
    if samples.is_empty() {
        return Vec::new();
    }
    let mut out = vec![
        counter_track(DIRTY, "page cache dirty".into(), None, UNIT_SIZE_BYTES),
        counter_track(
            WRITEBACK,
            "page cache under writeback".into(),
            None,
            UNIT_SIZE_BYTES,
        ),
    ];
    for s in samples {
        out.push(counter_event(s.ts, DIRTY, s.dirty as i64));
        out.push(counter_event(s.ts, WRITEBACK, s.writeback as i64));
    }
    out
}

/// An instant on fsprof's own track where a CPU's stream resumed after lost records.
fn lost_marks(records: &[Record]) -> Vec<TracePacket> {
    const TRACK: u64 = 1;
    let lost: Vec<_> = records
        .iter()
        .map(Record::head)
        .filter(|h| h.lost_before > 0)
        .collect();
    let mut out = vec![TracePacket {
        sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
        trusted_packet_sequence_id: Some(SEQUENCE),
        ..descriptor(TRACK, "fsprof: records lost".into(), None)
    }];
    out.extend(lost.into_iter().map(|h| {
        let name = format!("{} records lost on CPU {}", h.lost_before, h.cpu);
        track_event(h.ts, TRACK, INSTANT, Some(name))
    }));
    out
}

/// The instants following began and ended, on a track of that name: the figures (and
/// the stack samples) lie between, the switches and block requests go on either side.
pub const FOLLOWING_BEGAN: &str = "fsprof: following began";
pub const FOLLOWING_ENDED: &str = "fsprof: following ended";
/// The end's annotation: 1 when off-CPU time was given stacks (samples), else 0.
pub const WITH_STACKS: &str = "off_cpu_stacks";

fn following_marks(following: Following, with_stacks: bool) -> Vec<TracePacket> {
    const TRACK: u64 = 2;
    let mut out = vec![TracePacket {
        trusted_packet_sequence_id: Some(SEQUENCE),
        ..descriptor(TRACK, "fsprof: following".into(), None)
    }];
    if let Some(ts) = following.began {
        out.push(track_event(
            ts,
            TRACK,
            INSTANT,
            Some(FOLLOWING_BEGAN.into()),
        ));
    }
    if let Some(ts) = following.ended {
        let mut mark = track_event(ts, TRACK, INSTANT, Some(FOLLOWING_ENDED.into()));
        if let Some(e) = &mut mark.track_event {
            e.debug_annotations.push(DebugAnnotation {
                name: Some(WITH_STACKS.into()),
                uint_value: Some(with_stacks.into()),
                int_value: None,
            });
        }
        out.push(mark);
    }
    out
}

#[cfg(test)]
mod tests {
    use fsprof_common::timeline::TimelineHeader;

    use fsprof_common::TimeClass;

    use super::*;

    fn switch(state: u32, class: TimeClass, preempt: bool) -> TimelineSwitch {
        TimelineSwitch {
            prev_state: state,
            prev_class: class as u32,
            preempt: preempt.into(),
            ..Default::default()
        }
    }

    #[test]
    fn switch_states_are_reported_as_ftrace_reports_them() {
        assert_eq!(reported_state(&switch(0, TimeClass::RunQueue, true)), 0x100);
        assert_eq!(reported_state(&switch(0, TimeClass::RunQueue, false)), 0);
        assert_eq!(reported_state(&switch(1, TimeClass::Sleep, false)), 1);
        assert_eq!(reported_state(&switch(2, TimeClass::IoWait, false)), 2);
        // TASK_IDLE (D | NOLOAD) is I; TASK_KILLABLE (D | WAKEKILL 0x100) is D.
        assert_eq!(
            reported_state(&switch(0x402, TimeClass::Other, false)),
            0x80
        );
        assert_eq!(reported_state(&switch(0x102, TimeClass::Other, false)), 2);
        let dead = TimelineSwitch {
            prev_class: TIMELINE_DEAD,
            prev_state: 0x80,
            ..Default::default()
        };
        assert_eq!(reported_state(&dead), 0x10);
    }

    #[test]
    fn the_blocked_function_is_the_first_frame_past_the_scheduler() {
        let (lo, hi) = (0x1000, 0x2000);
        // bpf_trace_run, __traceiter_sched_switch, __schedule, schedule, io_schedule, the waiter.
        let frames = [0x9000, 0x9100, 0x1100, 0x1200, 0x1300, 0x5000, 0x6000, 0];
        assert_eq!(wchan(&frames, lo, hi), Some(0x5000));
        assert_eq!(wchan(&[0x9000, 0x5000, 0], lo, hi), None);
        assert_eq!(wchan(&[0x1100, 0, 0], lo, hi), None);
    }

    fn block(kind: TimelineKind, ts: u64, rq: u64, bytes: u32, left: u32) -> Record {
        Record::Block(TimelineBlock {
            head: TimelineHeader {
                kind: kind as u32,
                ts,
                ..Default::default()
            },
            rq,
            dev: fsprof_common::kdev::make(7, 0),
            class: BlockClass::Write as u32,
            bytes,
            left,
            ..Default::default()
        })
    }

    #[test]
    fn overlapping_requests_take_lanes_and_parts_complete_once() {
        use TimelineKind::{BlockComplete as C, BlockIssue as I};
        let records = [
            block(I, 10, 1, 8192, 0),
            block(I, 20, 2, 4096, 0),
            // Request 1 completes in two parts; only the last ends its slice.
            block(C, 30, 1, 4096, 8192),
            block(C, 40, 1, 4096, 4096),
            block(I, 50, 3, 4096, 0),
            block(C, 60, 2, 4096, 4096),
        ];
        let q = requests(&records);
        assert_eq!(q.len(), 3);
        assert_eq!(q[0].completed, Some(40));
        assert_eq!(q[2].completed, None);
        let out = block_packets(&records);
        let lanes: Vec<String> = out
            .packets
            .iter()
            .filter_map(|p| p.track_descriptor.as_ref()?.name.clone())
            .filter(|n| n.contains(" lane "))
            .collect();
        // 1 and 2 overlap; 3 arrives after 1 ended and takes its lane.
        assert_eq!(lanes.len(), 2, "{lanes:?}");
        let counter: Vec<i64> = out
            .packets
            .iter()
            .filter_map(|p| p.track_event.as_ref()?.counter_value)
            .collect();
        assert_eq!(counter, [1, 2, 1, 2, 1]);
        assert_eq!(out.requests.values().sum::<u64>(), 3);
    }
}
