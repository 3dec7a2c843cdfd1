//! Markdown for a blog post: a line of what was run, then per step the why (explain's
//! headline and leading reasons), a table, the time chart and the differential flame graph
//! of the slowest filesystem against the fastest. Written to a file, the post gets a folder
//! of its pictures beside it and stands alone; printed, its pictures stay where the run
//! wrote them.

use std::{
    fmt::Write as _,
    io,
    path::{Path, PathBuf},
};

use super::{explain, html::time_chart, run_summary, run_table::median_cells};
use crate::{
    results::{FlameDiff, RunResult, dir_of},
    units::{bytes, count, seconds},
};

/// Where a post's pictures go.
struct Pictures {
    /// The charts' (and a written post's flame graphs') directory.
    dir: PathBuf,
    /// The markdown's directory: links are relative to it.
    md_dir: PathBuf,
    /// Copy the flame graphs into `dir` (a written post), or link them where they are.
    copy: bool,
    /// The results file's directory: flame graph paths in the results are relative to it.
    results_dir: PathBuf,
}

impl Pictures {
    fn link(&self, path: &Path) -> String {
        let rel = path.strip_prefix(&self.md_dir).unwrap_or(path);
        rel.display().to_string()
    }
    /// A flame graph's link from the post, copied beside it first when the post is a folder.
    fn flame(&self, d: &FlameDiff) -> io::Result<String> {
        let from = self.results_dir.join(&d.path);
        if !self.copy {
            return Ok(self.link(&from));
        }
        let name = format!("{}.{}-vs-{}.{}.diff.svg", d.step, d.fs, d.base, d.kind);
        let to = self.dir.join(name);
        std::fs::copy(&from, &to)?;
        Ok(self.link(&to))
    }
}

/// The post as text; with `post` (its path) its pictures go into `<post stem>-pictures/`
/// beside it, else into `<results>.charts/`.
pub fn render(r: &RunResult, results: &Path, post: Option<&Path>) -> io::Result<String> {
    let pictures = match post {
        Some(p) => Pictures {
            dir: dir_of(p).join(format!(
                "{}-pictures",
                p.file_stem().unwrap_or_default().to_string_lossy()
            )),
            md_dir: dir_of(p).to_path_buf(),
            copy: true,
            results_dir: dir_of(results).to_path_buf(),
        },
        None => Pictures {
            dir: results.with_extension("charts"),
            md_dir: dir_of(results).to_path_buf(),
            copy: false,
            results_dir: dir_of(results).to_path_buf(),
        },
    };
    std::fs::create_dir_all(&pictures.dir)?;
    let mut o = header(r);
    let rows = run_summary::rows(r);
    for step in r.step_names() {
        let _ = writeln!(o, "## {step}\n");
        if let Some(why) = explain::step(r, results, &rows, &step) {
            let mut links = Vec::new();
            for d in &why.diffs {
                links.push(pictures.flame(d)?);
            }
            o.push_str(&why.markdown(&links));
        }
        o.push_str(&step_table(r, &step));
        let rated: Vec<String> = (rows.iter())
            .filter(|s| s.step == step && s.rate.is_some())
            .map(|s| {
                let rate = run_summary::side_rate(s).unwrap_or_else(|| run_summary::result(s));
                format!("{} {rate} ({:.2}×)", s.fs, s.vs_fastest)
            })
            .collect();
        if !rated.is_empty() {
            let _ = writeln!(o, "\nJudged by its rate (median): {}.", rated.join(", "));
        }
        let svg = pictures.dir.join(format!("{step}.svg"));
        std::fs::write(&svg, time_chart(r, &step))?;
        let _ = writeln!(
            o,
            "\n![{step}: time per filesystem]({})\n",
            pictures.link(&svg)
        );
    }
    Ok(o)
}

/// The title and what was run: kernel, machine, filesystems with their options, passes.
fn header(r: &RunResult) -> String {
    let fs: Vec<String> = r.filesystems.iter().map(|f| f.column()).collect();
    let mut o = format!("# fsprof run: suite {} on {}\n\n", r.suite, fs.join(", "));
    let setups: Vec<String> = (r.filesystems.iter())
        .map(|f| {
            let mkfs = f.mkfs_opts.join(" ");
            format!(
                "{} (mkfs {}; mount {})",
                f.column(),
                if mkfs.is_empty() { "defaults" } else { &mkfs },
                if f.mount_opts.is_empty() {
                    "defaults"
                } else {
                    &f.mount_opts
                }
            )
        })
        .collect();
    let _ = writeln!(
        o,
        "Kernel {}, {} CPUs, {} memory; suite {} at scale {}, {} (medians shown); fsprof {}; \
         filesystems: {}.\n",
        r.kernel,
        r.cpus,
        bytes(r.memory_bytes),
        r.suite,
        r.scale,
        count(r.passes, "pass", "passes"),
        r.fsprof_version,
        setups.join(", ")
    );
    if let Some(vm) = &r.vm {
        let _ = writeln!(o, "Ran {}.\n", vm.describe());
    }
    o
}

/// Per filesystem the step's medians, every time class.
fn step_table(r: &RunResult, step: &str) -> String {
    let mut o = String::from(
        "| fs | wall | user | sys | kernel bg | I/O wait | other D | run-queue | syncfs | quiesce | probes |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for f in &r.filesystems {
        let runs = f.runs_of(step);
        if runs.is_empty() {
            continue;
        }
        let m = median_cells(&runs).map(seconds);
        let _ = writeln!(o, "| {} | {} |", f.column(), m.join(" | "));
    }
    o
}
