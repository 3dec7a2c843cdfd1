//! `cargo xtask …`: everything fsprof needs on a fresh machine, then build, demo, test.

mod bench;
mod setup;
mod verdicts;

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "fsprof developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install the eBPF toolchain and the tools fsprof and its tests use (idempotent).
    Setup,
    /// Setup, then `cargo build --release`.
    Build,
    /// Setup, build, then the main job: `fsprof run` (quick suite) on ext4, xfs and btrfs.
    Run {
        /// Extra arguments for `fsprof run`, e.g. `--suite desktop`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Tracing overhead on ext4 and xfs loop filesystems: kernel-tree untar and delete and
    /// an fsync-heavy step, untraced vs every tracing mode vs bpftrace, medians.
    Bench {
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long, value_delimiter = ',', default_value = "ext4,xfs")]
        fs: Vec<String>,
        /// Modes to measure besides untraced (default: all), e.g. floor,default.
        #[arg(long, value_delimiter = ',', value_enum)]
        modes: Vec<bench::Mode>,
    },
    /// Calibrate `fsprof compare`: rounds of A, B, A runs; prints the false flags of the A/A
    /// pairs, what the A/B pairs flag, and the power to find an injected wall-time change.
    Verdicts {
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long, value_delimiter = ',', default_value = "ext4,xfs,btrfs")]
        fs: Vec<String>,
        /// The B side's extra `fsprof run` arguments.
        #[arg(
            long,
            default_value = "--mount-opts ext4:data=journal",
            allow_hyphen_values = true
        )]
        b: String,
        /// Steps B must be flagged in: STEP (as a regression) or STEP:improvement.
        #[arg(long, value_delimiter = ',', default_value = "db,seq-write")]
        expect: Vec<String>,
        /// Wall-time changes to inject, %.
        #[arg(long, value_delimiter = ',', default_value = "10,20,50,100")]
        effects: Vec<f64>,
        /// Cells per A/A pair the power is measured on.
        #[arg(long, default_value_t = 12)]
        cells: usize,
        /// Extra `fsprof run` arguments for both sides, e.g. "--only db --passes 5".
        #[arg(long, default_value = "", allow_hyphen_values = true)]
        run: String,
        /// Where the runs stay (a finished run is not run again).
        #[arg(long, default_value = "/var/tmp/fsprof-verdicts")]
        dir: std::path::PathBuf,
        /// Also judge the first K passes of every run alone (e.g. 3 of 5).
        #[arg(long)]
        first_passes: Option<usize>,
    },
    /// The bench's syscall-cost target: `calls` getpid syscalls, the mean ns each written to
    /// `out`.
    #[command(hide = true)]
    SyscallLoop { calls: u64, out: std::path::PathBuf },
    /// Setup, then formatting, lints and every test (integration tests need root).
    Test {
        /// Extra arguments for `cargo test`, e.g. a test name filter.
        #[arg(last = true)]
        args: Vec<String>,
    },
}

/// Runs a command, failing with its name when it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

pub fn build() -> Result<()> {
    setup::ensure()?;
    run(cargo().args(["build", "--release"]))
}

fn test(extra: &[String]) -> Result<()> {
    setup::ensure()?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--release",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The CLI tests run target/release/fsprof, which `cargo test` alone does not build.
    run(cargo().args(["build", "--release"]))?;
    // One test at a time: the integration tests measure timing and I/O on a 2-core machine,
    // and a neighbour's load would show up as run-queue time.
    let mut cmd = cargo();
    cmd.args(["test", "--release", "--"])
        .arg("--test-threads=1")
        .args(extra);
    run(&mut cmd)?;
    // The bench once, untimed, when every test ran (not for a filtered run).
    if extra.is_empty() {
        bench::smoke()?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::env::set_current_dir(&root)?;
    match Cli::parse().cmd {
        Cmd::Setup => setup::ensure(),
        Cmd::Build => build(),
        Cmd::Run { args } => {
            build()?;
            let mut cmd = Command::new("target/release/fsprof");
            cmd.args(["run", "--fs", "ext4,xfs,btrfs"]).args(args);
            run(&mut cmd)
        }
        Cmd::Bench { runs, fs, modes } => bench::overhead(runs, &fs, &modes),
        Cmd::Verdicts {
            rounds,
            fs,
            b,
            expect,
            effects,
            cells,
            run,
            dir,
            first_passes,
        } => verdicts::calibrate(&verdicts::Plan {
            rounds,
            fs,
            b_args: b.split_whitespace().map(String::from).collect(),
            expect,
            effects,
            cells,
            run_args: run.split_whitespace().map(String::from).collect(),
            dir,
            first_passes,
        }),
        Cmd::SyscallLoop { calls, out } => bench::syscall_loop(calls, &out),
        Cmd::Test { args } => test(&args),
    }
}
