//! `fsprof run`: a suite on fresh filesystems; prints the summary and writes the results
//! (JSON, CSV, HTML) whatever happened, with what finished.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Result;
use clap::Args;

use super::{
    args::{StackArgs, TimelineArgs, VmArgs, parse_fs, parse_pgbench, parse_size, per_fs},
    history_cmd::RecordArgs,
    results_cmds::write_html,
};
use crate::{
    history,
    lab::{self, FsKind},
    report,
    run::{self, RunOptions, RunStep},
    suite::Suite,
    workload::pgbench::PgbenchSpec,
};

#[derive(Args)]
pub struct RunArgs {
    /// Comma-separated filesystems, e.g. ext4,xfs,btrfs (see `fsprof list`).
    #[arg(long, value_delimiter = ',', value_parser = parse_fs, default_value = "ext4,xfs,btrfs")]
    fs: Vec<FsKind>,
    /// quick (default), desktop, build-tree, file-server, iozone, distro, full, none.
    #[arg(long, default_value = "quick", value_parser = |s: &str| Suite::find(s).map_err(|e| format!("{e:#}")))]
    suite: &'static Suite,
    /// Only these steps of the suite, comma-separated (e.g. extract-tree,delete-tree).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Passes per filesystem, each on a freshly made filesystem.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    passes: u32,
    /// Work scale (1.0 = the studies' sizes); default: the suite's.
    #[arg(long)]
    scale: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Copies of each step run at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
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
    #[arg(long = "step", value_parser = |s: &str| RunStep::parse_command(s, "--step").map_err(|e| e.to_string()))]
    steps: Vec<RunStep>,
    /// Preparation: NAME=COMMAND as --step, run untraced on each pass's fresh filesystem
    /// before the steps and recorded as preparation, not as a result (e.g. the file a
    /// --step reads). Repeatable.
    #[arg(long = "prepare", value_parser = |s: &str| RunStep::parse_command(s, "--prepare").map_err(|e| e.to_string()))]
    prepare: Vec<RunStep>,
    /// Add a pgbench step: SCALE,CLIENTS,SECONDS (e.g. 10,4,30) against a PostgreSQL server
    /// fsprof runs with its data directory on the fs under test.
    #[arg(long, value_parser = parse_pgbench)]
    pgbench: Option<PgbenchSpec>,
    #[command(flatten)]
    stacks: StackArgs,
    #[command(flatten)]
    vm: VmArgs,
    /// Do not freeze/thaw the filesystem after each step (then deferred background work,
    /// e.g. xfs inode inactivation, may land in a later step or nowhere).
    #[arg(long)]
    no_quiesce: bool,
    /// Per-pass stacks only, no per-cell graphs (what `--kernel` asks of the guest).
    #[arg(long, hide = true)]
    no_cell_graphs: bool,
    /// Report every pass of every step with all time classes, not just the summary.
    #[arg(long, short)]
    verbose: bool,
    #[command(flatten)]
    record: RecordArgs,
    /// Stop at the first step that fails (by default the cell is marked failed, with the
    /// steps of its pass that need it, and the run goes on).
    #[arg(long)]
    fail_fast: bool,
    /// Also write each cell's timeline (every context switch, wakeup and block request) as
    /// a Perfetto trace: DIR/STEP/FS-passN.perfetto-trace (with --kernel,
    /// DIR/KERNEL/STEP/FS-passN.perfetto-trace).
    #[arg(long, value_name = "DIR")]
    timeline: Option<PathBuf>,
    #[command(flatten)]
    timeline_args: TimelineArgs,
}

pub fn run_cmd(a: RunArgs) -> Result<ExitCode> {
    let opts = run_options(&a)?;
    let outputs = [Some(a.json.as_path()), Some(opts.flames_dir.as_path())];
    let more = [a.stacks.pprof.as_deref(), a.timeline.as_deref()];
    crate::os::ensure_writable(outputs.into_iter().chain(more).flatten())?;
    lab::workdir::WorkDir::secure(&a.dir)?;
    let kernels = a.vm.guest_kernels(&a.dir)?;
    let outcome = match kernels.is_empty() {
        true => run::run(&opts),
        false => {
            // The guest's fsprof gets this command line, less what names host paths.
            let host_args: Vec<String> = std::env::args()
                .skip_while(|a| a != "run")
                .skip(1)
                .collect();
            let guest_args = run::in_vm::guest_args(&host_args);
            run::in_vm::run(&opts, &kernels, &a.vm.config(), &guest_args)
        }
    };
    // Whatever happened, every finished step of this run is shown and written.
    if let Some(result) = &outcome.result {
        write_outputs(&a, result, &opts.flames_dir)?;
    }
    // Recorded last: the results files are written whatever the history says.
    let recorded = match (&outcome.result, a.record.location()) {
        (Some(result), Some(location)) => history::record_run(result, location),
        _ => Ok(()),
    };
    let failed = outcome.result.as_ref().map_or(0, |r| r.failures().len());
    match (outcome.error, recorded) {
        (Some(e), _) | (None, Err(e)) => Err(e),
        (None, Ok(())) if failed > 0 => {
            eprintln!("fsprof: {failed} cells failed (listed in the summary)");
            Ok(ExitCode::from(1))
        }
        (None, Ok(())) => Ok(ExitCode::SUCCESS),
    }
}

/// The summary on stdout; the results as CSV and HTML beside the JSON the run saved.
fn write_outputs(
    a: &RunArgs,
    result: &crate::results::RunResult,
    flames_dir: &std::path::Path,
) -> Result<()> {
    print!("{}", report::run_table::render(result, a.verbose));
    let csv = a.json.with_extension("csv");
    std::fs::write(&csv, result.to_csv())?;
    write_html(result, &a.json, &a.json.with_extension("html"))?;
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
            flames_dir.display()
        );
    }
    Ok(())
}

/// What the command line asks of the run.
fn run_options(a: &RunArgs) -> Result<RunOptions> {
    let mut extra_steps = a.steps.clone();
    extra_steps.extend(a.pgbench.clone().map(RunStep::Pgbench));
    let flames_dir = a
        .stacks
        .flames
        .clone()
        .unwrap_or_else(|| run::flames::default_dir(&a.json));
    Ok(RunOptions {
        extra_steps,
        prepare: a.prepare.clone(),
        filesystems: a.fs.clone(),
        suite: a.suite,
        scale: a.scale,
        passes: a.passes,
        seed: a.seed,
        jobs: a.jobs,
        size: a.size,
        image_dir: a.dir.clone(),
        mkfs_opts: per_fs(&a.mkfs_opts)?,
        mount_opts: per_fs(&a.mount_opts)?,
        // Checked now, on one open of the path: the run uses the kernel's node it names.
        device: (a.device.as_deref())
            .map(|d| lab::device::check_user_device(d, a.force))
            .transpose()?,
        results: a.json.clone(),
        drop_caches: !a.no_drop_caches,
        stacks: a.stacks.options(),
        fs_events: a.stacks.fs_event_set(),
        quiesce: !a.no_quiesce,
        only: a.only.clone(),
        flames_dir,
        pprof_dir: a.stacks.pprof.clone(),
        timeline_dir: a.timeline.clone(),
        timeline: a.timeline_args.options(a.timeline.is_some()),
        draw_cells: !a.no_cell_graphs,
        label: a.record.label.clone(),
        fail_fast: a.fail_fast,
    })
}
