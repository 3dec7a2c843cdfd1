//! `fsprof crash`: the crash study; prints its table and writes JSON and CSV whatever
//! happened, with the trials that finished.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Result;
use clap::Args;

use super::{
    args::{LabArgs, VmArgs, parse_fs},
    history_cmd::RecordArgs,
};
use crate::{
    history,
    lab::FsKind,
    report,
    results::crash::{CrashPoint, CrashStudy},
    run::{
        crash::{self, CrashOptions},
        crash_study,
        crash_vm::CrashVm,
    },
    workload::crash::Pattern,
};

#[derive(Args)]
pub struct CrashArgs {
    /// Comma-separated filesystems; on the host those with a shutdown ioctl (ext4, xfs,
    /// f2fs), in a VM (`--kernel`) every one its kernel has.
    #[arg(long, value_delimiter = ',', value_parser = parse_fs, default_value = "ext4,xfs")]
    fs: Vec<FsKind>,
    /// Comma-separated update patterns (default: all).
    #[arg(long, value_delimiter = ',', value_enum)]
    pattern: Vec<Pattern>,
    /// When to crash after the update: now, after-commit (the commit interval and 1 s).
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "now,after-commit"
    )]
    at: Vec<CrashPoint>,
    /// Trials per cell, each on a fresh filesystem.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    trials: u32,
    /// Updates traced per pattern for what it costs (0: no cost pass).
    #[arg(long, default_value_t = 100)]
    cost_updates: u32,
    #[command(flatten)]
    lab: LabArgs,
    /// With a kernel other than `host`: crash by cutting a VM's power (qemu killed; what
    /// its disks acknowledged stays), for every filesystem.
    #[command(flatten)]
    vm: VmArgs,
    /// Results file (JSON; a CSV is written beside it).
    #[arg(long, default_value = "fsprof-crash.json")]
    json: PathBuf,
    #[command(flatten)]
    record: RecordArgs,
}

pub fn crash_cmd(a: CrashArgs) -> Result<ExitCode> {
    crate::signals::install();
    let vm = match &a.vm.guest_kernels(&a.lab.dir)?[..] {
        [] => None,
        [kernel] => Some(CrashVm {
            kernel: kernel.clone(),
            config: a.vm.config(),
        }),
        _ => anyhow::bail!("crash takes one --kernel: studies of two kernels are two studies"),
    };
    let opts = CrashOptions {
        filesystems: a.fs.clone(),
        patterns: if a.pattern.is_empty() {
            Pattern::ALL.to_vec()
        } else {
            a.pattern.clone()
        },
        points: a.at.clone(),
        trials: a.trials,
        lab: a.lab.options(),
        cost_updates: a.cost_updates,
        label: a.record.label.clone(),
    };
    crash::validate(&opts)?;
    crate::os::ensure_writable([a.json.as_path()])?;
    crate::lab::workdir::WorkDir::secure(&a.lab.dir)?;
    let mut last: Option<CrashStudy> = None;
    let outcome = crash_study::study(
        &opts,
        vm.as_ref(),
        |line| eprintln!("fsprof: {line}"),
        |s| {
            last = Some(s.clone());
            s.save(&a.json)
        },
    );
    // Whatever happened, the trials that finished are shown and written.
    if let Some(study) = &last {
        print!("{}", report::crash::render(study));
        let (csv, html) = (a.json.with_extension("csv"), a.json.with_extension("html"));
        std::fs::write(&csv, report::crash::to_csv(study))?;
        std::fs::write(&html, report::crash::html(study))?;
        eprintln!(
            "fsprof: results in {}, {} and {}",
            a.json.display(),
            csv.display(),
            html.display()
        );
    }
    // Recorded last: the study's files are written whatever the history says.
    let recorded = match (&last, a.record.location()) {
        (Some(study), Some(location)) => history::crash::record_study(study, location),
        _ => Ok(()),
    };
    let study = outcome?;
    recorded?;
    Ok(if study.cells.iter().any(|c| c.broken_promise()) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
