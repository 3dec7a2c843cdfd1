//! Built-in workloads, the steps of the classic filesystem studies. Each step runs as
//! `fsprof workload STEP --ctx JSON` in a child process, so the tracer follows exactly the
//! workload and nothing of fsprof itself; everything is deterministic from the seed.

pub mod bigfile;
pub mod bonnie;
pub mod cpu;
pub mod crash;
pub mod db;
pub mod extract;
pub mod io;
pub mod iozone;
pub mod pgbench;
pub mod rate;
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
    /// bonnie++: sequential file size, and `-n files:max:min:dirs`.
    pub bonnie_size: u64,
    pub bonnie_files: u32,
    pub bonnie_max: u64,
    pub bonnie_min: u64,
    pub bonnie_dirs: u32,
    /// IOzone: largest file of the automatic matrix, and the O_DIRECT large file.
    pub iozone_max_file: u64,
    pub iozone_large: u64,
    /// Copies of the step run at once, each in `job-K/`.
    pub jobs: u32,
    /// Set in the per-job processes.
    pub job: Option<u32>,
}

/// The built-in steps, declared in an order where each finds what the earlier ones left
/// (`ALL`); names are kebab-case, one spelling for the CLI, results and files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub enum Step {
    /// Unpack a kernel tree (the real tarball or the synthetic kernel-like tree).
    ExtractTree,
    /// Copy the tree to another directory on the same filesystem.
    CopyTree,
    /// Recursive listing of the tree, saved to a file on the tested filesystem.
    ListTree,
    /// Find files by wildcard (`*.c`).
    Find,
    /// Delete the tree and its copy.
    DeleteTree,
    /// Copy a tree in from another disk.
    TreeIn,
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
    /// Sequential write of the big-file size from memory, then fsync (distribution test).
    SeqWrite,
    /// Sequential read of that file, cold.
    SeqRead,
    BonniePutc,
    BonnieWrite,
    BonnieRewrite,
    BonnieGetc,
    BonnieRead,
    BonnieSeeks,
    BonnieSeqCreate,
    BonnieSeqStat,
    BonnieSeqDelete,
    BonnieRandCreate,
    BonnieRandStat,
    BonnieRandDelete,
    IozoneWrite,
    IozoneRewrite,
    IozoneRead,
    IozoneReread,
    #[strum(serialize = "iozone-randread")]
    IozoneRandRead,
    #[strum(serialize = "iozone-randwrite")]
    IozoneRandWrite,
    IozoneLarge,
}

impl Step {
    /// Every step, in an order where each finds what the earlier ones left.
    pub const ALL: &'static [Step] = <Step as strum::VariantArray>::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
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

    /// Earlier steps whose leftovers this one works on: when one of them failed in a pass,
    /// this one is not run in that pass.
    pub fn needs(self) -> &'static [Step] {
        use Step::*;
        match self {
            CopyTree | ListTree | Find | DeleteTree => &[ExtractTree],
            BigCopy | Remux | DeleteBig => &[BigIn],
            SeqRead => &[SeqWrite],
            BonnieRewrite | BonnieGetc | BonnieRead | BonnieSeeks => &[BonnieWrite],
            BonnieSeqStat | BonnieSeqDelete => &[BonnieSeqCreate],
            BonnieRandStat | BonnieRandDelete => &[BonnieRandCreate],
            IozoneRewrite | IozoneRead | IozoneReread | IozoneRandRead | IozoneRandWrite => {
                &[IozoneWrite]
            }
            _ => &[],
        }
    }

    /// Steps that free space: capacity is measured after them.
    pub fn deletes(self) -> bool {
        matches!(
            self,
            Step::DeleteTree | Step::DeleteBig | Step::BonnieSeqDelete | Step::BonnieRandDelete
        )
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

    pub fn bonnie_spec(&self) -> bonnie::BonnieSpec {
        bonnie::BonnieSpec {
            file_size: self.bonnie_size,
            files: self.bonnie_files,
            max_size: self.bonnie_max,
            min_size: self.bonnie_min,
            dirs: self.bonnie_dirs,
            seed: self.seed,
        }
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
        Step::SeqWrite => bigfile::ensure_source(&dir.join("seq.bin"), ctx.big_size, ctx.seed),
        Step::SeqRead => bigfile::read(&dir.join("seq.bin")).map(drop),
        Step::BonniePutc => bonnie::putc(&dir, &ctx.bonnie_spec()),
        Step::BonnieWrite => bonnie::write_blocks(&dir, &ctx.bonnie_spec()),
        Step::BonnieRewrite => bonnie::rewrite(&dir),
        Step::BonnieGetc => bonnie::getc(&dir).map(drop),
        Step::BonnieRead => bonnie::read_blocks(&dir).map(drop),
        Step::BonnieSeeks => bonnie::seeks(&dir, &ctx.bonnie_spec()),
        Step::BonnieSeqCreate => bonnie::create(&dir, &ctx.bonnie_spec(), false),
        Step::BonnieSeqStat => bonnie::stat(&dir, &ctx.bonnie_spec(), false).map(drop),
        Step::BonnieSeqDelete => bonnie::delete(&dir, &ctx.bonnie_spec(), false),
        Step::BonnieRandCreate => bonnie::create(&dir, &ctx.bonnie_spec(), true),
        Step::BonnieRandStat => bonnie::stat(&dir, &ctx.bonnie_spec(), true).map(drop),
        Step::BonnieRandDelete => bonnie::delete(&dir, &ctx.bonnie_spec(), true),
        Step::IozoneWrite
        | Step::IozoneRewrite
        | Step::IozoneRead
        | Step::IozoneReread
        | Step::IozoneRandRead
        | Step::IozoneRandWrite => {
            let test = match step {
                Step::IozoneWrite => iozone::Test::Write,
                Step::IozoneRewrite => iozone::Test::Rewrite,
                Step::IozoneRead => iozone::Test::Read,
                Step::IozoneReread => iozone::Test::Reread,
                Step::IozoneRandRead => iozone::Test::RandomRead,
                _ => iozone::Test::RandomWrite,
            };
            iozone::run(&dir, test, ctx.iozone_max_file, ctx.seed).map(drop)
        }
        Step::IozoneLarge => iozone::large(&dir, ctx.iozone_large, ctx.seed).map(drop),
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
    let step = Step::parse(step)?;
    // The thread name is what stacks and flame graphs show as the process: the step's name
    // (first 15 bytes) says more than "fsprof".
    if let Ok(name) = std::ffi::CString::new(step.name()) {
        let _ = rustix::thread::set_name(&name);
    }
    run(step, &ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_are_kebab_case_unique_and_parse_back() {
        assert_eq!(Step::ALL.len(), 33);
        assert_eq!(Step::ALL[0], Step::ExtractTree);
        assert_eq!(Step::IozoneRandRead.name(), "iozone-randread");
        assert_eq!(Step::BonnieSeqCreate.name(), "bonnie-seq-create");
        let mut seen = std::collections::HashSet::new();
        for &st in Step::ALL {
            assert!(seen.insert(st.name()), "{} twice", st.name());
            assert_eq!(Step::parse(st.name()).unwrap(), st);
        }
    }
}
