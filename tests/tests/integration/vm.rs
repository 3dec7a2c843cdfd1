//! `fsprof run --kernel`: Debian 6.1 guests under qemu (TCG here) run the suite on
//! filesystems this host kernel lacks, count syscalls as strace does, alternate between
//! kernels, crash btrfs by cutting the guest's power, and leave nothing behind.

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use fsprof::results::RunResult;
use fsprof_tests::{TempDir, assert_success, checked, fsprof_bin, load_run, wait_until};

/// Fetched once into /var/tmp/fsprof/kernels (the default --dir) and kept.
const KERNEL: &str = "deb:linux-image-amd64";

/// `fsprof ARGS --json NAME` run in `json`'s directory: a relative results path, as the
/// README's examples give it (flame graphs go beside it).
fn fsprof(args: &[&str], json: &Path) -> Output {
    Command::new(fsprof_bin())
        .args(args)
        .arg("--json")
        .arg(json.file_name().unwrap())
        .current_dir(json.parent().unwrap())
        .output()
        .unwrap()
}

/// No qemu of fsprof, no VM share or disk image stays (tests run one at a time, so any
/// such leftover is the test's).
fn assert_no_vm_left() {
    let left: Vec<String> = std::fs::read_dir("/var/tmp/fsprof")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fsprof-") && n.contains("-vm"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let ps = qemus();
    assert!(!ps.contains("fsprof-"), "{ps}");
}

/// Two Debian 6.1 kernels the archive has now (bookworm's point release and its security
/// update, e.g. 6.1.176-1 and 6.1.192-3), as `deb:` specs: versions age, so they are asked
/// of apt, not written here.
fn two_debian_kernels() -> [String; 2] {
    let out = Command::new("apt-cache")
        .args(["madison", "linux-image-amd64"])
        .output()
        .unwrap();
    let mut versions: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split('|').nth(1).map(|v| v.trim().to_string()))
        .filter(|v| v.starts_with("6.1."))
        .collect();
    versions.sort();
    versions.dedup();
    assert!(
        versions.len() >= 2,
        "two Debian 6.1 kernels in apt: {versions:?}"
    );
    let spec = |v: &String| format!("{KERNEL}={v}");
    [spec(&versions[0]), spec(&versions[versions.len() - 1])]
}

/// Two Debian kernels make a kernel axis of two columns per filesystem.
/// Every cell's timeline was recorded in its guest and kept at
/// tl/KERNEL/STEP/FS-passN.perfetto-trace, whole (the size its summary says), with switches.
fn timelines_kept_per_kernel(r: &RunResult, tl: &Path) {
    for f in &r.filesystems {
        let label = f.kernel.clone().unwrap();
        for p in &f.passes {
            for c in &p.steps {
                let t = c.trace.timeline.as_ref().expect("a timeline per cell");
                let want = tl
                    .join(&label)
                    .join(&c.step)
                    .join(format!("{}-pass{}.perfetto-trace", f.fs, p.pass));
                assert_eq!(Path::new(&t.path), want);
                assert_eq!(std::fs::metadata(&want).unwrap().len(), t.bytes, "{want:?}");
                assert!(t.records.get("switch").copied().unwrap_or(0) > 0, "{t:?}");
            }
        }
    }
}

/// Every cell's pprof profiles were written in its guest and kept at
/// pprof/KERNEL/STEP/FS-passN.KIND.pb.gz, gzip files.
fn pprof_kept_per_kernel(r: &RunResult, pprof: &Path) {
    for f in &r.filesystems {
        let label = f.kernel.clone().unwrap();
        for p in &f.passes {
            for c in &p.steps {
                let on_cpu = pprof
                    .join(&label)
                    .join(&c.step)
                    .join(format!("{}-pass{}.on-cpu.pb.gz", f.fs, p.pass));
                assert_eq!(
                    c.trace.flames.get("on-cpu.pb.gz").map(Path::new),
                    Some(on_cpu.as_path())
                );
                let head = std::fs::read(&on_cpu).unwrap();
                assert_eq!(head[..2], [0x1f, 0x8b], "{on_cpu:?} is gzip");
            }
        }
    }
}

pub fn two_kernel_run_fills_jfs_and_reiserfs_cells_and_compares_by_kernel() {
    let dir = TempDir::new("vm");
    let json = dir.0.join("r.json");
    let specs = two_debian_kernels();
    let kernels = specs.join(",");
    let out = fsprof(
        &[
            "run",
            "--kernel",
            &kernels,
            "--fs",
            "jfs,reiserfs",
            "--only",
            "extract-tree",
            "--scale",
            "0.02",
            "--passes",
            "2",
            "--timeline",
            dir.0.join("tl").to_str().unwrap(),
            "--pprof",
            dir.0.join("pprof").to_str().unwrap(),
        ],
        &json,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r = load_run(&json);
    timelines_kept_per_kernel(&r, &dir.0.join("tl"));
    pprof_kept_per_kernel(&r, &dir.0.join("pprof"));
    assert!(r.complete, "{:?}", r.interrupted);
    let vm = r.vm.as_ref().expect("vm facts");
    assert_eq!((vm.accel.as_str(), vm.emulated), ("tcg", true));
    assert_eq!(vm.disk_cache, "none");
    let labels: Vec<&str> = vm.kernels.iter().map(|k| k.label.as_str()).collect();
    let releases: Vec<&str> = vm.kernels.iter().map(|k| k.release.as_str()).collect();
    assert!(
        releases.iter().all(|r| r.starts_with("6.1.")) && releases[0] != releases[1],
        "guest kernels {releases:?}"
    );
    assert_eq!(labels, releases);
    for (k, spec) in vm.kernels.iter().zip(&specs) {
        assert_eq!(&k.spec, spec);
        assert_eq!(k.boot_s.len(), 2, "a boot per pass: {:?}", k.boot_s);
        assert!(k.boot_s.iter().all(|&b| b > 0.0), "{:?}", k.boot_s);
    }
    assert_eq!(r.kernel_axis(), labels);
    let columns: Vec<String> = r.filesystems.iter().map(|f| f.column()).collect();
    assert_eq!(
        columns,
        [
            format!("jfs@{}", labels[0]),
            format!("jfs@{}", labels[1]),
            format!("reiserfs@{}", labels[0]),
            format!("reiserfs@{}", labels[1]),
        ]
    );
    let mut starts = Vec::new();
    for f in &r.filesystems {
        assert_eq!(f.device, "/dev/vda", "{}", f.column());
        let passes: Vec<u32> = f.passes.iter().map(|p| p.pass).collect();
        assert_eq!(passes, [1, 2], "{}", f.column());
        for p in &f.passes {
            starts.push((p.started, p.pass, f.kernel.clone().unwrap()));
        }
        for cell in f.runs_of("extract-tree") {
            let t = &cell.trace;
            // Every program, the optional requeue one included, verified on both kernels.
            assert!(
                t.missing_hooks.is_empty(),
                "{}: {:?}",
                f.column(),
                t.missing_hooks
            );
            let syscalls: u64 = t.profile.syscalls.iter().map(|s| s.count).sum();
            assert!(
                t.wall_ns > 0 && syscalls > 1000,
                "{}: {syscalls}",
                f.column()
            );
            // The tree went through the guest's block layer to the virtio disk.
            let written = fsprof_tests::block_bytes(t, "write");
            assert!(written > 1 << 20, "{}: {written} B written", f.column());
            // Only the workload is the target: no thread of fsprof's (the guest's heartbeat
            // once slept through every step, half of each cell's time), so the split is
            // the host's, where extracting a tree hardly sleeps.
            let time = &t.profile.time;
            assert!(
                time.sleep.ns * 20 <= time.followed_ns,
                "{}: sleep {} of {} ns",
                f.column(),
                time.sleep.ns,
                time.followed_ns
            );
            assert_eq!(
                t.profile.tasks_exited + time.open_threads,
                1,
                "{}",
                f.column()
            );
            for path in t.flames.values() {
                assert!(Path::new(path).is_file(), "per-pass stacks {path}");
            }
        }
    }
    // A B A B: every pass of kernel A started before the same pass of B, and after the
    // previous pass of B.
    starts.sort();
    let by_time: Vec<u32> = starts.iter().map(|(_, pass, _)| *pass).collect();
    assert!(by_time.is_sorted(), "passes interleave: {starts:?}");
    // Flame graphs drawn over both boots of each column, and each kernel against the first.
    let cells = &r.flames.cells["extract-tree"];
    let svg = &cells[&columns[1]]["off-cpu.svg"];
    assert!(dir.0.join(svg).is_file(), "{svg}");
    assert!(
        r.flames
            .diffs
            .iter()
            .any(|d| d.fs == columns[1] && d.base == columns[0]),
        "{:?}",
        r.flames.diffs
    );

    let cmp = dir.0.join("cmp.json");
    let out = Command::new(fsprof_bin())
        .args(["compare", "--by", "kernel", "--all", "--json"])
        .arg(&cmp)
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("kernel {} vs {} (base)", labels[1], labels[0])),
        "{text}"
    );
    let c: serde_json::Value = serde_json::from_slice(&std::fs::read(&cmp).unwrap()).unwrap();
    let rows = c["rows"].as_array().unwrap();
    for fs in ["jfs", "reiserfs"] {
        let wall = rows
            .iter()
            .find(|r| r["fs"] == fs && r["step"] == "extract-tree" && r["metric"] == "wall")
            .unwrap_or_else(|| panic!("no wall row for {fs}: {text}"));
        assert_eq!(
            (wall["n_base"].as_u64(), wall["n_new"].as_u64()),
            (Some(2), Some(2))
        );
        assert!(wall["p"].is_number(), "{wall}");
    }
    // The report names the columns and the emulator.
    let report = Command::new(fsprof_bin())
        .args(["report"])
        .arg(&json)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&report.stdout);
    assert!(
        table.contains(&columns[3]) && table.contains("tcg"),
        "{table}"
    );
    assert_no_vm_left();
}

/// In the guest, fsprof's syscall counts of a shell script equal `strace -c -f`'s of the
/// same script, run by a second step on the same filesystem.
pub fn guest_syscall_counts_equal_strace_in_the_guest() {
    let dir = TempDir::new("vm-strace");
    let json = dir.0.join("r.json");
    // Written by the guest into the default --dir, which it shares.
    let summary = Path::new("/var/tmp/fsprof").join(format!("strace-{}.txt", std::process::id()));
    let script = "mkdir t && cd t && for i in $(seq 300); do echo $i > f$i; done && cat f1 f2 f3 > /dev/null && cd .. && rm -rf t";
    // fsprof runs a step as `sh -c TEMPLATE`: the same shell strace starts below.
    let traced = format!("traced={script}");
    let stracing = format!(
        "stracing=strace -f -c -U name,calls -o {} sh -c '{script}'",
        summary.display()
    );
    let out = Command::new(fsprof_bin())
        .args(["run", "--kernel", KERNEL, "--fs", "ext4", "--suite", "none"])
        .args([
            "--passes",
            "1",
            "--no-stacks",
            "--step",
            &traced,
            "--step",
            &stracing,
        ])
        .arg("--json")
        .arg(&json)
        .current_dir(&dir.0)
        .output()
        .unwrap();
    let strace = std::fs::read_to_string(&summary);
    let _ = std::fs::remove_file(&summary);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = fsprof_tests::strace_summary(&strace.expect("strace's summary"));
    let r = load_run(&json);
    let cell = r.filesystems[0].runs_of("traced")[0];
    let ours = fsprof_tests::fsprof_counts(&cell.trace);
    assert!(ours.get("openat").copied().unwrap_or(0) >= 300, "{ours:?}");
    assert_eq!(
        ours, theirs,
        "fsprof (left) vs strace -c -f (right), in the guest"
    );
    assert_no_vm_left();
}

/// btrfs, which the host cannot crash (no shutdown ioctl), crashed for real in the guest:
/// qemu killed while the guest waits. A durable rename (file and directory fsynced) is new
/// after the cut; the filesystem is mounted again (its recovery timed) and checked; each
/// pattern's cost is traced in the guest (fsyncs counted as the pattern makes them).
pub fn power_cut_in_a_vm_crashes_btrfs() {
    let dir = TempDir::new("vm-crash");
    let json = dir.0.join("crash.json");
    let out = fsprof(
        &[
            "crash",
            "--kernel",
            KERNEL,
            "--fs",
            "btrfs",
            "--pattern",
            "rename-fsync-dir,rename-no-fsync",
            "--at",
            "now",
            "--trials",
            "2",
            "--cost-updates",
            "5",
        ],
        &json,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    checked(&[&json]);
    let study: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // Two trials: three boots (each looks at the last cut, then runs the next trial), and
    // one more for a boot stopped as hung (about 1 in 70 under TCG; it happened in CI).
    let hung = study["vm"]["kernels"][0]["hung_boots"]
        .as_u64()
        .unwrap_or(0) as usize;
    assert_eq!(err.matches("booting it again").count(), hung, "{err}");
    assert_eq!(
        err.matches("fsprof: booting deb:").count(),
        3 + hung,
        "{err}"
    );
    assert!(
        study["kernel"].as_str().unwrap().starts_with("6.1."),
        "{study:#}"
    );
    assert_eq!(
        study["vm"]["kernels"][0]["boot_s"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let cells = study["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2, "{study:#}");
    for c in cells {
        assert_eq!(c["method"], "power-cut", "{c:#}");
        let trials: u64 = c["outcomes"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(trials, 2, "{c:#}");
        assert_eq!(c["recovery_ns"].as_array().unwrap().len(), 2, "{c:#}");
        assert_eq!(c["fsck_ns"].as_array().unwrap().len(), 2, "{c:#}");
        assert!(c["wait_ns"].as_u64().unwrap() < 10_000_000_000, "{c:#}");
    }
    assert_eq!(cells[0]["pattern"], "rename-fsync-dir");
    assert_eq!(cells[0]["outcomes"]["new"], 2, "{:#}", cells[0]);
    // rename-fsync-dir fsyncs the file and then the directory: two per update.
    let costs = study["costs"].as_array().unwrap();
    assert_eq!(costs.len(), 2, "{study:#}");
    let fsyncs = costs[0]["trace"]["profile"]["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "fsync")
        .map(|r| r["count"].as_u64().unwrap());
    assert_eq!(
        fsyncs,
        Some(10),
        "{:#}",
        costs[0]["trace"]["profile"]["syscalls"]
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("power-cut"));
    assert_no_vm_left();
}

/// A crash boot that hangs (its qemu stopped as it starts: a hung emulator looks the same
/// from outside) is stopped and booted again, once. It had not touched the cut trial, so
/// the boot after looks at it: no trial is lost, and the study says a boot hung.
pub fn hung_crash_boot_is_booted_again_and_loses_no_trial() {
    let dir = TempDir::new("vm-crash-hung");
    let mut child = Command::new(fsprof_bin())
        .args(["crash", "--kernel", KERNEL, "--fs", "btrfs"])
        .args([
            "--pattern",
            "rename-fsync-dir",
            "--at",
            "now",
            "--trials",
            "1",
        ])
        .args(["--cost-updates", "0", "--no-history", "--json", "c.json"])
        .env("FSPROF_VM_STALL_SECONDS", "60")
        .current_dir(&dir.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The second boot is the one that looks at the cut.
    let first = qemu_of(&mut child, None);
    let second = qemu_of(&mut child, Some(first));
    // SAFETY: kill(2) on a pid pgrep just listed; at worst a qemu that already ended.
    assert_eq!(unsafe { libc::kill(second, libc::SIGSTOP) }, 0);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("booting it again, once").count(), 1, "{err}");
    assert_eq!(
        err.matches("look at the last power cut").count(),
        2,
        "{err}"
    );
    assert_eq!(err.matches("fsprof: booting deb:").count(), 3, "{err}");
    assert!(!err.contains("is lost"), "{err}");
    checked(&[&dir.0.join("c.json")]);
    let study: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("c.json")).unwrap()).unwrap();
    let kernel = &study["vm"]["kernels"][0];
    assert_eq!(kernel["hung_boots"], 1, "{kernel:#}");
    assert_eq!(kernel["boot_s"].as_array().unwrap().len(), 2, "{kernel:#}");
    let outcomes = study["cells"][0]["outcomes"].as_object().unwrap();
    let trials: u64 = outcomes.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(trials, 1, "{outcomes:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("1 more stopped as hung and booted again"),
        "{stdout}"
    );
    assert_no_vm_left();
}

/// The pid of the qemu `child` (an fsprof) runs, other than `not`, once it runs.
fn qemu_of(child: &mut std::process::Child, not: Option<i32>) -> i32 {
    let share = format!("fsprof-{}-vm", child.id());
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let found = qemus()
            .lines()
            .filter(|l| l.contains(&share))
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, cmd)| {
                cmd.split(' ')
                    .next()
                    .is_some_and(|c| c.contains("qemu-system"))
            })
            .filter_map(|(pid, _)| pid.parse().ok())
            .find(|&pid| Some(pid) != not);
        if let Some(pid) = found {
            return pid;
        }
        assert!(Instant::now() < deadline, "no qemu started within 300 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "fsprof ended before its qemu started"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// A `run` on the Debian kernel, once its qemu runs; the name of the VM's disk image.
fn vm_run_started(json: &Path) -> (std::process::Child, String) {
    let mut child = Command::new(fsprof_bin())
        .args([
            "run",
            "--kernel",
            KERNEL,
            "--fs",
            "ext4",
            "--only",
            "extract-tree",
        ])
        .args(["--scale", "0.02", "--passes", "1", "--json"])
        .arg(json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let image = format!("fsprof-{}-vm.img", child.id());
    let deadline = Instant::now() + Duration::from_secs(120);
    while !qemus().contains(&image) {
        assert!(Instant::now() < deadline, "no qemu started within 120 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "fsprof ended before qemu started"
        );
        thread::sleep(Duration::from_millis(200));
    }
    (child, image)
}

/// The pid of the qemu that runs disk `image`.
fn qemu_pid(image: &str) -> u32 {
    let line = qemus()
        .lines()
        .find(|l| l.contains(image))
        .map(String::from);
    let line = line.unwrap_or_else(|| panic!("no qemu with {image}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// The parent of process `pid` (None when it is gone).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid …: the comm may hold spaces, the fields after it do not.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The command lines of the running qemus.
fn qemus() -> String {
    let ps = Command::new("pgrep")
        .args(["-af", "qemu-system"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&ps.stdout).into_owned()
}

/// Ctrl-C while the guest boots or runs stops fsprof with an error and the VM with it.
pub fn sigint_mid_vm_run_leaves_no_qemu() {
    let dir = TempDir::new("vm-sigint");
    let (mut child, _) = vm_run_started(&dir.0.join("r.json"));
    // Into the suite: the guest's fsprof says which step it runs (passed on to stderr).
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut pipe = child.stderr.take().unwrap();
    let log = said.clone();
    let reader = thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = std::io::Read::read(&mut pipe, &mut buf) {
            log.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    wait_until(
        "the guest running the suite",
        Duration::from_secs(600),
        || said.lock().unwrap().contains("pass 1/1: extract-tree"),
    );
    // SAFETY: kill(2) on our own child's pid; it has not been reaped (try_wait saw it run).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "fsprof still running 60 s after SIGINT"
        );
        thread::sleep(Duration::from_millis(200));
    };
    reader.join().unwrap();
    let err = said.lock().unwrap().clone();
    // Stopped by SIGINT: the status a process it killed has.
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert_no_vm_left();
}

/// A guest that prints nothing for the stall limit is taken as hung: it is stopped, booted
/// once more, and then given up with a one-line error; no qemu stays.
pub fn silent_guest_is_stopped_and_booted_again_once() {
    let dir = TempDir::new("vm-stall");
    let started = Instant::now();
    // A step silent for longer than the limit is fine (the guest's fsprof sends heartbeats);
    // a guest whose fsprof stops (as a hung guest does) is not.
    let out = Command::new(fsprof_bin())
        .args(["run", "--kernel", KERNEL, "--fs", "ext4", "--suite", "none"])
        .args(["--passes", "1", "--no-stacks", "--step", "quiet=sleep 75"])
        .args(["--step", "hang=kill -STOP $PPID; sleep 900"])
        .arg("--json")
        .arg(dir.0.join("r.json"))
        .env("FSPROF_VM_STALL_SECONDS", "60")
        .current_dir(&dir.0)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.matches("booting it again, once").count(), 1, "{err}");
    assert_eq!(err.matches("fsprof: booting deb:").count(), 2, "{err}");
    // Both stalls came from the hanging step, not from a boot that stalled on its own.
    assert_eq!(err.matches("ext4 pass 1/1: hang").count(), 2, "{err}");
    assert!(
        err.lines()
            .last()
            .is_some_and(|l| l.contains("printed nothing for 60 s")),
        "{err}"
    );
    // Stopped, not waited out: the silent step would take 900 s in each boot.
    assert!(started.elapsed() < Duration::from_secs(900), "{err}");
    let r = load_run(&dir.0.join("r.json"));
    let quiet = &r.filesystems[0].passes[0].steps[0];
    assert_eq!((quiet.step.as_str(), &quiet.error), ("quiet", &None));
    // The first stall was booted again; the second ended the run.
    assert_eq!(r.vm.unwrap().kernels[0].hung_boots, 1);
    assert_no_vm_left();
}

/// `--vm-accel kvm` where the guest cannot boot under KVM (this host's KVM is PVM: stock
/// kernels stop after "Probing EDD", or qemu fails at once to set an MSR) ends in one line
/// that says why and what to use.
pub fn kvm_that_cannot_boot_the_guest_is_one_line() {
    let started = Instant::now();
    let out = Command::new(fsprof_bin())
        .args(["list", "--kernel", KERNEL, "--vm-accel", "kvm"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("ended after {:.1} s", started.elapsed().as_secs_f64());
    // What must happen is known before: a PVM host's KVM boots no stock kernel.
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    if !pvm && Path::new("/dev/kvm").exists() {
        // A host whose KVM boots the guest: it lists the guest's filesystems.
        assert_success(&out);
        assert!(String::from_utf8_lossy(&out.stdout).contains("jfs"));
    } else {
        assert_eq!(out.status.code(), Some(2), "{err}");
        let last = err.lines().last().unwrap_or_default();
        let why = if pvm { "PVM" } else { "/dev/kvm" };
        assert!(
            last.contains(why) && last.contains("--vm-accel tcg"),
            "{err}"
        );
        // Stopped at the boot limit, not by the 20-minute stall watchdog.
        assert!(started.elapsed() < Duration::from_secs(120), "{err}");
    }
    assert_no_vm_left();
}

/// SIGKILL gives fsprof no chance to stop its VM: the qemu goes on, and `fsprof cleanup`
/// kills it and removes its disk image and shared directory.
pub fn cleanup_stops_the_vm_of_a_killed_run() {
    let dir = TempDir::new("vm-sigkill");
    let (mut child, image) = vm_run_started(&dir.0.join("r.json"));
    let qemu = qemu_pid(&image);
    child.kill().unwrap();
    child.wait().unwrap();
    // Orphaned: a parent-death signal, had fsprof set one, has been sent by then.
    wait_until("qemu orphaned", Duration::from_secs(30), || {
        parent_of(qemu) != Some(child.id())
    });
    assert!(qemus().contains(&image), "qemu ended with fsprof");
    let out = Command::new(fsprof_bin()).arg("cleanup").output().unwrap();
    assert_success(&out);
    let said = String::from_utf8_lossy(&out.stdout);
    for done in ["killed process", "removed image", "removed VM share"] {
        assert!(said.contains(done), "{done}: {said}");
    }
    // Killed with SIGKILL and reaped by init: gone within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    while qemus().contains(&image) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200));
    }
    assert_no_vm_left();
}
