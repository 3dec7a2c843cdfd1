//! `fsprof compare`: two sets of runs, cell by cell and figure by figure, with Welch's
//! t-test over the passes; a change is flagged only when it is both large (the threshold)
//! and unlikely to be noise (p < alpha) and above a small absolute floor.

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use serde::Serialize;

use super::{
    metrics::{Metric, Unit, cell_metrics, noise_floor},
    stats::{Welch, mean, welch},
};
use crate::results::{RunResult, StepRun};

#[derive(Clone, Copy, Debug)]
pub struct CompareOptions {
    /// Relative change that counts, e.g. 0.05 for 5 %.
    pub threshold: f64,
    /// Significance level of the t-test.
    pub alpha: f64,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            threshold: 0.05,
            alpha: 0.05,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Regression,
    Improvement,
    /// Large but not significant, or below the noise floor.
    Noise,
    Unchanged,
    /// Fewer than two passes on a side: no test possible.
    Untested,
}

#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Row {
    pub fs: String,
    pub step: String,
    pub metric: String,
    pub unit: &'static str,
    pub base: f64,
    pub new: f64,
    /// (new − base) / base, %.
    pub change_pct: f64,
    /// 95 % confidence interval of the change, % of base.
    pub ci_pct: Option<(f64, f64)>,
    pub p: Option<f64>,
    pub n_base: usize,
    pub n_new: usize,
    pub verdict: Verdict,
}

#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub struct Comparison {
    pub rows: Vec<Row>,
    /// Differences between the runs that are not a result: kernels, mount options, …
    pub notes: Vec<String>,
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

fn cells(set: &[RunResult]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in set {
        for f in &r.filesystems {
            for p in &f.passes {
                for s in &p.steps {
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

fn row(fs: &str, step: &str, b: &Metric, n: &Metric, opts: &CompareOptions) -> Row {
    let (mb, mn) = (mean(&b.values), mean(&n.values));
    let change = if mb != 0.0 { (mn - mb) / mb } else { 0.0 };
    let test: Option<Welch> = welch(&b.values, &n.values);
    let worse = if b.higher_is_worse { mn > mb } else { mn < mb };
    let big = change.abs() >= opts.threshold && (mn - mb).abs() >= noise_floor(b.unit);
    let verdict = match test {
        None if big => Verdict::Untested,
        None => Verdict::Unchanged,
        Some(t) if big && t.p < opts.alpha => {
            if worse {
                Verdict::Regression
            } else {
                Verdict::Improvement
            }
        }
        Some(_) if big || change.abs() >= opts.threshold => Verdict::Noise,
        Some(_) => Verdict::Unchanged,
    };
    Row {
        fs: fs.to_string(),
        step: step.to_string(),
        metric: b.name.clone(),
        unit: match b.unit {
            Unit::Ns => "ns",
            Unit::BytesPerSec => "B/s",
        },
        base: mb,
        new: mn,
        change_pct: 100.0 * change,
        ci_pct: test
            .filter(|_| mb != 0.0)
            .map(|t| (100.0 * t.ci.0 / mb, 100.0 * t.ci.1 / mb)),
        p: test.map(|t| t.p),
        n_base: b.values.len(),
        n_new: n.values.len(),
        verdict,
    }
}

pub fn compare(base: &[RunResult], new: &[RunResult], opts: &CompareOptions) -> Result<Comparison> {
    if base.is_empty() || new.is_empty() {
        bail!("compare needs at least one results file on each side");
    }
    let notes = check(base, new)?;
    let new_cells = cells(new);
    let common: Vec<(String, String)> = cells(base)
        .into_iter()
        .filter(|c| new_cells.contains(c))
        .collect();
    if common.is_empty() {
        bail!("the runs have no filesystem × step in common");
    }
    let mut out = Comparison {
        notes,
        ..Default::default()
    };
    for (fs, step) in &common {
        let (rb, rn) = (runs(base, fs, step), runs(new, fs, step));
        let (mb, mn) = (cell_metrics(&rb), cell_metrics(&rn));
        for b in &mb {
            if let Some(n) = mn.iter().find(|n| n.name == b.name) {
                out.rows.push(row(fs, step, b, n, opts));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(v: &[f64]) -> Metric {
        Metric {
            name: "wall".into(),
            unit: Unit::Ns,
            higher_is_worse: true,
            values: v.iter().map(|x| x * 1e9).collect(),
        }
    }

    #[test]
    fn verdicts() {
        let o = CompareOptions::default();
        let same = row("x", "s", &m(&[1.0, 1.01, 0.99]), &m(&[1.0, 1.01, 0.99]), &o);
        assert_eq!(same.verdict, Verdict::Unchanged);
        let slow = row("x", "s", &m(&[1.0, 1.01, 0.99]), &m(&[1.5, 1.52, 1.49]), &o);
        assert_eq!(slow.verdict, Verdict::Regression);
        assert!(slow.change_pct > 45.0 && slow.p.unwrap() < 0.01);
        let fast = row("x", "s", &m(&[1.5, 1.52, 1.49]), &m(&[1.0, 1.01, 0.99]), &o);
        assert_eq!(fast.verdict, Verdict::Improvement);
        let noisy = row("x", "s", &m(&[1.0, 2.0, 0.5]), &m(&[1.5, 0.8, 2.2]), &o);
        assert_eq!(noisy.verdict, Verdict::Noise);
        let one = row("x", "s", &m(&[1.0]), &m(&[2.0]), &o);
        assert_eq!(one.verdict, Verdict::Untested);
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
