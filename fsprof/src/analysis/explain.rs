//! `fsprof explain`: a short ranked account of where a cell's time went and, against a
//! second filesystem, why it took longer: which time class grew, which syscalls, which
//! kernel paths (stacks collapsed to their filesystem frames), which block I/O. Every
//! sentence is computed from the results and carries its figure.

use std::{collections::BTreeMap, path::Path};

use anyhow::{Result, bail};
use fsprof_common::TimeClass;

use crate::{
    aggregate::{TIME_LABELS, background::FS_PREFIXES, wakes},
    analysis::{
        compare::{CellPair, Comparison, Row, judge_cells},
        metrics,
        stats::{median, median_f64},
        verdict::{Rule, Verdict},
    },
};

use crate::{
    aggregate::folded::{self, Folded},
    results::{RunResult, StepRun, dir_of},
    units::{bytes, count, duration_ns, seconds},
    workload::rate,
};

/// Frames that say what a kernel path does for a filesystem: the background work's
/// filesystem, block and writeback prefixes, and the VFS around them.
const VFS_FRAMES: &[&str] = &[
    "vfs_",
    "filemap_",
    "folio_",
    "lookup_",
    "path_",
    "iterate_dir",
    "do_unlinkat",
    "do_rmdir",
    "do_filp_open",
];

fn fs_frame(f: &str) -> bool {
    FS_PREFIXES
        .iter()
        .chain(VFS_FRAMES)
        .any(|p| f.starts_with(p))
}
/// The scheduler's own frames at the top of every off-CPU stack.
const SCHED: &[&str] = &[
    "__schedule",
    "schedule",
    "schedule_timeout",
    "io_schedule",
    "io_schedule_timeout",
    "schedule_preempt_disabled",
    "preempt_schedule",
    "preempt_schedule_common",
];

fn plain(f: &str) -> &str {
    for a in ["_[k]", "_[w]", "_[i]", "_[j]"] {
        if let Some(s) = f.strip_suffix(a) {
            return s;
        }
    }
    f
}

/// A stack (root first) as "syscall → fs frames … → what it waited in" (off-CPU) or
/// "syscall → fs frames" (on-CPU, where leaves are too scattered to group by).
pub fn collapse(frames: &[&str], off: bool) -> String {
    let frames: Vec<&str> = frames.iter().map(|f| plain(f)).collect();
    let syscall = frames.iter().find_map(|f| {
        f.strip_prefix("__x64_sys_")
            .or_else(|| f.strip_prefix("__arm64_sys_"))
            .or_else(|| f.strip_prefix("__do_sys_"))
            .or_else(|| f.strip_prefix("ksys_"))
    });
    let sched_at = frames
        .iter()
        .position(|f| SCHED.contains(f))
        .unwrap_or(frames.len());
    let mut fs: Vec<&str> = frames[..sched_at]
        .iter()
        .copied()
        .filter(|f| fs_frame(f))
        .collect();
    fs.dedup();
    if fs.len() > 6 {
        let tail: Vec<&str> = fs[fs.len() - 3..].to_vec();
        fs.truncate(2);
        fs.push("…");
        fs.extend(tail);
    }
    // What it waited in: the caller of the scheduler.
    let last = match frames[..sched_at].last().copied() {
        Some("exit_to_user_mode_loop") => Some("return to user space"),
        l if off => l,
        _ => None,
    };
    let mut parts: Vec<&str> = syscall.into_iter().collect();
    parts.extend(fs.iter().copied());
    if let Some(l) = last
        && parts.last() != Some(&l)
    {
        parts.push(l);
    }
    if parts.is_empty() {
        return frames.last().copied().unwrap_or("?").to_string();
    }
    parts.join(" → ")
}

/// Folded stacks of a kind collapsed: (class, path) → weight per pass, µs.
fn collapsed(folded: &Folded, passes: usize, with_class: bool) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for (stack, w) in folded {
        let frames: Vec<&str> = stack.split(';').skip(1).collect();
        let (class, rest) = match frames.first() {
            Some(c) if with_class && c.starts_with('[') => {
                (c.trim_matches(['[', ']']).to_string(), &frames[1..])
            }
            _ => (String::from("on-CPU"), &frames[..]),
        };
        *out.entry((class, collapse(rest, with_class))).or_insert(0) += w / passes.max(1) as u64;
    }
    out
}

/// One cell: its passes, medians and stacks.
struct Cell<'a> {
    fs: &'a str,
    runs: Vec<&'a StepRun>,
    off: Option<Folded>,
    on: Option<Folded>,
}

impl<'a> Cell<'a> {
    fn load(r: &'a RunResult, dir: &Path, step: &str, fs: &'a str) -> Result<Cell<'a>> {
        let Some(f) = r.filesystems.iter().find(|f| f.column() == fs) else {
            let have: Vec<String> = r.filesystems.iter().map(|f| f.column()).collect();
            bail!(
                "no filesystem {fs} in this run (it has {})",
                have.join(", ")
            );
        };
        let runs = f.runs_of(step);
        if runs.is_empty() {
            if let Some((pass, s)) = f.failures_of(step).first() {
                bail!(
                    "step {step} failed on {fs} in every pass (pass {pass}: {})",
                    s.error.as_deref().unwrap_or_default()
                );
            }
            bail!("step {step} did not run on {fs}");
        }
        let folded = |kind: &str| -> Option<Folded> {
            let p = r.flames.cells.get(step)?.get(fs)?.get(kind)?;
            folded::read_folded(&dir.join(p)).ok()
        };
        Ok(Cell {
            fs,
            off: folded("off-cpu.folded"),
            on: folded("on-cpu.folded"),
            runs,
        })
    }
    fn waited_for(&self) -> Vec<(String, u64)> {
        metrics::waited_for_medians(&self.runs)
    }
    /// The heaviest (blocked stack, waker) pair of the first pass, as a sentence part; a
    /// parent's wait for its children (pgbench's `runuser`) is their time, not a wait.
    fn top_wake(&self) -> Option<String> {
        let stacks = self.runs.first()?.trace.stacks.as_ref()?;
        let t = (stacks.top_wakes.iter()).find(|t| {
            !t.blocked
                .iter()
                .any(|f| f == crate::trace::WAIT_FOR_CHILD_KERNEL)
        })?;
        let frames = |f: &[String]| {
            wakes::past_plumbing(f)
                .iter()
                .take(3)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(" ← ")
        };
        Some(format!(
            "{} waited {} in {} until {} woke it ({})",
            t.comm,
            seconds(t.ns),
            frames(&t.blocked),
            t.waker,
            frames(&t.waker_frames)
        ))
    }
    fn med(&self, f: impl Fn(&StepRun) -> u64) -> u64 {
        median(self.runs.iter().map(|s| f(s)).collect())
    }
    fn wall(&self) -> u64 {
        self.med(|s| s.trace.wall_ns)
    }
    /// (label, median ns) of the target's time classes and the kernel's background work.
    /// The time classes as `TraceResult::own_classes` gives them (a parent's wait for its
    /// children left out), medians of the passes, "other" left out.
    fn classes(&self) -> Vec<(&'static str, u64)> {
        let other = crate::aggregate::time_label(TimeClass::Other);
        let labels = TIME_LABELS.iter().map(|&(_, l)| l).filter(|&l| l != other);
        labels.map(|l| (l, self.med(|s| own(s, l)))).collect()
    }
    fn background(&self) -> u64 {
        self.med(|s| s.trace.background.as_ref().map(|b| b.ns).unwrap_or(0))
    }
    fn background_classes(&self) -> String {
        let Some(b) = self.runs.first().and_then(|s| s.trace.background.as_ref()) else {
            return String::new();
        };
        b.by_class
            .iter()
            .take(3)
            .map(|(c, ns)| format!("{c} {}", seconds(*ns)))
            .collect::<Vec<_>>()
            .join(", ")
    }
    /// syscall → (median count, median total ns).
    fn syscalls(&self) -> BTreeMap<String, (u64, u64)> {
        let mut names: Vec<String> = Vec::new();
        for s in &self.runs {
            for c in &s.trace.profile.syscalls {
                if !names.contains(&c.name) {
                    names.push(c.name.clone());
                }
            }
        }
        names
            .into_iter()
            .map(|n| {
                let get = |s: &StepRun, total: bool| {
                    s.trace
                        .profile
                        .syscalls
                        .iter()
                        .find(|c| c.name == n)
                        .map(|c| if total { c.total_ns } else { c.count })
                        .unwrap_or(0)
                };
                let v = (self.med(|s| get(s, false)), self.med(|s| get(s, true)));
                (n, v)
            })
            .collect()
    }
    /// A parent's sleep waiting for its children (wait4 and its kind), median of passes.
    fn waiting_for_children(&self) -> u64 {
        self.med(|s| s.trace.waiting_for_children_ns())
    }

    fn paths(&self, off: bool) -> BTreeMap<(String, String), u64> {
        let f = if off { &self.off } else { &self.on };
        f.as_ref()
            .map(|f| collapsed(f, self.runs.len(), off))
            .unwrap_or_default()
    }
    /// block class → medians of (requests, bytes, median size, device p99).
    fn block(&self) -> BTreeMap<String, (u64, u64, u64, u64)> {
        let mut out: BTreeMap<String, (u64, u64, u64, u64)> = BTreeMap::new();
        let classes: Vec<String> = self
            .runs
            .iter()
            .flat_map(|s| s.trace.profile.block.iter().map(|b| b.class.clone()))
            .collect();
        for c in classes {
            let get = |s: &StepRun, k: usize| -> u64 {
                s.trace
                    .profile
                    .block
                    .iter()
                    .filter(|b| b.class == c)
                    .map(|b| match k {
                        0 => b.completions,
                        1 => b.bytes,
                        2 => b.size.p50,
                        _ => b.device_latency.p99,
                    })
                    .sum()
            };
            out.insert(
                c.clone(),
                (
                    self.med(|s| get(s, 0)),
                    self.med(|s| get(s, 1)),
                    self.med(|s| get(s, 2)),
                    self.med(|s| get(s, 3)),
                ),
            );
        }
        out
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    format!("{:.0} %", 100.0 * part as f64 / whole as f64)
}

fn signed(ns: i128) -> String {
    let s = seconds(ns.unsigned_abs() as u64);
    if ns < 0 {
        format!("−{s}")
    } else {
        format!("+{s}")
    }
}

fn top_paths(c: &Cell, off: bool, n: usize) -> Vec<String> {
    let mut v: Vec<((String, String), u64)> = c
        .paths(off)
        .into_iter()
        .filter(|((_, p), _)| {
            !crate::trace::WAIT_FOR_CHILD
                .iter()
                .any(|w| p.starts_with(w))
        })
        .collect();
    v.sort_by_key(|(_, w)| std::cmp::Reverse(*w));
    v.into_iter()
        .take(n)
        .map(|((class, path), us)| format!("{} {class} in {path}", seconds(us * 1000)))
        .collect()
}

fn one(c: &Cell, step: &str) -> Vec<String> {
    let mut out = vec![wall_sentence(c, step), classes_sentence(c)];
    let bg = c.background();
    if bg > 0 {
        out.push(format!(
            "Kernel threads worked {} for the filesystem alongside ({}).",
            seconds(bg),
            c.background_classes()
        ));
    }
    out.extend(syscalls_sentence(c));
    out.extend(waited_sentence(c));
    if let Some(t) = c.top_wake() {
        out.push(format!("Heaviest wait: {t}."));
    }
    let waits = top_paths(c, true, 3);
    if !waits.is_empty() {
        out.push(format!("Longest waits: {}.", waits.join("; ")));
    }
    let on = top_paths(c, false, 2);
    if !on.is_empty() {
        out.push(format!("Most on-CPU time: {}.", on.join("; ")));
    }
    out.extend(block_sentence(c));
    out
}

/// The wall, the time until durable, and until the background work was done.
fn wall_sentence(c: &Cell, step: &str) -> String {
    let n = c.runs.len();
    format!(
        "{} {step}: {} wall (median of {n} pass{}), then {} until durable (syncfs){}.",
        c.fs,
        seconds(c.wall()),
        if n == 1 { "" } else { "es" },
        seconds(c.med(|s| s.syncfs_ns)),
        match c.med(|s| s.trace.quiesce_ns.unwrap_or(0)) {
            0 => String::new(),
            q => format!(
                " and {} until its background work was done (freeze)",
                seconds(q)
            ),
        }
    )
}

/// The target's time by class, a parent's sleep waiting for its children left out.
fn classes_sentence(c: &Cell) -> String {
    let mut classes = c.classes();
    let waiting = c.waiting_for_children();
    classes.sort_by_key(|(_, ns)| std::cmp::Reverse(*ns));
    let total: u64 = classes.iter().map(|(_, ns)| ns).sum();
    let parts: Vec<String> = classes
        .iter()
        .filter(|(_, ns)| *ns >= 500_000)
        .map(|(l, ns)| format!("{l} {} ({})", seconds(*ns), pct(*ns, total)))
        .collect();
    format!(
        "The target's threads spent {}{}.",
        parts.join(", "),
        if waiting > 0 {
            format!(
                " (not counting {} a parent slept waiting for its children)",
                seconds(waiting)
            )
        } else {
            String::new()
        }
    )
}

/// Class `label`'s time in `s`, as `own_classes` gives it.
fn own(s: &StepRun, label: &str) -> u64 {
    s.trace
        .own_classes()
        .iter()
        .find(|(l, _)| *l == label)
        .map_or(0, |c| c.1)
}

/// The three syscalls with the most time (waits for children left out).
fn syscalls_sentence(c: &Cell) -> Option<String> {
    let mut sc: Vec<(String, (u64, u64))> = c
        .syscalls()
        .into_iter()
        .filter(|(n, _)| !crate::trace::WAIT_FOR_CHILD.contains(&n.as_str()))
        .collect();
    sc.sort_by_key(|(_, (_, t))| std::cmp::Reverse(*t));
    let calls: Vec<String> = sc
        .iter()
        .take(3)
        .map(|(name, (count, total))| {
            format!(
                "{name} {count} calls, {} ({} each)",
                seconds(*total),
                duration_ns(total / (*count).max(1))
            )
        })
        .collect();
    (!calls.is_empty()).then(|| format!("Most syscall time: {}.", calls.join("; ")))
}

/// Off-CPU time by what ended each wait.
fn waited_sentence(c: &Cell) -> Option<String> {
    let waited = c.waited_for();
    let off: u64 = waited.iter().map(|(_, ns)| ns).sum();
    let parts: Vec<String> = waited
        .iter()
        .filter(|(_, ns)| *ns >= 500_000)
        .take(5)
        .map(|(w, ns)| format!("{w} {} ({})", seconds(*ns), pct(*ns, off)))
        .collect();
    (!parts.is_empty()).then(|| format!("Off-CPU, by what ended it: {}.", parts.join(", ")))
}

/// The block requests per class.
fn block_sentence(c: &Cell) -> Option<String> {
    let blocks: Vec<String> = c
        .block()
        .iter()
        .filter(|(_, v)| v.0 > 0)
        .map(|(class, (n, b, size, p99))| {
            format!(
                "{n} {class} requests ({}, {} median, device p99 {})",
                bytes(*b),
                bytes(*size),
                duration_ns(*p99)
            )
        })
        .collect();
    (!blocks.is_empty()).then(|| format!("Block I/O: {}.", blocks.join("; ")))
}

/// What compare's rule says of a figure of `a` against `b`, as a sentence part.
fn judged(r: &Row) -> String {
    let passes = format!(
        "{} vs {}",
        r.n_new,
        count(r.n_base as u64, "pass", "passes")
    );
    match (r.verdict, r.passes_needed) {
        (Verdict::Regression | Verdict::Improvement, _) => format!(
            "a clear difference ({}, {passes})",
            super::verdict::q_clause(r.q.unwrap_or_default())
        ),
        (Verdict::Inconclusive, Some(n)) => {
            format!("not clear from {passes}: about {n} passes each would settle it")
        }
        (Verdict::Inconclusive, None) => format!("not clear: within the spread of {passes}"),
        (Verdict::Unchanged, _) => format!(
            "within ±{:.0} %: no real difference",
            Rule::default().threshold * 100.0
        ),
    }
}

fn row<'c>(c: &'c Comparison, metric: &str) -> Option<&'c Row> {
    c.rows
        .iter()
        .find(|r| r.metric == metric || r.aliases.iter().any(|a| a == metric))
}

/// Smallest difference a line of `versus` shows: 1 ms (what a step's time is printed in),
/// and 2 % of the difference of the walls, so a second's difference is not explained with
/// microseconds.
fn shown_floor(wall_diff: i128) -> i128 {
    (wall_diff.abs() / 50).max(1_000_000)
}

/// `a` against `b` (the base) on `step`, one sentence a line: the wall and its verdict, then
/// what grew and shrank, largest first, leaving out changes below the shown floor.
fn versus(a: &Cell, b: &Cell, step: &str) -> Vec<String> {
    // b is the base: compare's rule over this cell pair's figures.
    let cmp = judge_cells(
        &[CellPair {
            fs: a.fs.to_string(),
            step: step.to_string(),
            base: b.runs.clone(),
            new: a.runs.clone(),
        }],
        &Rule::default(),
    );
    let verdict = |metric: &str| row(&cmp, metric).map(judged);
    let floor = shown_floor(a.wall() as i128 - b.wall() as i128);
    let head = rate_headline(a, b, step, &verdict);
    let mut out = vec![head.unwrap_or_else(|| headline(a, b, step, verdict("wall")))];
    out.extend(time_classes(a, b, floor, &verdict));
    out.extend(waits(a, b, floor));
    out.extend(background(a, b));
    out.extend(syscalls(a, b, floor));
    out.extend(paths(a, b, floor));
    out.extend(contrast_and_block(a, b));
    out
}

/// The step's own rate on a cell when that is its result (pgbench's tps), median.
fn own_rate(c: &Cell) -> Option<(rate::Unit, f64)> {
    let rates: Option<Vec<(rate::Unit, f64)>> =
        c.runs.iter().map(|s| rate::result_of(&s.metrics)).collect();
    let unit = rates.as_deref()?.first()?.0;
    Some((unit, median_f64(rates?.iter().map(|r| r.1).collect())))
}

/// "{step}: a ran 1886.5 tps, b 2091.6 tps: −9.8 %, verdict." for a step judged by its rate.
fn rate_headline(
    a: &Cell,
    b: &Cell,
    step: &str,
    verdict: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let ((unit, ra), (_, rb)) = (own_rate(a)?, own_rate(b)?);
    Some(format!(
        "{step}: {} ran {ra:.1} {u}, {} {rb:.1} {u}: {:+.1} % (its time is fixed: its rate is its result){}.",
        a.fs,
        b.fs,
        if rb > 0.0 {
            100.0 * (ra - rb) / rb
        } else {
            0.0
        },
        verdict(unit.key)
            .map(|v| format!(", {v}"))
            .unwrap_or_default(),
        u = unit.shown
    ))
}

/// "{step}: a took …, b took …: +d (+p %), verdict."
fn headline(a: &Cell, b: &Cell, step: &str, wall_verdict: Option<String>) -> String {
    let (wa, wb) = (a.wall(), b.wall());
    let d = wa as i128 - wb as i128;
    format!(
        "{step}: {} took {}, {} took {}: {} ({:+.0} %){}.",
        a.fs,
        seconds(wa),
        b.fs,
        seconds(wb),
        signed(d),
        if wb > 0 {
            100.0 * d as f64 / wb as f64
        } else {
            0.0
        },
        wall_verdict.map(|v| format!(", {v}")).unwrap_or_default()
    )
}

/// The time classes that grew (with their verdicts) and shrank.
fn time_classes(
    a: &Cell,
    b: &Cell,
    floor: i128,
    verdict: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    let (ca, cb) = (a.classes(), b.classes());
    let mut deltas: Vec<(&str, u64, u64)> = ca
        .iter()
        .zip(&cb)
        .map(|((l, x), (_, y))| (*l, *x, *y))
        .collect();
    deltas.sort_by_key(|(_, x, y)| std::cmp::Reverse(*x as i128 - *y as i128));
    let grew: Vec<String> = deltas
        .iter()
        .filter(|(_, x, y)| *x as i128 - *y as i128 >= floor)
        .map(|(l, x, y)| {
            format!(
                "{l} {} ({} vs {}{})",
                signed(*x as i128 - *y as i128),
                seconds(*x),
                seconds(*y),
                verdict(l).map(|v| format!("; {v}")).unwrap_or_default()
            )
        })
        .collect();
    if !grew.is_empty() {
        out.push(format!("Time that grew on {}: {}.", a.fs, grew.join(", ")));
    }
    let shrank: Vec<String> = deltas
        .iter()
        .filter(|(_, x, y)| *y as i128 - *x as i128 >= floor)
        .map(|(l, x, y)| format!("{l} {}", signed(*x as i128 - *y as i128)))
        .collect();
    if !shrank.is_empty() {
        out.push(format!("Time that shrank: {}.", shrank.join(", ")));
    }
    out
}

/// The waits that grew, by what ended them, and the top wake of `a`.
fn waits(a: &Cell, b: &Cell, floor: i128) -> Vec<String> {
    let mut out = Vec::new();
    let (wfa, wfb) = (a.waited_for(), b.waited_for());
    let of = |v: &[(String, u64)], n: &str| v.iter().find(|(w, _)| w == n).map_or(0, |x| x.1);
    let mut names: Vec<&String> = wfa.iter().chain(&wfb).map(|(n, _)| n).collect();
    names.sort();
    names.dedup();
    let mut grew_w: Vec<(i128, String)> = names
        .into_iter()
        .map(|n| (of(&wfa, n) as i128 - of(&wfb, n) as i128, n.clone()))
        .filter(|(d, _)| *d >= floor)
        .collect();
    grew_w.sort_by_key(|(d, _)| std::cmp::Reverse(*d));
    if !grew_w.is_empty() {
        let parts: Vec<String> = grew_w
            .iter()
            .take(3)
            .map(|(d, n)| {
                format!(
                    "{n} {} ({} vs {})",
                    signed(*d),
                    seconds(of(&wfa, n)),
                    seconds(of(&wfb, n))
                )
            })
            .collect();
        out.push(format!(
            "Waits that grew on {}, by what ended them: {}.",
            a.fs,
            parts.join(", ")
        ));
        if let Some(t) = a.top_wake() {
            out.push(format!("On {}, {t}.", a.fs));
        }
    }
    out
}

/// The kernel's background work for the filesystem on each side.
fn background(a: &Cell, b: &Cell) -> Option<String> {
    let (ba, bb) = (a.background(), b.background());
    (ba > 0 || bb > 0).then(|| {
        format!(
            "Kernel background work for the filesystem: {} on {} ({}) vs {} on {}.",
            seconds(ba),
            a.fs,
            a.background_classes(),
            seconds(bb),
            b.fs
        )
    })
}

/// The syscalls whose total time grew most.
fn syscalls(a: &Cell, b: &Cell, floor: i128) -> Option<String> {
    let (sa, sb) = (a.syscalls(), b.syscalls());
    // (syscall, total ns grown, (count, total) on a, on b)
    type Grown = (String, i128, (u64, u64), (u64, u64));
    let mut sc: Vec<Grown> = sa
        .iter()
        .map(|(n, x)| {
            let y = sb.get(n).copied().unwrap_or((0, 0));
            (n.clone(), x.1 as i128 - y.1 as i128, *x, y)
        })
        .collect();
    sc.sort_by_key(|(_, d, _, _)| std::cmp::Reverse(*d));
    let calls: Vec<String> = sc
        .iter()
        .filter(|(_, d, _, _)| *d >= floor)
        .take(3)
        .map(|(n, d, x, y)| {
            format!(
                "{n} {} ({} vs {} calls, {} vs {} each)",
                signed(*d),
                x.0,
                y.0,
                duration_ns(x.1 / x.0.max(1)),
                duration_ns(y.1 / y.0.max(1))
            )
        })
        .collect();
    (!calls.is_empty()).then(|| {
        format!(
            "Syscalls that took longer on {}: {}.",
            a.fs,
            calls.join("; ")
        )
    })
}

/// The off-CPU and on-CPU stack paths that grew most.
fn paths(a: &Cell, b: &Cell, floor: i128) -> Vec<String> {
    let mut out = Vec::new();
    for (off, what) in [
        (true, "Kernel paths that waited longer"),
        (false, "On-CPU paths that grew"),
    ] {
        let (pa, pb) = (a.paths(off), b.paths(off));
        let mut v: Vec<((String, String), i128, u64)> = pa
            .iter()
            .map(|(k, w)| {
                (
                    k.clone(),
                    *w as i128 - *pb.get(k).unwrap_or(&0) as i128,
                    *pb.get(k).unwrap_or(&0),
                )
            })
            .collect();
        v.sort_by_key(|(_, d, _)| std::cmp::Reverse(*d));
        let items: Vec<String> = v
            .iter()
            .filter(|(_, d, _)| *d * 1000 >= floor)
            .take(3)
            .map(|((class, path), d, other)| {
                format!(
                    "{} {class} in {path}{}",
                    signed(d * 1000),
                    if *other == 0 {
                        format!(" (none on {})", b.fs)
                    } else {
                        String::new()
                    }
                )
            })
            .collect();
        if !items.is_empty() {
            out.push(format!("{what} on {}: {}.", a.fs, items.join("; ")));
        }
    }
    out
}

/// The base's longest wait, and the block requests that differ.
fn contrast_and_block(a: &Cell, b: &Cell) -> Vec<String> {
    let mut out = Vec::new();
    let top_b = top_paths(b, true, 1);
    if let Some(t) = top_b.first() {
        out.push(format!("For contrast, {}'s longest wait: {t}.", b.fs));
    }
    let (ka, kb) = (a.block(), b.block());
    let mut blocks = Vec::new();
    for (class, x) in &ka {
        let y = kb.get(class).copied().unwrap_or_default();
        if x.0 != y.0 {
            blocks.push(format!(
                "{class}: {} vs {} requests ({} vs {}, {} vs {} median size)",
                x.0,
                y.0,
                bytes(x.1),
                bytes(y.1),
                bytes(x.2),
                bytes(y.2)
            ));
        }
    }
    if !blocks.is_empty() {
        out.push(format!(
            "Block I/O, {} vs {}: {}.",
            a.fs,
            b.fs,
            blocks.join("; ")
        ));
    }
    out
}

/// The explanation of `step` on `fs` (against `vs`), one sentence a line. `results` is the
/// file's path: flame graph paths in it are relative to its directory.
pub fn explain(
    r: &RunResult,
    results: &Path,
    step: &str,
    fs: &str,
    vs: Option<&str>,
) -> Result<Vec<String>> {
    let dir = dir_of(results);
    let a = Cell::load(r, dir, step, fs)?;
    match vs {
        None => Ok(one(&a, step)),
        Some(other) => {
            let b = Cell::load(r, dir, step, other)?;
            Ok(versus(&a, &b, step))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapses_to_fs_frames() {
        let s = "entry_SYSCALL_64_after_hwframe_[k];do_syscall_64_[k];__x64_sys_getdents64_[k];iterate_dir_[k];xfs_readdir_[k];xfs_dir2_block_getdents_[k];xfs_dir3_block_read_[k];xfs_buf_lock_[k];down_[k];__down_common_[k];schedule_timeout_[k];schedule_[k];__schedule_[k]";
        let frames: Vec<&str> = s.split(';').collect();
        assert_eq!(
            collapse(&frames, true),
            "getdents64 → iterate_dir → xfs_readdir → xfs_dir2_block_getdents → xfs_dir3_block_read → xfs_buf_lock → __down_common"
        );
    }
}
