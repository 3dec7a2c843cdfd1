//! The command line: clap types and one module per command; `main` only calls [`main`].

mod args;
mod check_cmd;
mod crash_cmd;
mod history_cmd;
mod results_cmds;
mod run_cmd;
mod trace_cmd;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{
    Parser, Subcommand,
    error::{ContextKind, ContextValue, ErrorKind},
};

use crate::{lab, vm, workload};

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
    Trace(trace_cmd::TraceArgs),
    /// Run a suite of standard workloads on fresh filesystems, every step traced.
    Run(run_cmd::RunArgs),
    /// What a crash leaves of an application's update: per filesystem, update pattern
    /// (rename with or without fsync, append, overwrite, …) and crash point, independent
    /// trials on fresh filesystems, with journal replay and fsck times.
    Crash(crash_cmd::CrashArgs),
    /// Which filesystems this machine (or, with --kernel, that kernel in a VM) can test, or
    /// why not.
    List {
        #[command(flatten)]
        vm: args::VmArgs,
        /// Directory for a fetched kernel and the VM's scratch files.
        #[arg(long, default_value = lab::DEFAULT_IMAGE_DIR)]
        dir: std::path::PathBuf,
    },
    /// Show a saved `fsprof run` results file again, or write its HTML report.
    Report(results_cmds::ReportArgs),
    /// Compare results (several files per side, comma-separated): per filesystem × step ×
    /// figure the change, its 95 % confidence interval, a moderated t-test over the passes
    /// and Benjamini–Hochberg over all figures; a verdict for each.
    Compare(results_cmds::CompareArgs),
    /// Recorded runs (every `fsprof run` is, unless --no-history): list them, a figure's
    /// trend over them with compare's verdicts, import results files, export a run.
    History(history_cmd::HistoryArgs),
    /// Where the time of one cell went, and with --vs why it took longer than on another
    /// filesystem.
    Explain(results_cmds::ExplainArgs),
    /// Check the invariants that tie an output's figures together (time classes, stacks,
    /// syscalls, block I/O, frames, graphs, profiles, timeline, crash cells, history):
    /// one line per invariant; exit status 1 naming those that fail.
    Check(check_cmd::CheckArgs),
    /// Remove mounts, loop devices and images a killed fsprof left behind.
    Cleanup,
    /// Differential flame graph of two folded stack files (e.g. the same cell of two runs):
    /// widths from NEW, red where NEW spent more time, blue where less.
    FlameDiff(results_cmds::FlameDiffArgs),
    /// Update every copy of a crash pattern in the current directory (what `crash` traces).
    #[command(hide = true)]
    CrashUpdate {
        #[arg(value_enum)]
        pattern: workload::crash::Pattern,
        #[arg(long)]
        count: u32,
        /// Write the updates' own time (ns) here.
        #[arg(long)]
        elapsed_to: std::path::PathBuf,
    },
    /// In a VM of `crash --kernel`: one boot's part of the study (the plan in the share).
    #[command(hide = true)]
    CrashGuest {
        #[arg(long)]
        plan: std::path::PathBuf,
    },
    /// Run one built-in workload step in this process (what `run` traces).
    #[command(hide = true)]
    Workload {
        step: String,
        #[arg(long)]
        ctx: String,
    },
}

fn list(vm: &args::VmArgs, dir: &std::path::Path) -> Result<ExitCode> {
    let kernels = vm.guest_kernels(dir)?;
    if kernels.is_empty() {
        for &kind in lab::FsKind::ALL {
            match crate::vm::check_fs_available(kind, dir) {
                Ok(()) => println!("{:<9} available", kind.name()),
                Err(e) => println!("{:<9} unavailable: {e}", kind.name()),
            }
        }
        println!(
            "reiser4   unavailable: never merged into mainline Linux; no kernel fsprof boots has it"
        );
        return Ok(ExitCode::SUCCESS);
    }
    // The guest's own `fsprof list` answers for its kernel and modules.
    lab::workdir::WorkDir::secure(dir)?;
    let (share, _) = vm::guest::scratch_paths(dir);
    let me = std::env::current_exe()?;
    let script = format!(
        "{} list > list.txt",
        shlex::try_quote(&me.to_string_lossy())?
    );
    for kernel in kernels {
        std::fs::create_dir_all(&share)?;
        let ran = vm::guest::run(&kernel, &vm.config(), &[&share], &[], None, &script);
        let listed = std::fs::read_to_string(share.join("list.txt"));
        let _ = std::fs::remove_dir_all(&share);
        ran?;
        let listed = listed.context("the VM wrote no list")?;
        println!(
            "kernel {} ({}) in qemu/{}:",
            kernel.release,
            kernel.spec,
            vm.vm_accel.name()
        );
        print!("{listed}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Commands that only read files and print: a reader that stops reading (`| head`) ends
/// them quietly, as it ends any Unix filter, instead of a panic on the closed pipe.
fn end_quietly_on_closed_pipe() {
    // SAFETY: restores the default disposition before any thread exists; nothing else of
    // fsprof depends on SIGPIPE being ignored in these commands.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn dispatch(cmd: Cmd) -> Result<ExitCode> {
    if matches!(
        cmd,
        Cmd::Report(_)
            | Cmd::Compare(_)
            | Cmd::Explain(_)
            | Cmd::FlameDiff(_)
            | Cmd::History(_)
            | Cmd::Check(_)
    ) {
        end_quietly_on_closed_pipe();
    }
    match cmd {
        Cmd::Trace(a) => trace_cmd::trace_cmd(a),
        Cmd::Run(a) => run_cmd::run_cmd(a),
        Cmd::Crash(a) => crash_cmd::crash_cmd(a),
        Cmd::List { vm, dir } => list(&vm, &dir),
        Cmd::Report(a) => results_cmds::report_cmd(a),
        Cmd::Compare(a) => results_cmds::compare_cmd(a),
        Cmd::Explain(a) => results_cmds::explain_cmd(a),
        Cmd::History(a) => history_cmd::history_cmd(a),
        Cmd::FlameDiff(a) => results_cmds::flame_diff_cmd(a),
        Cmd::Check(a) => check_cmd::check_cmd(a),
        Cmd::Cleanup => {
            for line in lab::cleanup::cleanup(&lab::cleanup::default_image_dirs())? {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::CrashUpdate {
            pattern,
            count,
            elapsed_to,
        } => {
            let took = workload::crash::update_copies(pattern, &std::env::current_dir()?, count)?;
            std::fs::write(elapsed_to, took.as_nanos().to_string())?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::CrashGuest { plan } => {
            crate::run::crash_vm::guest_boot(&plan)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Workload { step, ctx } => {
            workload::run_cli(&step, &ctx)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A usage error in one line: what clap says is wrong, whole (a missing argument's name is
/// on the lines after the first), the choices of a bad value, and for a missing or
/// conflicting argument the usage it breaks.
fn usage_error(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let (said, rest) = text.split_once("\n\n").unwrap_or((&text, ""));
    let words: Vec<&str> = said.split_whitespace().collect();
    let mut msg = words.join(" ");
    msg = msg.strip_prefix("error: ").unwrap_or(&msg).to_string();
    if let Some(ContextValue::Strings(values)) = e.get(ContextKind::ValidValue)
        && !values.is_empty()
    {
        msg = format!("{msg} [possible values: {}]", values.join(", "));
    }
    let shows_usage = matches!(
        e.kind(),
        ErrorKind::MissingRequiredArgument
            | ErrorKind::ArgumentConflict
            | ErrorKind::MissingSubcommand
    );
    let usage = rest.lines().find_map(|l| l.trim().strip_prefix("Usage: "));
    if let (true, Some(u)) = (shows_usage, usage) {
        msg = format!("{msg} (usage: {u})");
    }
    msg
}

/// One line on stderr and status 2 for any error, clap's usage errors included.
fn fail(msg: &str) -> ExitCode {
    eprintln!("fsprof: error: {msg}");
    ExitCode::from(2)
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            e.exit()
        }
        Err(e) => return fail(&usage_error(&e)),
    };
    vm::guest::heartbeat_if_asked();
    match dispatch(cli.cmd) {
        Ok(code) => code,
        // Stopped by a signal (after cleaning up): the status a process it killed has.
        Err(e) => match crate::signals::received() {
            Some(s) => {
                fail(&format!("{e:#}"));
                ExitCode::from(128 + s as u8)
            }
            None => fail(&format!("{e:#}")),
        },
    }
}
