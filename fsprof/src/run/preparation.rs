//! Preparation: a step the run takes may need what another step makes (delete-tree deletes
//! the tree extract-tree writes). With `--only` taking the one and not the other, the other
//! runs first on each pass's fresh filesystem, untraced, as the suite would have run it (with
//! the syncfs and quiesce a traced step ends with), and is recorded as preparation, not as a
//! result; so do the user's `--prepare` commands, after it.

use std::{path::Path, process::Command, time::Instant};

use anyhow::{Context, Result};

use crate::{
    lab::{LabFs, quiesce},
    os,
    results::Prepared,
    signals,
    workload::{Ctx, Step},
};

use super::RunStep;

/// The steps `taken` need that are not among them, in the suite's order.
pub fn needed(suite: &[Step], taken: &[Step]) -> Vec<Step> {
    suite
        .iter()
        .copied()
        .filter(|s| !taken.contains(s))
        .filter(|s| taken.iter().any(|t| t.needs().contains(s)))
        .collect()
}

/// Runs `steps` untraced on `labfs`, each as it would run in a cell (`me`: fsprof); a
/// failed one is recorded with its error and the rest still run.
pub fn run(
    steps: &[RunStep],
    me: &Path,
    ctx: &Ctx,
    labfs: &LabFs,
    quiesced: bool,
) -> Result<Vec<Prepared>> {
    let mut out = Vec::new();
    for step in steps {
        signals::check()?;
        let started = Instant::now();
        let error = prepare(step, me, ctx, labfs, quiesced).err();
        signals::check()?;
        out.push(Prepared {
            step: step.name(),
            wall_ns: super::ns(started.elapsed()),
            error: error.map(|e| format!("{e:#}")),
        });
    }
    Ok(out)
}

fn prepare(step: &RunStep, me: &Path, ctx: &Ctx, labfs: &LabFs, quiesced: bool) -> Result<()> {
    let mnt = labfs.mountpoint();
    let argv = step.command(me, ctx, None)?;
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(mnt)
        .output()
        .with_context(|| format!("running {}", me.display()))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        anyhow::bail!("{} ({})", out.status, said.trim());
    }
    os::syncfs(mnt)?;
    if quiesced {
        quiesce::quiesce(mnt)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Step::*;

    #[test]
    fn a_step_taken_alone_gets_what_it_needs_first() {
        let suite = [ExtractTree, Find, DeleteTree, BigIn, BigCopy, Db];
        assert_eq!(needed(&suite, &[DeleteTree]), [ExtractTree]);
        assert_eq!(
            needed(&suite, &[Find, DeleteTree, BigCopy]),
            [ExtractTree, BigIn]
        );
        assert!(needed(&suite, &[ExtractTree, DeleteTree]).is_empty());
        assert!(needed(&suite, &[Db]).is_empty());
    }
}
