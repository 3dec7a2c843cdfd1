//! IOzone-style automatic mode: for every file size and every record size that fits, the
//! write, rewrite, read, reread, random read and random write tests, one step per test so
//! each gets a cell; plus a file larger than the page cache, written and read with O_DIRECT.

use std::{
    fs,
    io::{Read, Write},
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use anyhow::Result;

use super::rng::Rng;

pub const MIN_FILE: u64 = 64 << 10;
pub const MAX_FILE: u64 = 512 << 20;
pub const MIN_RECORD: u64 = 4 << 10;
pub const MAX_RECORD: u64 = 16 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    Write,
    Rewrite,
    Read,
    Reread,
    RandomRead,
    RandomWrite,
}

/// (file size, record size) pairs, as `iozone -a -n 64k -g MAX` walks them.
pub fn matrix(max_file: u64) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    let mut f = MIN_FILE;
    while f <= max_file.min(MAX_FILE) {
        let mut r = MIN_RECORD;
        while r <= f.min(MAX_RECORD) {
            v.push((f, r));
            r *= 2;
        }
        f *= 2;
    }
    v
}

/// Bytes a test moves over the matrix: each file size once per record size.
pub fn bytes_per_test(max_file: u64) -> u64 {
    matrix(max_file).iter().map(|(size, _)| size).sum()
}

/// Bytes `large` moves: the file written, then read, in whole records.
pub fn large_bytes(size: u64) -> u64 {
    2 * (size / LARGE_RECORD as u64) * LARGE_RECORD as u64
}

fn file(dir: &Path, size: u64) -> PathBuf {
    dir.join(format!("iozone-{size}.tmp"))
}

/// Runs `test` over the whole matrix; returns bytes moved.
pub fn run(dir: &Path, test: Test, max_file: u64, seed: u64) -> Result<u64> {
    let mut moved = 0;
    for (size, rec) in matrix(max_file) {
        let path = file(dir, size);
        let mut buf = vec![0u8; rec as usize];
        Rng::new(seed ^ rec).fill(&mut buf);
        let records = size / rec;
        match test {
            Test::Write => {
                let mut f = fs::File::create(&path)?;
                for _ in 0..records {
                    f.write_all(&buf)?;
                }
                f.sync_all()?; // iozone -e: include flush in write timing
            }
            Test::Rewrite => {
                let mut f = fs::OpenOptions::new().write(true).open(&path)?;
                for _ in 0..records {
                    f.write_all(&buf)?;
                }
                f.sync_all()?;
            }
            Test::Read | Test::Reread => {
                let mut f = fs::File::open(&path)?;
                for _ in 0..records {
                    f.read_exact(&mut buf)?;
                }
            }
            Test::RandomRead | Test::RandomWrite => {
                let f = fs::OpenOptions::new().read(true).write(true).open(&path)?;
                let mut rng = Rng::new(seed ^ size ^ rec);
                for _ in 0..records {
                    let off = rng.range(0, records - 1) * rec;
                    if test == Test::RandomRead {
                        f.read_exact_at(&mut buf, off)?;
                    } else {
                        f.write_all_at(&buf, off)?;
                    }
                }
                if test == Test::RandomWrite {
                    f.sync_all()?;
                }
            }
        }
        moved += records * rec;
    }
    Ok(moved)
}

/// The larger-than-cache test: write then read `size` bytes in 128 KiB records with
/// O_DIRECT, so the page cache cannot serve any of it.
/// The large file's record.
const LARGE_RECORD: usize = 128 << 10;

pub fn large(dir: &Path, size: u64, seed: u64) -> Result<u64> {
    const REC: usize = LARGE_RECORD;
    let path = dir.join("iozone-large.tmp");
    // O_DIRECT needs an aligned buffer: over-allocate and take an aligned window.
    let mut raw = vec![0u8; REC + 4096];
    let off = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[off..off + REC];
    Rng::new(seed).fill(buf);
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)?;
    let records = size / REC as u64;
    for i in 0..records {
        f.write_all_at(buf, i * REC as u64)?;
    }
    for i in 0..records {
        f.read_exact_at(buf, i * REC as u64)?;
    }
    drop(f);
    fs::remove_file(&path)?;
    Ok(large_bytes(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_matches_iozone_auto() {
        let m = matrix(MAX_FILE);
        assert_eq!(m.first(), Some(&(MIN_FILE, MIN_RECORD)));
        assert!(m.contains(&(MAX_FILE, MAX_RECORD)));
        assert!(m.iter().all(|&(f, r)| r <= f));
        // 14 file sizes; records 4k..min(f,16M).
        assert_eq!(m.iter().filter(|(f, _)| *f == MIN_FILE).count(), 5);
    }
}
