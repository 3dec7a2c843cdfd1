//! The result of `fsprof run`: filesystem × pass × step, each cell a full trace.

use std::{collections::BTreeMap, fs, path::Path};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::{lab::Capacity, trace::TraceResult};

/// Version of the results JSON (docs/json.md). Bump on any breaking change.
pub const RUN_SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FsRun {
    pub fs: String,
    pub mkfs_opts: Vec<String>,
    pub mount_opts: String,
    pub device: String,
    pub device_bytes: u64,
    pub passes: Vec<PassRun>,
}

impl FsRun {
    /// The cells of `step`, one per pass that ran it.
    pub fn runs_of(&self, step: &str) -> Vec<&StepRun> {
        self.passes
            .iter()
            .filter_map(|p| p.steps.iter().find(|s| s.step == step))
            .collect()
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PassRun {
    pub pass: u32,
    pub mkfs_ns: u64,
    pub mount_ns: u64,
    /// Null until the pass finished.
    pub umount_ns: Option<u64>,
    pub capacity_after_mkfs: Capacity,
    pub steps: Vec<StepRun>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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
}

/// The directory a results file is in: the paths it holds (flame graphs) are relative to it.
pub fn dir_of(results: &Path) -> &Path {
    results
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

impl RunResult {
    /// Writes atomically (temp file + rename), so a reader never sees half a file.
    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("json.partial");
        fs::write(&tmp, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    }

    /// Loads a results file, with one-line errors for what is not one.
    pub fn load(path: &Path) -> Result<RunResult> {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not valid JSON ({e})", path.display()))?;
        match v.get("schema_version").and_then(|s| s.as_u64()) {
            Some(s) if s == RUN_SCHEMA_VERSION as u64 => {}
            Some(s) => bail!(
                "{} has results schema {s}; this fsprof reads {RUN_SCHEMA_VERSION}",
                path.display()
            ),
            None => bail!(
                "{} is not an fsprof results file (no schema_version)",
                path.display()
            ),
        }
        serde_json::from_value(v)
            .map_err(|e| anyhow::anyhow!("{} is malformed: {e}", path.display()))
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

    /// CSV, one row per filesystem × pass × step.
    pub fn to_csv(&self) -> String {
        let mut out = String::from(
            "fs,pass,step,wall_s,user_s,sys_s,cpu_percent,on_cpu_s,io_wait_s,uninterruptible_s,\
             sleep_s,run_queue_s,syncfs_s,quiesce_s,kernel_background_s,block_read_bytes,block_write_bytes,\
             syscalls,lost_events,probe_s,probe_runs\n",
        );
        let s = |ns: u64| format!("{:.6}", ns as f64 / 1e9);
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
                    let calls: u64 = t.profile.syscalls.iter().map(|c| c.count).sum();
                    let lost: u64 = t.profile.lost.values().sum();
                    out.push_str(&format!(
                        "{},{},{},{},{},{},{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                        f.fs,
                        p.pass,
                        st.step,
                        s(t.wall_ns),
                        s(t.user_ns),
                        s(t.sys_ns),
                        t.cpu_percent(),
                        s(time.on_cpu.ns),
                        s(time.io_wait.ns),
                        s(time.uninterruptible.ns),
                        s(time.sleep.ns),
                        s(time.run_queue.ns),
                        s(st.syncfs_ns),
                        s(t.quiesce_ns.unwrap_or(0)),
                        s(t.background.as_ref().map(|b| b.ns).unwrap_or(0)),
                        block("read"),
                        block("write"),
                        calls,
                        lost,
                        s(t.profile.probe_cost.as_ref().map(|c| c.run_ns).unwrap_or(0)),
                        t.profile.probe_cost.as_ref().map(|c| c.runs).unwrap_or(0)
                    ));
                }
            }
        }
        out
    }
}

/// Graph files of a run, paths relative to the results file's directory.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunFlames {
    /// step → fs → "off-cpu.svg" (etc.) → path.
    pub cells: BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>,
    pub diffs: Vec<FlameDiff>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FlameDiff {
    pub step: String,
    /// The filesystem compared against (the run's first).
    pub base: String,
    pub fs: String,
    pub kind: String,
    pub path: String,
}
