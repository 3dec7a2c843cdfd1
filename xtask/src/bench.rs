//! Overhead benchmark: `rm -rf` of a real kernel tree on tmpfs, plain vs under
//! `fsprof trace`, alternating, median of N. tmpfs has no device latency, so the ratio is
//! the worst case for syscall-heavy work: every syscall pays the probes and nothing hides them.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{run, setup};

const DIR: &str = "/run/fsprof-bench";

/// tmpfs mounted for the bench, unmounted on drop (also on error).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path) -> Result<Tmpfs> {
        std::fs::create_dir_all(path)?;
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8G", "fsprof-bench"])
            .arg(path))?;
        Ok(Tmpfs(path.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn kernel_tarball() -> Result<PathBuf> {
    for entry in std::fs::read_dir("/usr/src")? {
        let p = entry?.path();
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if name.starts_with("linux-source-") && name.contains(".tar") {
            return Ok(p);
        }
    }
    bail!("no /usr/src/linux-source-*.tar.*: apt-get install linux-source-6.1")
}

fn timed(cmd: &mut Command) -> Result<Duration> {
    let start = Instant::now();
    run(cmd)?;
    Ok(start.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The traced command's own wall time, as fsprof measured it (from its JSON).
fn traced_wall(json: &Path) -> Result<Duration> {
    let text = std::fs::read_to_string(json)?;
    let key = "\"wall_ns\": ";
    let at = text.find(key).context("wall_ns missing from fsprof JSON")? + key.len();
    let ns: u64 = text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap_or("")
        .parse()?;
    Ok(Duration::from_nanos(ns))
}

pub fn overhead(runs: usize) -> Result<()> {
    setup::ensure()?;
    setup::apt_install(&["linux-source-6.1"])?;
    run(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release"]),
    )?;
    let fsprof = std::fs::canonicalize("target/release/fsprof")?;
    let tarball = kernel_tarball()?;
    let tmp = Tmpfs::mount(Path::new(DIR))?;
    let src = tmp.0.join("src");
    std::fs::create_dir_all(&src)?;
    eprintln!("bench: unpacking {} on tmpfs", tarball.display());
    run(Command::new("tar")
        .arg("xf")
        .arg(&tarball)
        .arg("-C")
        .arg(&src))?;
    let entries = String::from_utf8(
        Command::new("sh")
            .arg("-c")
            .arg(format!("find {} | wc -l", src.display()))
            .output()?
            .stdout,
    )?;
    // (label, extra fsprof trace arguments): the tracer core alone, then with stacks.
    let variants: [(&str, &[&str]); 2] = [
        ("core (--no-stacks)", &["--no-stacks"]),
        ("core + stacks (default)", &[]),
    ];
    let mut plain = Vec::new();
    let mut traced: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut traced_cmd: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let json = tmp.0.join("trace.json");
    let flames = tmp.0.join("flames");
    let copy = tmp.0.join("copy");
    for i in 0..runs {
        run(Command::new("cp").arg("-a").arg(&src).arg(&copy))?;
        plain.push(timed(Command::new("rm").arg("-rf").arg(&copy))?);
        for (v, (label, args)) in variants.iter().enumerate() {
            run(Command::new("cp").arg("-a").arg(&src).arg(&copy))?;
            traced[v].push(timed(
                Command::new(&fsprof)
                    .args(["trace", "--json"])
                    .arg(&json)
                    .arg("--flames")
                    .arg(&flames)
                    .args(*args)
                    .args(["--", "rm", "-rf"])
                    .arg(&copy)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null()),
            )?);
            traced_cmd[v].push(traced_wall(&json)?);
            eprintln!(
                "bench: run {}: plain {:.3}s, {label}: fsprof trace {:.3}s (command {:.3}s)",
                i + 1,
                plain[i].as_secs_f64(),
                traced[v][i].as_secs_f64(),
                traced_cmd[v][i].as_secs_f64()
            );
        }
    }
    let p = median(plain);
    println!(
        "rm -rf of a kernel tree ({} entries) on tmpfs, median of {runs}:",
        entries.trim()
    );
    println!(
        "  plain rm -rf                         {:.3}s",
        p.as_secs_f64()
    );
    for (v, (label, _)) in variants.iter().enumerate() {
        let (t, c) = (median(traced[v].clone()), median(traced_cmd[v].clone()));
        println!("  {label}:");
        println!(
            "    fsprof trace -- rm -rf             {:.3}s  (ratio {:.2}, incl. loading probes)",
            t.as_secs_f64(),
            t.as_secs_f64() / p.as_secs_f64()
        );
        println!(
            "    rm -rf while traced                {:.3}s  (ratio {:.2})",
            c.as_secs_f64(),
            c.as_secs_f64() / p.as_secs_f64()
        );
    }
    Ok(())
}
