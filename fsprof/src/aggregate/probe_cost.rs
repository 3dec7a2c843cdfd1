//! fsprof's own kernel-side cost: how often each of its programs ran (their own counters)
//! and for how long (the kernel's BPF run-time statistics, on in windows: see
//! `probes::probe_cost`).

use anyhow::Result;
use aya::maps::PerCpuArray;
use fsprof_common::MapName;
use fsprof_common::Program;
use serde::{Deserialize, Serialize};

use crate::probes::Probes;

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProgramCost {
    pub program: String,
    pub runs: u64,
    /// Time inside the program, ns: `runs` × the mean run time the kernel measured in the
    /// windows (exact when `measured_share` is 1).
    pub run_ns: u64,
    /// Runs the kernel timed (inside the windows); none: `run_ns` is unknown, shown as 0.
    #[serde(default)]
    pub measured_runs: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProbeCost {
    /// Summed over programs: every run on every CPU, in any task or interrupt.
    pub runs: u64,
    pub run_ns: u64,
    /// Share (0–1) of fsprof's time the kernel's run-time statistics were on: their two
    /// clock reads a run are paid only then. Results from before the windows: 1.
    #[serde(default = "always")]
    pub measured_share: f64,
    /// Programs that ran, most expensive first.
    pub programs: Vec<ProgramCost>,
}

fn always() -> f64 {
    1.0
}

impl ProbeCost {
    /// The cost as a share (%) of `ns` (the target's wall or sys time).
    pub fn percent_of(&self, ns: u64) -> Option<f64> {
        (ns > 0).then(|| 100.0 * self.run_ns as f64 / ns as f64)
    }

    /// One line: total, shares of wall and sys, and the three most expensive programs.
    pub fn line(&self, wall_ns: u64, sys_ns: u64) -> String {
        let pct = |v: Option<f64>| v.map(|p| format!("{p:.1} %")).unwrap_or("-".into());
        let top: Vec<String> = self
            .programs
            .iter()
            .take(3)
            .map(|p| {
                format!(
                    "{} {:.1} ms ({} runs, {} ns each)",
                    p.program,
                    p.run_ns as f64 / 1e6,
                    p.runs,
                    p.run_ns / p.runs.max(1)
                )
            })
            .collect();
        let sampled = match self.measured_share {
            s if s >= 0.995 => String::new(),
            s => format!(" (timed {:.0} % of the time)", 100.0 * s),
        };
        format!(
            "fsprof probes: {:.1} ms in the kernel{sampled}, {} runs = {} of wall, {} of the target's sys; {}",
            self.run_ns as f64 / 1e6,
            self.runs,
            pct(self.percent_of(wall_ns)),
            pct(self.percent_of(sys_ns)),
            top.join(", ")
        )
    }
}

/// None when the kernel keeps no statistics for fsprof (BPF_ENABLE_STATS refused).
pub fn collect(probes: &Probes) -> Result<Option<ProbeCost>> {
    let Some(windows) = probes.finish_cost_windows() else {
        return Ok(None);
    };
    let counts: PerCpuArray<_, u64> =
        PerCpuArray::try_from(crate::probes::map(&probes.ebpf, MapName::ProgramRuns)?)?;
    let mut cost = ProbeCost {
        measured_share: match windows.elapsed.as_secs_f64() {
            e if e > 0.0 => (windows.on.as_secs_f64() / e).min(1.0),
            _ => 0.0,
        },
        ..ProbeCost::default()
    };
    for (name, prog) in probes.ebpf.programs() {
        let Some(&p) = Program::ALL.iter().find(|p| p.name() == name) else {
            continue;
        };
        let runs: u64 = counts.get(&(p as u32), 0)?.iter().sum();
        if runs == 0 {
            continue;
        }
        let id = prog.info().map(|i| i.id()).unwrap_or_default();
        let (measured_runs, measured_ns) = windows.by_id.get(&id).copied().unwrap_or_default();
        let run_ns = match measured_runs {
            0 => 0,
            m => (u128::from(runs) * u128::from(measured_ns) / u128::from(m)) as u64,
        };
        cost.runs += runs;
        cost.run_ns += run_ns;
        cost.programs.push(ProgramCost {
            program: name.to_string(),
            runs,
            run_ns,
            measured_runs,
        });
    }
    cost.programs
        .sort_by(|a, b| b.run_ns.cmp(&a.run_ns).then(a.program.cmp(&b.program)));
    Ok(Some(cost))
}
