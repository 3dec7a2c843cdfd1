use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use fsprof::{
    aggregate,
    lab::{self, FsKind, LabFs, LabOptions},
    probes::{FsEventSet, ProbeOptions, StackOptions},
    report,
    results::{self, RunResult},
    run::{self, RunOptions},
    signals,
    suite::Suite,
    trace::{self, TraceOptions, TraceResult},
    workload::{self, pgbench::PgbenchSpec},
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
    /// Run a suite of standard workloads on fresh filesystems, every step traced.
    Run(RunArgs),
    /// Which filesystems this machine can test, or why not.
    List,
    /// Show a saved `fsprof run` results file again, or write its HTML report.
    Report {
        results: PathBuf,
        /// table (the terminal report), csv, json (normalised) or markdown (charts as SVG
        /// files in RESULTS.charts/).
        #[arg(long, default_value = "table")]
        format: String,
        /// Write the HTML report here (one file; flame graphs load from the run's
        /// .flames directory).
        #[arg(long)]
        html: Option<PathBuf>,
        /// The table with every pass and time class, not just the summary.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Compare results (several files per side, comma-separated): per filesystem × step ×
    /// figure the change, its 95 % confidence interval and Welch's t-test over the passes.
    Compare {
        /// Base results, e.g. old-kernel.json or a.json,b.json.
        base: String,
        /// New results.
        new: String,
        /// Relative change that counts, in %.
        #[arg(long, default_value_t = 5.0)]
        threshold: f64,
        /// Significance level of the t-test.
        #[arg(long, default_value_t = 0.05)]
        alpha: f64,
        /// Exit with status 1 when a regression is flagged (for CI).
        #[arg(long)]
        fail_on_regression: bool,
        /// Show every figure, not only the flagged ones.
        #[arg(long)]
        all: bool,
        /// Also write the comparison as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also write an HTML page with differential flame graphs of the flagged cells.
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// Where the time of one cell went, and with --vs why it took longer than on another
    /// filesystem.
    Explain {
        results: PathBuf,
        #[arg(long)]
        step: String,
        #[arg(long)]
        fs: String,
        #[arg(long)]
        vs: Option<String>,
    },
    /// Remove mounts, loop devices and images a killed fsprof left behind.
    Cleanup,
    /// Differential flame graph of two folded stack files (e.g. the same cell of two runs):
    /// widths from NEW, red where NEW spent more time, blue where less.
    FlameDiff {
        base: PathBuf,
        new: PathBuf,
        /// The SVG to write.
        #[arg(short, long, default_value = "diff.svg")]
        output: PathBuf,
        #[arg(long)]
        title: Option<String>,
    },
    /// Run one built-in workload step in this process (what `run` traces).
    #[command(hide = true)]
    Workload {
        step: String,
        #[arg(long)]
        ctx: String,
    },
}

#[derive(Args)]
struct RunArgs {
    /// Comma-separated filesystems, e.g. ext4,xfs,btrfs (see `fsprof list`).
    #[arg(long, default_value = "ext4,xfs,btrfs")]
    fs: String,
    /// quick (default), desktop, build-tree, file-server, iozone, distro, full, none.
    #[arg(long, default_value = "quick")]
    suite: String,
    /// Only these steps of the suite, comma-separated (e.g. extract-tree,delete-tree).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Passes per filesystem, each on a freshly made filesystem.
    #[arg(long, default_value_t = 3)]
    passes: u32,
    /// Work scale (1.0 = the studies' sizes); default: the suite's.
    #[arg(long)]
    scale: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Copies of each step run at once.
    #[arg(long, default_value_t = 1)]
    jobs: u32,
    /// Loop image size (e.g. 20G); default: from the suite's needs.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Directory for images and workload sources (not tmpfs, not the fs under test).
    #[arg(long, default_value = lab::DEFAULT_IMAGE_DIR)]
    dir: PathBuf,
    /// mkfs options, for all or one filesystem: "-b 1024" or "ext4:-b 1024"; repeatable.
    #[arg(long, allow_hyphen_values = true)]
    mkfs_opts: Vec<String>,
    /// Mount options, e.g. "ext4:data=writeback" or "noatime"; repeatable.
    #[arg(long)]
    mount_opts: Vec<String>,
    /// Format this block device instead of loop images. It is refused when mounted, in
    /// use, or holding a filesystem or partition table (unless --force).
    #[arg(long)]
    device: Option<PathBuf>,
    #[arg(long, requires = "device")]
    force: bool,
    /// Results file (JSON; a .csv is written beside it).
    #[arg(long, default_value = "fsprof-results.json")]
    json: PathBuf,
    /// Keep the page cache between steps.
    #[arg(long)]
    no_drop_caches: bool,
    /// An extra step: NAME=COMMAND, run with sh -c on the fs under test ({mnt} = its mount
    /// point), e.g. bonnie='bonnie++ -d {mnt} -u root -s 1024 -n 16'. Repeatable.
    #[arg(long = "step", value_parser = |s: &str| run::RunStep::parse_command(s).map_err(|e| e.to_string()))]
    steps: Vec<run::RunStep>,
    /// Add a pgbench step: SCALE,CLIENTS,SECONDS (e.g. 10,4,30) against a PostgreSQL server
    /// fsprof runs with its data directory on the fs under test.
    #[arg(long, value_parser = parse_pgbench)]
    pgbench: Option<PgbenchSpec>,
    #[command(flatten)]
    stacks: StackArgs,
    /// Do not freeze/thaw the filesystem after each step (then deferred background work,
    /// e.g. xfs inode inactivation, may land in a later step or nowhere).
    #[arg(long)]
    no_quiesce: bool,
    /// Report every pass of every step with all time classes, not just the summary.
    #[arg(long, short)]
    verbose: bool,
}

#[derive(Args)]
struct StackArgs {
    /// No stacks: no on-CPU sampling, off-CPU stacks, background work or flame graphs.
    #[arg(long)]
    no_stacks: bool,
    /// On-CPU samples per second per CPU (cpu-clock).
    #[arg(long, default_value_t = fsprof::probes::DEFAULT_SAMPLE_HZ)]
    sample_hz: u32,
    /// Do not count the filesystem's own tracepoints (xfs:*, ext4:*, jbd2:*, …).
    #[arg(long, conflicts_with = "all_fs_events")]
    no_fs_events: bool,
    /// Count every tracepoint of the filesystem's subsystems (the census), not only the
    /// curated waits, commits and background work. Costs ~150 ns per event: a kernel-tree
    /// delete fires millions (1.2–1.5× its wall time); the default set costs ~nothing.
    #[arg(long)]
    all_fs_events: bool,
    /// Directory for folded stacks and flame graphs (default: fsprof-flames for trace,
    /// RESULTS.flames beside the results file for run).
    #[arg(long)]
    flames: Option<PathBuf>,
}

impl StackArgs {
    fn fs_event_set(&self) -> FsEventSet {
        match (self.no_fs_events, self.all_fs_events) {
            (true, _) => FsEventSet::Off,
            (false, true) => FsEventSet::Census,
            (false, false) => FsEventSet::Curated,
        }
    }

    fn options(&self) -> Option<StackOptions> {
        (!self.no_stacks).then_some(StackOptions {
            sample_hz: self.sample_hz.max(1),
            background: true,
        })
    }
}

fn parse_pgbench(s: &str) -> Result<PgbenchSpec, String> {
    let v: Vec<u32> = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("bad --pgbench {s:?}: want SCALE,CLIENTS,SECONDS"))
        })
        .collect::<Result<_, _>>()?;
    match v[..] {
        [scale, clients, seconds] if scale > 0 && clients > 0 && seconds > 0 => Ok(PgbenchSpec {
            scale,
            clients,
            seconds,
        }),
        _ => Err(format!("bad --pgbench {s:?}: want SCALE,CLIENTS,SECONDS")),
    }
}

/// "ext4:opts" → (Some(ext4), "opts"); "opts" → (None, "opts").
fn per_fs(values: &[String]) -> Result<Vec<(Option<FsKind>, String)>> {
    values
        .iter()
        .map(|v| match v.split_once(':') {
            Some((fs, o)) if FsKind::ALL.iter().any(|k| k.name() == fs) => {
                Ok((Some(FsKind::parse(fs)?), o.to_string()))
            }
            _ => Ok((None, v.clone())),
        })
        .collect()
}

fn write_html(r: &RunResult, results: &std::path::Path, path: &std::path::Path) -> Result<()> {
    std::fs::write(path, report::html::render(r, results, path))
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("fsprof: HTML report in {}", path.display());
    Ok(())
}

fn run_cmd(a: RunArgs) -> Result<ExitCode> {
    let filesystems =
        a.fs.split(',')
            .map(FsKind::parse)
            .collect::<Result<Vec<_>>>()?;
    let mut extra_steps = a.steps.clone();
    extra_steps.extend(a.pgbench.clone().map(run::RunStep::Pgbench));
    let opts = RunOptions {
        extra_steps,
        filesystems,
        suite: Suite::find(&a.suite)?,
        scale: a.scale,
        passes: a.passes.max(1),
        seed: a.seed,
        jobs: a.jobs.max(1),
        size: a.size,
        image_dir: a.dir,
        mkfs_opts: per_fs(&a.mkfs_opts)?,
        mount_opts: per_fs(&a.mount_opts)?,
        device: a.device,
        force: a.force,
        results: a.json.clone(),
        drop_caches: !a.no_drop_caches,
        stacks: a.stacks.options(),
        fs_events: a.stacks.fs_event_set(),
        quiesce: !a.no_quiesce,
        only: a.only.clone(),
        flames_dir: a
            .stacks
            .flames
            .clone()
            .unwrap_or_else(|| run::flames::default_dir(&a.json)),
    };
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let opts_flames_dir = opts.flames_dir.clone();
    let outcome = run::run(&opts);
    // Whatever happened, the results file holds every finished step of this run: show them.
    if let Ok(result) = RunResult::load(&a.json)
        && result.started >= started
    {
        print!("{}", report::run_table::render(&result, a.verbose));
        let csv = a.json.with_extension("csv");
        std::fs::write(&csv, result.to_csv())?;
        write_html(&result, &a.json, &a.json.with_extension("html"))?;
        eprintln!(
            "fsprof: results in {} and {}",
            a.json.display(),
            csv.display()
        );
        if !result.flames.cells.is_empty() {
            eprintln!(
                "fsprof: flame graphs of {} cells and {} differential graphs in {}",
                result.flames.cells.values().map(|c| c.len()).sum::<usize>(),
                result.flames.diffs.len(),
                opts_flames_dir.display()
            );
        }
    }
    outcome.map(|_| ExitCode::SUCCESS)
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
    /// Count the tracepoints of the filesystem holding this path only (default: of each
    /// local filesystem the traced command fires one on).
    #[arg(long, conflicts_with = "fs")]
    fs_events_on: Option<PathBuf>,
    /// Attach do-nothing programs to the same hooks instead (benchmarks: what any tracer
    /// on these hooks costs); the report is then empty.
    #[arg(long, hide = true)]
    floor: bool,
    /// Drop the page cache before starting.
    #[arg(long)]
    drop_caches: bool,
    #[command(flatten)]
    stacks: StackArgs,
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
            device: None,
        }
    }
}

/// Traces `command` on a fresh `kind` filesystem, which is removed afterwards whatever happens.
fn trace_on_lab(
    kind: FsKind,
    lab_opts: &LabOptions,
    prepare: Option<&str>,
    fs_events: FsEventSet,
    mut opts: TraceOptions,
) -> Result<TraceResult> {
    signals::install();
    let labfs = LabFs::create(kind, lab_opts)?;
    eprintln!(
        "fsprof: {kind} on {} mounted at {} (mkfs {:.2}s, mount {:.3}s)",
        labfs.device_path().display(),
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
    opts.on_lab(&labfs, fs_events, true)?;
    if let Some(f) = &mut opts.flames {
        f.title = format!("{kind} · {}", f.title);
    }
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
    if let Some(svg) = result.flames.get("combined.svg") {
        let dir = std::path::Path::new(svg)
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
    let what = match a.pid {
        Some(p) => format!("PID {p}"),
        None => a.command.join(" "),
    };
    let stem = match a.pid {
        Some(p) => format!("pid-{p}"),
        None => std::path::Path::new(&a.command[0])
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "trace".into()),
    };
    let mut opts = TraceOptions {
        command: a.command.clone(),
        pid: a.pid,
        duration: a.duration.map(Duration::from_secs_f64),
        probes: ProbeOptions {
            stacks: a.stacks.options(),
            floor: a.floor,
            fs_events: match &a.fs {
                Some(_) => None, // the lab's, set by on_lab
                None => trace::fs_events_outside_lab(
                    a.stacks.fs_event_set(),
                    a.fs_events_on.as_deref(),
                    &a.command,
                    &std::env::current_dir()?,
                )?,
            },
            ..ProbeOptions::default()
        },
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
        }),
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
        Cmd::Run(a) => run_cmd(a),
        Cmd::List => list(),
        Cmd::Report {
            results,
            format,
            html,
            verbose,
        } => {
            let r = RunResult::load(&results)?;
            if let Some(path) = html {
                write_html(&r, &results, &path)?;
                return Ok(ExitCode::SUCCESS);
            }
            match format.as_str() {
                "table" => print!("{}", report::run_table::render(&r, verbose)),
                "csv" => print!("{}", r.to_csv()),
                "json" => println!("{}", serde_json::to_string_pretty(&r)?),
                "markdown" => {
                    let dir = results::dir_of(&results);
                    let md = report::html::markdown(&r, &results.with_extension("charts"), dir)?;
                    print!("{md}");
                }
                f => bail!("unknown --format {f:?}; use table, csv, json or markdown"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::FlameDiff {
            base,
            new,
            output,
            title,
        } => {
            let (b, n) = (
                aggregate::folded::read_folded(&base)?,
                aggregate::folded::read_folded(&new)?,
            );
            let title = title.unwrap_or_else(|| format!("{} vs {}", new.display(), base.display()));
            let sub = format!(
                "widths: {} ({} µs); red: more time than in {} ({} µs), blue: less",
                new.display(),
                aggregate::folded::total_us(&n),
                base.display(),
                aggregate::folded::total_us(&b)
            );
            if !report::flame::render_diff(&b, &n, &title, &sub, &output)? {
                bail!(
                    "{} has no time to draw: a differential graph takes its shapes from the new file",
                    new.display()
                );
            }
            eprintln!("fsprof: wrote {}", output.display());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Compare {
            base,
            new,
            threshold,
            alpha,
            fail_on_regression,
            all,
            json,
            html,
        } => {
            let load = |list: &str| -> Result<Vec<(PathBuf, RunResult)>> {
                list.split(',')
                    .map(|p| Ok((PathBuf::from(p), RunResult::load(std::path::Path::new(p))?)))
                    .collect()
            };
            let (base, new) = (load(&base)?, load(&new)?);
            let results = |set: &[(PathBuf, RunResult)]| -> Vec<RunResult> {
                set.iter().map(|(_, r)| r.clone()).collect()
            };
            let opts = fsprof::analysis::compare::CompareOptions {
                threshold: threshold / 100.0,
                alpha,
            };
            let c = fsprof::analysis::compare::compare(&results(&base), &results(&new), &opts)?;
            print!("{}", report::compare_table::render(&c, &opts, all));
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&c)? + "\n")?;
                eprintln!("fsprof: wrote {}", path.display());
            }
            if let Some(path) = html {
                report::compare_html::write(&c, &base, &new, &path)?;
                eprintln!("fsprof: wrote {}", path.display());
            }
            let regressed = c.regressions().next().is_some();
            Ok(if fail_on_regression && regressed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Cmd::Explain {
            results,
            step,
            fs,
            vs,
        } => {
            let r = RunResult::load(&results)?;
            for line in fsprof::analysis::explain::explain(&r, &results, &step, &fs, vs.as_deref())?
            {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Cleanup => {
            for line in lab::cleanup::cleanup(&lab::cleanup::default_image_dirs())? {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Workload { step, ctx } => {
            workload::run_cli(&step, &ctx)?;
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
