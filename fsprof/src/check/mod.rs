//! `fsprof check`: the invariants that tie an output's figures together, checked on any
//! output of fsprof (results of `trace` and `run`, a crash study, folded stacks, pprof
//! profiles, a Perfetto timeline, a history store). Each feature was checked when it was
//! built; these keep them true together when another part changes (a start-up change once
//! named every BPF frame `_einittext`, with every test green). docs/check.md says what each
//! invariant guards.

mod inputs;
mod stacks;
mod stores;
mod timeline;
mod trace;

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf};

use anyhow::Result;

pub use inputs::{check_paths, check_trace_result};

/// An invariant: its name (what a failure is called), what it is checked on, and what it
/// guards.
pub struct Invariant {
    pub name: &'static str,
    pub items: &'static str,
    pub guards: &'static str,
}

macro_rules! invariants {
    ($($id:ident $name:literal $items:literal $guards:literal),* $(,)?) => {
        $(pub const $id: &str = $name;)*
        /// Every invariant, in the order they are printed.
        pub const INVARIANTS: &[Invariant] =
            &[$(Invariant { name: $name, items: $items, guards: $guards }),*];
    };
}

invariants! {
    TIME_CLASSES "time-classes-add-up" "traces"
        "the scheduler programs: every followed thread's time, from when it was followed to its exit or the end, is in exactly one time class (steal included); an interval dropped or counted twice breaks it",
    OFF_CPU_STACKS "off-cpu-stacks-equal-classes" "classes of traces"
        "off-CPU stacks: per class, the stacks' weights add up to the time class exactly (waits sampled per thread and class carry the time since the last, open waits are closed at the end)",
    WAITED_FOR "waited-for-adds-up" "traces"
        "wakers: the off-CPU time split by what ended each wait adds up to the off-CPU time",
    ON_CPU_SAMPLES "on-cpu-samples-match-on-cpu-time" "traces"
        "the sampler: each on-CPU sample weighs the CPU time charged since the thread's last one, so the weights add up to the on-CPU time within one sampling period per thread",
    SYSCALL_HISTOGRAMS "syscall-counts-equal-histograms" "syscall rows"
        "syscall aggregation: each syscall's count equals its latency histogram's, and its total time lies within the histogram's bucket bounds",
    BLOCK_BYTES "block-bytes-within-request-sizes" "device rows"
        "block aggregation: per device and class, the bytes lie within the bounds of the request-size histogram's buckets, which counts every completed request",
    KERNEL_FRAMES "kernel-frames-are-functions" "traces and files"
        "kernel symbols: no frame is named by a linker boundary mark (_einittext, _etext, __*_text_end, …) or a data symbol; with the same kernel's /proc/kallsyms, every kernel frame names a function or a BPF program",
    USER_FRAMES "user-frames-in-their-mappings" "files"
        "user symbols: every user frame of a pprof profile lies inside the mapping it names, and no frame is an unnamed [unknown]",
    FOLDED_TOTALS "folded-totals-match-stacks" "folded files"
        "flame graphs: each folded file adds up to the trace's stack totals (on-CPU samples, off-CPU time, their sum) within the rounding of each stack to µs",
    PPROF_TOTALS "pprof-equals-folded" "profiles"
        "pprof export: each profile's time adds up to its folded file's within rounding",
    TIMELINE_STACKS "timeline-stack-samples-equal-classes" "classes of timelines"
        "the timeline's off-CPU stack samples: per class, their weights add up to the off-CPU time classes",
    TIMELINE_STATES "timeline-states-equal-split" "classes of timelines"
        "the timeline's thread states, rebuilt from its switches and wakeups, add up to the time split (a thread's time before its first event is in neither: 1 ms + 2 % allowed)",
    CRASH_OUTCOMES "crash-outcomes-add-up" "cells"
        "crash studies: each cell's outcomes add up to its trials (all it asked for when complete), with one recovery and one fsck time per trial",
    STORED_RUNS "stored-runs-equal-results" "stored runs and studies"
        "the history: every figure stored for a run equals the figure of the results stored with it, and every crash outcome row the study's",
}

/// What one invariant found over everything checked.
#[derive(Default)]
struct Tally {
    /// Items checked (traces, files, cells).
    items: u64,
    /// Sums of the two sides of compared figures, and their unit.
    sums: Option<(u64, u64, Unit)>,
    /// The largest difference met, and what was allowed there.
    worst: Option<(u64, u64)>,
    failures: Vec<String>,
    /// Why it could not be checked where it could not.
    skipped: BTreeMap<String, u64>,
}

/// The unit of compared figures: nanoseconds, or µs (folded files' weights).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Unit {
    Ns,
    Us,
}

impl Unit {
    fn show(self, v: u64) -> String {
        match self {
            Unit::Ns => crate::units::duration_ns(v),
            Unit::Us => crate::units::duration_ns(v.saturating_mul(1000)),
        }
    }
}

/// The findings of a check, by invariant.
#[derive(Default)]
pub struct Checks {
    tallies: BTreeMap<&'static str, Tally>,
    /// Inputs that are no output of fsprof, or broken ones, with why.
    pub unreadable: Vec<(PathBuf, String)>,
}

impl Checks {
    fn tally(&mut self, name: &'static str) -> &mut Tally {
        self.tallies.entry(name).or_default()
    }

    /// Compares two figures of `item` that must agree within `allowed`.
    pub fn agree(
        &mut self,
        name: &'static str,
        item: &str,
        (what_a, a): (&str, u64),
        (what_b, b): (&str, u64),
        allowed: u64,
        figure: Unit,
    ) {
        let t = self.tally(name);
        t.items += 1;
        let (sa, sb, _) = t.sums.get_or_insert((0, 0, figure));
        *sa += a;
        *sb += b;
        let diff = a.abs_diff(b);
        if t.worst.is_none_or(|(d, _)| diff > d) {
            t.worst = Some((diff, allowed));
        }
        if diff > allowed {
            t.failures.push(format!(
                "{item}: {what_a} {} ≠ {what_b} {} (differ by {}, allowed {})",
                figure.show(a),
                figure.show(b),
                figure.show(diff),
                figure.show(allowed)
            ));
        }
    }

    /// Records a yes/no finding of `item`; the error says what was wrong.
    pub fn holds(&mut self, name: &'static str, item: &str, ok: Result<(), String>) {
        let t = self.tally(name);
        t.items += 1;
        if let Err(why) = ok {
            t.failures.push(format!("{item}: {why}"));
        }
    }

    /// `name` could not be checked on one item, and why.
    pub fn skip(&mut self, name: &'static str, why: &str) {
        *self
            .tallies
            .entry(name)
            .or_default()
            .skipped
            .entry(why.to_string())
            .or_insert(0) += 1;
    }

    /// The invariants that failed.
    pub fn failed(&self) -> Vec<&'static str> {
        self.tallies
            .iter()
            .filter(|(_, t)| !t.failures.is_empty())
            .map(|(n, _)| *n)
            .collect()
    }

    /// Whether anything was checked at all.
    pub fn checked_any(&self) -> bool {
        self.tallies.values().any(|t| t.items > 0)
    }

    /// One line per invariant with its figures (its first failures under it), in the
    /// catalog's order; unreadable inputs first.
    pub fn render(&self) -> String {
        let mut o = String::new();
        for (p, why) in &self.unreadable {
            let _ = writeln!(o, "FAIL  {}: {why}", p.display());
        }
        for inv in INVARIANTS {
            let Some(t) = self.tallies.get(inv.name) else {
                let _ = writeln!(
                    o,
                    "-     {:<36} nothing in the input it applies to",
                    inv.name
                );
                continue;
            };
            let _ = writeln!(o, "{}", line(inv, t));
            for f in t.failures.iter().take(3) {
                let _ = writeln!(o, "        {f}");
            }
            if t.failures.len() > 3 {
                let _ = writeln!(o, "        … and {} more", t.failures.len() - 3);
            }
        }
        o
    }
}

fn line(inv: &Invariant, t: &Tally) -> String {
    let mark = match (t.items, t.failures.len()) {
        (0, _) => "skip",
        (_, 0) => "ok",
        _ => "FAIL",
    };
    let mut l = format!("{mark:<5} {:<36} ", inv.name);
    if t.failures.is_empty() {
        let _ = write!(l, "{} {}", t.items, inv.items);
    } else {
        let _ = write!(l, "{} of {} {} fail", t.failures.len(), t.items, inv.items);
    }
    if let Some((a, b, unit)) = t.sums {
        let _ = write!(l, "; Σ {} vs {}", unit.show(a), unit.show(b));
        if let Some((d, allowed)) = t.worst {
            let _ = write!(
                l,
                ", largest difference {} (allowed there {})",
                unit.show(d),
                unit.show(allowed)
            );
        }
    }
    for (why, n) in &t.skipped {
        let _ = write!(l, "; not checked on {n}: {why}");
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/check.md names every invariant, and nothing else in its table.
    #[test]
    fn every_invariant_is_documented() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/check.md");
        let text = std::fs::read_to_string(docs).unwrap();
        let rows: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .collect();
        let names: Vec<&str> = INVARIANTS.iter().map(|i| i.name).collect();
        assert_eq!(rows, names);
    }

    #[test]
    fn a_failure_names_the_invariant_and_its_figures() {
        let mut c = Checks::default();
        c.agree(
            TIME_CLASSES,
            "t",
            ("classes", 10),
            ("followed", 12),
            1,
            Unit::Ns,
        );
        c.agree(
            TIME_CLASSES,
            "u",
            ("classes", 5),
            ("followed", 5),
            0,
            Unit::Ns,
        );
        assert_eq!(c.failed(), [TIME_CLASSES]);
        let text = c.render();
        let line = text.lines().find(|l| l.contains(TIME_CLASSES)).unwrap();
        assert!(
            line.starts_with("FAIL") && line.contains("1 of 2 traces fail"),
            "{text}"
        );
        assert!(
            text.contains("t: classes 10ns ≠ followed 12ns (differ by 2ns, allowed 1ns)"),
            "{text}"
        );
    }
}
