//! The two loops every workload needs, with the chunk size as the one thing that varies
//! (1 MiB for cp-like steps, 8 KiB for bonnie++'s block phases).

use std::io::{Read, Write};

use anyhow::Result;

/// Reads `from` to the end in `buf`-sized reads; returns the bytes read.
pub fn drain(from: &mut impl Read, buf: &mut [u8]) -> Result<u64> {
    let mut total = 0;
    loop {
        let n = from.read(buf)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

/// Copies `from` to `to` in `buf`-sized reads and writes; returns the bytes copied.
pub fn pump(from: &mut impl Read, to: &mut impl Write, buf: &mut [u8]) -> Result<u64> {
    let mut total = 0;
    loop {
        let n = from.read(buf)?;
        if n == 0 {
            return Ok(total);
        }
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}
