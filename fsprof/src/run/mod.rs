//! `fsprof run`: fresh filesystems × passes × the steps of a suite, every step traced.

pub mod crash;
pub mod crash_study;
pub mod crash_vm;
pub mod flames;
pub mod in_vm;
mod preparation;

use std::{
    io::IsTerminal,
    path::PathBuf,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};

use crate::results::{self, FsRun, PassRun, RUN_SCHEMA_VERSION, RunResult, StepRun};
use crate::{
    lab::{self, FsKind, LabFs, LabOptions},
    probes::StackOptions,
    signals,
    suite::Suite,
    trace::{self, FlameOutput, TraceOptions},
    workload::{
        self, Step,
        pgbench::{PgServer, PgbenchSpec},
    },
};

/// A step of a run: built in, a user's command template, or pgbench on a real server.
#[derive(Clone, Debug)]
pub enum RunStep {
    Builtin(Step),
    /// Run with `sh -c` on the filesystem under test; `{mnt}` is its mount point.
    Command {
        name: String,
        template: String,
    },
    Pgbench(PgbenchSpec),
}

impl RunStep {
    pub fn name(&self) -> String {
        match self {
            RunStep::Builtin(s) => s.name().to_string(),
            RunStep::Command { name, .. } => name.clone(),
            RunStep::Pgbench(_) => "pgbench".to_string(),
        }
    }

    /// Parses `NAME=COMMAND` for `flag` (`--step`, `--prepare`).
    pub fn parse_command(s: &str, flag: &str) -> Result<RunStep> {
        match s.split_once('=') {
            Some((name, cmd)) if !name.is_empty() && !cmd.trim().is_empty() => {
                Ok(RunStep::Command {
                    name: name.to_string(),
                    template: cmd.to_string(),
                })
            }
            _ => anyhow::bail!(
                "{flag} takes NAME=COMMAND, e.g. untar='tar xf /src/linux.tar -C {{mnt}}'"
            ),
        }
    }

    /// The command line of the step in the lab (`ctx.dir`): a built-in step as `fsprof
    /// workload STEP --ctx JSON` (`me`), a user's through `sh -c`, pgbench against `server`.
    fn command(
        &self,
        me: &std::path::Path,
        ctx: &workload::Ctx,
        server: Option<&PgServer>,
    ) -> Result<Vec<String>> {
        Ok(match self {
            RunStep::Builtin(s) => vec![
                me.display().to_string(),
                "workload".into(),
                s.name().into(),
                "--ctx".into(),
                serde_json::to_string(ctx)?,
            ],
            RunStep::Command { template, .. } => {
                let mnt = ctx.dir.display().to_string();
                vec!["sh".into(), "-c".into(), template.replace("{mnt}", &mnt)]
            }
            RunStep::Pgbench(spec) => match server {
                Some(server) => server.bench_command(spec),
                None => anyhow::bail!("pgbench runs against its server"),
            },
        })
    }
}

pub struct RunOptions {
    /// Steps run after the suite's (`--step`, `--pgbench`).
    pub extra_steps: Vec<RunStep>,
    /// Commands run untraced on each pass's fresh filesystem before its steps (`--prepare`),
    /// after the built-in steps the run's steps need.
    pub prepare: Vec<RunStep>,
    pub filesystems: Vec<FsKind>,
    pub suite: &'static Suite,
    /// Overrides the suite's default scale.
    pub scale: Option<f64>,
    pub passes: u32,
    pub seed: u64,
    pub jobs: u32,
    /// Image size; default: from the suite's peak usage.
    pub size: Option<u64>,
    pub image_dir: PathBuf,
    /// Per filesystem; `None` key = all filesystems.
    pub mkfs_opts: Vec<(Option<FsKind>, String)>,
    pub mount_opts: Vec<(Option<FsKind>, String)>,
    /// A real block device to format instead of loop images: the kernel's node, checked
    /// (`lab::device::check_user_device`).
    pub device: Option<PathBuf>,
    /// Written after every step (valid, partial until `complete`).
    pub results: PathBuf,
    /// Drop caches before each step (default on, as the studies rebooted or remounted).
    pub drop_caches: bool,
    /// Stacks (on-CPU samples, off-CPU stacks, background work); None: off.
    pub stacks: Option<StackOptions>,
    /// Which of the filesystem's own tracepoints to count.
    pub fs_events: crate::probes::FsEventSet,
    /// Freeze and thaw after each step's syncfs, traced, so deferred work lands in it.
    pub quiesce: bool,
    /// Where folded stacks and flame graphs go (with `stacks`).
    pub flames_dir: PathBuf,
    /// Where pprof profiles go, per step, each pass's (`--pprof`).
    pub pprof_dir: Option<PathBuf>,
    /// Where each cell's timeline goes, per step (`--timeline`).
    pub timeline_dir: Option<PathBuf>,
    /// What the timelines hold (with `timeline_dir`).
    pub timeline: Option<crate::probes::timeline::TimelineOptions>,
    /// Draw the per-cell graphs at the end; false in a VM, whose host draws them over
    /// every boot's passes.
    pub draw_cells: bool,
    /// Only these steps of the suite (empty: all), in the suite's order.
    pub only: Vec<String>,
    /// `--label`, kept in the results.
    pub label: Option<String>,
    /// Stop the run at the first failed cell (else it is marked and the run goes on).
    pub fail_fast: bool,
}

fn opts_for(list: &[(Option<FsKind>, String)], kind: FsKind) -> Vec<String> {
    list.iter()
        .filter(|(k, _)| k.is_none_or(|k| k == kind))
        .map(|(_, o)| o.clone())
        .collect()
}

fn ns(d: std::time::Duration) -> u64 {
    d.as_nanos() as u64
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn memory_bytes() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Progress on stderr: where we are, elapsed, and a linear estimate of what is left. On a
/// terminal one line that rewrites itself; otherwise (a log, CI) a line per step.
struct Progress {
    start: Instant,
    total: usize,
    done: usize,
    tty: bool,
}

impl Progress {
    fn new(total: usize) -> Progress {
        Progress {
            start: Instant::now(),
            total,
            done: 0,
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn step(&mut self, fs: FsKind, pass: u32, passes: u32, step: &str) {
        let el = self.start.elapsed().as_secs();
        let eta = if self.done > 0 {
            let per = self.start.elapsed().as_secs_f64() / self.done as f64;
            format!(
                ", ~{}s left",
                (per * (self.total - self.done) as f64) as u64
            )
        } else {
            String::new()
        };
        self.note(&format!(
            "[{}/{}] {fs} pass {pass}/{passes}: {step} (elapsed {}:{:02}{eta})",
            self.done + 1,
            self.total,
            el / 60,
            el % 60
        ));
        self.done += 1;
    }

    /// A progress line; on a terminal the next one overwrites it.
    fn note(&self, what: &str) {
        if self.tty {
            // Carriage return and erase-line.
            eprint!("\r\x1b[2Kfsprof: {what}");
        } else {
            eprintln!("fsprof: {what}");
        }
    }

    /// Ends the rewriting line so what follows starts on its own.
    fn finish(&self) {
        if self.tty && self.done > 0 {
            eprintln!();
        }
    }
}

/// How a run ended: its results (partial when it stopped early, none when it could not
/// start) and the error that stopped it, if any.
pub struct Outcome {
    pub result: Option<RunResult>,
    pub error: Option<anyhow::Error>,
}

pub fn run(opts: &RunOptions) -> Outcome {
    let mut result = None;
    let error = run_into(opts, &mut result).err();
    Outcome { result, error }
}

/// The run, its results built in `out` as soon as it starts.
fn run_into(opts: &RunOptions, out: &mut Option<RunResult>) -> Result<()> {
    signals::install();
    crate::probes::check_environment()?;
    for &kind in &opts.filesystems {
        crate::vm::check_fs_available(kind, &opts.image_dir)?;
    }
    let scale = opts.scale.unwrap_or(opts.suite.default_scale);
    let mut ctx = opts.suite.ctx(scale, opts.seed, opts.jobs);
    ctx.src = opts.image_dir.join("sources");
    let size = opts.size.unwrap_or_else(|| opts.suite.image_size(&ctx));
    let me = std::env::current_exe().context("locating the fsprof binary")?;

    let (suite_steps, prepared) = prepare_sources(opts, &ctx)?;
    let steps: Vec<RunStep> = suite_steps
        .iter()
        .map(|&s| RunStep::Builtin(s))
        .chain(
            opts.suite
                .pgbench_spec(scale)
                .filter(|_| wanted(opts, "pgbench"))
                .map(RunStep::Pgbench),
        )
        .chain(opts.extra_steps.iter().cloned())
        .collect();
    let result = out.insert(RunResult {
        schema_version: RUN_SCHEMA_VERSION,
        fsprof_version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: crate::os::kernel_release(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        memory_bytes: memory_bytes(),
        suite: opts.suite.name.to_string(),
        scale,
        passes: opts.passes,
        seed: opts.seed,
        jobs: opts.jobs,
        started: unix_now(),
        run_id: crate::os::random_id(),
        host: crate::os::hostname(),
        kernel_build: crate::os::kernel_build(),
        label: opts.label.clone(),
        ..Default::default()
    });
    let mut progress = Progress::new(opts.filesystems.len() * opts.passes as usize * steps.len());
    let m = Matrix {
        opts,
        steps: &steps,
        prepared: &prepared,
        me: &me,
    };
    let outcome = run_matrix(&m, &mut ctx, size, result, &mut progress);
    progress.finish();
    match &outcome {
        Ok(()) => result.complete = true,
        Err(e) => result.interrupted = Some(format!("{e:#}")),
    }
    if opts.stacks.is_some() && opts.draw_cells {
        match flames::draw(result, &opts.flames_dir, results::dir_of(&opts.results)) {
            Ok(f) => result.flames = f,
            Err(e) => eprintln!("fsprof: warning: flame graphs not drawn: {e:#}"),
        }
    }
    result.save(&opts.results)?;
    outcome
}

fn wanted(opts: &RunOptions, name: &str) -> bool {
    opts.only.is_empty() || opts.only.iter().any(|o| o == name)
}

/// The suite's built-in steps this run takes (`--only`), refusing names the suite lacks.
fn suite_steps(opts: &RunOptions) -> Result<Vec<Step>> {
    let with_pgbench = opts.suite.pgbench.is_some();
    for o in &opts.only {
        let known = opts.suite.steps.iter().any(|s| s.name() == o);
        if !(known || with_pgbench && o == "pgbench") {
            let mut names: Vec<&str> = opts.suite.steps.iter().map(|s| s.name()).collect();
            if with_pgbench {
                names.push("pgbench");
            }
            anyhow::bail!(
                "step {o:?} is not in suite {} (its steps: {})",
                opts.suite.name,
                names.join(", ")
            );
        }
    }
    Ok(opts
        .suite
        .steps
        .iter()
        .copied()
        .filter(|s| wanted(opts, s.name()))
        .collect())
}

/// Makes the workload sources of the run's steps and of their preparation under `ctx.src`
/// (kept between runs); returns the suite's steps the run takes, and its preparation: the
/// built-in steps they need, then `--prepare`'s commands.
pub fn prepare_sources(
    opts: &RunOptions,
    ctx: &crate::workload::Ctx,
) -> Result<(Vec<Step>, Vec<RunStep>)> {
    let steps = suite_steps(opts)?;
    let needed = preparation::needed(opts.suite.steps, &steps);
    for &step in steps.iter().chain(&needed) {
        workload::prepare(step, ctx)?;
    }
    let prepared = (needed.into_iter().map(RunStep::Builtin))
        .chain(opts.prepare.iter().cloned())
        .collect();
    Ok((steps, prepared))
}

fn lab_options(opts: &RunOptions, kind: FsKind, size: u64) -> LabOptions {
    let mut mount_opts = opts_for(&opts.mount_opts, kind).join(",");
    if mount_opts.is_empty()
        && let Some(o) = opts.suite.mount_opts_for(kind)
    {
        mount_opts = o.to_string();
    }
    LabOptions {
        size,
        image_dir: opts.image_dir.clone(),
        mkfs_opts: opts_for(&opts.mkfs_opts, kind)
            .iter()
            .flat_map(|o| o.split_whitespace().map(String::from))
            .collect(),
        mount_opts,
        device: opts.device.clone(),
    }
}

/// The filesystems' turn within pass `pass` (from 1): all take turns in every pass, each
/// pass starting one further, so a slow minute of the machine falls on one pass of several
/// filesystems instead of every pass of one (measured: whole blocks of one filesystem's
/// cells moved 15–40 % between identical runs when its passes ran back to back).
fn pass_order(filesystems: usize, pass: u32) -> impl Iterator<Item = usize> {
    let first = (pass as usize - 1) % filesystems.max(1);
    (0..filesystems).map(move |i| (first + i) % filesystems)
}

/// What every pass of a run shares.
struct Matrix<'a> {
    opts: &'a RunOptions,
    steps: &'a [RunStep],
    /// Run untraced first on every pass (`preparation`).
    prepared: &'a [RunStep],
    me: &'a std::path::Path,
}

fn run_matrix(
    m: &Matrix,
    ctx: &mut workload::Ctx,
    size: u64,
    result: &mut RunResult,
    progress: &mut Progress,
) -> Result<()> {
    let opts = m.opts;
    let labs: Vec<LabOptions> = opts
        .filesystems
        .iter()
        .map(|&kind| lab_options(opts, kind, size))
        .collect();
    for (&kind, lab) in opts.filesystems.iter().zip(&labs) {
        result.filesystems.push(FsRun {
            fs: kind.name().to_string(),
            mkfs_opts: lab.mkfs_opts.clone(),
            mount_opts: lab.mount_opts.clone(),
            ..Default::default()
        });
    }
    for pass in 1..=opts.passes {
        for i in pass_order(labs.len(), pass) {
            let kind = opts.filesystems[i];
            m.pass(kind, &labs[i], pass, ctx, result, i, progress)?;
        }
    }
    Ok(())
}

/// Where a cell runs: the filesystem, its pass, the workload's context and the lab.
#[derive(Clone, Copy)]
struct CellAt<'a> {
    kind: FsKind,
    pass: u32,
    ctx: &'a workload::Ctx,
    labfs: &'a LabFs,
}

impl Matrix<'_> {
    /// One pass of every step on a fresh filesystem, recorded in `result.filesystems[fs_index]`.
    #[allow(clippy::too_many_arguments)]
    fn pass(
        &self,
        kind: FsKind,
        lab_opts: &LabOptions,
        pass: u32,
        ctx: &mut workload::Ctx,
        result: &mut RunResult,
        fs_index: usize,
        progress: &mut Progress,
    ) -> Result<()> {
        signals::check()?;
        let pass_started = unix_now();
        // A fresh filesystem for every pass.
        let mut labfs = LabFs::create(kind, lab_opts)?;
        let fs_run = &mut result.filesystems[fs_index];
        fs_run.device = labfs.device_path().display().to_string();
        fs_run.device_bytes = labfs.device_bytes();
        fs_run.passes.push(PassRun {
            pass,
            started: pass_started,
            mkfs_ns: ns(labfs.mkfs_time),
            mount_ns: ns(labfs.mount_time),
            capacity_after_mkfs: labfs.capacity()?,
            ..Default::default()
        });
        ctx.dir = labfs.mountpoint().to_path_buf();
        let mut failed: Vec<String> = Vec::new();
        if !self.prepared.is_empty() {
            progress.note(&format!("{kind} pass {pass}: preparing (untraced)"));
            let prepared =
                preparation::run(self.prepared, self.me, ctx, &labfs, self.opts.quiesce)?;
            for p in &prepared {
                if let Some(e) = &p.error {
                    eprintln!(
                        "fsprof: preparing {} failed on {kind} (pass {pass}): {e}",
                        p.step
                    );
                    failed.push(p.step.clone());
                }
            }
            let pass_run = result.filesystems[fs_index].passes.last_mut();
            pass_run.expect("pushed above").prepared = prepared;
        }
        for step in self.steps {
            signals::check()?;
            progress.step(kind, pass, self.opts.passes, &step.name());
            let at = CellAt {
                kind,
                pass,
                ctx,
                labfs: &labfs,
            };
            let run = self.cell(step, &at, &failed)?;
            let name = run.step.clone();
            let error = run.error.clone();
            let pass_run = result.filesystems[fs_index].passes.last_mut();
            pass_run.expect("pushed above").steps.push(run);
            result.save(&self.opts.results)?;
            signals::check()?;
            if let Some(e) = error {
                if self.opts.fail_fast {
                    anyhow::bail!("step {name} failed on {kind} (pass {pass}): {e}");
                }
                eprintln!("fsprof: step {name} failed on {kind} (pass {pass}): {e}; going on");
                failed.push(name);
            }
        }
        let umount = labfs.unmount()?;
        let pass_run = result.filesystems[fs_index].passes.last_mut();
        pass_run.expect("pushed above").umount_ns = Some(ns(umount));
        result.save(&self.opts.results)?;
        Ok(())
    }

    /// One cell: the step traced, or why it failed or was not run (a step it needs failed
    /// earlier in the pass). Only an interruption is an error here.
    fn cell(&self, step: &RunStep, at: &CellAt, failed: &[String]) -> Result<StepRun> {
        let needs = match step {
            RunStep::Builtin(s) => s.needs(),
            _ => &[],
        };
        let unmet: Vec<&str> = needs
            .iter()
            .map(|n| n.name())
            .filter(|n| failed.iter().any(|f| f == n))
            .collect();
        let not_run = |why: String| StepRun {
            step: step.name(),
            error: Some(why),
            ..StepRun::default()
        };
        if !unmet.is_empty() {
            return Ok(not_run(format!(
                "not run: needs {}, which failed",
                unmet.join(", ")
            )));
        }
        match self.step(step, at) {
            Ok(mut run) => {
                run.error = match (run.trace.exit_code, run.trace.exit_signal) {
                    (Some(0), _) => None,
                    (Some(c), _) => Some(format!("exited with status {c}")),
                    (None, Some(sig)) => Some(format!("killed by signal {sig}")),
                    (None, None) => Some("did not exit".to_string()),
                };
                Ok(run)
            }
            Err(e) => {
                signals::check()?;
                Ok(not_run(format!("{e:#}")))
            }
        }
    }

    /// One step traced on the pass's filesystem.
    fn step(&self, step: &RunStep, at: &CellAt) -> Result<StepRun> {
        let CellAt {
            kind,
            pass,
            ctx,
            labfs,
        } = *at;
        let opts = self.opts;
        let name = step.name();
        // Untraced set-up: a server the step talks to, stopped when `server` drops.
        let server = match step {
            RunStep::Pgbench(spec) => Some(PgServer::start(&ctx.dir, spec)?),
            _ => None,
        };
        let command = step.command(self.me, ctx, server.as_ref())?;
        if opts.drop_caches {
            lab::drop_caches()?;
        }
        let mut trace_opts = TraceOptions {
            command,
            also_follow: server.iter().map(|s| s.pid).collect(),
            flames: opts.stacks.map(|_| FlameOutput {
                dir: opts.flames_dir.join(&name),
                stem: format!("{kind}-pass{pass}"),
                title: format!("{kind} · {name} · pass {pass}"),
                svg: None,
                pprof: opts.pprof_dir.as_ref().map(|d| d.join(&name)),
            }),
            timeline: opts.timeline_dir.as_ref().map(|d| {
                d.join(&name)
                    .join(format!("{kind}-pass{pass}.{}", trace::TIMELINE_EXT))
            }),
            ..Default::default()
        };
        trace_opts.probes.stacks = opts.stacks;
        trace_opts.probes.timeline = opts.timeline;
        trace_opts.on_lab(labfs, opts.fs_events, opts.quiesce)?;
        if server.is_some() {
            // The server is meant to outlive the client; it is stopped below.
            trace_opts.kill_leftovers_in = None;
        }
        let trace = trace::run(&trace_opts)?;
        let mut metrics = server.as_ref().map(PgServer::metrics).unwrap_or_default();
        // A built-in step's rate as the tool it stands for reports it: its work over its wall.
        if let RunStep::Builtin(s) = step
            && let Some((unit, work)) = workload::rate::work(*s, ctx)
            && trace.exit_code == Some(0)
            && trace.wall_ns > 0
        {
            metrics.insert(unit.key.into(), work / (trace.wall_ns as f64 / 1e9));
        }
        drop(server);
        let deletes = matches!(step, RunStep::Builtin(s) if s.deletes());
        Ok(StepRun {
            step: name,
            syncfs_ns: trace.syncfs_ns.unwrap_or(0),
            capacity_after: deletes.then(|| labfs.capacity()).transpose()?,
            metrics,
            trace,
            error: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::pass_order;

    #[test]
    fn filesystems_take_turns_in_every_pass() {
        let order = |pass| pass_order(3, pass).collect::<Vec<_>>();
        assert_eq!(order(1), [0, 1, 2]);
        assert_eq!(order(2), [1, 2, 0]);
        assert_eq!(order(4), [0, 1, 2]);
        assert_eq!(pass_order(1, 5).collect::<Vec<_>>(), [0]);
    }
}
