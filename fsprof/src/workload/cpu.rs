//! The CPU-bound control: the "encode an MP3" step of the distribution benchmark, where
//! the filesystem should not matter. Reads an input, transforms it in a CPU-heavy loop,
//! writes the small result.

use std::{fs, hint::black_box, path::Path};

use anyhow::Result;

use super::rng::Rng;

pub fn run(dir: &Path, scale: f64, seed: u64) -> Result<()> {
    let mut rng = Rng::new(seed);
    let mut input = vec![0u8; 8 << 20];
    rng.fill(&mut input);
    fs::write(dir.join("cpu.in"), &input)?;
    let input = fs::read(dir.join("cpu.in"))?;
    let rounds = ((400.0 * scale) as u32).max(4);
    let mut acc = [0u64; 4];
    for r in 0..rounds {
        for (i, chunk) in input.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            let lane = &mut acc[i & 3];
            *lane =
                black_box(lane.rotate_left(7) ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15 + r as u64));
        }
    }
    let out: Vec<u8> = acc.iter().flat_map(|v| v.to_le_bytes()).collect();
    fs::write(dir.join("cpu.out"), out)?;
    Ok(())
}
