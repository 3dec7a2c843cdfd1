//! The terminal report of one traced interval.

use std::fmt::Write as _;

use fsprof_common::TimeClass;

use crate::aggregate::{
    TIME_LABELS,
    stacks::{StackSummary, UserCompleteness},
    wakes,
};
use crate::trace::TraceResult;
use crate::units::{bytes, duration_ns, percent, seconds};

/// Left-aligned first column, right-aligned rest, widths from the content.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from(" ");
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            let pad = w - c.chars().count();
            if i < 2 {
                s.push_str(&format!(" {c}{}", " ".repeat(pad)));
            } else {
                s.push_str(&format!(" {}{c}", " ".repeat(pad)));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

pub fn render(r: &TraceResult) -> String {
    let mut o = String::new();
    render_header(&mut o, r);
    render_syscalls(&mut o, r);
    render_block(&mut o, r);
    render_stacks(&mut o, r);
    render_fs_events(&mut o, r);
    render_losses(&mut o, r);
    o
}

/// The command, its status, wall/user/sys and the time split of its threads.
fn render_header(o: &mut String, r: &TraceResult) {
    let what = if r.command.is_empty() {
        format!("PID {}", r.pid.unwrap_or(0))
    } else {
        r.command.join(" ")
    };
    let status = match (r.exit_code, r.exit_signal) {
        (Some(c), _) => format!("exit {c}"),
        (_, Some(s)) => format!("killed by signal {s}"),
        _ => "still running".into(),
    };
    let _ = writeln!(o, "fsprof trace: {what}  [{status}, kernel {}]", r.kernel);
    let _ = writeln!(
        o,
        "  wall {}   user {}   sys {}   CPU {:.0}%",
        seconds(r.wall_ns),
        seconds(r.user_ns),
        seconds(r.sys_ns),
        r.cpu_percent()
    );
    let t = &r.profile.time;
    // Shares of the threads' own summed time (which the classes add up to), so that many
    // threads never read as thousands of percent of the wall.
    let (whole, of) = match t.followed_ns {
        0 => (r.wall_ns, "wall"),
        f => (f, "their time"),
    };
    let mut parts = Vec::new();
    for (class, label) in TIME_LABELS {
        let ns = t.class(class).ns;
        if ns > 0 || matches!(class, TimeClass::OnCpu | TimeClass::IoWait) {
            parts.push(format!("{label} {} ({})", seconds(ns), percent(ns, whole)));
        }
    }
    let tasks = r.profile.tasks_exited + t.open_threads;
    let _ = writeln!(
        o,
        "  time of the target's threads{} (% of {of}): {}",
        if tasks > 1 {
            format!(", summed over {tasks} tasks")
        } else {
            String::new()
        },
        parts.join("   ")
    );
    if r.profile.tasks_forked > 0 {
        let _ = writeln!(
            o,
            "  followed {} forked tasks ({} exited)",
            r.profile.tasks_forked, r.profile.tasks_exited
        );
    }
}

/// The syscall table, longest total time first.
fn render_syscalls(o: &mut String, r: &TraceResult) {
    let _ = writeln!(o, "\nsyscalls, by total time");
    let rows: Vec<Vec<String>> = r
        .profile
        .syscalls
        .iter()
        .map(|s| {
            let l = &s.latency;
            vec![
                s.op.clone(),
                s.name.clone(),
                s.count.to_string(),
                s.errors.to_string(),
                s.bytes.map(bytes).unwrap_or_else(|| "-".into()),
                duration_ns(s.total_ns),
                duration_ns(l.p50),
                duration_ns(l.p90),
                duration_ns(l.p99),
                duration_ns(l.p999),
                duration_ns(l.max),
            ]
        })
        .collect();
    o.push_str(&table(
        &[
            "op", "syscall", "count", "errors", "bytes", "total", "p50", "p90", "p99", "p99.9",
            "max",
        ],
        &rows,
    ));
}

/// The block table per device and class, and the requests never seen completing.
fn render_block(o: &mut String, r: &TraceResult) {
    let _ = writeln!(o, "\nblock I/O, per device and class");
    if r.profile.block.is_empty() {
        let _ = writeln!(o, "  (none)");
    } else {
        let rows: Vec<Vec<String>> = r
            .profile
            .block
            .iter()
            .map(|b| {
                vec![
                    format!("{} ({})", b.name, b.dev),
                    b.class.clone(),
                    b.completions.to_string(),
                    bytes(b.bytes),
                    bytes(b.size.p50),
                    duration_ns(b.queue_latency.p50),
                    duration_ns(b.queue_latency.p99),
                    duration_ns(b.device_latency.p50),
                    duration_ns(b.device_latency.p99),
                    duration_ns(b.device_latency.max),
                ]
            })
            .collect();
        o.push_str(&table(
            &[
                "device",
                "class",
                "requests",
                "bytes",
                "size p50",
                "queue p50",
                "queue p99",
                "dev p50",
                "dev p99",
                "dev max",
            ],
            &rows,
        ));
        for b in r
            .profile
            .block
            .iter()
            .filter(|b| b.unseen + b.in_flight > 0)
        {
            let _ = writeln!(
                o,
                "  {} {}: {} issued, {} never seen completing (missed: not in the figures above), {} in flight at the end",
                b.name, b.class, b.issued, b.unseen, b.in_flight
            );
        }
    }
    let others: Vec<String> = (r.profile.other_block.iter())
        .map(|b| {
            format!(
                "{} {} {} requests {}",
                b.name,
                b.class,
                b.completions,
                bytes(b.bytes)
            )
        })
        .collect();
    if !others.is_empty() {
        let _ = writeln!(
            o,
            "  other processes (devices of no filesystem the target used, not above): {}",
            others.join(", ")
        );
    }
}

/// fsprof's own cost, lost events and missing hooks.
fn render_losses(o: &mut String, r: &TraceResult) {
    if let Some(c) = &r.profile.probe_cost {
        let _ = writeln!(o, "\n{}", c.line(r.wall_ns, r.sys_ns));
    }
    if r.profile.lost.is_empty() {
        let _ = writeln!(o, "\nlost events: none");
    } else {
        let lost: Vec<String> = r
            .profile
            .lost
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            o,
            "\nLOST EVENTS (figures above are incomplete): {}",
            lost.join(" ")
        );
    }
    let unseen = r.profile.time.switch_ins_unseen;
    if unseen > 0 {
        let _ = writeln!(
            o,
            "switch-ins the kernel did not trace: {unseen} (the on-CPU time after each is the \
             scheduler's charge; any steal in it counts as the wait before)"
        );
    }
    if !r.missing_hooks.is_empty() {
        let _ = writeln!(o, "missing optional hooks: {}", r.missing_hooks.join(" "));
    }
}

/// Leaf-first frames shortened for one line: the first `n`, without annotations.
fn path(frames: &[String], n: usize) -> String {
    let mut v: Vec<&str> = frames.iter().take(n).map(String::as_str).collect();
    if frames.len() > n {
        v.push("…");
    }
    v.join(" ← ")
}

/// "user stacks whole …": how many reach the program's entry, and why the others end.
pub fn user_completeness(u: &UserCompleteness) -> Option<String> {
    let share = |n: u64, all: u64| format!("{:.1} % of {all}", 100.0 * n as f64 / all as f64);
    let mut parts = Vec::new();
    if u.on_cpu > 0 {
        parts.push(format!(
            "{} on-CPU samples",
            share(u.on_cpu_whole, u.on_cpu)
        ));
    }
    if u.off_cpu > 0 {
        parts.push(format!(
            "{} off-CPU stacks",
            share(u.off_cpu_whole, u.off_cpu)
        ));
    }
    if parts.is_empty() {
        return None;
    }
    let mut line = format!(
        "user stacks whole (leaf to the program's entry): {}",
        parts.join(", ")
    );
    if !u.ends.is_empty() {
        let ends: Vec<String> = u.ends.iter().map(|(why, n)| format!("{why} {n}")).collect();
        line.push_str(&format!("; the rest: {}", ends.join(", ")));
    }
    if u.unwound > 0 {
        line.push_str(&format!(
            "; unwound in the kernel: {} stacks, {:.1} frames and {} each",
            u.unwound,
            u.frames as f64 / u.unwound as f64,
            duration_ns(u.unwind_ns / u.unwound)
        ));
    }
    Some(line)
}

fn render_stacks(o: &mut String, r: &TraceResult) {
    let Some(s) = &r.stacks else {
        return;
    };
    let hz = 1_000_000_000 / s.sample_period_ns.max(1);
    let _ = writeln!(
        o,
        "\nstacks: {} on-CPU samples at {hz} Hz (≈{} on-CPU), {} off-CPU in stacks ({}), {} distinct stacks",
        s.on_cpu_samples,
        seconds(s.on_cpu_sampled_ns),
        seconds(s.off_cpu_ns),
        crate::probes::off_cpu_stacks(s.off_cpu_period_ns),
        s.distinct_stacks
    );
    if let Some(line) = user_completeness(&s.user_stacks) {
        let _ = writeln!(o, "  {line}");
    }
    if !s.capture_problems.is_empty() {
        let p: Vec<String> = s
            .capture_problems
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(o, "  stack capture problems: {}", p.join(" "));
    }
    if s.unnamed_kernel_frames > 0 {
        let _ = writeln!(
            o,
            "  kernel frames in no known function (code gone before naming): {} addresses, shown as [kernel] 0x…",
            s.unnamed_kernel_frames
        );
    }
    render_wakes(o, s);
    render_top_stacks(o, s);
    render_background(o, r);
}

/// What ended the off-CPU time, and the top waits with their wakers.
fn render_wakes(o: &mut String, s: &StackSummary) {
    if !s.waited_for.is_empty() {
        let parts: Vec<String> = s
            .waited_for
            .iter()
            .map(|w| format!("{} {}", w.what, seconds(w.ns)))
            .collect();
        let _ = writeln!(o, "off-CPU, by what ended it: {}", parts.join(", "));
        for t in s.top_wakes.iter().take(3) {
            let _ = writeln!(
                o,
                "  {:>8} {} in {}\n           woken by {}: {}",
                seconds(t.ns),
                t.comm,
                path(wakes::past_plumbing(&t.blocked), 6),
                t.waker,
                path(wakes::past_plumbing(&t.waker_frames), 6)
            );
        }
    }
}

/// The top off- and on-CPU stacks.
fn render_top_stacks(o: &mut String, s: &StackSummary) {
    for (title, list) in [
        ("top off-CPU stacks", &s.top_off_cpu),
        ("top on-CPU stacks", &s.top_on_cpu),
    ] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(o, "{title} (leaf first)");
        for t in list.iter().take(5) {
            let _ = writeln!(
                o,
                "  {:>8} {:<12} {:<14} {}",
                seconds(t.ns),
                t.class,
                t.comm,
                path(&t.frames, 8)
            );
        }
    }
}

/// The filesystem's kernel threads' sampled work.
fn render_background(o: &mut String, r: &TraceResult) {
    if let Some(b) = &r.background {
        let classes: Vec<String> = b
            .by_class
            .iter()
            .map(|(c, ns)| format!("{c} {}", seconds(*ns)))
            .collect();
        let _ = writeln!(
            o,
            "kernel background work for the filesystem (sampled): {}{}  (other kernel threads {}, not attributed)",
            seconds(b.ns),
            if classes.is_empty() {
                String::new()
            } else {
                format!(": {}", classes.join(", "))
            },
            seconds(b.unattributed_ns)
        );
    }
}

fn render_fs_events(o: &mut String, r: &TraceResult) {
    let Some(f) = &r.profile.fs_events else {
        return;
    };
    let total: u64 = f.events.iter().map(|e| e.count).sum();
    let _ = writeln!(
        o,
        "\nfilesystem tracepoints ({}{}: {} attached{}) on {}: {total} events, {} kinds{}",
        if f.census { "all of " } else { "" },
        f.subsystems.join(", "),
        f.attached,
        if f.failed > 0 {
            format!(", {} failed", f.failed)
        } else {
            String::new()
        },
        if f.watched.is_empty() {
            "no filesystem the target touched".to_string()
        } else {
            f.watched
                .iter()
                .map(|w| w.describe())
                .collect::<Vec<_>>()
                .join(", ")
        },
        f.events.len(),
        if f.lost_nested > 0 {
            format!(", {} LOST (nested in an interrupt)", f.lost_nested)
        } else {
            String::new()
        }
    );
    if !f.events.is_empty() {
        let rows: Vec<Vec<String>> = f
            .events
            .iter()
            .take(10)
            .map(|e| {
                vec![
                    format!("{}{}", e.name, if e.filtered { "" } else { " *" }),
                    e.count.to_string(),
                ]
            })
            .collect();
        o.push_str(&table(&["event", "count"], &rows));
        if f.events.iter().take(10).any(|e| !e.filtered) {
            let _ = writeln!(
                o,
                "  * no argument leads to a device: counted for every filesystem"
            );
        }
    }
    if !f.pairs.is_empty() {
        let rows: Vec<Vec<String>> = f
            .pairs
            .iter()
            .map(|p| {
                vec![
                    p.name.clone(),
                    p.count.to_string(),
                    duration_ns(p.total_ns),
                    duration_ns(p.latency.p50),
                    duration_ns(p.latency.p99),
                    duration_ns(p.latency.max),
                ]
            })
            .collect();
        o.push_str(&table(
            &["begin → end", "count", "total", "p50", "p99", "max"],
            &rows,
        ));
    }
}
