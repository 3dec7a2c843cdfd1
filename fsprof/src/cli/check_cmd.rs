//! `fsprof check`: prints one line per invariant and exits 1 naming those that failed.

use std::process::ExitCode;

use anyhow::{Result, bail};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Outputs of fsprof: results files (.json of trace, run or crash, with the graphs,
    /// profiles and timeline they name), directories of them, .folded files, pprof
    /// profiles, Perfetto traces, history stores (an SQLite file or a postgres:// URL).
    #[arg(required = true, value_name = "FILE|DIR|URL")]
    pub paths: Vec<String>,
}

pub fn check_cmd(a: CheckArgs) -> Result<ExitCode> {
    let c = crate::check::check_paths(&a.paths);
    print!("{}", c.render());
    let failed = c.failed();
    if let Some((path, why)) = c.unreadable.first()
        && failed.is_empty()
    {
        let also = match c.unreadable.len() - 1 {
            0 => String::new(),
            n => format!(" (and {n} more inputs not read)"),
        };
        bail!("{}: {why}{also}", path.display());
    }
    if !failed.is_empty() {
        eprintln!("fsprof: check failed: {}", failed.join(", "));
        return Ok(ExitCode::from(1));
    }
    if !c.checked_any() {
        bail!("nothing in the input to check");
    }
    Ok(ExitCode::SUCCESS)
}
