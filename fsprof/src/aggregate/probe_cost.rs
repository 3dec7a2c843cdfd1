//! fsprof's own kernel-side cost: how often each of its programs ran and for how long, from
//! the kernel's BPF run-time statistics (on only while fsprof runs, see `Probes`).

use serde::{Deserialize, Serialize};

use crate::probes::Probes;

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProgramCost {
    pub program: String,
    pub runs: u64,
    /// Time inside the program, ns (the kernel's run_time_ns).
    pub run_ns: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProbeCost {
    /// Summed over programs: every run on every CPU, in any task or interrupt.
    pub runs: u64,
    pub run_ns: u64,
    /// Programs that ran, most expensive first.
    pub programs: Vec<ProgramCost>,
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
        format!(
            "fsprof probes: {:.1} ms in the kernel, {} runs = {} of wall, {} of the target's sys; {}",
            self.run_ns as f64 / 1e6,
            self.runs,
            pct(self.percent_of(wall_ns)),
            pct(self.percent_of(sys_ns)),
            top.join(", ")
        )
    }
}

/// None when the kernel keeps no statistics for fsprof (BPF_ENABLE_STATS refused).
pub fn collect(probes: &Probes) -> Option<ProbeCost> {
    if !probes.cost_measured() {
        return None;
    }
    let mut cost = ProbeCost::default();
    for (name, prog) in probes.ebpf.programs() {
        let Ok(info) = prog.info() else { continue };
        let (runs, run_ns) = (info.run_count(), info.run_time().as_nanos() as u64);
        if runs == 0 {
            continue;
        }
        cost.runs += runs;
        cost.run_ns += run_ns;
        cost.programs.push(ProgramCost {
            program: name.to_string(),
            runs,
            run_ns,
        });
    }
    cost.programs
        .sort_by(|a, b| b.run_ns.cmp(&a.run_ns).then(a.program.cmp(&b.program)));
    Some(cost)
}
