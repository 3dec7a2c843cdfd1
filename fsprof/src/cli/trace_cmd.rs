//! `fsprof trace`: one command or process tree, on the host's filesystems or a fresh one.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Result, bail};
use clap::Args;

use super::args::{LabArgs, StackArgs, TimelineArgs, parse_fs};
use crate::{
    lab::{self, FsKind},
    probes::{CostSampling, ProbeOptions},
    report,
    trace::{self, TraceOptions, TraceResult},
};

#[derive(Args)]
pub struct TraceArgs {
    /// Write the result as JSON (schema: docs/json.md).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Follow this running process and its descendants instead of starting a command.
    #[arg(short, long, conflicts_with = "command")]
    pid: Option<u32>,
    /// With -p: stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Run on a fresh loop filesystem of this kind; `{mnt}` in the command is its mount point
    /// and the command starts there. Block figures then cover only its device.
    #[arg(long, value_parser = parse_fs)]
    fs: Option<FsKind>,
    #[command(flatten)]
    lab: LabArgs,
    /// With --fs: a shell command run untraced on the fresh filesystem first (cwd and
    /// `{mnt}` = its mount point), e.g. unpacking the tree a traced `rm -rf` deletes.
    #[arg(long, requires = "fs")]
    prepare: Option<String>,
    /// Only these block devices (e.g. /dev/vda); default: all.
    #[arg(long = "dev")]
    devices: Vec<PathBuf>,
    /// Count the tracepoints of the filesystem holding this path only (default: of each
    /// local filesystem the traced command fires one on).
    #[arg(long, conflicts_with = "fs")]
    fs_events_on: Option<PathBuf>,
    /// Attach do-nothing programs to the same hooks instead (benchmarks: what any tracer
    /// on these hooks costs); the report is then empty.
    #[arg(long, hide = true)]
    floor: bool,
    /// Percent of the time the kernel times fsprof's programs (1–100). Timing costs two
    /// clock reads per program run (~70 ns), so by default it is on 20 ms of every 200
    /// and run times are estimated from then; 100 measures exactly and pays it throughout.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(1..=100))]
    probe_cost_sampling: u8,
    /// Drop the page cache before starting.
    #[arg(long)]
    drop_caches: bool,
    /// Also write a timeline of every context switch, wakeup and block request as a
    /// Perfetto trace to FILE (open it in ui.perfetto.dev).
    #[arg(long, value_name = "FILE", conflicts_with = "floor")]
    timeline: Option<PathBuf>,
    #[command(flatten)]
    timeline_args: TimelineArgs,
    #[command(flatten)]
    stacks: StackArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

pub fn trace_cmd(a: TraceArgs) -> Result<ExitCode> {
    if a.pid.is_none() && a.command.is_empty() {
        bail!("nothing to trace: give a command after `--` or -p PID");
    }
    let (what, stem) = match a.pid {
        Some(p) => (format!("PID {p}"), format!("pid-{p}")),
        None => (
            a.command.join(" "),
            Path::new(&a.command[0])
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "trace".into()),
        ),
    };
    let mut opts = TraceOptions {
        command: a.command.clone(),
        pid: a.pid,
        duration: a.duration.map(Duration::from_secs_f64),
        probes: ProbeOptions {
            stacks: a.stacks.options(),
            floor: a.floor,
            cost_sampling: CostSampling(a.probe_cost_sampling),
            fs_events: match a.fs {
                Some(_) => None, // the lab's, set by on_lab
                None => trace::fs_events_outside_lab(
                    a.stacks.fs_event_set(),
                    a.fs_events_on.as_deref(),
                    &a.command,
                    &std::env::current_dir()?,
                )?,
            },
            timeline: a.timeline_args.options(a.timeline.is_some()),
            ..ProbeOptions::default()
        },
        timeline: a.timeline.clone(),
        verbose: true,
        flames: (!a.stacks.no_stacks).then(|| trace::FlameOutput {
            dir: a
                .stacks
                .flames
                .clone()
                .unwrap_or_else(|| "fsprof-flames".into()),
            stem,
            title: what,
            svg: Some(report::flame::render),
            pprof: a.stacks.pprof.clone(),
        }),
        ..Default::default()
    };
    for d in &a.devices {
        opts.probes.devices.push(lab::kernel_dev_of(d)?);
    }
    let flames = opts.flames.as_ref().map(|f| f.dir.as_path());
    let outputs = [
        a.json.as_deref(),
        a.timeline.as_deref(),
        a.stacks.pprof.as_deref(),
        flames,
    ];
    crate::os::ensure_writable(outputs.into_iter().flatten())?;
    if let Some(pid) = a.pid
        && !Path::new(&format!("/proc/{pid}")).exists()
    {
        bail!("no process with PID {pid}");
    }
    if let Some(kind) = a.fs {
        lab::workdir::WorkDir::secure(&a.lab.dir)?;
        crate::vm::check_fs_available(kind, &a.lab.dir)?;
    }
    let result = match a.fs {
        Some(kind) => trace::run_on_lab(
            kind,
            &a.lab.options(),
            a.prepare.as_deref(),
            a.stacks.fs_event_set(),
            opts,
        )?,
        None => {
            if a.drop_caches {
                lab::drop_caches()?;
            }
            trace::run(&opts)?
        }
    };
    output(&result, a.json.as_deref())
}

fn output(result: &TraceResult, json: Option<&Path>) -> Result<ExitCode> {
    // stderr, like time(1), strace and perf stat: the command may be writing to stdout.
    eprint!("{}", report::table::render(result));
    if let Some(svg) = result.flames.get("combined.svg") {
        let dir = Path::new(svg)
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let kinds: Vec<&str> = result
            .flames
            .keys()
            .filter_map(|k| k.strip_suffix(".svg"))
            .collect();
        eprintln!("fsprof: flame graphs ({}) in {dir}/", kinds.join(", "));
    }
    let profiles: Vec<&String> = result
        .flames
        .iter()
        .filter(|(k, _)| k.ends_with(crate::aggregate::pprof::PPROF_EXT))
        .map(|(_, p)| p)
        .collect();
    if !profiles.is_empty() {
        eprintln!(
            "fsprof: pprof profiles: {}",
            profiles
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(t) = &result.timeline {
        eprintln!("fsprof: {}", crate::report::timeline::line(t));
    }
    if let Some(path) = json {
        report::write_json(result, path)?;
        eprintln!("fsprof: wrote {}", path.display());
    }
    // Like time(1): the traced command's status is ours.
    Ok(match (result.exit_code, result.exit_signal) {
        (Some(c), _) => ExitCode::from(c as u8),
        (_, Some(s)) => ExitCode::from(128 + s as u8),
        _ => ExitCode::SUCCESS,
    })
}
