//! The result of `fsprof run`: filesystem × pass × step, each cell a full trace.

pub mod crash;

use std::{collections::BTreeMap, fs, path::Path};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::{lab::Capacity, trace::TraceResult};

/// Version of the results JSON (docs/json.md). Bump on any breaking change.
pub const RUN_SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunResult {
    pub schema_version: u32,
    pub fsprof_version: String,
    pub kernel: String,
    pub cpus: usize,
    pub memory_bytes: u64,
    pub suite: String,
    pub scale: f64,
    pub passes: u32,
    pub seed: u64,
    pub jobs: u32,
    /// Unix time the run started.
    pub started: u64,
    /// False while running and when interrupted: the file is still valid, just partial.
    pub complete: bool,
    pub interrupted: Option<String>,
    pub filesystems: Vec<FsRun>,
    /// Flame graphs per cell and differential graphs; paths relative to this file.
    #[serde(default)]
    pub flames: RunFlames,
    /// Set when the suite ran inside a VM (`fsprof run --kernel`); absent on bare metal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<VmFacts>,
    /// Unique to this run (random): the history records a run once, however often it is
    /// imported.
    #[serde(default)]
    pub run_id: String,
    /// The machine that ran it (for a VM run, the host).
    #[serde(default)]
    pub host: String,
    /// `uname -v` of the kernel the suite ran on.
    #[serde(default)]
    pub kernel_build: String,
    /// `--label`: a free name for the run (e.g. a branch or a patch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// The VM a run's figures come from: they compare only with runs in the same kind of VM.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VmFacts {
    /// The kernels booted, in `--kernel` order.
    #[serde(default)]
    pub kernels: Vec<VmKernel>,
    /// qemu accelerator: `tcg` (emulated CPU) or `kvm`.
    pub accel: String,
    /// True under TCG: times are emulated and only comparable with other TCG runs.
    pub emulated: bool,
    pub cpus: u32,
    pub memory_bytes: u64,
    /// The test disk: a raw image on virtio-blk.
    pub disk: String,
    /// qemu's cache mode for the test disk (`none`: no host page cache).
    pub disk_cache: String,
    /// The host kernel the VM ran on.
    pub host_kernel: String,
}

/// One kernel of a VM run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VmKernel {
    /// The `--kernel` it came from (e.g. `deb:linux-image-amd64`).
    pub spec: String,
    /// Its release (`uname -r` in the guest).
    pub release: String,
    /// Its name on the kernel axis (`FsRun.kernel`): the release, made unique when the same
    /// release was given twice.
    pub label: String,
    /// Seconds from starting qemu to the guest running the suite, one per boot.
    pub boot_s: Vec<f64>,
    /// Boots stopped as hung (the guest printed nothing for the stall limit) and booted
    /// again; what they left unfinished ran in the boot after.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hung_boots: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FsRun {
    pub fs: String,
    /// The kernel these passes ran on (a `VmKernel.label`), when the run has several: the
    /// kernel axis. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    pub mkfs_opts: Vec<String>,
    pub mount_opts: String,
    pub device: String,
    pub device_bytes: u64,
    pub passes: Vec<PassRun>,
}

impl FsRun {
    /// Its column in reports and its name in compare and explain: the filesystem, with
    /// the kernel when the run has a kernel axis (`jfs@6.1.0-57-amd64`).
    pub fn column(&self) -> String {
        match &self.kernel {
            Some(k) => format!("{}@{k}", self.fs),
            None => self.fs.clone(),
        }
    }

    /// The cells of `step` that worked, one per pass: what every figure is made of.
    pub fn runs_of(&self, step: &str) -> Vec<&StepRun> {
        self.pass_runs(step).into_iter().map(|(_, s)| s).collect()
    }

    /// (pass, cell) of `step` in every pass where it worked.
    pub fn pass_runs(&self, step: &str) -> Vec<(u32, &StepRun)> {
        self.cells_where(step, true)
    }

    /// (pass, cell) of `step` in every pass where it failed or was not run.
    pub fn failures_of(&self, step: &str) -> Vec<(u32, &StepRun)> {
        self.cells_where(step, false)
    }

    fn cells_where(&self, step: &str, worked: bool) -> Vec<(u32, &StepRun)> {
        self.passes
            .iter()
            .filter_map(|p| p.steps.iter().find(|s| s.step == step).map(|s| (p.pass, s)))
            .filter(|(_, s)| s.error.is_none() == worked)
            .collect()
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PassRun {
    pub pass: u32,
    /// Unix time the pass started (before its mkfs).
    #[serde(default)]
    pub started: u64,
    pub mkfs_ns: u64,
    pub mount_ns: u64,
    /// Null until the pass finished.
    pub umount_ns: Option<u64>,
    pub capacity_after_mkfs: Capacity,
    /// Steps run untraced before `steps` to make their input (`--only delete-tree` first
    /// extracts the tree): preparation, not results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prepared: Vec<Prepared>,
    pub steps: Vec<StepRun>,
}

/// A step run untraced to prepare a pass (`PassRun::prepared`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Prepared {
    pub step: String,
    /// Its wall, with the syncfs (and quiesce) after it.
    pub wall_ns: u64,
    /// Why it failed; the steps that need it are then not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StepRun {
    pub step: String,
    /// syncfs right after the step returned, traced with it: "returned" is the trace's
    /// wall, "durable" adds this.
    pub syncfs_ns: u64,
    /// Capacity after the step (recorded after steps that delete).
    pub capacity_after: Option<Capacity>,
    /// Figures the step's own tool reports, e.g. pgbench's `tps`.
    pub metrics: BTreeMap<String, f64>,
    pub trace: TraceResult,
    /// Why the cell failed (its command's exit status, an error, or a step it needs that
    /// failed); absent when it worked. A failed cell's figures are left out of every summary,
    /// comparison and history figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl VmFacts {
    /// One line for report headers: the VM, and under TCG that its times are emulated.
    pub fn describe(&self) -> String {
        let boots: Vec<f64> = self
            .kernels
            .iter()
            .flat_map(|k| &k.boot_s)
            .copied()
            .collect();
        let boot = match boots.len() {
            0 => String::new(),
            1 => format!(", booted in {:.1}s", boots[0]),
            n => format!(
                ", {n} boots of {:.1}–{:.1}s",
                boots.iter().copied().fold(f64::INFINITY, f64::min),
                boots.iter().copied().fold(0.0, f64::max)
            ),
        };
        let hung: u32 = self.kernels.iter().map(|k| k.hung_boots).sum();
        let hung = match hung {
            0 => String::new(),
            n => format!(" ({n} more stopped as hung and booted again)"),
        };
        let accel = if self.emulated {
            format!(
                "{} (emulated CPU: times compare only with runs in the same emulator)",
                self.accel
            )
        } else {
            self.accel.clone()
        };
        format!(
            "in a qemu VM, {accel}, {} CPUs, {} MiB, {} cache={}{boot}{hung}, on host kernel {}",
            self.cpus,
            self.memory_bytes >> 20,
            self.disk,
            self.disk_cache,
            self.host_kernel
        )
    }
}

/// The directory a results file is in: the paths it holds (flame graphs) are relative to it.
pub fn dir_of(results: &Path) -> &Path {
    results
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// What an fsprof results file holds: a run's results or a crash study.
pub enum Saved {
    Run(Box<RunResult>),
    Crash(Box<crash::CrashStudy>),
}

impl Saved {
    /// Reads a results file of either kind, each checked against its schema version.
    pub fn load(path: &Path) -> Result<Saved> {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not valid JSON ({e})", path.display()))?;
        // A crash study has cells of trials where a run has filesystems of passes.
        let crash = v.get("cells").is_some() && v.get("filesystems").is_none();
        let want = if crash {
            crash::CRASH_SCHEMA_VERSION
        } else {
            RUN_SCHEMA_VERSION
        };
        match v.get("schema_version").and_then(|s| s.as_u64()) {
            Some(s) if s == want as u64 => {}
            Some(s) => bail!(
                "{} has results schema {s}; this fsprof reads {want}",
                path.display()
            ),
            None => bail!(
                "{} is not an fsprof results file (no schema_version)",
                path.display()
            ),
        }
        let malformed =
            |e: serde_json::Error| anyhow::anyhow!("{} is malformed: {e}", path.display());
        Ok(if crash {
            Saved::Crash(Box::new(serde_json::from_value(v).map_err(malformed)?))
        } else {
            Saved::Run(Box::new(serde_json::from_value(v).map_err(malformed)?))
        })
    }
}

impl RunResult {
    /// Writes atomically (temp file + rename), so a reader never sees half a file.
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::os::write_atomic(path, &(serde_json::to_string_pretty(self)? + "\n"))
    }

    /// Loads a results file, with one-line errors for what is not one.
    pub fn load(path: &Path) -> Result<RunResult> {
        match Saved::load(path)? {
            Saved::Run(r) => Ok(*r),
            Saved::Crash(_) => bail!(
                "{} is a crash study (`fsprof crash`), not a run's results: `fsprof report {}` \
                 shows it",
                path.display(),
                path.display()
            ),
        }
    }

    /// The kernels on the run's kernel axis, in run order; empty without one.
    pub fn kernel_axis(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for k in self.filesystems.iter().filter_map(|f| f.kernel.as_ref()) {
            if !out.contains(k) {
                out.push(k.clone());
            }
        }
        out
    }

    /// One result per kernel of the axis, its filesystems without the kernel (so they
    /// compare as plain runs); the whole run as one part when it has no axis.
    pub fn split_by_kernel(&self) -> Vec<(String, RunResult)> {
        let axis = self.kernel_axis();
        if axis.is_empty() {
            return vec![(self.kernel.clone(), self.clone())];
        }
        axis.into_iter()
            .map(|k| {
                let mut part = self.clone();
                part.kernel = k.clone();
                part.filesystems.retain(|f| f.kernel.as_ref() == Some(&k));
                if let Some(vm) = &mut part.vm {
                    vm.kernels.retain(|v| v.label == k);
                }
                // Cells renamed from `fs@kernel` to `fs`, as the part's columns are.
                part.flames = RunFlames::default();
                for f in &mut part.filesystems {
                    for (step, columns) in &self.flames.cells {
                        if let Some(files) = columns.get(&f.column()) {
                            let cells = part.flames.cells.entry(step.clone()).or_default();
                            cells.insert(f.fs.clone(), files.clone());
                        }
                    }
                    f.kernel = None;
                }
                (k, part)
            })
            .collect()
    }

    /// Every failed cell: (column, pass, step, why), in run order.
    pub fn failures(&self) -> Vec<(String, u32, &str, &str)> {
        let mut out = Vec::new();
        for f in &self.filesystems {
            for p in &f.passes {
                for s in &p.steps {
                    if let Some(e) = &s.error {
                        out.push((f.column(), p.pass, s.step.as_str(), e.as_str()));
                    }
                }
            }
        }
        out
    }

    /// Step names in the order they ran.
    pub fn step_names(&self) -> Vec<String> {
        let mut seen = Vec::new();
        for f in &self.filesystems {
            for p in &f.passes {
                for s in &p.steps {
                    if !seen.contains(&s.step) {
                        seen.push(s.step.clone());
                    }
                }
            }
        }
        seen
    }

    /// CSV, one row per filesystem × pass × step (fields quoted where they need it).
    pub fn to_csv(&self) -> String {
        let mut w = csv::Writer::from_writer(Vec::new());
        let s = |ns: u64| ns as f64 / 1e9;
        for f in &self.filesystems {
            for p in &f.passes {
                for st in &p.steps {
                    let t = &st.trace;
                    let time = &t.profile.time;
                    let block = |class: &str| -> u64 {
                        t.profile
                            .block
                            .iter()
                            .filter(|b| b.class == class)
                            .map(|b| b.bytes)
                            .sum()
                    };
                    let rate = crate::workload::rate::of(&st.metrics);
                    let row = CsvRow {
                        fs: &f.fs,
                        pass: p.pass,
                        step: &st.step,
                        wall_s: s(t.wall_ns),
                        user_s: s(t.user_ns),
                        sys_s: s(t.sys_ns),
                        cpu_percent: (t.cpu_percent() * 10.0).round() / 10.0,
                        on_cpu_s: s(time.on_cpu.ns),
                        io_wait_s: s(time.io_wait.ns),
                        uninterruptible_s: s(time.uninterruptible.ns),
                        sleep_s: s(time.sleep.ns),
                        run_queue_s: s(time.run_queue.ns),
                        syncfs_s: s(st.syncfs_ns),
                        quiesce_s: s(t.quiesce_ns.unwrap_or(0)),
                        kernel_background_s: s(t.background.as_ref().map(|b| b.ns).unwrap_or(0)),
                        block_read_bytes: block("read"),
                        block_write_bytes: block("write"),
                        syscalls: t.profile.syscalls.iter().map(|c| c.count).sum(),
                        lost_events: t.profile.lost.values().sum(),
                        probe_s: s(t.profile.probe_cost.as_ref().map(|c| c.run_ns).unwrap_or(0)),
                        probe_runs: t.profile.probe_cost.as_ref().map(|c| c.runs).unwrap_or(0),
                        kernel: f.kernel.as_deref().unwrap_or(&self.kernel),
                        error: st.error.as_deref().unwrap_or(""),
                        rate: rate.map(|r| r.1),
                        rate_unit: rate.map_or("", |r| r.0.shown),
                        latency_ms: st
                            .metrics
                            .get(crate::workload::pgbench::LATENCY_MS)
                            .copied(),
                    };
                    w.serialize(row).expect("CSV into memory");
                }
            }
        }
        String::from_utf8(w.into_inner().expect("CSV into memory")).expect("CSV of UTF-8 fields")
    }
}

/// One CSV row; the field names are the header.
#[derive(Serialize)]
struct CsvRow<'a> {
    fs: &'a str,
    pass: u32,
    step: &'a str,
    wall_s: f64,
    user_s: f64,
    sys_s: f64,
    cpu_percent: f64,
    on_cpu_s: f64,
    io_wait_s: f64,
    uninterruptible_s: f64,
    sleep_s: f64,
    run_queue_s: f64,
    syncfs_s: f64,
    quiesce_s: f64,
    kernel_background_s: f64,
    block_read_bytes: u64,
    block_write_bytes: u64,
    syscalls: u64,
    lost_events: u64,
    probe_s: f64,
    probe_runs: u64,
    /// Added last, so the columns before them keep their places.
    kernel: &'a str,
    /// Empty unless the cell failed.
    error: &'a str,
    /// The step's own rate (pgbench's transactions per second; bonnie++'s and iozone's
    /// KiB/s, files/s or seeks/s) and its unit; empty for other steps.
    rate: Option<f64>,
    rate_unit: &'a str,
    /// pgbench's average latency, ms; empty for other steps.
    latency_ms: Option<f64>,
}

/// Graph files of a run, paths relative to the results file's directory.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunFlames {
    /// step → fs → "off-cpu.svg" (etc.) → path.
    pub cells: BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>,
    pub diffs: Vec<FlameDiff>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FlameDiff {
    pub step: String,
    /// The filesystem compared against (the run's first).
    pub base: String,
    pub fs: String,
    pub kind: String,
    pub path: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_names_and_keeps_one_row_per_cell() {
        let cell = |step: &str, wall_ns| StepRun {
            step: step.into(),
            trace: TraceResult {
                wall_ns,
                ..TraceResult::default()
            },
            ..StepRun::default()
        };
        let r = RunResult {
            filesystems: vec![FsRun {
                fs: "ext4".into(),
                passes: vec![PassRun {
                    pass: 1,
                    steps: vec![cell("odd,\"name\"", 1_500_000_000), cell("rm", 2)],
                    ..PassRun::default()
                }],
                ..FsRun::default()
            }],
            ..RunResult::default()
        };
        let text = r.to_csv();
        let mut rd = csv::Reader::from_reader(text.as_bytes());
        let head = rd.headers().unwrap().clone();
        assert_eq!(
            head.iter().take(3).collect::<Vec<_>>(),
            ["fs", "pass", "step"]
        );
        let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert!(rows.iter().all(|r| r.len() == head.len()));
        assert_eq!(&rows[0][2], "odd,\"name\"");
        let wall = head.iter().position(|h| h == "wall_s").unwrap();
        assert_eq!(rows[0][wall].parse::<f64>().unwrap(), 1.5);
    }

    #[test]
    fn a_kernel_axis_splits_into_plain_runs_per_kernel() {
        let col = |fs: &str, kernel: &str, wall_ns| FsRun {
            fs: fs.into(),
            kernel: Some(kernel.into()),
            passes: vec![PassRun {
                pass: 1,
                steps: vec![StepRun {
                    step: "rm".into(),
                    trace: TraceResult {
                        wall_ns,
                        ..TraceResult::default()
                    },
                    ..StepRun::default()
                }],
                ..PassRun::default()
            }],
            ..FsRun::default()
        };
        let mut r = RunResult {
            filesystems: vec![col("jfs", "a", 1), col("jfs", "b", 2), col("xfs", "a", 3)],
            ..RunResult::default()
        };
        r.flames.cells.entry("rm".into()).or_default().insert(
            "jfs@b".into(),
            [(
                "off-cpu.svg".to_string(),
                "f/rm/jfs@b.off-cpu.svg".to_string(),
            )]
            .into(),
        );
        assert_eq!(r.kernel_axis(), ["a", "b"]);
        let parts = r.split_by_kernel();
        assert_eq!(parts.len(), 2);
        let (b, part) = &parts[1];
        assert_eq!((b.as_str(), part.kernel.as_str()), ("b", "b"));
        assert_eq!(part.filesystems.len(), 1);
        assert_eq!(part.filesystems[0].column(), "jfs");
        assert_eq!(part.filesystems[0].passes[0].steps[0].trace.wall_ns, 2);
        assert_eq!(
            part.flames.cells["rm"]["jfs"]["off-cpu.svg"],
            "f/rm/jfs@b.off-cpu.svg"
        );
        let a = &parts[0].1;
        let cols: Vec<String> = a.filesystems.iter().map(FsRun::column).collect();
        assert_eq!(cols, ["jfs", "xfs"]);
        assert!(a.to_csv().lines().skip(1).all(|l| l.ends_with(",a,,,,")));
        let plain = RunResult::default();
        assert_eq!(plain.split_by_kernel().len(), 1);
    }
}
