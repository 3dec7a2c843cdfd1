//! A database-style workload: each transaction appends a WAL record and fdatasyncs it
//! (commit durability), and dirties random pages of a data file; every `CHECKPOINT`
//! transactions the data file is fsynced, as a checkpoint would.

use std::{fs::OpenOptions, io::Write, os::unix::fs::FileExt, path::Path};

use anyhow::Result;

use super::rng::Rng;

pub const PAGE: u64 = 8192;
const RECORD: usize = 512;
const PAGES_PER_TXN: u32 = 2;
const CHECKPOINT: u32 = 100;

#[derive(Clone, Debug)]
pub struct DbSpec {
    pub transactions: u32,
    pub data_pages: u64,
    pub seed: u64,
}

impl DbSpec {
    pub fn scaled(scale: f64, seed: u64) -> DbSpec {
        DbSpec {
            transactions: ((20_000.0 * scale) as u32).max(100),
            data_pages: ((131_072.0 * scale) as u64).max(1024), // 1 GiB at scale 1
            seed,
        }
    }

    /// Bytes the WAL holds afterwards.
    pub fn wal_bytes(&self) -> u64 {
        self.transactions as u64 * RECORD as u64
    }
}

pub fn run(dir: &Path, spec: &DbSpec) -> Result<()> {
    let mut rng = Rng::new(spec.seed);
    let mut wal = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("db.wal"))?;
    let data = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.join("db.data"))?;
    data.set_len(spec.data_pages * PAGE)?;
    let mut record = vec![0u8; RECORD];
    let mut page = vec![0u8; PAGE as usize];
    for txn in 1..=spec.transactions {
        rng.fill(&mut record);
        wal.write_all(&record)?;
        wal.sync_data()?;
        for _ in 0..PAGES_PER_TXN {
            rng.fill(&mut page);
            data.write_all_at(&page, rng.range(0, spec.data_pages - 1) * PAGE)?;
        }
        if txn.is_multiple_of(CHECKPOINT) {
            data.sync_all()?;
        }
    }
    data.sync_all()?;
    Ok(())
}
