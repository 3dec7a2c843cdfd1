//! `fsprof compare`: two sets of runs, cell by cell and figure by figure, each quantity
//! once, judged as one family by the verdict rule (`verdict`): a change is flagged only when
//! it is large (the threshold and the kind's floor) and clear after the number of figures
//! tested is accounted for.

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use serde::Serialize;

use super::{
    machine::{self, MachineCheck},
    metrics::{Kind, Metric, Unit, cell_metrics},
    stats::mean,
    verdict::{self, Judged, KindSpread},
};
use crate::results::{RunResult, StepRun};

pub use super::verdict::{Rule as CompareOptions, Verdict};

#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Row {
    pub fs: String,
    pub step: String,
    pub metric: String,
    /// Other names of the same figure in this cell (equal in every pass), tested once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// The figure's kind: its spread is moderated toward the others of that kind.
    pub kind: &'static str,
    pub unit: &'static str,
    pub base: f64,
    pub new: f64,
    /// (new − base) / base, %; null when base is 0.
    pub change_pct: Option<f64>,
    /// 95 % interval of the change, % of base; null with one pass a side.
    pub ci_pct: Option<(f64, f64)>,
    /// Two-sided p of the change (moderated t over the passes).
    pub p: Option<f64>,
    /// Benjamini–Hochberg q over every figure of the comparison.
    pub q: Option<f64>,
    pub n_base: usize,
    pub n_new: usize,
    pub verdict: Verdict,
    /// Inconclusive: passes a side that would settle it (absent: more than 50).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passes_needed: Option<u32>,
    /// Flagged by the rule, but the machine differed between the sides (`machine`) and the
    /// figure is a time that includes waiting: inconclusive; omitted when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub machine_differed: bool,
    /// The figure in each pass of each side.
    pub base_values: Vec<f64>,
    pub new_values: Vec<f64>,
}

/// The rule a comparison applied, with what it learned.
#[derive(Clone, Debug, Default, Serialize, schemars::JsonSchema)]
pub struct RuleSummary {
    /// Figures tested (each quantity once).
    pub figures: usize,
    /// Figures left out as other names of a tested one.
    pub aliases: usize,
    pub threshold_pct: f64,
    /// False discovery rate the flags are held to.
    pub fdr: f64,
    /// Pass-to-pass spread per kind of figure, learned from this comparison's passes.
    pub spread: Vec<KindSpread>,
}

#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub struct Comparison {
    pub rule: RuleSummary,
    pub rows: Vec<Row>,
    /// Differences between the runs that are not a result: kernels, mount options, …
    pub notes: Vec<String>,
    /// Whether the machine was as quiet on both sides; null when a results file has no
    /// record of the machine, and in `explain`, whose sides are one run.
    pub machine: Option<MachineCheck>,
}

impl Comparison {
    pub fn regressions(&self) -> impl Iterator<Item = &Row> {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Regression)
    }
    pub fn flagged(&self) -> impl Iterator<Item = &Row> {
        self.rows
            .iter()
            .filter(|r| matches!(r.verdict, Verdict::Regression | Verdict::Improvement))
    }
    pub fn count(&self, v: Verdict) -> usize {
        self.rows.iter().filter(|r| r.verdict == v).count()
    }
}

fn workload(r: &RunResult) -> String {
    format!(
        "suite {} scale {} jobs {} seed {}",
        r.suite, r.scale, r.jobs, r.seed
    )
}

fn describe_set(set: &[RunResult], what: impl Fn(&RunResult) -> String) -> String {
    let v: BTreeSet<String> = set.iter().map(what).collect();
    v.into_iter().collect::<Vec<_>>().join(" / ")
}

/// fsprof's own kernel time as a share of the wall time of every cell of `set`; None when
/// no cell measured it.
fn probe_share(set: &[RunResult]) -> Option<f64> {
    let (mut probe, mut wall, mut measured) = (0u64, 0u64, false);
    for st in set
        .iter()
        .flat_map(|r| &r.filesystems)
        .flat_map(|f| &f.passes)
        .flat_map(|p| &p.steps)
    {
        wall += st.trace.wall_ns;
        if let Some(c) = &st.trace.profile.probe_cost {
            probe += c.run_ns;
            measured = true;
        }
    }
    (measured && wall > 0).then(|| 100.0 * probe as f64 / wall as f64)
}

/// A note when the two sides paid different tracing costs (other modes, other event
/// sets, another kernel's dispatch): a difference of that size may be the profiler's.
fn probe_cost_note(base: &[RunResult], new: &[RunResult]) -> Option<String> {
    let show = |v: Option<f64>| {
        v.map(|p| format!("{p:.1} %"))
            .unwrap_or("unmeasured".into())
    };
    let (b, n) = (probe_share(base), probe_share(new));
    let differ = match (b, n) {
        (Some(b), Some(n)) => (b - n).abs() >= 1.0 && (b.max(n) / b.min(n).max(1e-9)) >= 1.5,
        (None, None) => false,
        _ => true,
    };
    differ.then(|| {
        format!(
            "fsprof's own probe cost differs: {} of wall in base, {} in new (changes of that size may be the profiler's)",
            show(b),
            show(n)
        )
    })
}

/// Refuses what cannot be compared; notes what differs but may (that is the point).
fn check(base: &[RunResult], new: &[RunResult]) -> Result<Vec<String>> {
    let all: Vec<&RunResult> = base.iter().chain(new).collect();
    let w0 = workload(all[0]);
    if let Some(other) = all.iter().find(|r| workload(r) != w0) {
        bail!(
            "the runs ran different workloads ({w0} vs {}): compare runs of the same suite, scale, jobs and seed",
            workload(other)
        );
    }
    // An emulated CPU is tens of times slower, and even KVM adds its own costs.
    let machine = |r: &RunResult| {
        r.vm.as_ref().map_or("bare metal".to_string(), |v| {
            format!("a qemu VM ({})", v.accel)
        })
    };
    let m0 = machine(all[0]);
    if let Some(other) = all.iter().find(|r| machine(r) != m0) {
        bail!(
            "one side ran on {m0}, the other on {}: their times are not comparable; compare runs made the same way",
            machine(other)
        );
    }
    let mut notes = Vec::new();
    let (kb, kn) = (
        describe_set(base, |r| r.kernel.clone()),
        describe_set(new, |r| r.kernel.clone()),
    );
    if kb != kn {
        notes.push(format!("kernels differ: base {kb}, new {kn}"));
    }
    let opts = |set: &[RunResult]| {
        describe_set(set, |r| {
            r.filesystems
                .iter()
                .map(|f| format!("{}[{}|{}]", f.column(), f.mount_opts, f.mkfs_opts.join(" ")))
                .collect::<Vec<_>>()
                .join(",")
        })
    };
    let (ob, on) = (opts(base), opts(new));
    if ob != on {
        notes.push(format!(
            "filesystem options differ (fs[mount|mkfs]): base {ob}, new {on}"
        ));
    }
    if let Some(n) = probe_cost_note(base, new) {
        notes.push(n);
    }
    for r in &all {
        if !r.complete {
            notes.push("a results file is incomplete: only its finished cells count".into());
            break;
        }
    }
    Ok(notes)
}

/// Cells of `fs` × `step` over all files of a set.
fn runs<'a>(set: &'a [RunResult], fs: &str, step: &str) -> Vec<&'a StepRun> {
    set.iter()
        .flat_map(|r| r.filesystems.iter().filter(|f| f.column() == fs))
        .flat_map(|f| f.runs_of(step))
        .collect()
}

/// (column, step) of every cell with a pass that worked.
fn cells(set: &[RunResult]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in set {
        for f in &r.filesystems {
            for p in &f.passes {
                for s in p.steps.iter().filter(|s| s.error.is_none()) {
                    let k = (f.column(), s.step.clone());
                    if !out.contains(&k) {
                        out.push(k);
                    }
                }
            }
        }
    }
    out
}

/// A note per cell that failed in some pass of either side: those passes are left out, and
/// a cell left with no pass on a side is not compared.
fn failure_notes(base: &[RunResult], new: &[RunResult]) -> Vec<String> {
    let mut notes = Vec::new();
    for (side, set) in [("base", base), ("new", new)] {
        let mut seen: Vec<(String, String)> = Vec::new();
        for r in set {
            for (fs, _, step, why) in r.failures() {
                let key = (fs.clone(), step.to_string());
                if seen.contains(&key) {
                    continue;
                }
                let failed = runs_failed(set, &fs, step);
                let ok = runs(set, &fs, step).len();
                notes.push(format!(
                    "{fs} {step}: failed in {failed} pass{} of the {side} side ({why}){}",
                    if failed == 1 { "" } else { "es" },
                    if ok == 0 {
                        "; not compared"
                    } else {
                        "; those passes are left out"
                    }
                ));
                seen.push(key);
            }
        }
    }
    notes
}

fn runs_failed(set: &[RunResult], fs: &str, step: &str) -> usize {
    set.iter()
        .flat_map(|r| r.filesystems.iter().filter(|f| f.column() == fs))
        .map(|f| f.failures_of(step).len())
        .sum()
}

/// A cell's figures paired across the sides, each quantity once: a figure equal in every
/// pass of both sides to an earlier one is its alias (I/O wait is often exactly the time a
/// disk completion ended).
fn paired(mb: Vec<Metric>, mn: Vec<Metric>) -> Vec<(Metric, Metric, Vec<String>)> {
    let mut out: Vec<(Metric, Metric, Vec<String>)> = Vec::new();
    for b in mb {
        let Some(n) = mn.iter().find(|n| n.name == b.name) else {
            continue;
        };
        let zero = b.values.iter().chain(&n.values).all(|v| *v == 0.0);
        if zero {
            continue;
        }
        match out
            .iter_mut()
            .find(|(ob, on, _)| ob.values == b.values && on.values == n.values)
        {
            Some(first) => first.2.push(b.name),
            None => out.push((b, n.clone(), Vec::new())),
        }
    }
    out
}

fn row(fs: &str, step: &str, (b, n, aliases): &(Metric, Metric, Vec<String>), j: &Judged) -> Row {
    let (mb, mn) = (mean(&b.values), mean(&n.values));
    Row {
        fs: fs.to_string(),
        step: step.to_string(),
        metric: b.name.clone(),
        aliases: aliases.clone(),
        kind: b.kind.into(),
        unit: match b.unit() {
            Unit::Ns => "ns",
            Unit::BytesPerSec => "B/s",
            Unit::PerSec => "/s",
        },
        base: mb,
        new: mn,
        change_pct: (mb != 0.0).then(|| 100.0 * (mn - mb) / mb),
        ci_pct: j.ci_pct,
        p: j.p,
        q: j.q,
        n_base: b.values.len(),
        n_new: n.values.len(),
        verdict: j.verdict.unwrap_or(Verdict::Unchanged),
        passes_needed: j.passes_needed,
        machine_differed: false,
        base_values: b.values.clone(),
        new_values: n.values.clone(),
    }
}

pub fn compare(base: &[RunResult], new: &[RunResult], opts: &CompareOptions) -> Result<Comparison> {
    if base.is_empty() || new.is_empty() {
        bail!("compare needs at least one results file on each side");
    }
    let mut notes = check(base, new)?;
    notes.extend(failure_notes(base, new));
    let new_cells = cells(new);
    let common: Vec<(String, String)> = cells(base)
        .into_iter()
        .filter(|c| new_cells.contains(c))
        .collect();
    if common.is_empty() {
        bail!("the runs have no filesystem × step in common");
    }
    let cells: Vec<CellPair> = common
        .iter()
        .map(|(fs, step)| CellPair {
            fs: fs.clone(),
            step: step.clone(),
            base: runs(base, fs, step),
            new: runs(new, fs, step),
        })
        .collect();
    let mut c = Comparison {
        notes,
        machine: machine::check(
            cells.iter().flat_map(|c| c.base.iter().copied()),
            cells.iter().flat_map(|c| c.new.iter().copied()),
        ),
        ..judge_cells(&cells, opts)
    };
    if let Some(m) = c.machine.as_mut().filter(|m| m.differed) {
        m.set_aside = set_aside_the_machines(&mut c.rows);
        c.notes.push(m.describe());
    }
    Ok(c)
}

/// With a machine that differed, every flag of a figure that includes waiting (wall, the
/// time classes, syncfs, latencies, throughput, waits) becomes inconclusive: the others took
/// CPUs from the target and from the kernel threads it waits for (a starved jbd2 made ext4's
/// `db` 8× slower beside two busy loops). The CPU time the work itself took (user, sys,
/// kernel background) keeps its verdict. Returns how many were set aside.
fn set_aside_the_machines(rows: &mut [Row]) -> usize {
    let cpu_time: [&str; 3] = [Kind::User, Kind::Sys, Kind::KernelBg].map(<&str>::from);
    let mut n = 0;
    for r in rows.iter_mut().filter(|r| {
        matches!(r.verdict, Verdict::Regression | Verdict::Improvement)
            && !cpu_time.contains(&r.kind)
    }) {
        r.verdict = Verdict::Inconclusive;
        r.passes_needed = None;
        r.machine_differed = true;
        n += 1;
    }
    n
}

/// One cell's passes on each side.
pub struct CellPair<'a> {
    pub fs: String,
    pub step: String,
    pub base: Vec<&'a StepRun>,
    pub new: Vec<&'a StepRun>,
}

/// Every figure of these cells, judged as one family (`compare` over a suite, `explain`
/// over one filesystem against another).
pub fn judge_cells(cells: &[CellPair], opts: &CompareOptions) -> Comparison {
    let mut figures = Vec::new();
    for c in cells {
        for p in paired(cell_metrics(&c.base), cell_metrics(&c.new)) {
            figures.push((c, p));
        }
    }
    let pairs: Vec<(&Metric, &Metric)> = figures.iter().map(|(_, (b, n, _))| (b, n)).collect();
    let family = verdict::judge(&pairs, opts);
    Comparison {
        rule: RuleSummary {
            figures: figures.len(),
            aliases: figures.iter().map(|f| f.1.2.len()).sum(),
            threshold_pct: 100.0 * opts.threshold,
            fdr: opts.alpha,
            spread: family.spread,
        },
        rows: figures
            .iter()
            .zip(&family.judged)
            .map(|((c, p), j)| row(&c.fs, &c.step, p, j))
            .collect(),
        notes: Vec::new(),
        machine: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flagged(metric: &str, kind: &'static str) -> Row {
        Row {
            fs: "ext4".into(),
            step: "cpu".into(),
            metric: metric.into(),
            aliases: Vec::new(),
            kind,
            unit: "ns",
            base: 1e6,
            new: 2e6,
            change_pct: None,
            ci_pct: None,
            p: Some(0.0),
            q: Some(0.0),
            n_base: 3,
            n_new: 3,
            verdict: Verdict::Regression,
            passes_needed: None,
            machine_differed: false,
            base_values: Vec::new(),
            new_values: Vec::new(),
        }
    }

    /// A busier machine: the flags of waits go, those of CPU time stay.
    #[test]
    fn the_machine_explains_waits_not_cpu_time() {
        let mut rows = vec![
            flagged("run-queue", "time_class"),
            flagged("wall", "wall"),
            flagged("fdatasync p99", "latency_p99"),
            flagged("sys", "sys"),
        ];
        assert_eq!(set_aside_the_machines(&mut rows), 3);
        let kept: Vec<&str> = rows
            .iter()
            .filter(|r| r.verdict == Verdict::Regression)
            .map(|r| r.metric.as_str())
            .collect();
        assert_eq!(kept, ["sys"]);
        assert!(rows[..3].iter().all(|r| r.machine_differed));
    }

    #[test]
    fn a_vm_run_is_not_compared_with_a_bare_metal_one() {
        let bare = [RunResult::default()];
        let tcg = [RunResult {
            vm: Some(crate::results::VmFacts {
                accel: "tcg".into(),
                ..Default::default()
            }),
            ..Default::default()
        }];
        let err = check(&bare, &tcg).unwrap_err().to_string();
        assert!(
            err.contains("bare metal") && err.contains("qemu VM (tcg)"),
            "{err}"
        );
        assert!(check(&tcg, &tcg).is_ok());
        assert!(check(&bare, &bare).is_ok());
    }
}
