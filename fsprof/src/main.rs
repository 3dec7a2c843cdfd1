use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use fsprof::{
    lab::{self, FsKind, LabFs, LabOptions},
    probes::ProbeOptions,
    report, signals,
    trace::{self, TraceOptions, TraceResult},
    workload,
};

#[derive(Parser)]
#[command(
    name = "fsprof",
    version,
    about = "Kernel-level tracing profiler for filesystem workloads"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Trace a command (and everything it starts) or a running process tree.
    Trace(TraceArgs),
    /// Trace the built-in demo workload on a fresh loop filesystem.
    Demo {
        #[arg(long, default_value = "ext4")]
        fs: String,
        #[command(flatten)]
        lab: LabArgs,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Which filesystems this machine can test, or why not.
    List,
    /// Run a built-in workload in this process (what `demo` and `run` trace).
    #[command(hide = true)]
    Workload {
        name: String,
        dir: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

#[derive(Args)]
struct LabArgs {
    /// Size of the loop filesystem's image (e.g. 512M, 4G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Directory for the sparse image (not tmpfs).
    #[arg(long, default_value = lab::DEFAULT_IMAGE_DIR)]
    dir: PathBuf,
    /// Extra mkfs options, e.g. "-b 1024".
    #[arg(long, allow_hyphen_values = true)]
    mkfs_opts: Option<String>,
    /// Mount options, e.g. "data=writeback".
    #[arg(long)]
    mount_opts: Option<String>,
}

#[derive(Args)]
struct TraceArgs {
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
    #[arg(long)]
    fs: Option<String>,
    #[command(flatten)]
    lab: LabArgs,
    /// With --fs: a shell command run untraced on the fresh filesystem first (cwd and
    /// `{mnt}` = its mount point), e.g. unpacking the tree a traced `rm -rf` deletes.
    #[arg(long, requires = "fs")]
    prepare: Option<String>,
    /// Only these block devices (e.g. /dev/vda); default: all.
    #[arg(long = "dev")]
    devices: Vec<PathBuf>,
    /// Drop the page cache before starting.
    #[arg(long)]
    drop_caches: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("bad size suffix in {s:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("bad size {s:?}"))
}

impl LabArgs {
    fn options(&self) -> LabOptions {
        LabOptions {
            size: self.size,
            image_dir: self.dir.clone(),
            mkfs_opts: self
                .mkfs_opts
                .as_deref()
                .map(|s| s.split_whitespace().map(String::from).collect())
                .unwrap_or_default(),
            mount_opts: self.mount_opts.clone().unwrap_or_default(),
        }
    }
}

/// Traces `command` on a fresh `kind` filesystem, which is removed afterwards whatever happens.
fn trace_on_lab(
    kind: FsKind,
    lab_opts: &LabOptions,
    prepare: Option<&str>,
    mut opts: TraceOptions,
) -> Result<TraceResult> {
    signals::install();
    let labfs = LabFs::create(kind, lab_opts)?;
    eprintln!(
        "fsprof: {kind} on {} mounted at {} (mkfs {:.2}s, mount {:.3}s)",
        labfs.device.path.display(),
        labfs.mountpoint().display(),
        labfs.mkfs_time.as_secs_f64(),
        labfs.mount_time.as_secs_f64()
    );
    let mnt = labfs.mountpoint().to_string_lossy().into_owned();
    opts.command = opts
        .command
        .iter()
        .map(|a| a.replace("{mnt}", &mnt))
        .collect();
    opts.cwd = Some(labfs.mountpoint().to_path_buf());
    opts.kill_leftovers = true;
    opts.probes.devices.push(labfs.kernel_dev()?);
    if let Some(script) = prepare {
        let script = script.replace("{mnt}", &mnt);
        eprintln!("fsprof: preparing (untraced): {script}");
        let status = std::process::Command::new("sh")
            .args(["-c", &script])
            .current_dir(labfs.mountpoint())
            .status()
            .context("running the --prepare command")?;
        if !status.success() {
            bail!("--prepare command failed ({status}): {script}");
        }
        labfs.syncfs()?;
    }
    lab::drop_caches()?;
    signals::check()?;
    trace::run(&opts)
}

fn output(result: &TraceResult, json: Option<&PathBuf>) -> Result<ExitCode> {
    // stderr, like time(1), strace and perf stat: the command may be writing to stdout.
    eprint!("{}", report::table::render(result));
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

fn trace_cmd(a: TraceArgs) -> Result<ExitCode> {
    if a.pid.is_none() && a.command.is_empty() {
        bail!("nothing to trace: give a command after `--` or -p PID");
    }
    let mut opts = TraceOptions {
        command: a.command.clone(),
        pid: a.pid,
        duration: a.duration.map(Duration::from_secs_f64),
        probes: ProbeOptions::default(),
        verbose: true,
        ..Default::default()
    };
    for d in &a.devices {
        opts.probes.devices.push(lab::kernel_dev_of(d)?);
    }
    let result = match &a.fs {
        Some(fs) => trace_on_lab(
            FsKind::parse(fs)?,
            &a.lab.options(),
            a.prepare.as_deref(),
            opts,
        )?,
        None => {
            if a.drop_caches {
                lab::drop_caches()?;
            }
            trace::run(&opts)?
        }
    };
    output(&result, a.json.as_ref())
}

fn list() -> Result<ExitCode> {
    for kind in FsKind::ALL {
        match kind.check_available() {
            Ok(()) => println!("{:<9} available", kind.name()),
            Err(e) => println!("{:<9} unavailable: {e}", kind.name()),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn real_main() -> Result<ExitCode> {
    match Cli::parse().cmd {
        Cmd::Trace(a) => trace_cmd(a),
        Cmd::Demo { fs, lab, json } => {
            let me = std::env::current_exe().context("locating the fsprof binary")?;
            let opts = TraceOptions {
                command: vec![
                    me.to_string_lossy().into_owned(),
                    "workload".into(),
                    "small-tree".into(),
                    "{mnt}".into(),
                ],
                verbose: true,
                ..Default::default()
            };
            let result = trace_on_lab(FsKind::parse(&fs)?, &lab.options(), None, opts)?;
            output(&result, json.as_ref())
        }
        Cmd::List => list(),
        Cmd::Workload { name, dir, seed } => {
            workload::run(&name, &dir, seed)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fsprof: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
