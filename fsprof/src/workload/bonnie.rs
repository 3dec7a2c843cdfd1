//! bonnie++-style phases, each a step of its own so each gets its own traced cell.
//! Sequential output per character (stdio-buffered putc) and per 8 KiB block, rewrite,
//! sequential input per character and per block, random seeks with three workers; and the
//! `-n` metadata phases: sequential and random create / read (stat) / delete.

use std::{
    fs,
    io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write},
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};

use super::rng::Rng;

/// bonnie's chunk for block I/O.
pub const CHUNK: usize = 8192;
/// stdio's buffer, what putc/getc go through.
const STDIO: usize = 4096;
const SEEKS: u64 = 8000;
const SEEKERS: u64 = 3;
/// Seeks the seek phase does: each worker its share of `SEEKS`.
pub const SEEKS_DONE: u64 = SEEKS / SEEKERS * SEEKERS;

#[derive(Clone, Debug)]
pub struct BonnieSpec {
    /// Size of the sequential/seek test file.
    pub file_size: u64,
    /// `-n files:max:min:dirs`
    pub files: u32,
    pub max_size: u64,
    pub min_size: u64,
    pub dirs: u32,
    pub seed: u64,
}

fn data_file(dir: &Path) -> PathBuf {
    dir.join("bonnie.dat")
}

/// Sequential output, per character.
pub fn putc(dir: &Path, spec: &BonnieSpec) -> Result<()> {
    let mut w = BufWriter::with_capacity(STDIO, fs::File::create(data_file(dir))?);
    for i in 0..spec.file_size {
        w.write_all(&[(i & 0x7f) as u8])?;
    }
    w.flush()?;
    Ok(())
}

/// Sequential output, per block (rewrites the file from scratch).
pub fn write_blocks(dir: &Path, spec: &BonnieSpec) -> Result<()> {
    let mut f = fs::File::create(data_file(dir))?;
    let buf = vec![b'b'; CHUNK];
    let mut left = spec.file_size;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Rewrite: read a block, dirty it, seek back, write it.
pub fn rewrite(dir: &Path) -> Result<()> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(data_file(dir))?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        buf[0] = buf[0].wrapping_add(1);
        f.seek(SeekFrom::Current(-(n as i64)))?;
        f.write_all(&buf[..n])?;
    }
}

/// Sequential input, per character; returns bytes read.
pub fn getc(dir: &Path) -> Result<u64> {
    let mut r = BufReader::with_capacity(STDIO, fs::File::open(data_file(dir))?);
    let mut b = [0u8; 1];
    let mut n = 0;
    while r.read(&mut b)? == 1 {
        n += 1;
    }
    Ok(n)
}

/// Sequential input, per block; returns bytes read.
pub fn read_blocks(dir: &Path) -> Result<u64> {
    super::io::drain(&mut fs::File::open(data_file(dir))?, &mut [0u8; CHUNK])
}

/// Random seeks: three workers read random blocks, rewriting one in ten.
pub fn seeks(dir: &Path, spec: &BonnieSpec) -> Result<()> {
    let blocks = (spec.file_size / CHUNK as u64).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..SEEKERS)
            .map(|w| {
                s.spawn(move || -> Result<()> {
                    let f = fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(data_file(dir))?;
                    let mut rng = Rng::new(spec.seed + w);
                    let mut buf = vec![0u8; CHUNK];
                    for i in 0..SEEKS / SEEKERS {
                        let off = rng.range(0, blocks - 1) * CHUNK as u64;
                        f.read_at(&mut buf, off)?;
                        if i % 10 == 0 {
                            buf[0] = buf[0].wrapping_add(1);
                            f.write_at(&buf, off)?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("seek worker panicked"))??;
        }
        Ok(())
    })
}

/// The `-n` file set: (path, size), directories `dirs` wide, names as bonnie makes them.
pub fn file_set(spec: &BonnieSpec, random_order: bool) -> Vec<(PathBuf, u64)> {
    let mut rng = Rng::new(spec.seed ^ 0xb0);
    let mut v: Vec<(PathBuf, u64)> = (0..spec.files)
        .map(|i| {
            let d = i % spec.dirs.max(1);
            let size = rng.range(spec.min_size, spec.max_size.max(spec.min_size));
            (
                PathBuf::from(format!(
                    "{d:05}/{:010x}{i:07}",
                    rng.next_u64() & 0xff_ffff_ffff
                )),
                size,
            )
        })
        .collect();
    if random_order {
        for i in (1..v.len()).rev() {
            v.swap(i, rng.range(0, i as u64) as usize);
        }
    }
    v
}

fn meta_root(dir: &Path, random: bool) -> PathBuf {
    dir.join(if random {
        "bonnie-random"
    } else {
        "bonnie-seq"
    })
}

/// Create phase: mkdir the directories, create and fill every file in set order.
pub fn create(dir: &Path, spec: &BonnieSpec, random: bool) -> Result<()> {
    let root = meta_root(dir, random);
    for d in 0..spec.dirs.max(1) {
        fs::create_dir_all(root.join(format!("{d:05}")))?;
    }
    let buf = vec![b'n'; spec.max_size as usize];
    for (p, size) in file_set(spec, random) {
        let mut f = fs::File::create(root.join(p))?;
        f.write_all(&buf[..size as usize])?;
    }
    Ok(())
}

/// Read phase: stat every file in set order (and read it, as bonnie does for sized files).
pub fn stat(dir: &Path, spec: &BonnieSpec, random: bool) -> Result<u64> {
    let root = meta_root(dir, random);
    let mut total = 0;
    let mut buf = vec![0u8; spec.max_size.max(1) as usize];
    for (p, size) in file_set(spec, random) {
        let path = root.join(p);
        let len = fs::metadata(&path)?.len();
        if len != size {
            bail!("{} has {len} bytes, expected {size}", path.display());
        }
        if size > 0 {
            total += fs::File::open(&path)?.read(&mut buf)? as u64;
        }
    }
    Ok(total)
}

/// Delete phase: unlink every file in set order, then the directories.
pub fn delete(dir: &Path, spec: &BonnieSpec, random: bool) -> Result<()> {
    let root = meta_root(dir, random);
    for (p, _) in file_set(spec, random) {
        fs::remove_file(root.join(p))?;
    }
    for d in 0..spec.dirs.max(1) {
        fs::remove_dir(root.join(format!("{d:05}")))?;
    }
    fs::remove_dir(&root)?;
    Ok(())
}
