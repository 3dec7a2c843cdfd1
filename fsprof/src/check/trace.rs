//! The invariants of one trace's figures (a `trace` result, a run's cell, a crash
//! study's cost): time, stacks, syscalls and block I/O against each other.

use fsprof_common::TimeClass;

use super::{
    BLOCK_BYTES, Checks, KERNEL_FRAMES, OFF_CPU_STACKS, ON_CPU_SAMPLES, SYSCALL_HISTOGRAMS,
    TIME_CLASSES, Unit, WAITED_FOR,
};
use crate::{
    aggregate::{histogram::Summary, stacks::StackSummary, time_label},
    trace::TraceResult,
};

/// Checks one trace's figures; `item` names it in failures.
pub fn check_trace(c: &mut Checks, item: &str, t: &TraceResult) {
    time_classes(c, item, t);
    syscalls(c, item, t);
    block(c, item, t);
    if let Some(s) = &t.stacks {
        stacks(c, item, t, s);
    }
}

/// Events lost in the kernel make the figures incomplete: invariants that need them
/// whole are not checked then (the loss is shown in the trace itself).
fn lost(t: &TraceResult) -> Option<String> {
    let lost: u64 = t.profile.lost.values().sum();
    (lost > 0).then(|| format!("{lost} events lost in the kernel"))
}

fn time_classes(c: &mut Checks, item: &str, t: &TraceResult) {
    let time = &t.profile.time;
    if time.followed_ns == 0 {
        return c.skip(
            TIME_CLASSES,
            "written by an fsprof that did not record followed time",
        );
    }
    if let Some(why) = lost(t) {
        return c.skip(TIME_CLASSES, &why);
    }
    let classes: u64 = TimeClass::ALL.iter().map(|&k| time.class(k).ns).sum();
    // Threads alive at the end too: everything ends at the freeze (fsprof Probes::freeze).
    c.agree(
        TIME_CLASSES,
        item,
        ("time classes", classes),
        ("followed threads' time", time.followed_ns),
        0,
        Unit::Ns,
    );
}

/// A histogram's bounds on the sum of its values: bucket k holds [2^k, 2^(k+1)) (k = 0
/// also 0).
fn sum_bounds(s: &Summary) -> (u64, u64) {
    s.log2.iter().fold((0, 0), |(lo, hi), &(k, n)| {
        let low = if k == 0 { 0 } else { 1u64 << k };
        (lo + n * low, hi + n * ((2u64 << k) - 1))
    })
}

fn histogram_count(s: &Summary) -> u64 {
    s.log2.iter().map(|(_, n)| n).sum()
}

fn within(v: u64, (lo, hi): (u64, u64)) -> Result<(), String> {
    match (lo..=hi).contains(&v) {
        true => Ok(()),
        false => Err(format!("{v} outside the histogram's bounds {lo}..={hi}")),
    }
}

fn syscalls(c: &mut Checks, item: &str, t: &TraceResult) {
    for s in &t.profile.syscalls {
        let what = format!("{item} {}", s.name);
        let counts = [s.count, s.latency.count, histogram_count(&s.latency)];
        let ok = match counts {
            [a, b, h] if a == b && b == h => {
                within(s.total_ns, sum_bounds(&s.latency)).map_err(|e| format!("total time {e}"))
            }
            _ => Err(format!(
                "count {} ≠ histogram count {} (buckets {})",
                counts[0], counts[1], counts[2]
            )),
        };
        c.holds(SYSCALL_HISTOGRAMS, &what, ok);
    }
}

fn block(c: &mut Checks, item: &str, t: &TraceResult) {
    for b in t.profile.block.iter().chain(&t.profile.other_block) {
        let what = format!("{item} {} {}", b.name, b.class);
        // Each request issued during the trace, completed whole, once (a requeued one is
        // issued twice; one still in flight or missed has no last part).
        if b.device_latency.count != b.issued || b.unseen + b.in_flight > 0 {
            c.skip(
                BLOCK_BYTES,
                "requests in flight, missed or requeued at the end",
            );
            continue;
        }
        let counted = [b.issued, b.size.count, histogram_count(&b.size)];
        let ok = match counted {
            [a, s, h] if a == s && s == h => within(b.issued_bytes, sum_bounds(&b.size))
                .map_err(|e| format!("bytes of requests issued {e}")),
            _ => Err(format!(
                "{} requests ≠ size histogram count {} (buckets {})",
                counted[0], counted[1], counted[2]
            )),
        };
        c.holds(BLOCK_BYTES, &what, ok);
    }
}

fn stacks(c: &mut Checks, item: &str, t: &TraceResult, s: &StackSummary) {
    let time = &t.profile.time;
    let problems: u64 = s.capture_problems.values().sum();
    if let Some(why) =
        lost(t).or((problems > 0).then(|| format!("{problems} stack captures failed")))
    {
        c.skip(OFF_CPU_STACKS, &why);
    } else {
        for &k in TimeClass::ALL {
            if k == TimeClass::OnCpu || k == TimeClass::Steal {
                continue;
            }
            let in_stacks = s.off_cpu_by_class.get(k.name()).copied().unwrap_or(0);
            c.agree(
                OFF_CPU_STACKS,
                &format!("{item} {}", time_label(k)),
                ("stacks", in_stacks),
                ("time class", time.class(k).ns),
                0,
                Unit::Ns,
            );
        }
    }
    let waited: u64 = s.waited_for.iter().map(|w| w.ns).sum();
    c.agree(
        WAITED_FOR,
        item,
        ("waited for", waited),
        ("off-CPU time", s.off_cpu_ns),
        0,
        Unit::Ns,
    );
    on_cpu_samples(c, item, t, s);
    let frames = s.top_on_cpu.iter().chain(&s.top_off_cpu);
    let bad: Vec<&String> = frames
        .flat_map(|st| &st.frames)
        .filter(|f| super::stacks::not_a_function(f))
        .collect();
    let ok = match bad.first() {
        None => Ok(()),
        Some(f) => Err(format!("{} top-stack frames like {f:?}", bad.len())),
    };
    c.holds(KERNEL_FRAMES, item, ok);
}

/// Each sample weighs its thread's on-CPU time (as the time classes count it) since the
/// thread's last sample, a first sample one period. So per thread the weights miss the
/// on-CPU time before its first sample and after its last, and add one period. A thread
/// that runs in bursts shorter than a period is hit at random: each of the two is then about
/// exponential with a period's mean, and their sum exceeds 13 periods with probability
/// 14·e⁻¹³ ≈ 3·10⁻⁵. A thread running throughout is hit every period, each under one.
fn on_cpu_samples(c: &mut Checks, item: &str, t: &TraceResult, s: &StackSummary) {
    if s.on_cpu_samples == 0 {
        return c.skip(ON_CPU_SAMPLES, "no on-CPU samples");
    }
    let time = &t.profile.time;
    let threads = t.profile.tasks_exited + time.open_threads;
    let (weights, on_cpu) = (s.on_cpu_sampled_ns, time.on_cpu.ns);
    let per_thread = match weights > on_cpu {
        true => s.sample_period_ns,
        false => 13 * s.sample_period_ns,
    };
    c.agree(
        ON_CPU_SAMPLES,
        item,
        ("sample weights", weights),
        ("on-CPU time", on_cpu),
        threads.max(1) * per_thread,
        Unit::Ns,
    );
}
