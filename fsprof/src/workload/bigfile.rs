//! Big files: bring one in from another disk, copy it, rewrite it in a new order (the
//! "re-order the audio tracks of an mkv" step: read everything, write a remuxed copy).

use std::{
    fs,
    io::{Read, Write},
    path::Path,
};

use anyhow::{Context, Result, bail};

use super::rng::Rng;

const CHUNK: usize = 1 << 20;

/// Makes `path` with `size` deterministic bytes unless it already has exactly that size.
pub fn ensure_source(path: &Path, size: u64, seed: u64) -> Result<()> {
    if fs::metadata(path).is_ok_and(|m| m.len() == size) {
        return Ok(());
    }
    let tmp = path.with_extension("partial");
    let mut f = fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; CHUNK];
    let mut left = size;
    while left > 0 {
        // Making a 9 GB source takes a while: stop promptly on Ctrl-C.
        crate::signals::check()?;
        let n = left.min(CHUNK as u64) as usize;
        rng.fill(&mut buf[..n]);
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    Ok(())
}

/// Plain sequential copy in 1 MiB reads and writes; returns bytes copied.
pub fn copy(src: &Path, dst: &Path) -> Result<u64> {
    let mut from = fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
    let mut to = fs::File::create(dst).with_context(|| format!("creating {}", dst.display()))?;
    super::io::pump(&mut from, &mut to, &mut vec![0u8; CHUNK])
}

/// Reads `src` and writes `dst` with each pair of 1 MiB chunks swapped, the way a remuxer
/// reads every packet and writes them in a new interleaving. Returns bytes written.
pub fn remux(src: &Path, dst: &Path) -> Result<u64> {
    let mut from = fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
    let mut to = fs::File::create(dst).with_context(|| format!("creating {}", dst.display()))?;
    let (mut a, mut b) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut total = 0;
    loop {
        let na = read_full(&mut from, &mut a)?;
        let nb = read_full(&mut from, &mut b)?;
        to.write_all(&b[..nb])?;
        to.write_all(&a[..na])?;
        total += (na + nb) as u64;
        if na + nb < 2 * CHUNK {
            break;
        }
    }
    let expect = fs::metadata(src)?.len();
    if total != expect {
        bail!("remux wrote {total} bytes of {expect}");
    }
    Ok(total)
}

/// Reads `path` to the end in 1 MiB reads; returns bytes read.
pub fn read(path: &Path) -> Result<u64> {
    let mut f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    super::io::drain(&mut f, &mut vec![0u8; CHUNK])
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let r = f.read(&mut buf[n..])?;
        if r == 0 {
            break;
        }
        n += r;
    }
    Ok(n)
}
