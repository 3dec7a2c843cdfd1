//! Overhead benchmark on real filesystems: the kernel tree unpacked (`tar xf`), deleted
//! (`rm -rf`) and an fsync-heavy database step, on fresh ext4 and xfs loop filesystems
//! (direct I/O to an image on the host disk), untraced and in every tracing mode (all-waits:
//! an off-CPU stack at every switch-out, `--off-cpu-period 0`), with a
//! bpftrace one-liner of the same syscall histogram as an anchor and fsprof's do-nothing
//! programs on the same hooks as the floor. Modes alternate (the order rotates every round)
//! and each figure is the median over `runs` rounds; the command is timed by GNU time inside the
//! trace, so probe loading is not in it. Start-up and tear-down are measured apart.
//! Ratios pair each traced sample with the untraced one of the same round: this machine kind
//! drifts by ±10 % over minutes, which unpaired medians of each mode carry into the ratio.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{run, setup};

const DIR: &str = "/run/fsprof-bench";
const IMAGE_DIR: &str = "/var/tmp/fsprof-bench";
/// In the bench's tmpfs (`DIR`, its `files`), gone with it.
const TIMELINE_FILE: &str = "/run/fsprof-bench/files/timeline.perfetto-trace";

/// A way of running each workload; the names are what `--modes` takes and the table shows.
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
pub enum Mode {
    Untraced,
    Floor,
    Default,
    /// The default with the kernel timing fsprof's programs throughout, not 10 % of the time.
    TimedAll,
    #[value(name = "all-waits")]
    EveryWait,
    NoStacks,
    #[value(name = "no-fs-ev")]
    NoFsEvents,
    Census,
    /// The default plus `--timeline`: every switch, wakeup and block request streamed.
    Timeline,
    Bpftrace,
}

/// Every mode, untraced (the baseline every ratio needs) first.
fn modes() -> &'static [Mode] {
    <Mode as clap::ValueEnum>::value_variants()
}

impl Mode {
    fn label(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    fn fsprof_args(self) -> Option<&'static [&'static str]> {
        match self {
            Mode::Untraced | Mode::Bpftrace => None,
            Mode::Floor => Some(&["--floor"]),
            Mode::Default => Some(&[]),
            Mode::TimedAll => Some(&["--probe-cost-sampling", "100"]),
            Mode::EveryWait => Some(&["--off-cpu-period", "0"]),
            Mode::NoStacks => Some(&["--no-stacks"]),
            Mode::NoFsEvents => Some(&["--no-fs-events"]),
            Mode::Census => Some(&["--all-fs-events"]),
            Mode::Timeline => Some(&["--timeline", TIMELINE_FILE]),
        }
    }
}

const WORKLOADS: [&str; 3] = ["untar", "rm", "db"];

/// A sparse image on a loop device with direct I/O, formatted and mounted; taken down on
/// drop, also on error.
struct Lab {
    mnt: PathBuf,
    dev: String,
}

impl Lab {
    fn new(fs: &str) -> Result<Lab> {
        std::fs::create_dir_all(IMAGE_DIR)?;
        let image = Path::new(IMAGE_DIR).join("image");
        let _ = std::fs::remove_file(&image);
        std::fs::File::create(&image)?.set_len(6 << 30)?;
        let out = Command::new("losetup")
            .args(["--direct-io=on", "--find", "--show"])
            .arg(&image)
            .output()?;
        if !out.status.success() {
            bail!("losetup: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let dev = String::from_utf8(out.stdout)?.trim().to_string();
        let mnt = Path::new(DIR).join("mnt");
        let lab = Lab {
            mnt: mnt.clone(),
            dev: dev.clone(),
        };
        let force = if fs == "xfs" { "-f" } else { "-F" };
        run(Command::new(format!("mkfs.{fs}"))
            .args(["-q", force, &dev])
            .stdout(Stdio::null()))?;
        std::fs::create_dir_all(&mnt)?;
        run(Command::new("mount").arg(&dev).arg(&mnt))?;
        Ok(lab)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_file(Path::new(IMAGE_DIR).join("image"));
    }
}

/// tracefs at /sys/kernel/tracing for bpftrace's tracepoints (these machines do not mount
/// it; fsprof needs none), unmounted on drop if the bench mounted it.
struct Tracefs(bool);

impl Tracefs {
    fn ensure() -> Result<Tracefs> {
        let p = Path::new("/sys/kernel/tracing/events");
        if p.exists() {
            return Ok(Tracefs(false));
        }
        run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))?;
        Ok(Tracefs(true))
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.0 {
            let _ = Command::new("umount").arg("/sys/kernel/tracing").status();
        }
    }
}

/// tmpfs for the decompressed tarball and the bench's files, unmounted on drop.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn kernel_tarball() -> Result<PathBuf> {
    for entry in std::fs::read_dir("/usr/src")? {
        let p = entry?.path();
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("linux-source-") && name.contains(".tar") {
            return Ok(p);
        }
    }
    bail!("no /usr/src/linux-source-*.tar.*: apt-get install linux-source-6.1")
}

fn drop_caches() -> Result<()> {
    run(&mut Command::new("sync"))?;
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping caches")
}

/// One measurement: the command's wall and sys (GNU time), and fsprof's probe cost.
#[derive(Default, Clone)]
struct Sample {
    wall: f64,
    sys: f64,
    probe_ns: Option<u64>,
    programs: Vec<(String, u64, u64)>,
    /// User stacks unwound in the kernel: (stacks, frames, ns).
    unwound: (u64, u64, u64),
}

struct Bench {
    fsprof: PathBuf,
    files: PathBuf,
}

impl Bench {
    /// Runs `cmd` (in `cwd`) in `mode`; `comm` is the command name bpftrace filters on.
    fn run_in(&self, mode: Mode, cmd: &[String], cwd: &Path, comm: &str) -> Result<()> {
        let mut tracer = None;
        let mut c = match mode.fsprof_args() {
            Some(args) => {
                let mut c = Command::new(&self.fsprof);
                c.arg("trace")
                    .args(args)
                    .arg("--json")
                    .arg(self.files.join("trace.json"))
                    .arg("--flames")
                    .arg(self.files.join("flames"))
                    .arg("--")
                    .args(cmd);
                c
            }
            None => {
                if mode == Mode::Bpftrace {
                    tracer = Some(start_bpftrace(comm)?);
                }
                let mut c = Command::new(&cmd[0]);
                c.args(&cmd[1..]);
                c
            }
        };
        let status = c
            .current_dir(cwd)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(mut t) = tracer {
            let _ = Command::new("kill")
                .args(["-INT", &t.id().to_string()])
                .status();
            let _ = t.wait();
        }
        if !status?.success() {
            bail!("{} failed in mode {}", cmd.join(" "), mode.label());
        }
        Ok(())
    }

    /// `cmd` timed by GNU time, with fsprof's probe cost when traced.
    fn measure(&self, mode: Mode, cmd: &[String], cwd: &Path, comm: &str) -> Result<Sample> {
        let times = self.files.join("time.out");
        let mut timed: Vec<String> = vec![
            "/usr/bin/time".into(),
            "-f".into(),
            "%e %S".into(),
            "-o".into(),
            times.display().to_string(),
        ];
        timed.extend(cmd.iter().cloned());
        self.run_in(mode, &timed, cwd, comm)?;
        let t = std::fs::read_to_string(&times)?;
        let mut f = t
            .lines()
            .last()
            .unwrap_or("")
            .split_whitespace()
            .map(|x| x.parse::<f64>().unwrap_or(0.0));
        let mut s = Sample {
            wall: f.next().unwrap_or(0.0),
            sys: f.next().unwrap_or(0.0),
            ..Default::default()
        };
        if mode.fsprof_args().is_some() {
            let json = self.files.join("trace.json");
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
            let u = &v["stacks"]["user_stacks"];
            let n = |k: &str| u[k].as_u64().unwrap_or(0);
            s.unwound = (n("unwound"), n("frames"), n("unwind_ns"));
            let cost = &v["profile"]["probe_cost"];
            s.probe_ns = cost["run_ns"].as_u64();
            for p in cost["programs"].as_array().into_iter().flatten() {
                s.programs.push((
                    p["program"].as_str().unwrap_or("").to_string(),
                    p["runs"].as_u64().unwrap_or(0),
                    p["run_ns"].as_u64().unwrap_or(0),
                ));
            }
        }
        Ok(s)
    }
}

/// One figure of every sample of (workload, fs, mode), rounds in order.
fn series(samples: &Samples, w: &str, fs: &str, m: usize, f: fn(&Sample) -> f64) -> Vec<f64> {
    samples
        .get(&(w.to_string(), fs.to_string(), m))
        .map(|v| v.iter().map(f).collect())
        .unwrap_or_default()
}

/// The answer users come for, in every mode: each filesystem's wall over the first's, per
/// workload (median over rounds of the same round's pair). A profiler that changes it shows
/// here as a traced ratio that differs from the untraced one.
fn print_fs_ratios(samples: &Samples, filesystems: &[String], sel: &[usize]) {
    let Some((first, rest)) = filesystems.split_first() else {
        return;
    };
    if rest.is_empty() {
        return;
    }
    println!("\nwall of each filesystem over {first}'s, per mode (median over rounds):");
    for w in WORKLOADS {
        for fs in rest {
            let cells: Vec<String> = sel
                .iter()
                .map(|&m| {
                    let wall = |fs: &str| series(samples, w, fs, m, |s| s.wall);
                    let r = median(paired_ratios(&wall(first), &wall(fs)));
                    format!("{} {r:.2}", modes()[m].label())
                })
                .collect();
            println!("  {w:<5} {fs}/{first}: {}", cells.join(", "));
        }
    }
}

/// What user stacks cost in each mode with stacks (median run): unwound in the kernel from
/// DWARF CFI, so no stack bytes are copied to userspace.
fn print_unwinder(samples: &Samples, filesystems: &[String], sel: &[usize]) {
    println!(
        "\nuser stacks (unwound in the kernel, 0 bytes of stack copied to userspace), median run:"
    );
    for w in WORKLOADS {
        for fs in filesystems {
            let cells: Vec<String> = sel
                .iter()
                .filter_map(|&m| {
                    let mut v = samples.get(&(w.to_string(), fs.clone(), m))?.clone();
                    v.sort_by_key(|s| s.unwound.0);
                    let (n, frames, ns) = v.get(v.len() / 2)?.unwound;
                    (n > 0).then(|| {
                        format!(
                            "{} {n} stacks × {:.1} frames, {:.1} µs each",
                            modes()[m].label(),
                            frames as f64 / n as f64,
                            ns as f64 / n as f64 / 1e3
                        )
                    })
                })
                .collect();
            if !cells.is_empty() {
                println!("  {w:<5} {fs:<5} {}", cells.join("; "));
            }
        }
    }
}

/// The per-syscall cost target: `calls` getpid syscalls (glibc does not cache getpid), the
/// mean in ns written to `out`. Timed inside, so process start and probe loading stay out.
pub fn syscall_loop(calls: u64, out: &Path) -> Result<()> {
    let t = Instant::now();
    for _ in 0..calls {
        std::hint::black_box(std::process::id());
    }
    let ns = t.elapsed().as_nanos() as f64 / calls.max(1) as f64;
    std::fs::write(out, format!("{ns:.1}\n"))?;
    Ok(())
}

/// What one syscall costs in each mode: a getpid loop, modes alternating as in the main
/// bench, median over `runs` rounds. On this kernel the syscall tracepoints' slow path is
/// most of any syscall tracer's cost; this separates it (floor) from fsprof's programs.
fn syscall_cost(bench: &Bench, sel: &[usize], runs: usize) -> Result<()> {
    const CALLS: u64 = 2_000_000;
    let exe = std::env::current_exe()?;
    let out = bench.files.join("syscall.ns");
    let cmd: Vec<String> = vec![
        exe.display().to_string(),
        "syscall-loop".into(),
        CALLS.to_string(),
        out.display().to_string(),
    ];
    let comm: String = exe
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .chars()
        .take(15)
        .collect();
    let mut ns: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for round in 0..runs {
        for k in 0..sel.len() {
            let m = sel[(k + round) % sel.len()];
            bench.run_in(modes()[m], &cmd, &bench.files, &comm)?;
            let v: f64 = std::fs::read_to_string(&out)?.trim().parse()?;
            ns.entry(m).or_default().push(v);
        }
    }
    let base = median(ns.get(&0).cloned().unwrap_or_default());
    let mut line = format!("untraced {base:.0} ns");
    for &m in sel.iter().skip(1) {
        let v = median(ns.get(&m).cloned().unwrap_or_default());
        line.push_str(&format!(", {} +{:.0} ns", modes()[m].label(), v - base));
    }
    println!(
        "\nper syscall (getpid loop, {} M calls, median of {runs}): {line}",
        CALLS / 1_000_000
    );
    Ok(())
}

/// bpftrace with the same per-syscall latency histogram fsprof keeps, for one command name;
/// returns once its probes are attached.
fn start_bpftrace(comm: &str) -> Result<std::process::Child> {
    let script = format!(
        "tracepoint:raw_syscalls:sys_enter /comm == \"{comm}\"/ {{ @s[tid] = nsecs; }} \
         tracepoint:raw_syscalls:sys_exit /@s[tid]/ {{ @h[args->id] = hist(nsecs - @s[tid]); \
         delete(@s[tid]); }}"
    );
    let mut child = Command::new("bpftrace")
        .args(["-e", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting bpftrace")?;
    use std::io::BufRead;
    let out = child.stdout.take().context("bpftrace stdout")?;
    let mut lines = std::io::BufReader::new(out).lines();
    // "Attaching 2 probes..." comes before the attach; give it a moment after.
    match lines.next() {
        Some(Ok(l)) if l.starts_with("Attaching") => {}
        other => bail!("bpftrace did not start: {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(1500));
    // Drain the rest in the background so bpftrace never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok(child)
}

/// traced / untraced of the same round, rounds in order (one sample per mode per round).
fn paired_ratios(base: &[f64], traced: &[f64]) -> Vec<f64> {
    base.iter()
        .zip(traced)
        .filter(|(b, _)| **b > 0.0)
        .map(|(b, t)| t / b)
        .collect()
}

/// Median and a 90 % percentile-bootstrap interval of the median (fixed seed: the same
/// samples always print the same interval).
fn median_interval(v: &[f64]) -> (f64, f64, f64) {
    let m = median(v.to_vec());
    if v.len() < 2 {
        return (m, m, m);
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut medians: Vec<f64> = (0..2000)
        .map(|_| median((0..v.len()).map(|_| v[next() as usize % v.len()]).collect()))
        .collect();
    medians.sort_by(|a, b| a.total_cmp(b));
    (m, medians[100], medians[1899])
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn ctx_json(mnt: &Path, src: &Path) -> String {
    // The `db` step at 8,000 transactions (each a WAL append + fdatasync, checkpoints
    // fsync the 51 MiB data file): ~5 s. 1,000 (0.6 s) drowned in this machine's noise:
    // modes that cost the same came out 0.96–1.75×.
    format!(
        r#"{{"dir":"{}","src":"{}","seed":1,"tree_dirs":1,"tree_files":1,"tree_size_factor":1.0,"real_kernel":false,"big_size":0,"db_transactions":8000,"db_pages":6553,"cpu_scale":0.0,"bonnie_size":0,"bonnie_files":0,"bonnie_max":0,"bonnie_min":0,"bonnie_dirs":0,"iozone_max_file":0,"iozone_large":0,"jobs":1,"job":null}}"#,
        mnt.display(),
        src.display()
    )
}

/// (workload, fs, mode index) → samples.
type Samples = BTreeMap<(String, String, usize), Vec<Sample>>;

pub fn overhead(runs: usize, filesystems: &[String], wanted: &[Mode]) -> Result<()> {
    // Untraced is the baseline every ratio needs.
    let mut sel = vec![0];
    for (i, m) in modes().iter().enumerate().skip(1) {
        if wanted.is_empty() || wanted.contains(m) {
            sel.push(i);
        }
    }
    let (tmp, bench, tar) = prepare()?;
    let _tracefs = Tracefs::ensure()?;
    let mut samples = Samples::new();
    for round in 0..runs {
        for fs in filesystems {
            for k in 0..sel.len() {
                let m = sel[(k + round) % sel.len()];
                let mut record = |w: &str, s: Sample| {
                    eprintln!(
                        "bench: round {} {fs} {w} {}: {:.2}s wall, {:.2}s sys{}",
                        round + 1,
                        modes()[m].label(),
                        s.wall,
                        s.sys,
                        s.probe_ns
                            .map(|n| format!(", probes {:.1} ms", n as f64 / 1e6))
                            .unwrap_or_default()
                    );
                    let key = (w.to_string(), fs.clone(), m);
                    samples.entry(key).or_default().push(s);
                };
                bench.workloads(modes()[m], fs, &tar, &mut record)?;
            }
        }
    }
    check_complete(&samples, runs, filesystems, &sel)?;
    print_ratios(&samples, runs, filesystems, &sel);
    print_fs_ratios(&samples, filesystems, &sel);
    print_programs(&samples, filesystems);
    print_unwinder(&samples, filesystems, &sel);
    syscall_cost(&bench, &sel, runs)?;
    startup(&bench.fsprof, &bench.files, runs.max(STARTUP_RUNS))?;
    drop(tmp);
    Ok(())
}

/// `cargo xtask bench --runs 1 --fs ext4 --modes default`, which `cargo xtask test` runs as
/// a smoke test: every stage of the bench works (its figures are not judged).
pub fn smoke() -> Result<()> {
    overhead(1, &["ext4".to_string()], &[Mode::Default])
}

/// Every workload has a timed sample per round in every mode, and fsprof's modes their
/// probe cost: a table with holes would hide a bench that stopped measuring.
fn check_complete(
    samples: &Samples,
    runs: usize,
    filesystems: &[String],
    sel: &[usize],
) -> Result<()> {
    for w in WORKLOADS {
        for fs in filesystems {
            for &m in sel {
                let got = samples.get(&(w.to_string(), fs.clone(), m));
                let traced = modes()[m].fsprof_args().is_some();
                let whole =
                    |s: &Sample| s.wall > 0.0 && (!traced || s.probe_ns.is_some_and(|n| n > 0));
                anyhow::ensure!(
                    got.is_some_and(|v| v.len() == runs && v.iter().all(whole)),
                    "bench: {w} on {fs} {}: {} of {runs} rounds measured",
                    modes()[m].label(),
                    got.map_or(0, |v| v.iter().filter(|s| whole(s)).count())
                );
            }
        }
    }
    Ok(())
}

/// Builds fsprof, mounts the bench's tmpfs and unpacks the kernel tarball into it.
fn prepare() -> Result<(Tmpfs, Bench, PathBuf)> {
    setup::ensure()?;
    setup::apt_install(&["linux-source-6.1", "bpftrace"])?;
    run(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release"]),
    )?;
    let fsprof = std::fs::canonicalize("target/release/fsprof")?;
    std::fs::create_dir_all(DIR)?;
    run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=4G", "fsprof-bench", DIR]))?;
    let tmp = Tmpfs(PathBuf::from(DIR));
    let files = tmp.0.join("files");
    std::fs::create_dir_all(&files)?;
    let tar = tmp.0.join("linux.tar");
    let tarball = kernel_tarball()?;
    eprintln!("bench: decompressing {} to tmpfs", tarball.display());
    run(Command::new("sh").arg("-c").arg(format!(
        "xz -dc {} > {}",
        tarball.display(),
        tar.display()
    )))?;
    Ok((tmp, Bench { fsprof, files }, tar))
}

impl Bench {
    /// untar, rm and db on a fresh `fs` in `mode`, each sample handed to `record`.
    fn workloads(
        &self,
        mode: Mode,
        fs: &str,
        tar: &Path,
        record: &mut dyn FnMut(&str, Sample),
    ) -> Result<()> {
        let lab = Lab::new(fs)?;
        let mnt = lab.mnt.clone();
        drop_caches()?;
        let untar = vec![
            "tar".into(),
            "xf".into(),
            tar.display().to_string(),
            "-C".into(),
            mnt.display().to_string(),
        ];
        record("untar", self.measure(mode, &untar, &mnt, "tar")?);
        drop_caches()?;
        let tree = std::fs::read_dir(&mnt)?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("linux"))
            .context("no tree after tar")?
            .path();
        let rm = vec!["rm".into(), "-rf".into(), tree.display().to_string()];
        record("rm", self.measure(mode, &rm, &mnt, "rm")?);
        drop_caches()?;
        let db = vec![
            self.fsprof.display().to_string(),
            "workload".into(),
            "db".into(),
            "--ctx".into(),
            ctx_json(&mnt, &self.files),
        ];
        record("db", self.measure(mode, &db, &mnt, "db")?);
        Ok(())
    }
}

/// The ratio table: traced / untraced of the same round, and the probes' share of wall.
fn print_ratios(samples: &Samples, runs: usize, filesystems: &[String], sel: &[usize]) {
    println!(
        "\nfsprof overhead on real filesystems (loop device, direct I/O), {runs} rounds; GNU time \
         inside the trace"
    );
    println!(
        "  untar = tar xf of linux-source-6.1 (uncompressed, from tmpfs); rm = rm -rf of that \
         tree; db = fsprof's db step, 8,000 fdatasync'd transactions"
    );
    println!(
        "  ratio = median over rounds of traced / untraced *of the same round* (modes alternate \
         within a round, so slow phases of the machine cancel), [90 % bootstrap interval]; \
         probes = fsprof's BPF run time (runs counted by its programs × mean run time the \
         kernel measured in 20 ms of every 200), as a share of the untraced median wall"
    );
    let mut header = format!("{:<6} {:<5} {:<6}", "work", "fs", "");
    for &m in sel {
        header.push_str(&format!(" {:>21}", modes()[m].label()));
    }
    println!("{header}");
    for w in WORKLOADS {
        for fs in filesystems {
            let series = |m: usize, f: fn(&Sample) -> f64| series(samples, w, fs, m, f);
            for (what, f) in [
                ("wall", (|s: &Sample| s.wall) as fn(&Sample) -> f64),
                ("sys", |s: &Sample| s.sys),
            ] {
                let base = series(0, f);
                let mut line = format!("{w:<6} {fs:<5} {what:<6}");
                for &m in sel {
                    if m == 0 {
                        line.push_str(&format!(" {:>20.2}s", median(base.clone())));
                        continue;
                    }
                    let (r, lo, hi) = median_interval(&paired_ratios(&base, &series(m, f)));
                    line.push_str(&format!(" {r:>6.3}× [{lo:.3}–{hi:.3}]"));
                }
                println!("{line}");
            }
            let wall = median(series(0, |s| s.wall));
            let mut line = format!("{w:<6} {fs:<5} {:<6}", "probes");
            for &m in sel {
                let ns = series(m, |s| s.probe_ns.map_or(f64::NAN, |n| n as f64));
                let cell = if ns.iter().all(|n| n.is_nan()) {
                    "—".to_string()
                } else {
                    format!("{:.1} %", median(ns) / 1e7 / wall)
                };
                line.push_str(&format!(" {cell:>21}"));
            }
            println!("{line}");
        }
    }
}

/// fsprof's own kernel time per program in the default mode (the median run), and in the
/// timeline mode the timeline's own programs (its block requests are streamed by the core
/// block programs: in the total, not listed).
fn print_programs(samples: &Samples, filesystems: &[String]) {
    for (mode, only) in [(Mode::Default, ""), (Mode::Timeline, "timeline_")] {
        let Some(m) = modes().iter().position(|&x| x == mode) else {
            continue;
        };
        let rows: Vec<(&str, &String, Sample)> = WORKLOADS
            .iter()
            .flat_map(|w| filesystems.iter().map(move |fs| (*w, fs)))
            .filter_map(|(w, fs)| {
                let runs = samples.get(&(w.to_string(), fs.clone(), m))?;
                Some((w, fs, median_run(runs)?))
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        println!(
            "\nfsprof's own kernel time in the {} mode (median run), per {}program:",
            mode.label(),
            if only.is_empty() { "" } else { "timeline " }
        );
        for (w, fs, s) in rows {
            let progs: Vec<String> = s
                .programs
                .iter()
                .filter(|(p, _, _)| p.starts_with(only))
                .take(6)
                .map(|(p, runs, ns)| {
                    format!(
                        "{p} {:.1}ms/{runs}×{}ns",
                        *ns as f64 / 1e6,
                        ns / (*runs).max(1)
                    )
                })
                .collect();
            println!(
                "  {w:<5} {fs:<5} total {:.1} ms = {:.1} % of wall: {}",
                s.probe_ns.unwrap_or(0) as f64 / 1e6,
                s.probe_ns.unwrap_or(0) as f64 / 1e7 / s.wall.max(1e-9),
                progs.join(", ")
            );
        }
    }
}

/// The run of median wall time.
fn median_run(v: &[Sample]) -> Option<Sample> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.wall.total_cmp(&b.wall));
    v.get(v.len() / 2).cloned()
}

/// Start-up samples at least (a start takes ~0.15 s): a median of one is noise.
const STARTUP_RUNS: usize = 9;

/// `fsprof trace -- true` end to end, and fsprof's own phases inside it (its JSON's
/// `own_time_ns`); the rest is process start, output and tear-down. After one start not
/// counted: the first of a build in a boot reads what later ones find kept
/// (`probes::kept`).
fn startup(fsprof: &Path, files: &Path, runs: usize) -> Result<()> {
    let json = files.join("startup.json");
    let (mut total, mut phases) = (Vec::new(), BTreeMap::<String, Vec<f64>>::new());
    for i in 0..=runs {
        let t = Instant::now();
        run(Command::new(fsprof)
            .args(["trace", "--flames"])
            .arg(files.join("flames"))
            .arg("--json")
            .arg(&json)
            .args(["--", "true"])
            .stderr(Stdio::null()))?;
        if i == 0 {
            continue;
        }
        total.push(t.elapsed().as_secs_f64());
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
        for (phase, ns) in v["own_time_ns"].as_object().into_iter().flatten() {
            let s = ns.as_f64().unwrap_or(0.0) / 1e9;
            phases.entry(phase.clone()).or_default().push(s);
        }
    }
    let inside: f64 = phases.values().map(|v| median(v.clone())).sum();
    let total = median(total);
    let parts: Vec<String> = phases
        .into_iter()
        .map(|(p, v)| format!("{p} {:.3}", median(v)))
        .chain([format!("rest {:.3}", (total - inside).max(0.0))])
        .collect();
    println!(
        "\nstart-up and tear-down: fsprof trace -- true {total:.3}s (median of {runs}: {})",
        parts.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_ratio_interval() {
        // The machine slows down in round 2: each round's ratio stays 1.1.
        let base = [2.0, 4.0, 2.2];
        let traced = [2.2, 4.4, 2.42];
        let r = paired_ratios(&base, &traced);
        let (m, lo, hi) = median_interval(&r);
        assert!((m - 1.1).abs() < 1e-9 && (lo - 1.1).abs() < 1e-9 && (hi - 1.1).abs() < 1e-9);
        let (m, lo, hi) = median_interval(&[0.9, 1.0, 1.1, 1.2, 1.3]);
        assert_eq!(m, 1.1);
        assert!(lo < m && m < hi && lo >= 0.9 && hi <= 1.3);
    }
}
