//! Suites: the task lists of the classic studies, one per study, plus `quick` and `full`.

use anyhow::{Result, bail};

use crate::{
    lab::FsKind,
    workload::{Ctx, Step, iozone, pgbench::PgbenchSpec},
};

pub struct Suite {
    pub name: &'static str,
    pub about: &'static str,
    pub steps: &'static [Step],
    /// Scale used when the user gives none.
    pub default_scale: f64,
    /// Tree at scale 1: directories, files, factor on kernel-like file sizes.
    pub tree: (u32, u32, f64),
    /// Big file at scale 1, bytes.
    pub big: u64,
    /// bonnie++ at scale 1: sequential file size, `-n` files, max, min, directories.
    pub bonnie: (u64, u32, u64, u64, u32),
    /// IOzone at scale 1: largest file of the automatic matrix, O_DIRECT large file.
    pub iozone: (u64, u64),
    /// pgbench SCALE, CLIENTS, SECONDS, appended as a step when set.
    pub pgbench: Option<(u32, u32, u32)>,
    /// Mount options the study used, per filesystem.
    pub mount_opts: &'static [(FsKind, &'static str)],
}

/// bonnie++ as the build-tree study ran it: -n 40:1024k:128k:2265, 1 GiB sequential file.
const BONNIE_STUDY: (u64, u32, u64, u64, u32) = (GIB, 40_000, MIB, 128 << 10, 2_265);
/// Small files for the quick suite: the same phases without gigabytes of data.
const BONNIE_SMALL: (u64, u32, u64, u64, u32) = (GIB, 40_000, 16 << 10, 0, 2_265);
/// iozone -a -g 512m, and a 3 GB file with 128 KiB records.
const IOZONE_STUDY: (u64, u64) = (512 * MIB, 3 * GIB);

use Step::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const KERNEL_TREE: (u32, u32, f64) = (5_300, 78_700, 1.0);

pub const SUITES: &[Suite] = &[
    Suite {
        name: "quick",
        about: "every kind of step at small scale (the default)",
        steps: Step::ALL,
        default_scale: 0.05,
        tree: KERNEL_TREE,
        // 100 MiB at the default scale: big enough to leave the page cache's fast path.
        big: 2 * GIB,
        bonnie: BONNIE_SMALL,
        iozone: (32 * MIB, 3 * GIB),
        pgbench: None,
        mount_opts: &[],
    },
    Suite {
        name: "desktop",
        about: "desktop/NAS test: extract the kernel, remux a 9 GB video, copy the tree, \
                delete the tree, delete the big files; ext3/ext4 with data=writeback",
        steps: &[ExtractTree, BigIn, Remux, CopyTree, DeleteTree, DeleteBig],
        default_scale: 1.0,
        tree: KERNEL_TREE,
        big: 9 * GIB,
        bonnie: BONNIE_STUDY,
        iozone: IOZONE_STUDY,
        pgbench: None,
        mount_opts: &[
            (FsKind::Ext3, "data=writeback"),
            (FsKind::Ext4, "data=writeback"),
        ],
    },
    Suite {
        name: "build-tree",
        about: "kernel build tree study: copy and delete a 38,755-file, 567 MB tree; then \
                bonnie++ -n 40:1024k:128k:2265 and its sequential and seek phases",
        steps: &[
            TreeIn,
            CopyTree,
            DeleteTree,
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
        ],
        default_scale: 1.0,
        tree: (2_265, 38_755, 0.91),
        big: 0,
        bonnie: BONNIE_STUDY,
        iozone: IOZONE_STUDY,
        pgbench: None,
        mount_opts: &[],
    },
    Suite {
        name: "file-server",
        about: "small-office file server: copy a 700 MB ISO in, re-copy, delete; copy a \
                7,500-file 1.9 GB tree in, re-copy, list, find, delete; capacity",
        steps: &[
            BigIn, BigCopy, DeleteBig, TreeIn, CopyTree, ListTree, Find, DeleteTree,
        ],
        default_scale: 1.0,
        tree: (900, 7_500, 15.8),
        big: 700 * MIB,
        bonnie: BONNIE_STUDY,
        iozone: IOZONE_STUDY,
        pgbench: None,
        mount_opts: &[],
    },
    Suite {
        name: "iozone",
        about: "IOzone study: write, rewrite, read, reread, random read, random write over \
                record sizes 4 KiB-16 MiB and file sizes 64 KiB-512 MiB; a 3 GB O_DIRECT file",
        steps: &[
            IozoneWrite,
            IozoneRewrite,
            IozoneRead,
            IozoneReread,
            IozoneRandRead,
            IozoneRandWrite,
            IozoneLarge,
        ],
        default_scale: 1.0,
        tree: KERNEL_TREE,
        big: 0,
        bonnie: BONNIE_STUDY,
        iozone: IOZONE_STUDY,
        pgbench: None,
        mount_opts: &[],
    },
    Suite {
        name: "distro",
        about: "distribution benchmark: 4 GB sequential write and read, pgbench on \
                PostgreSQL, and a CPU-bound control where the filesystem should not matter",
        steps: &[SeqWrite, SeqRead, Cpu],
        default_scale: 1.0,
        tree: KERNEL_TREE,
        big: 4 * GIB,
        bonnie: BONNIE_STUDY,
        iozone: IOZONE_STUDY,
        pgbench: Some((10, 4, 60)),
        mount_opts: &[],
    },
    Suite {
        name: "none",
        about: "no built-in steps: only --step and --pgbench",
        steps: &[],
        default_scale: 1.0,
        tree: KERNEL_TREE,
        big: 0,
        bonnie: BONNIE_STUDY,
        iozone: IOZONE_STUDY,
        pgbench: None,
        mount_opts: &[],
    },
    Suite {
        name: "full",
        about: "every step at full scale, on the real kernel tree",
        steps: Step::ALL,
        default_scale: 1.0,
        tree: KERNEL_TREE,
        big: 700 * MIB,
        bonnie: BONNIE_STUDY,
        iozone: IOZONE_STUDY,
        pgbench: Some((10, 4, 60)),
        mount_opts: &[],
    },
];

/// Suites of the issue that are not built yet, so `--suite` can say so instead of "unknown".
const PLANNED: &[&str] = &[];

impl Suite {
    pub fn find(name: &str) -> Result<&'static Suite> {
        if let Some(s) = SUITES.iter().find(|s| s.name == name) {
            return Ok(s);
        }
        let names: Vec<_> = SUITES.iter().map(|s| s.name).collect();
        if PLANNED.contains(&name) {
            bail!(
                "suite {name:?} is not built yet; available: {}",
                names.join(", ")
            );
        }
        bail!("unknown suite {name:?}; available: {}", names.join(", "))
    }

    /// The workload context at `scale`; the real kernel tarball is used at full scale.
    pub fn ctx(&self, scale: f64, seed: u64, jobs: u32) -> Ctx {
        let (dirs, files, factor) = self.tree;
        Ctx {
            dir: Default::default(),
            src: Default::default(),
            seed,
            tree_dirs: ((dirs as f64 * scale) as u32).max(4),
            tree_files: ((files as f64 * scale) as u32).max(16),
            tree_size_factor: factor,
            real_kernel: scale >= 1.0
                && self.tree == KERNEL_TREE
                && crate::workload::extract::kernel_tarball().is_some(),
            big_size: ((self.big as f64 * scale) as u64).max(if self.big > 0 {
                4 * MIB
            } else {
                0
            }),
            db_transactions: ((20_000.0 * scale) as u32).max(100),
            db_pages: ((131_072.0 * scale) as u64).max(1024),
            cpu_scale: scale,
            bonnie_size: ((self.bonnie.0 as f64 * scale) as u64).max(MIB),
            bonnie_files: ((self.bonnie.1 as f64 * scale) as u32).max(16),
            bonnie_max: self.bonnie.2,
            bonnie_min: self.bonnie.3,
            bonnie_dirs: ((self.bonnie.4 as f64 * scale) as u32).max(1),
            iozone_max_file: ((self.iozone.0 as f64 * scale) as u64).max(iozone::MIN_FILE),
            iozone_large: ((self.iozone.1 as f64 * scale) as u64).max(16 * MIB),
            jobs,
            job: None,
        }
    }

    /// Image size that holds the suite's peak usage with room to spare.
    pub fn image_size(&self, ctx: &Ctx) -> u64 {
        let uses = |f: fn(&Step) -> bool| self.steps.iter().any(f);
        let mut peak = 8 << 20;
        if uses(|s| matches!(s, ExtractTree | TreeIn)) {
            let tree = ctx.tree_files as u64 * (16 << 10) as u64;
            peak += 2 * (tree as f64 * ctx.tree_size_factor) as u64;
        }
        if uses(|s| matches!(s, BigIn | SeqWrite)) {
            peak += 3 * ctx.big_size;
        }
        if uses(|s| matches!(s, Db)) {
            peak += ctx.db_pages * 8192;
        }
        if uses(|s| s.name().starts_with("bonnie")) {
            peak += ctx.bonnie_size + ctx.bonnie_files as u64 * ctx.bonnie_max;
        }
        if uses(|s| s.name().starts_with("iozone")) {
            peak += 2 * ctx.iozone_max_file + ctx.iozone_large;
        }
        if self.pgbench.is_some() {
            peak += GIB;
        }
        let peak = peak * ctx.jobs.max(1) as u64;
        (peak + peak / 2 + GIB).next_multiple_of(GIB)
    }

    pub fn mount_opts_for(&self, kind: FsKind) -> Option<&'static str> {
        self.mount_opts
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, o)| *o)
    }
}

impl Suite {
    /// The suite's own pgbench step, if the study had one, at the run's `scale`: the
    /// database and the duration scale with the work (at least 1 and 2 s), clients do not.
    pub fn pgbench_spec(&self, scale: f64) -> Option<PgbenchSpec> {
        let at = |v: u32, min: u32| ((v as f64 * scale).round() as u32).max(min);
        self.pgbench.map(|(size, clients, seconds)| PgbenchSpec {
            scale: at(size, 1),
            clients,
            seconds: at(seconds, 2),
        })
    }
}
