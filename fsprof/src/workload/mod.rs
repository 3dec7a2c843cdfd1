//! Built-in workloads, the steps of the classic filesystem studies. Each step runs as
//! `fsprof workload STEP --ctx JSON` in a child process, so the tracer follows exactly the
//! workload and nothing of fsprof itself; everything is deterministic from the seed.

pub mod bigfile;
pub mod cpu;
pub mod db;
pub mod extract;
pub mod pgbench;
pub mod rng;
pub mod tree;

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// Everything a step needs; the run passes it to the workload process as JSON.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ctx {
    /// Mount point of the filesystem under test.
    pub dir: PathBuf,
    /// Directory on another disk holding the sources steps copy in from.
    pub src: PathBuf,
    pub seed: u64,
    /// Tree shape: directories, files, and a factor on the kernel-like file sizes.
    pub tree_dirs: u32,
    pub tree_files: u32,
    pub tree_size_factor: f64,
    /// Extract the real kernel tarball instead of writing the synthetic tree.
    pub real_kernel: bool,
    pub big_size: u64,
    pub db_transactions: u32,
    pub db_pages: u64,
    pub cpu_scale: f64,
    /// Copies of the step run at once, each in `job-K/`.
    pub jobs: u32,
    /// Set in the per-job processes.
    pub job: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// Unpack a kernel tree (the real tarball or the synthetic kernel-like tree).
    ExtractTree,
    /// Copy a tree in from another disk.
    TreeIn,
    /// Copy the tree to another directory on the same filesystem.
    CopyTree,
    /// Recursive listing of the tree, saved to a file on the tested filesystem.
    ListTree,
    /// Find files by wildcard (`*.c`).
    Find,
    /// Delete the tree and its copy.
    DeleteTree,
    /// Copy a big file (ISO, video) in from another disk.
    BigIn,
    /// Copy the big file again on the same filesystem.
    BigCopy,
    /// Read the big file and write a rewritten copy.
    Remux,
    /// Delete the big files.
    DeleteBig,
    /// WAL append + fdatasync per transaction, random page writes, checkpoints.
    Db,
    /// CPU-bound control.
    Cpu,
}

impl Step {
    /// Every step, in an order where each finds what the earlier ones left.
    pub const ALL: [Step; 12] = [
        Step::ExtractTree,
        Step::CopyTree,
        Step::ListTree,
        Step::Find,
        Step::DeleteTree,
        Step::TreeIn,
        Step::BigIn,
        Step::BigCopy,
        Step::Remux,
        Step::DeleteBig,
        Step::Db,
        Step::Cpu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Step::ExtractTree => "extract-tree",
            Step::TreeIn => "tree-in",
            Step::CopyTree => "copy-tree",
            Step::ListTree => "list-tree",
            Step::Find => "find",
            Step::DeleteTree => "delete-tree",
            Step::BigIn => "big-in",
            Step::BigCopy => "big-copy",
            Step::Remux => "remux",
            Step::DeleteBig => "delete-big",
            Step::Db => "db",
            Step::Cpu => "cpu",
        }
    }

    pub fn parse(s: &str) -> Result<Step> {
        Step::ALL
            .iter()
            .copied()
            .find(|st| st.name() == s)
            .with_context(|| {
                let names: Vec<_> = Step::ALL.iter().map(|s| s.name()).collect();
                format!("unknown step {s:?}; known: {}", names.join(", "))
            })
    }

    /// Steps that free space: capacity is measured after them.
    pub fn deletes(self) -> bool {
        matches!(self, Step::DeleteTree | Step::DeleteBig)
    }
}

impl Ctx {
    pub fn tree_spec(&self) -> tree::TreeSpec {
        tree::TreeSpec {
            dirs: self.tree_dirs,
            files: self.tree_files,
            size_factor: self.tree_size_factor,
            seed: self.seed,
        }
    }

    fn big_source(&self) -> PathBuf {
        self.src
            .join(format!("big-{}-{}.bin", self.big_size, self.seed))
    }

    fn tree_source(&self) -> PathBuf {
        let s = self.tree_spec();
        self.src.join(format!(
            "tree-{}-{}-{}-{}",
            s.dirs, s.files, s.size_factor, s.seed
        ))
    }

    /// Where this process works: the mount point, or its job directory.
    fn work_dir(&self) -> PathBuf {
        match self.job {
            Some(k) => self.dir.join(format!("job-{k}")),
            None => self.dir.clone(),
        }
    }
}

/// Creates, untraced and off the filesystem under test, what `step` copies in.
pub fn prepare(step: Step, ctx: &Ctx) -> Result<()> {
    fs::create_dir_all(&ctx.src).with_context(|| format!("creating {}", ctx.src.display()))?;
    match step {
        Step::BigIn => bigfile::ensure_source(&ctx.big_source(), ctx.big_size, ctx.seed),
        Step::TreeIn => {
            let dst = ctx.tree_source();
            let plan = ctx.tree_spec().plan();
            // Reuse a cached source only if it is exactly what the plan says.
            if tree::measure(&dst).ok() != Some(plan.totals()) {
                let _ = fs::remove_dir_all(&dst);
                let tmp = dst.with_extension("partial");
                let _ = fs::remove_dir_all(&tmp);
                plan.create(&tmp, ctx.seed)?;
                fs::rename(&tmp, &dst)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Runs one step in this process (or fans out to `jobs` processes).
pub fn run(step: Step, ctx: &Ctx) -> Result<()> {
    if ctx.jobs > 1 && ctx.job.is_none() {
        return fan_out(step, ctx);
    }
    let dir = ctx.work_dir();
    fs::create_dir_all(&dir)?;
    let tree = dir.join("tree");
    match step {
        Step::ExtractTree => match (ctx.real_kernel, extract::kernel_tarball()) {
            (true, Some(tarball)) => extract::extract(&tarball, &tree).map(drop),
            (true, None) => bail!("no kernel tarball: apt-get install linux-source-6.1"),
            (false, _) => ctx.tree_spec().plan().create(&tree, ctx.seed).map(drop),
        },
        Step::TreeIn => tree::copy(&ctx.tree_source(), &tree).map(drop),
        Step::CopyTree => tree::copy(&tree, &dir.join("tree-copy")).map(drop),
        Step::ListTree => tree::list_into(&tree, &dir.join("listing.txt")).map(drop),
        Step::Find => tree::find(&tree, "*.c").map(drop),
        Step::DeleteTree => {
            tree::delete(&tree)?;
            let copy = dir.join("tree-copy");
            if copy.exists() {
                tree::delete(&copy)?;
            }
            Ok(())
        }
        Step::BigIn => bigfile::copy(&ctx.big_source(), &dir.join("big.bin")).map(drop),
        Step::BigCopy => bigfile::copy(&dir.join("big.bin"), &dir.join("big-copy.bin")).map(drop),
        Step::Remux => bigfile::remux(&dir.join("big.bin"), &dir.join("big-remux.bin")).map(drop),
        Step::DeleteBig => {
            for name in ["big.bin", "big-copy.bin", "big-remux.bin"] {
                let p = dir.join(name);
                if p.exists() {
                    fs::remove_file(&p).with_context(|| format!("deleting {}", p.display()))?;
                }
            }
            Ok(())
        }
        Step::Db => db::run(
            &dir,
            &db::DbSpec {
                transactions: ctx.db_transactions,
                data_pages: ctx.db_pages,
                seed: ctx.seed,
            },
        ),
        Step::Cpu => cpu::run(&dir, ctx.cpu_scale, ctx.seed),
    }
}

/// `--jobs N`: N processes run the step at once, each in its own job directory.
fn fan_out(step: Step, ctx: &Ctx) -> Result<()> {
    let me = std::env::current_exe()?;
    let children: Vec<_> = (0..ctx.jobs)
        .map(|k| {
            let job = Ctx {
                job: Some(k),
                ..ctx.clone()
            };
            Command::new(&me)
                .args([
                    "workload",
                    step.name(),
                    "--ctx",
                    &serde_json::to_string(&job)?,
                ])
                .spawn()
                .context("starting a job")
        })
        .collect::<Result<_>>()?;
    let mut failed = 0;
    for mut c in children {
        if !c.wait()?.success() {
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("{failed} of {} jobs failed", ctx.jobs);
    }
    Ok(())
}

/// Entry point of `fsprof workload`.
pub fn run_cli(step: &str, ctx_json: &str) -> Result<()> {
    let ctx: Ctx = serde_json::from_str(ctx_json).context("bad --ctx")?;
    run(Step::parse(step)?, &ctx)
}
