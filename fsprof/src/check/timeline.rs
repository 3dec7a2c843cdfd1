//! The invariants of a Perfetto timeline: its off-CPU stack samples and the thread states
//! its switches and wakeups draw, against each other or against the trace it came with.

use std::{collections::BTreeMap, path::Path};

use anyhow::{Context, Result};
use fsprof_common::TimeClass;
use prost::Message;

use super::{Checks, TIMELINE_STACKS, TIMELINE_STATES, Unit};
use crate::{
    aggregate::timeline::{
        FOLLOWING_BEGAN, FOLLOWING_ENDED, Following, WITH_STACKS, proto, stack_counter,
    },
    trace::TraceResult,
};

/// What a timeline says, per time class (by `TimeClass::name`).
struct Read {
    /// Thread states of the target's threads, ns; "on_cpu" holds running (and steal).
    states: BTreeMap<&'static str, u64>,
    /// Off-CPU stack samples' weights, ns.
    stacks: BTreeMap<&'static str, u64>,
    /// Whether off-CPU time was given stack samples (some were, or the timeline says so).
    has_stacks: bool,
    /// Whether the timeline says which D-waits were I/O waits (`--timeline-blocked-functions`
    /// writes sched_blocked_reason); without, all are uninterruptible to Perfetto.
    has_blocked: bool,
    lost: bool,
}

/// Reads a following mark into `f` (timelines written before them have none), and
/// whether off-CPU time was given stacks.
fn following_mark(p: &proto::TracePacket, f: &mut Following, stacks: &mut bool) {
    let Some((e, ts)) = p.track_event.as_ref().zip(p.timestamp) else {
        return;
    };
    match e.name.as_deref() {
        Some(FOLLOWING_BEGAN) => f.began = Some(ts),
        Some(FOLLOWING_ENDED) => {
            f.ended = Some(ts);
            *stacks |= (e.debug_annotations.iter())
                .any(|a| a.name.as_deref() == Some(WITH_STACKS) && a.uint_value == Some(1));
        }
        _ => {}
    }
}

/// Checks the timeline at `path`, against `trace` when it is the trace that wrote it.
pub fn check_timeline(c: &mut Checks, path: &Path, trace: Option<&TraceResult>) {
    let item = path.display().to_string();
    let r = match read(path) {
        Ok(r) => r,
        Err(e) => return c.unreadable.push((path.to_path_buf(), format!("{e:#}"))),
    };
    if r.lost {
        c.skip(TIMELINE_STATES, "records lost in the kernel");
        return c.skip(TIMELINE_STACKS, "records lost in the kernel");
    }
    // Without blocked reasons I/O waits are drawn as uninterruptible: D-waits compare whole.
    let merged = |k: TimeClass, by: &dyn Fn(TimeClass) -> u64| match (k, r.has_blocked) {
        (TimeClass::Uninterruptible, false) => by(k) + by(TimeClass::IoWait),
        _ => by(k),
    };
    for &k in TimeClass::ALL {
        if k == TimeClass::Steal || (k == TimeClass::IoWait && !r.has_blocked) {
            continue;
        }
        let state = r.states.get(k.name()).copied().unwrap_or(0);
        let off_cpu = k != TimeClass::OnCpu;
        let stacked = merged(k, &|k| r.stacks.get(k.name()).copied().unwrap_or(0));
        let what = format!("{item} {}", k.name());
        match trace {
            Some(t) => {
                let time = &t.profile.time;
                let class =
                    merged(k, &|k| time.class(k).ns) + if off_cpu { 0 } else { time.steal.ns };
                c.agree(
                    TIMELINE_STATES,
                    &what,
                    ("thread states", state),
                    ("time class", class),
                    slack(class),
                    Unit::Ns,
                );
                if off_cpu && r.has_stacks {
                    c.agree(
                        TIMELINE_STACKS,
                        &what,
                        ("stack samples", stacked),
                        ("time class", class),
                        0,
                        Unit::Ns,
                    );
                }
            }
            None if off_cpu && r.has_stacks => {
                c.agree(
                    TIMELINE_STACKS,
                    &what,
                    ("stack samples", stacked),
                    ("thread states", state),
                    slack(state),
                    Unit::Ns,
                );
            }
            None => {}
        }
    }
}

/// Two programs stamp each switch a few hundred ns apart, and a thread's time before its
/// first event is in no state.
fn slack(ns: u64) -> u64 {
    1_000_000 + ns / 50
}

/// Whether `bytes` are a Perfetto trace of fsprof's: one that decodes, with a process
/// tree (every timeline fsprof writes has one).
pub fn is_timeline(bytes: &[u8]) -> bool {
    proto::Trace::decode(bytes).is_ok_and(|t| t.packet.iter().any(|p| p.process_tree.is_some()))
}

fn read(path: &Path) -> Result<Read> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let trace = proto::Trace::decode(&bytes[..]).context("not a Perfetto trace")?;
    let mut events = Vec::new();
    let mut threads = Vec::new();
    let mut r = Read {
        states: BTreeMap::new(),
        stacks: BTreeMap::new(),
        has_stacks: false,
        has_blocked: false,
        lost: false,
    };
    let counters: BTreeMap<String, &'static str> = TimeClass::ALL
        .iter()
        .map(|&k| (stack_counter(k as u32), k.name()))
        .collect();
    let mut following = Following::default();
    for p in trace.packet {
        following_mark(&p, &mut following, &mut r.has_stacks);
        if let Some(b) = p.ftrace_events {
            r.lost |= b.lost_events == Some(true);
            r.has_blocked |= b.event.iter().any(|e| e.sched_blocked_reason.is_some());
            events.extend(b.event);
        }
        if let Some(t) = p.process_tree {
            threads.extend(t.threads.iter().filter_map(|t| t.tid));
        }
        if let Some(s) = p.stack_sample {
            r.has_stacks = true;
            let name = s
                .primary_descriptor
                .and_then(|d| d.name)
                .unwrap_or_default();
            let class = counters.get(&name).copied().unwrap_or("other");
            *r.stacks.entry(class).or_insert(0) += s.primary_weight.unwrap_or(0);
        }
    }
    events.sort_by_key(|e| e.timestamp.unwrap_or(0));
    r.states = states(&events, &threads, following);
    Ok(r)
}

/// A thread's state as the timeline draws it, by the time class it counts in.
fn after_switch(prev_state: i64) -> Option<TimeClass> {
    Some(match prev_state {
        0 | 0x100 => TimeClass::RunQueue,
        1 => TimeClass::Sleep,
        // D, and I (TASK_IDLE), which fsprof counts as uninterruptible too.
        2 | 0x80 => TimeClass::Uninterruptible,
        0x10 | 0x20 => return None,
        _ => TimeClass::Other,
    })
}

/// Time per state of `threads`, from each thread's first event (or when following began)
/// to its exit or when following ended: the timeline goes on either side (the machine's
/// switches and block requests, as the block table counts them), the figures do not (a
/// command's last switch comes after its parent was told it exited). Without the end mark
/// (an older timeline) a thread alive at the end is left out from its last event.
fn states(
    events: &[proto::FtraceEvent],
    threads: &[i32],
    following: Following,
) -> BTreeMap<&'static str, u64> {
    let began = following.began.unwrap_or(0);
    let mut now: BTreeMap<i32, (TimeClass, u64)> = BTreeMap::new();
    let mut total = BTreeMap::new();
    let mut enter =
        |now: &mut BTreeMap<i32, (TimeClass, u64)>, tid, state: Option<TimeClass>, ts: u64| {
            if let Some((was, since)) = now.remove(&tid) {
                *total.entry(was.name()).or_insert(0) += ts.saturating_sub(since.max(began));
            }
            if let Some(s) = state {
                now.insert(tid, (s, ts));
            }
        };
    for e in events {
        let ts = e.timestamp.unwrap_or(0);
        if following.ended.is_some_and(|end| ts > end) {
            break;
        }
        if let Some(s) = &e.sched_switch {
            let (prev, next) = (s.prev_pid.unwrap_or(0), s.next_pid.unwrap_or(0));
            if threads.contains(&prev) {
                enter(&mut now, prev, after_switch(s.prev_state.unwrap_or(0)), ts);
            }
            if threads.contains(&next) {
                enter(&mut now, next, Some(TimeClass::OnCpu), ts);
            }
        } else if let Some(b) = &e.sched_blocked_reason {
            if let Some((state @ TimeClass::Uninterruptible, _)) = now.get_mut(&b.pid.unwrap_or(0))
                && b.io_wait == Some(1)
            {
                *state = TimeClass::IoWait;
            }
        } else if let Some(w) = &e.sched_waking {
            let tid = w.pid.unwrap_or(0);
            let asleep = now
                .get(&tid)
                .is_some_and(|(s, _)| !matches!(s, TimeClass::OnCpu | TimeClass::RunQueue));
            if asleep {
                enter(&mut now, tid, Some(TimeClass::RunQueue), ts);
            }
        } else if let Some(w) = &e.sched_wakeup_new
            && threads.contains(&w.pid.unwrap_or(0))
        {
            enter(&mut now, w.pid.unwrap_or(0), Some(TimeClass::RunQueue), ts);
        }
    }
    if let Some(end) = following.ended {
        for tid in now.keys().copied().collect::<Vec<_>>() {
            enter(&mut now, tid, None, end);
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch(ts: u64, prev: i32, prev_state: i64, next: i32) -> proto::FtraceEvent {
        proto::FtraceEvent {
            timestamp: Some(ts),
            sched_switch: Some(proto::SchedSwitch {
                prev_pid: Some(prev),
                prev_state: Some(prev_state),
                next_pid: Some(next),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A command's last switches come after its parent was told it exited, so after the
    /// freeze: its states end there, as its classes do.
    #[test]
    fn states_end_where_following_ended() {
        const PREEMPTED: i64 = 0x100;
        const DEAD: i64 = 0x10;
        let events = [
            switch(0, 1, 1, 5),
            switch(10, 5, PREEMPTED, 1),
            switch(100, 1, 1, 5),
            switch(110, 5, DEAD, 1),
        ];
        let at = |began, ended| states(&events, &[5], Following { began, ended });
        let cut = at(None, Some(50));
        assert_eq!((cut["on_cpu"], cut["run_queue"]), (10, 40));
        let whole = at(None, None);
        assert_eq!((whole["on_cpu"], whole["run_queue"]), (20, 90));
        // A held child's wait for its release is fsprof's, not the command's.
        let released = at(Some(5), Some(105));
        assert_eq!((released["on_cpu"], released["run_queue"]), (10, 90));
    }
}
