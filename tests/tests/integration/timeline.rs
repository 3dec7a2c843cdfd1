//! The timeline against the trace's own figures, read back with a decoder generated from
//! Perfetto's own schema (tracing-perfetto-sdk-schema), not fsprof's writer: the target's
//! thread states, rebuilt from the switches, wakeups and forks, sum to the time classes;
//! one block slice per block request counted; the in-flight counter ends at zero; one slice
//! per syscall and per fs begin/end pair counted.

use std::collections::BTreeMap;

use fsprof_tests::*;
use prost::Message;
use tracing_perfetto_sdk_schema::{
    self as pf, FtraceEvent, Trace, ftrace_event::Event, trace_packet::Data,
};

/// A thread's state as Perfetto shows it, by fsprof's time class names.
#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    Running,
    Runnable,
    Sleeping,
    Blocked { io: bool },
    Other,
}

impl State {
    /// The time class fsprof counts this state in.
    fn class(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Runnable => "run_queue",
            State::Sleeping => "sleep",
            State::Blocked { io: true } => "io_wait",
            State::Blocked { io: false } => "uninterruptible",
            State::Other => "other",
        }
    }

    /// From sched_switch's prev_state (ftrace's letters as bits); None: the thread exited.
    fn after_switch(prev_state: i64) -> Option<State> {
        Some(match prev_state {
            0 | 0x100 => State::Runnable,
            1 => State::Sleeping,
            // D, and I (TASK_IDLE), which fsprof counts as uninterruptible too.
            2 | 0x80 => State::Blocked { io: false },
            0x10 | 0x20 => return None,
            _ => State::Other,
        })
    }
}

/// The instant named `mark` on the timeline (fsprof's following began or ended).
fn mark(d: &Decoded, mark: &str) -> u64 {
    let at = d.track_events.iter().find(|(_, e)| event_name(e) == mark);
    at.unwrap_or_else(|| panic!("no '{mark}' on the timeline"))
        .0
}

/// Time per state of `threads`, from each thread's first event (or `began`) to its exit
/// (or `ended`): where the trace's figures begin and end.
fn thread_states(
    events: &[FtraceEvent],
    threads: &[i32],
    (began, ended): (u64, u64),
) -> BTreeMap<&'static str, u64> {
    let mut now: BTreeMap<i32, (State, u64)> = BTreeMap::new();
    let mut total = BTreeMap::new();
    let mut enter = |now: &mut BTreeMap<i32, (State, u64)>, tid, state: Option<State>, ts: u64| {
        if let Some((was, since)) = now.remove(&tid) {
            *total.entry(was.class()).or_insert(0) += ts.saturating_sub(since.max(began));
        }
        if let Some(s) = state {
            now.insert(tid, (s, ts));
        }
    };
    for e in events.iter().take_while(|e| e.timestamp() <= ended) {
        let ts = e.timestamp.unwrap();
        match e.event.as_ref() {
            Some(Event::SchedSwitch(s)) => {
                let (prev, next) = (s.prev_pid.unwrap(), s.next_pid.unwrap());
                if threads.contains(&prev) {
                    enter(
                        &mut now,
                        prev,
                        State::after_switch(s.prev_state.unwrap()),
                        ts,
                    );
                }
                if threads.contains(&next) {
                    enter(&mut now, next, Some(State::Running), ts);
                }
            }
            Some(Event::SchedBlockedReason(b)) => {
                if let Some((State::Blocked { io }, _)) = now.get_mut(&b.pid.unwrap()) {
                    *io = b.io_wait == Some(1);
                }
            }
            Some(Event::SchedWaking(w)) => {
                let tid = w.pid.unwrap();
                let asleep = now
                    .get(&tid)
                    .is_some_and(|(s, _)| !matches!(s, State::Running | State::Runnable));
                if asleep {
                    enter(&mut now, tid, Some(State::Runnable), ts);
                }
            }
            Some(Event::SchedWakeupNew(w)) if threads.contains(&w.pid.unwrap()) => {
                enter(&mut now, w.pid.unwrap(), Some(State::Runnable), ts);
            }
            _ => {}
        }
    }
    for tid in now.keys().copied().collect::<Vec<_>>() {
        enter(&mut now, tid, None, ended);
    }
    total
}

fn event_name(e: &pf::TrackEvent) -> &str {
    match &e.name_field {
        Some(pf::track_event::NameField::Name(n)) => n,
        _ => "",
    }
}

fn counter_value(e: &pf::TrackEvent) -> i64 {
    match e.counter_value_field {
        Some(pf::track_event::CounterValueField::CounterValue(v)) => v,
        _ => panic!("a counter event without an integer value: {e:?}"),
    }
}

/// The trace's ftrace events in time order, its target threads, and its track events by
/// the name of their track.
struct Decoded {
    events: Vec<FtraceEvent>,
    /// Where the target's threads blocked (sched_blocked_reason's caller, named through its
    /// packet's interned kernel symbols; "" when it names none), with how often.
    blocked: BTreeMap<String, u64>,
    threads: Vec<i32>,
    tracks: BTreeMap<u64, String>,
    track_events: Vec<(u64, pf::TrackEvent)>,
}

fn decode(bytes: &[u8]) -> Decoded {
    let trace = Trace::decode(bytes).expect("a Perfetto trace");
    let mut blocked_at: Vec<(i32, String)> = Vec::new();
    let mut d = Decoded {
        events: Vec::new(),
        blocked: BTreeMap::new(),
        threads: Vec::new(),
        tracks: BTreeMap::new(),
        track_events: Vec::new(),
    };
    for p in trace.packet {
        match p.data {
            Some(Data::FtraceEvents(b)) => {
                let symbols: BTreeMap<u64, String> = p
                    .interned_data
                    .iter()
                    .flat_map(|i| &i.kernel_symbols)
                    .map(|s| (s.iid(), String::from_utf8_lossy(s.str()).into_owned()))
                    .collect();
                for e in &b.event {
                    if let Some(Event::SchedBlockedReason(r)) = &e.event {
                        let name = r.caller.and_then(|c| symbols.get(&c)).cloned();
                        blocked_at.push((r.pid(), name.unwrap_or_default()));
                    }
                }
                d.events.extend(b.event);
            }
            Some(Data::ProcessTree(t)) => d.threads.extend(t.threads.iter().map(|t| t.tid())),
            Some(Data::TrackDescriptor(t)) => {
                let uuid = t.uuid();
                let name = match t.static_or_dynamic_name {
                    Some(pf::track_descriptor::StaticOrDynamicName::Name(n)) => n,
                    _ => String::new(),
                };
                d.tracks.insert(uuid, name);
            }
            Some(Data::TrackEvent(e)) => d.track_events.push((p.timestamp.unwrap(), e)),
            _ => {}
        }
    }
    for (pid, name) in blocked_at {
        if d.threads.contains(&pid) {
            *d.blocked.entry(name).or_insert(0) += 1;
        }
    }
    // Stable: a blocked reason stays after its switch.
    d.events.sort_by_key(|e| e.timestamp.unwrap());
    d.track_events.sort_by_key(|(ts, _)| *ts);
    d
}

pub fn thread_states_and_block_slices_match_the_trace() {
    let out = TempDir::new("timeline");
    let file = out.0.join("t.perfetto-trace");
    // Direct I/O waits, then 8 MB left dirty in the page cache until the syncfs after it.
    let script = "dd if=/dev/zero of=f bs=64k count=400 oflag=direct status=none; \
                  dd if=f of=/dev/null bs=64k iflag=direct status=none; \
                  dd if=/dev/zero of=g bs=1M count=8 status=none; sleep 0.3";
    let (said, t) = trace_sh(
        &[
            "--fs",
            "ext4",
            "--size",
            "128M",
            "--no-stacks",
            "--timeline-syscalls-over",
            "0",
            "--timeline-blocked-functions",
            "--timeline",
            file.to_str().unwrap(),
        ],
        &out.0.join("t.json"),
        script,
    );
    assert!(said.contains("timeline: "), "{said}");
    let summary = t.timeline.as_ref().expect("the timeline's summary");
    assert_eq!(summary.lost, 0, "{summary:?}");
    let d = decode(&std::fs::read(&file).unwrap());
    assert_eq!(d.threads.len() as u64, summary.threads);
    assert!(d.threads.len() >= 3, "sh and two dd: {:?}", d.threads);

    let following = (
        mark(&d, fsprof::aggregate::timeline::FOLLOWING_BEGAN),
        mark(&d, fsprof::aggregate::timeline::FOLLOWING_ENDED),
    );
    let states = thread_states(&d.events, &d.threads, following);
    let time = &t.profile.time;
    eprintln!("timeline states {states:?}, trace {time:?}");
    for (state, fsprof) in [
        ("running", time.on_cpu.ns + time.steal.ns),
        ("run_queue", time.run_queue.ns),
        ("io_wait", time.io_wait.ns),
        ("uninterruptible", time.uninterruptible.ns),
        ("sleep", time.sleep.ns),
        ("other", time.other.ns),
    ] {
        let seen = states.get(state).copied().unwrap_or(0);
        // Two programs stamp each switch a few hundred ns apart; a thread's first interval
        // (before its first switch) is in neither.
        let slack = 1_000_000 + fsprof / 50;
        assert!(
            seen.abs_diff(fsprof) <= slack,
            "{state}: timeline {seen} ns, trace {fsprof} ns"
        );
    }
    assert!(time.io_wait.ns > 0 && states["io_wait"] > 0);

    check_block(&d, &t, summary);
    check_spans(&d, &t);
    check_blocked_functions(&d, &t);
    check_dirty(&d);
}

/// The page cache counters: sampled every drain (50 ms), in bytes, and the 8 MB the
/// script left dirty shows.
fn check_dirty(d: &Decoded) {
    let values = |name: &str| -> Vec<i64> {
        d.track_events
            .iter()
            .filter(|(_, e)| d.tracks[&e.track_uuid()] == name)
            .map(|(_, e)| counter_value(e))
            .collect()
    };
    let (dirty, writeback) = (
        values("page cache dirty"),
        values("page cache under writeback"),
    );
    assert!(
        dirty.len() >= 6 && dirty.len() == writeback.len(),
        "{dirty:?}"
    );
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as i64;
    assert!(
        dirty
            .iter()
            .chain(&writeback)
            .all(|v| *v >= 0 && v % page == 0)
    );
    assert!(dirty.iter().any(|&v| v >= 8 << 20), "{dirty:?}");
}

/// Every D-state switch-out of the target names the kernel function it blocked in (past
/// the scheduler's), one per D episode the trace counted.
fn check_blocked_functions(d: &Decoded, t: &fsprof::trace::TraceResult) {
    eprintln!("blocked in: {:?}", d.blocked);
    let episodes = t.profile.time.io_wait.episodes + t.profile.time.uninterruptible.episodes;
    assert_eq!(d.blocked.values().sum::<u64>(), episodes);
    assert_eq!(d.blocked.get(""), None, "{:?}", d.blocked);
    let scheduler = ["schedule", "io_schedule", "__schedule", "schedule_timeout"];
    for name in d.blocked.keys() {
        assert!(!scheduler.contains(&name.as_str()), "{name}");
    }
}

/// Every syscall counted (the threshold is 0) and every completed fs pair is one slice on
/// its thread, by name.
fn check_spans(d: &Decoded, t: &fsprof::trace::TraceResult) {
    use pf::track_event::Type;
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for s in &t.profile.syscalls {
        *want.entry(s.name.clone()).or_insert(0) += s.count;
    }
    let pairs = &t.profile.fs_events.as_ref().expect("fs events").pairs;
    for p in pairs.iter().filter(|p| p.count > 0) {
        *want.entry(p.name.clone()).or_insert(0) += p.count;
    }
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for (_, e) in &d.track_events {
        let track = &d.tracks[&e.track_uuid()];
        if e.r#type() == Type::SliceBegin && !track.starts_with("loop0") {
            *got.entry(event_name(e).to_string()).or_insert(0) += 1;
        }
    }
    assert_eq!(got, want);
    assert!(pairs.iter().any(|p| p.count > 0), "{pairs:?}");
}

/// One slice per request counted, each with its device part, and the in-flight counter
/// back at zero.
fn check_block(
    d: &Decoded,
    t: &fsprof::trace::TraceResult,
    summary: &fsprof::aggregate::timeline::TimelineSummary,
) {
    use pf::track_event::Type;
    let issued: u64 = t
        .profile
        .block
        .iter()
        .filter(|b| b.name == "loop0")
        .map(|b| b.issued)
        .sum();
    assert!(issued >= 800, "{issued}");
    let lanes = |name: &str| name.starts_with("loop0 lane ");
    let begins = |what: &dyn Fn(&str) -> bool| {
        d.track_events
            .iter()
            .filter(|(_, e)| e.r#type() == Type::SliceBegin && lanes(&d.tracks[&e.track_uuid()]))
            .filter(|(_, e)| what(event_name(e)))
            .count() as u64
    };
    assert_eq!(begins(&|n| n != "device"), issued);
    assert_eq!(begins(&|n| n == "device"), issued);
    let ends = d
        .track_events
        .iter()
        .filter(|(_, e)| e.r#type() == Type::SliceEnd && lanes(&d.tracks[&e.track_uuid()]))
        .count() as u64;
    assert_eq!(ends, 2 * issued);
    assert_eq!(summary.block_requests.get("loop0"), Some(&issued));
    let counter: Vec<i64> = d
        .track_events
        .iter()
        .filter(|(_, e)| d.tracks[&e.track_uuid()] == "loop0 requests in flight")
        .map(|(_, e)| counter_value(e))
        .collect();
    assert_eq!(counter.last(), Some(&0));
    assert!(counter.iter().all(|&n| n >= 0) && counter.iter().any(|&n| n >= 1));
}

/// One stack sample of the timeline, as Perfetto's own schema reads it.
#[derive(serde::Deserialize, Debug)]
struct StackSample {
    ts: u64,
    tid: u32,
    counter: String,
    unit: String,
    weight: u64,
    /// Bottom first: [function, file].
    frames: Vec<(String, String)>,
}

/// The stack samples of a trace, read by Perfetto's Python package (its v59 schema: the
/// Rust schema crate above predates stack samples).
fn stack_samples(file: &std::path::Path) -> Vec<StackSample> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/perfetto_stack_samples.py"
    );
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(file)
        .output()
        .unwrap();
    assert_success(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The target's off-CPU stacks on the timeline: per class, their weights add up to the
/// trace's time class exactly, and each is a stack of the off-CPU flame graph, as heavy.
pub fn off_cpu_stacks_on_the_timeline_add_up_to_the_time_classes() {
    use fsprof::aggregate::timeline::stack_counter;
    use fsprof_common::TimeClass;
    let out = TempDir::new("timeline-stacks");
    let (file, flames) = (out.0.join("t.perfetto-trace"), out.0.join("flames"));
    let script = "dd if=/dev/zero of=f bs=64k count=300 oflag=direct status=none; \
                  sleep 0.1; dd if=f of=/dev/null bs=64k iflag=direct status=none";
    let (file_arg, flames_arg) = (file.to_str().unwrap(), flames.to_str().unwrap());
    let (_, t) = trace_sh(
        &[
            "--fs",
            "ext4",
            "--size",
            "128M",
            "--timeline",
            file_arg,
            "--flames",
            flames_arg,
        ],
        &out.0.join("t.json"),
        script,
    );
    let summary = t.timeline.as_ref().expect("the timeline's summary");
    assert_eq!(summary.lost, 0, "{summary:?}");
    let threads = decode(&std::fs::read(&file).unwrap()).threads;
    let samples = stack_samples(&file);
    assert_eq!(
        samples.len() as u64,
        summary.off_cpu_stacks.values().sum::<u64>()
    );
    let mut by_class: BTreeMap<&str, u64> = BTreeMap::new();
    for s in &samples {
        assert_eq!(s.unit, "UNIT_NANOSECONDS");
        assert!(s.ts > 0 && threads.contains(&(s.tid as i32)), "{s:?}");
        *by_class.entry(&s.counter).or_insert(0) += s.weight;
    }
    eprintln!("stack samples {} by class {by_class:?}", samples.len());
    let time = &t.profile.time;
    for c in [
        TimeClass::IoWait,
        TimeClass::Uninterruptible,
        TimeClass::Sleep,
        TimeClass::RunQueue,
        TimeClass::Other,
    ] {
        let got = by_class.get(stack_counter(c as u32).as_str()).copied();
        assert_eq!(got.unwrap_or(0), time.class(c).ns, "{c:?}");
    }
    assert!(time.io_wait.ns > 0 && time.sleep.ns > 0);
    check_sample_frames(&samples, &flames.join("sh.off-cpu.folded"));
}

/// Every stack sample's frames are a stack of the off-CPU folded file (below its thread's
/// frame), and the samples of one stack weigh what the file gives it (µs, rounded per
/// stack).
fn check_sample_frames(samples: &[StackSample], folded: &std::path::Path) {
    use fsprof::aggregate::{stacks::class_label, timeline::stack_counter};
    let mut file: BTreeMap<String, u64> = BTreeMap::new();
    for line in std::fs::read_to_string(folded).unwrap().lines() {
        let (stack, us) = line.rsplit_once(' ').unwrap();
        let below_thread = stack.split_once(';').map_or("", |(_, rest)| rest);
        *file.entry(below_thread.to_string()).or_insert(0) += us.parse::<u64>().unwrap();
    }
    let class_of = |counter: &str| {
        (1..6)
            .find(|&c| stack_counter(c) == counter)
            .map(class_label)
            .unwrap()
    };
    let mut timeline: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| s.frames[0].0 != "[stack unavailable]")
    {
        let frames = s.frames.iter().map(|(f, file)| {
            let f = f.replace(';', ":");
            if file == "[kernel]" {
                format!("{f}_[k]")
            } else {
                f
            }
        });
        let stack = std::iter::once(format!("[{}]", class_of(&s.counter)))
            .chain(frames)
            .collect::<Vec<_>>()
            .join(";");
        let e = timeline.entry(stack).or_default();
        e.0 += s.weight;
        e.1 += 1;
    }
    assert!(timeline.len() >= 3, "{timeline:?}");
    for (stack, (ns, n)) in &timeline {
        let us = file.get(stack).copied().unwrap_or(0);
        assert!(
            (ns / 1000).abs_diff(us) <= n + 1,
            "{stack}: {ns} ns in {n} samples, {us} µs in the file"
        );
    }
}
