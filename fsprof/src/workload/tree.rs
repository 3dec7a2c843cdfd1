//! Directory trees: a deterministic kernel-like plan, creating it, copying, listing,
//! finding and deleting trees.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use super::{
    io::{drain, pump},
    rng::Rng,
};

/// What a tree holds; tests compare a walk of the filesystem with the plan's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeTotals {
    pub dirs: u64,
    pub files: u64,
    pub bytes: u64,
}

/// A tree shaped like a kernel source tree: at scale 1.0, 5,300 directories and 78,700
/// files (≈84k entries) averaging 16 KiB (≈1.3 GB), nested up to 8 deep, with the kernel's
/// mix of names (.c, .h, Makefile, Kconfig, .rst, …).
#[derive(Clone, Debug)]
pub struct TreeSpec {
    pub dirs: u32,
    pub files: u32,
    /// Multiplies every file size: 1.0 is a kernel tree's mix.
    pub size_factor: f64,
    pub seed: u64,
}

pub struct TreePlan {
    /// Relative directory paths, parents before children.
    pub dirs: Vec<PathBuf>,
    /// Relative file paths and sizes.
    pub files: Vec<(PathBuf, u64)>,
}

const EXTENSIONS: [(&str, u64); 8] = [
    (".c", 40),
    (".h", 30),
    (".S", 3),
    (".rst", 8),
    (".txt", 4),
    (".yaml", 5),
    ("", 5), // Makefile / Kconfig style names
    (".sh", 5),
];

impl TreeSpec {
    pub fn kernel_like(scale: f64, seed: u64) -> TreeSpec {
        TreeSpec {
            dirs: ((5_300.0 * scale) as u32).max(4),
            files: ((78_700.0 * scale) as u32).max(16),
            size_factor: 1.0,
            seed,
        }
    }

    fn file_size(rng: &mut Rng) -> u64 {
        // Mixture fitted to a kernel tree: most files small, a long tail of big ones.
        // Mean ≈ 16 KiB.
        match rng.range(0, 99) {
            0..=49 => rng.range(200, 8 << 10),
            50..=87 => rng.range(8 << 10, 24 << 10),
            88..=98 => rng.range(24 << 10, 64 << 10),
            _ => rng.range(64 << 10, 512 << 10),
        }
    }

    fn file_name(rng: &mut Rng, i: u32) -> String {
        let pick = rng.range(0, 99);
        let mut acc = 0;
        for (ext, weight) in EXTENSIONS {
            acc += weight;
            if pick < acc {
                return match ext {
                    "" if i.is_multiple_of(2) => format!("Makefile.{i}"),
                    "" => format!("Kconfig.{i}"),
                    _ => format!("file{i}{ext}"),
                };
            }
        }
        format!("file{i}.c")
    }

    /// The exact directories, files and sizes the spec stands for.
    pub fn plan(&self) -> TreePlan {
        let mut rng = Rng::new(self.seed);
        let mut dirs: Vec<PathBuf> = vec![PathBuf::new()];
        let mut depth = vec![0u32];
        for i in 1..self.dirs {
            // Attach to a random earlier directory not already 8 deep.
            let mut parent = rng.range(0, i as u64 - 1) as usize;
            while depth[parent] >= 8 {
                parent = rng.range(0, i as u64 - 1) as usize;
            }
            dirs.push(dirs[parent].join(format!("dir{i}")));
            depth.push(depth[parent] + 1);
        }
        let files = (0..self.files)
            .map(|i| {
                let d = rng.range(0, self.dirs as u64 - 1) as usize;
                let name = Self::file_name(&mut rng, i);
                let size = (Self::file_size(&mut rng) as f64 * self.size_factor) as u64;
                (dirs[d].join(name), size)
            })
            .collect();
        dirs.remove(0);
        TreePlan { dirs, files }
    }
}

impl TreePlan {
    pub fn totals(&self) -> TreeTotals {
        TreeTotals {
            dirs: self.dirs.len() as u64,
            files: self.files.len() as u64,
            bytes: self.files.iter().map(|f| f.1).sum(),
        }
    }

    /// Writes the plan under `root` (created); contents come from `seed`.
    pub fn create(&self, root: &Path, seed: u64) -> Result<TreeTotals> {
        fs::create_dir_all(root).with_context(|| format!("mkdir {}", root.display()))?;
        for d in &self.dirs {
            fs::create_dir(root.join(d)).with_context(|| format!("mkdir {}", d.display()))?;
        }
        let mut rng = Rng::new(seed ^ 0x5eed);
        let mut buf = Vec::new();
        for (path, size) in &self.files {
            crate::signals::check()?;
            buf.resize(*size as usize, 0);
            rng.fill(&mut buf);
            let p = root.join(path);
            fs::File::create(&p)
                .and_then(|mut f| f.write_all(&buf))
                .with_context(|| format!("writing {}", p.display()))?;
        }
        Ok(self.totals())
    }
}

/// What a directory entry is; symlinks are never followed (a kernel tree has them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

/// Calls `visit(path, kind, len)` for everything below `root`, depth first.
pub fn walk(root: &Path, visit: &mut dyn FnMut(&Path, Kind, u64) -> Result<()>) -> Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let ft = e.file_type()?;
            let path = e.path();
            if ft.is_dir() {
                visit(&path, Kind::Dir, 0)?;
                stack.push(path);
            } else if ft.is_symlink() {
                visit(&path, Kind::Symlink, 0)?;
            } else {
                visit(&path, Kind::File, e.metadata()?.len())?;
            }
        }
    }
    Ok(())
}

/// Totals of what is on disk below `root`.
pub fn measure(root: &Path) -> Result<TreeTotals> {
    let mut t = TreeTotals::default();
    walk(root, &mut |_, kind, len| {
        match kind {
            Kind::Dir => t.dirs += 1,
            Kind::File => {
                t.files += 1;
                t.bytes += len;
            }
            // Counted with files, as tar counts entries.
            Kind::Symlink => t.files += 1,
        }
        Ok(())
    })?;
    Ok(t)
}

/// Copies `src` to `dst` (which must not exist) file by file, as `cp -r` does.
pub fn copy(src: &Path, dst: &Path) -> Result<TreeTotals> {
    fs::create_dir(dst).with_context(|| format!("mkdir {}", dst.display()))?;
    let mut t = TreeTotals::default();
    let mut buf = vec![0u8; 1 << 20];
    walk(src, &mut |path, kind, _| {
        let target = dst.join(path.strip_prefix(src)?);
        if kind == Kind::Dir {
            fs::create_dir(&target)?;
            t.dirs += 1;
        } else if kind == Kind::Symlink {
            std::os::unix::fs::symlink(fs::read_link(path)?, &target)?;
            t.files += 1;
        } else {
            let mut from = fs::File::open(path)?;
            let mut to = fs::File::create(&target)?;
            t.bytes += pump(&mut from, &mut to, &mut buf)?;
            t.files += 1;
        }
        Ok(())
    })?;
    Ok(t)
}

/// Reads every regular file under `root`; returns the bytes read.
pub fn read_all(root: &Path) -> Result<u64> {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 20];
    walk(root, &mut |path, kind, _| {
        if kind == Kind::File {
            total += drain(&mut fs::File::open(path)?, &mut buf)?;
        }
        Ok(())
    })?;
    Ok(total)
}

/// `ls -lR`-like listing of `root` written to `out`; returns the number of lines.
pub fn list_into(root: &Path, out: &Path) -> Result<u64> {
    let mut w = std::io::BufWriter::new(fs::File::create(out)?);
    let mut lines = 0;
    walk(root, &mut |path, kind, len| {
        let meta = fs::symlink_metadata(path)?;
        let mtime = std::os::unix::fs::MetadataExt::mtime(&meta);
        let c = match kind {
            Kind::Dir => 'd',
            Kind::File => '-',
            Kind::Symlink => 'l',
        };
        writeln!(w, "{c} {len:>10} {mtime} {}", path.display())?;
        lines += 1;
        Ok(())
    })?;
    w.flush()?;
    Ok(lines)
}

/// Shell-style wildcard match (`*` and `?`).
pub fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Names under `root` matching `pattern`, like `find root -name pattern`.
pub fn find(root: &Path, pattern: &str) -> Result<u64> {
    let mut hits = 0;
    walk(root, &mut |path, _, _| {
        if path
            .file_name()
            .is_some_and(|n| wildcard(pattern, &n.to_string_lossy()))
        {
            hits += 1;
        }
        Ok(())
    })?;
    Ok(hits)
}

pub fn delete(root: &Path) -> Result<()> {
    fs::remove_dir_all(root).with_context(|| format!("deleting {}", root.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_is_deterministic_and_kernel_sized() {
        let a = TreeSpec::kernel_like(1.0, 7).plan();
        let b = TreeSpec::kernel_like(1.0, 7).plan();
        assert_eq!(a.totals(), b.totals());
        let t = a.totals();
        assert!((80_000..90_000).contains(&(t.dirs + t.files)), "{t:?}");
        let gb = t.bytes as f64 / 1e9;
        assert!((1.1..1.5).contains(&gb), "{gb} GB");
        assert_ne!(a.totals(), TreeSpec::kernel_like(1.0, 8).plan().totals());
    }

    #[test]
    fn symlinks_are_copied_not_followed() {
        let base = std::env::temp_dir().join(format!("fsprof-symlink-{}", std::process::id()));
        let src = base.join("src");
        fs::create_dir_all(src.join("dir")).unwrap();
        fs::write(src.join("dir/f"), b"abc").unwrap();
        // A link to a directory, like arch/*/boot/dts links in a kernel tree.
        std::os::unix::fs::symlink("dir", src.join("link")).unwrap();
        let copied = copy(&src, &base.join("dst")).unwrap();
        assert_eq!(measure(&base.join("dst")).unwrap(), copied);
        assert_eq!(
            fs::read_link(base.join("dst/link")).unwrap(),
            Path::new("dir")
        );
        assert_eq!(read_all(&src).unwrap(), 3);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn wildcards() {
        assert!(wildcard("*.c", "main.c"));
        assert!(!wildcard("*.c", "main.h"));
        assert!(wildcard("Make*", "Makefile.2"));
        assert!(wildcard("f?le*", "file1.c"));
    }
}
