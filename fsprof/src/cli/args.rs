//! Options and value parsers shared by several commands.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::{
    lab::{self, FsKind, LabOptions},
    probes::{DEFAULT_SAMPLE_HZ, FsEventSet, StackOptions, off_cpu_period_for},
    workload::pgbench::PgbenchSpec,
};

#[derive(Args)]
pub struct StackArgs {
    /// No stacks: no on-CPU sampling, off-CPU stacks, background work or flame graphs.
    #[arg(long)]
    pub no_stacks: bool,
    /// On-CPU samples per second per CPU (cpu-clock).
    #[arg(long, default_value_t = DEFAULT_SAMPLE_HZ)]
    pub sample_hz: u32,
    /// Off-CPU waits at least this long get a kernel stack each; shorter ones are sampled,
    /// one stack per this much waiting per thread, carrying the time since the last (every
    /// total stays exact). Default: the on-CPU sample period (1/sample-hz), so waiting and
    /// running are sampled alike. 0: a stack for every wait, which costs 3–6 µs per wait
    /// (rm -rf of a kernel tree on xfs: ~10 % slower). Units: ns, us, ms, s.
    #[arg(long, value_parser = parse_duration_ns)]
    pub off_cpu_period: Option<u64>,
    /// User frames kept per stack (1–64): deeper stacks end in "[stack ends: depth limit]"
    /// (PostgreSQL's backends reach ~35). Each frame is one more step of the in-kernel
    /// unwinder; stacks are never copied out of the kernel.
    #[arg(long, default_value_t = fsprof_common::DEFAULT_USER_DEPTH,
          value_parser = clap::value_parser!(u32).range(1..=fsprof_common::USTACK_DEPTH as i64))]
    pub user_depth: u32,
    /// Do not count the filesystem's own tracepoints (xfs:*, ext4:*, jbd2:*, …).
    #[arg(long, conflicts_with = "all_fs_events")]
    pub no_fs_events: bool,
    /// Count every tracepoint of the filesystem's subsystems (the census), not only the
    /// curated waits, commits and background work. Costs ~150 ns per event: a kernel-tree
    /// delete fires millions (1.2–1.5× its wall time); the default set costs ~nothing.
    #[arg(long)]
    pub all_fs_events: bool,
    /// Directory for folded stacks and flame graphs (default: fsprof-flames for trace,
    /// RESULTS.flames beside the results file for run).
    #[arg(long)]
    pub flames: Option<PathBuf>,
    /// Also write the on-CPU, off-CPU and off-wake stacks as pprof profiles (gzipped
    /// profile.proto, for `go tool pprof`, Pyroscope, Parca) into this directory, named
    /// as the folded files.
    #[arg(long, conflicts_with = "no_stacks")]
    pub pprof: Option<PathBuf>,
}

/// What the timeline holds besides switches, wakeups and block requests.
#[derive(Args, Clone)]
pub struct TimelineArgs {
    /// With --timeline: the target's syscalls at least this long are slices on their
    /// thread (0: every syscall). Units: ns, us, ms, s.
    #[arg(long, value_parser = parse_duration_ns,
          default_value = crate::probes::timeline::DEFAULT_SYSCALL_MIN)]
    pub timeline_syscalls_over: u64,
    /// With --timeline: name the kernel function each D-state wait blocked in (Perfetto
    /// shows it in the thread state's details). Takes a kernel stack per wait, ~2 µs:
    /// fdatasync-heavy work pays 5–13 % of its wall more.
    #[arg(long)]
    pub timeline_blocked_functions: bool,
}

impl TimelineArgs {
    /// The probes' timeline options when `on`.
    pub fn options(&self, on: bool) -> Option<crate::probes::timeline::TimelineOptions> {
        on.then_some(crate::probes::timeline::TimelineOptions {
            syscall_min_ns: self.timeline_syscalls_over,
            blocked_functions: self.timeline_blocked_functions,
        })
    }
}

impl StackArgs {
    pub fn fs_event_set(&self) -> FsEventSet {
        match (self.no_fs_events, self.all_fs_events) {
            (true, _) => FsEventSet::Off,
            (false, true) => FsEventSet::Census,
            (false, false) => FsEventSet::Curated,
        }
    }

    pub fn options(&self) -> Option<StackOptions> {
        (!self.no_stacks).then_some(StackOptions {
            sample_hz: self.sample_hz.max(1),
            background: true,
            off_cpu_period_ns: self
                .off_cpu_period
                .unwrap_or_else(|| off_cpu_period_for(self.sample_hz)),
            user_depth: self.user_depth,
        })
    }
}

#[derive(Args)]
pub struct LabArgs {
    /// Size of the loop filesystem's image (e.g. 512M, 4G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Directory for the sparse image (not tmpfs).
    #[arg(long, default_value = lab::DEFAULT_IMAGE_DIR)]
    pub dir: PathBuf,
    /// Extra mkfs options, e.g. "-b 1024".
    #[arg(long, allow_hyphen_values = true)]
    pub mkfs_opts: Option<String>,
    /// Mount options, e.g. "data=writeback".
    #[arg(long)]
    pub mount_opts: Option<String>,
}

impl LabArgs {
    pub fn options(&self) -> LabOptions {
        LabOptions {
            size: self.size,
            image_dir: self.dir.clone(),
            mkfs_opts: self
                .mkfs_opts
                .as_deref()
                .map(|s| s.split_whitespace().map(String::from).collect())
                .unwrap_or_default(),
            mount_opts: self.mount_opts.clone().unwrap_or_default(),
            device: None,
        }
    }
}

/// A filesystem name as clap sees it (the error is the lab's one line).
pub fn parse_fs(s: &str) -> Result<FsKind, String> {
    FsKind::parse(s).map_err(|e| format!("{e:#}"))
}

/// "512M", "4G", "1048576".
/// "1ms", "250us", "0" → ns.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 1ms, 250us, 0)"))?;
    let scale = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "" if v == 0.0 => 0.0,
        u => return Err(format!("unknown unit {u:?} in {s:?} (ns, us, ms, s)")),
    };
    Ok((v * scale).round() as u64)
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("bad size suffix in {s:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("bad size {s:?}"))
}

pub fn parse_pgbench(s: &str) -> Result<PgbenchSpec, String> {
    let bad = || format!("bad --pgbench {s:?}: want SCALE,CLIENTS,SECONDS");
    let v: Vec<u32> = s
        .split(',')
        .map(|x| x.trim().parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    match v[..] {
        [scale, clients, seconds] if scale > 0 && clients > 0 && seconds > 0 => Ok(PgbenchSpec {
            scale,
            clients,
            seconds,
        }),
        _ => Err(bad()),
    }
}

/// "ext4:opts" → (Some(ext4), "opts"); "opts" → (None, "opts").
pub fn per_fs(values: &[String]) -> Result<Vec<(Option<FsKind>, String)>> {
    values
        .iter()
        .map(|v| match v.split_once(':') {
            Some((fs, o)) if FsKind::ALL.iter().any(|k| k.name() == fs) => {
                Ok((Some(FsKind::parse(fs)?), o.to_string()))
            }
            _ => Ok((None, v.clone())),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("1ms"), Ok(1_000_000));
        assert_eq!(parse_duration_ns("250us"), Ok(250_000));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration_ns("0"), Ok(0));
        assert!(parse_duration_ns("5").is_err() && parse_duration_ns("1h").is_err());
        assert!(parse_duration_ns("ms").is_err());
    }

    #[test]
    fn sizes_and_pgbench_specs() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("3X").is_err() && parse_size("M").is_err());
        let p = parse_pgbench("10, 4,30").unwrap();
        assert_eq!((p.scale, p.clients, p.seconds), (10, 4, 30));
        assert!(parse_pgbench("10,4").is_err() && parse_pgbench("0,4,30").is_err());
    }

    #[test]
    fn options_per_filesystem() {
        let v = per_fs(&["ext4:data=writeback".into(), "noatime".into()]).unwrap();
        assert_eq!(v[0], (Some(FsKind::Ext4), "data=writeback".into()));
        assert_eq!(v[1], (None, "noatime".into()));
    }
}

/// Where the suite runs: on the host's kernel, or in a VM booted with another.
#[derive(Args)]
pub struct VmArgs {
    /// Kernel to run on: `host`, a kernel image (vmlinuz-RELEASE, modules beside it or in
    /// /lib/modules), or a Debian package fetched once, e.g. `deb:linux-image-amd64`
    /// (Linux 6.1, with jfs, reiserfs, f2fs and nilfs2). Other than `host`, fsprof runs in a
    /// qemu VM on a raw virtio-blk disk (cache=none). Several (repeated or
    /// comma-separated) make a kernel axis: passes alternate between them (A B A B) and
    /// `compare --by kernel` compares them.
    #[arg(long, default_value = "host", value_delimiter = ',')]
    pub kernel: Vec<crate::vm::KernelSpec>,
    /// The VM's CPUs (default: the host's).
    #[arg(long)]
    pub vm_cpus: Option<u32>,
    /// The VM's memory (e.g. 4G).
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub vm_memory: u64,
    /// qemu accelerator. tcg (emulated; times compare only with other tcg runs) works on
    /// any machine; kvm where /dev/kvm boots guests.
    #[arg(long, value_enum, default_value = "tcg")]
    pub vm_accel: crate::vm::Accel,
}

impl VmArgs {
    pub fn config(&self) -> crate::vm::VmConfig {
        crate::vm::VmConfig {
            cpus: self.vm_cpus.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
            }),
            memory_bytes: self.vm_memory,
            accel: self.vm_accel,
        }
    }

    /// The kernels to boot, fetched into `dir`/kernels if needed; none: the host's.
    pub fn guest_kernels(&self, dir: &std::path::Path) -> Result<Vec<crate::vm::GuestKernel>> {
        let host = self.kernel.contains(&crate::vm::KernelSpec::Host);
        if host && self.kernel.len() > 1 {
            anyhow::bail!(
                "--kernel host with other kernels: bare-metal and VM times do not compare; run the host on its own"
            );
        }
        if host || self.kernel.is_empty() {
            return Ok(Vec::new());
        }
        // Kernels are fetched and unpacked there, and booted from there.
        let kernels = crate::lab::workdir::WorkDir::secure(dir)?.subdir("kernels")?;
        let mut out = Vec::new();
        for spec in &self.kernel {
            out.extend(spec.resolve(&kernels.path)?);
        }
        Ok(out)
    }
}
