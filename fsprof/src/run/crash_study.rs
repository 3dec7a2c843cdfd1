//! A crash study, on the host's kernel (crashed by the shutdown ioctl) or in a VM (its
//! power cut): the one entry both take, so neither of them needs the other.

use anyhow::Result;

use super::{crash, crash::CrashOptions, crash_vm::CrashVm};
use crate::results::crash::CrashStudy;

/// Runs the study, in `vm` when given; `progress` gets a line per trial, `save` the study
/// after each (so an interrupted study leaves what it measured).
pub fn study(
    opts: &CrashOptions,
    vm: Option<&CrashVm>,
    mut progress: impl FnMut(&str),
    mut save: impl FnMut(&CrashStudy) -> Result<()>,
) -> Result<CrashStudy> {
    let mut out = crash::begun(opts);
    match vm {
        Some(vm) => {
            out.kernel = vm.kernel.release.clone();
            out.kernel_build = String::new();
            out.vm = Some(vm.facts());
            super::crash_vm::study(opts, vm, &mut out, &mut progress, &mut save)?;
        }
        None => crash::on_host(opts, &mut out, &mut progress, &mut save)?,
    }
    out.complete = true;
    save(&out)?;
    Ok(out)
}
