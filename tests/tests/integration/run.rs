//! `fsprof run`: the matrix is filled, workloads write exactly their specs, capacity agrees
//! with df, interruption leaves nothing behind, devices are guarded, errors are one line.

use std::{path::Path, process::Command};

use fsprof::{
    aggregate::stacks::UserCompleteness,
    lab::{
        Capacity, FsKind,
        loopdev::{Image, LoopDevice},
    },
    results::RunResult,
    suite::Suite,
    workload::{self, Step, tree},
};
use fsprof_tests::*;

fn tmp_json(tag: &str) -> Results {
    Results(std::env::temp_dir().join(format!("fsprof-{tag}-{}.json", std::process::id())))
}

/// A results path in the temp dir: the file and what a run writes beside it (CSV, HTML,
/// flame graphs) are removed with it, also when the test fails.
struct Results(std::path::PathBuf);

impl std::ops::Deref for Results {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Results {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Results {
    fn drop(&mut self) {
        for ext in ["json", "csv", "html", "broken.json", "json.partial"] {
            let _ = std::fs::remove_file(self.0.with_extension(ext));
        }
        let _ = std::fs::remove_dir_all(self.0.with_extension("flames"));
    }
}

/// `fsprof run ARGS --json JSON` that must succeed, its output checked; returns its stdout.
fn run_to(json: &Path, args: &[&str]) -> String {
    let out = Command::new(fsprof_bin())
        .arg("run")
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Shown with a failing test's output: warnings (e.g. graphs not drawn) explain it.
    eprintln!("{stderr}");
    checked(&[json]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// No frame of any graph is an address outside the process's code: user frames are
/// named, `file+offset`, or a `[stack ends: …]` marker.
fn assert_no_invented_frames(flames: &Path) {
    let mut folded = 0;
    for step in std::fs::read_dir(flames).unwrap().flatten() {
        for f in std::fs::read_dir(step.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if f.path().extension().is_some_and(|e| e == "folded") {
                let text = std::fs::read_to_string(f.path()).unwrap();
                for bad in ["[unknown]", "[mapping not recorded]"] {
                    assert!(!text.contains(bad), "{bad} in {}", f.path().display());
                }
                folded += 1;
            }
        }
    }
    assert!(folded > 0, "no folded stacks in {}", flames.display());
}

/// Every user stack of `f`'s cells, merged.
fn user_stacks(f: &fsprof::results::FsRun) -> UserCompleteness {
    let mut u = UserCompleteness::default();
    for s in f.passes.iter().flat_map(|p| &p.steps) {
        u.merge(&s.trace.stacks.as_ref().unwrap().user_stacks);
    }
    u
}

fn quick_step_names() -> Vec<&'static str> {
    let quick = Suite::find("quick").unwrap();
    quick.steps.iter().map(|s| s.name()).collect()
}

fn quick_steps_len() -> usize {
    quick_step_names().len()
}

pub fn quick_suite_fills_every_cell() {
    let json = tmp_json("quick");
    let stdout = run_to(
        &json,
        &["--fs", "ext4,xfs,btrfs", "--passes", "2", "--scale", "0.02"],
    );
    let r = load_run(&json);
    assert_no_invented_frames(&json.with_extension("flames"));
    // The whole output through `fsprof check`, as a user would run it (CI's log shows it).
    let check = Command::new(fsprof_bin())
        .arg("check")
        .arg(&*json)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    eprintln!("fsprof check {}:\n{said}", json.display());
    assert_success(&check);
    for must in [
        "time-classes-add-up",
        "off-cpu-stacks-equal-classes",
        "folded-totals-match-stacks",
        "kernel-frames-are-functions",
    ] {
        assert!(
            said.lines()
                .any(|l| l.starts_with("ok") && l.contains(must)),
            "{must}: {said}"
        );
    }
    assert!(r.complete);
    // Every cell has stacks and flame graphs (folded per pass, SVGs per cell).
    assert_eq!(
        r.flames.cells.len(),
        quick_steps_len(),
        "{:?}",
        r.flames.cells.keys()
    );
    for (step, cells) in &r.flames.cells {
        assert_eq!(cells.len(), 3, "{step}: {:?}", cells.keys());
        for (fs, files) in cells {
            assert!(files.contains_key("combined.svg"), "{step} {fs}: {files:?}");
        }
    }
    // A differential graph for every other filesystem and kind with time to draw (a
    // millisecond step may get no on-CPU sample at all).
    let base = &r.filesystems[0].fs;
    let drawable: usize = r
        .flames
        .cells
        .values()
        .flat_map(|cells| cells.iter().filter(|(fs, _)| *fs != base))
        .map(|(_, files)| {
            ["off-cpu", "on-cpu", "combined"]
                .iter()
                .filter(|k| files.contains_key(&format!("{k}.svg")))
                .count()
        })
        .sum();
    assert!(drawable >= quick_steps_len() * 2, "{drawable}");
    let against_first = (r.flames.diffs.iter()).filter(|d| d.base == *base);
    assert_eq!(against_first.count(), drawable);
    // The others: a step's slowest against its fastest (the pair the reports explain),
    // where the fastest is not the first.
    let rows = fsprof::report::run_summary::rows(&r);
    for d in r.flames.diffs.iter().filter(|d| d.base != *base) {
        let pair = fsprof::report::run_summary::slowest_and_fastest(&rows, &d.step);
        assert_eq!(pair, Some((d.fs.as_str(), d.base.as_str())), "{d:?}");
    }
    let quick = Suite::find("quick").unwrap();
    assert_eq!(r.filesystems.len(), 3);
    // Requests not seen completing, over the whole run (see `assert_unseen_bound`).
    let mut unseen = (0, 0);
    for f in &r.filesystems {
        assert_eq!(f.passes.len(), 2, "{}", f.fs);
        for p in &f.passes {
            assert!(
                p.mkfs_ns > 0 && p.mount_ns > 0 && p.umount_ns.is_some(),
                "{} {}",
                f.fs,
                p.pass
            );
            assert!(p.capacity_after_mkfs.total_bytes > 0);
            let names: Vec<&str> = p.steps.iter().map(|s| s.step.as_str()).collect();
            let want: Vec<&str> = quick.steps.iter().map(|s| s.name()).collect();
            assert_eq!(names, want, "{} pass {}", f.fs, p.pass);
            for s in &p.steps {
                let t = &s.trace;
                assert_eq!(t.exit_code, Some(0), "{} {}", f.fs, s.step);
                assert!(
                    t.wall_ns > 0 && !t.profile.syscalls.is_empty(),
                    "{} {}",
                    f.fs,
                    s.step
                );
                let (u, i) = unseen_of(&t.profile, &format!("{} {}", f.fs, s.step));
                unseen.0 += u;
                unseen.1 += i;
            }
            // Writing steps reach the device under test, and only it is reported.
            let copy = p.steps.iter().find(|s| s.step == "copy-tree").unwrap();
            assert!(
                copy.trace
                    .profile
                    .block
                    .iter()
                    .any(|b| b.class == "write" && b.bytes > 0)
            );
        }
    }
    // The terminal summary: a row per step and filesystem, the fastest at 1.00×.
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() >= 6 && w.iter().any(|c| c.ends_with('×')))
        .collect();
    assert_eq!(rows.len(), quick_steps_len() * 3, "{stdout}");
    for step in quick.steps.iter() {
        assert!(
            rows.iter().any(|r| r[0] == step.name()),
            "{} missing: {stdout}",
            step.name()
        );
    }
    assert_unseen_bound(unseen.0, unseen.1, "the quick suite");
    assert!(rows.iter().filter(|r| r.contains(&"1.00×")).count() >= quick_steps_len());
    assert!(stdout.contains("--verbose"), "{stdout}");
    // fsprof's own workloads, bonnie++ and IOzone have whole user stacks, and say so.
    for f in &r.filesystems {
        let u = user_stacks(f);
        let (on, off) = (u.on_cpu_share().unwrap(), u.off_cpu_share().unwrap());
        eprintln!(
            "{}: user stacks whole {on:.4} on-CPU, {off:.4} off-CPU; {:?}",
            f.fs, u.ends
        );
        // Off-CPU 99.99 % here (with crti's `_fini` unwound: 97.6-99.9 % before, each
        // process's exit faulting the page of every library's `_fini` on a cold cache);
        // under 98 % a class of stacks lost its user part.
        assert!(on >= 0.95 && off >= 0.98, "{}: {u:?}", f.fs);
        assert!(
            stdout.contains(&format!("{}: user stacks whole", f.fs)),
            "{stdout}"
        );
    }
}

fn ctx_on(mnt: &Path, src: &Path) -> workload::Ctx {
    let mut ctx = Suite::find("quick").unwrap().ctx(0.01, 3, 1);
    ctx.dir = mnt.to_path_buf();
    ctx.src = src.to_path_buf();
    ctx.big_size = 6 << 20;
    ctx
}

pub fn workloads_write_exactly_their_specs() {
    let fs = lab(FsKind::Ext4, 1 << 30, "");
    let mnt = fs.mountpoint().to_path_buf();
    let src = Path::new("/var/tmp/fsprof-tests/sources");
    let ctx = ctx_on(&mnt, src);
    let plan = ctx.tree_spec().plan();
    let run = |step: Step| {
        workload::prepare(step, &ctx).unwrap();
        workload::run(step, &ctx).unwrap();
    };

    run(Step::ExtractTree);
    assert_eq!(tree::measure(&mnt.join("tree")).unwrap(), plan.totals());
    run(Step::CopyTree);
    assert_eq!(
        tree::measure(&mnt.join("tree-copy")).unwrap(),
        plan.totals()
    );
    run(Step::ListTree);
    let lines = std::fs::read_to_string(mnt.join("listing.txt"))
        .unwrap()
        .lines()
        .count() as u64;
    assert_eq!(lines, plan.totals().dirs + plan.totals().files);
    let c_files = plan
        .files
        .iter()
        .filter(|(p, _)| p.to_string_lossy().ends_with(".c"))
        .count() as u64;
    assert_eq!(tree::find(&mnt.join("tree"), "*.c").unwrap(), c_files);
    run(Step::DeleteTree);
    assert!(!mnt.join("tree").exists() && !mnt.join("tree-copy").exists());
    run(Step::TreeIn);
    assert_eq!(tree::measure(&mnt.join("tree")).unwrap(), plan.totals());

    run(Step::BigIn);
    let big = std::fs::read(mnt.join("big.bin")).unwrap();
    assert_eq!(big.len() as u64, ctx.big_size);
    run(Step::BigCopy);
    assert!(std::fs::read(mnt.join("big-copy.bin")).unwrap() == big);
    run(Step::Remux);
    let remux = std::fs::read(mnt.join("big-remux.bin")).unwrap();
    let mib = 1 << 20;
    assert_eq!(remux.len(), big.len());
    assert!(remux[..mib] == big[mib..2 * mib] && remux[mib..2 * mib] == big[..mib]);
    run(Step::DeleteBig);
    assert!(!mnt.join("big.bin").exists() && !mnt.join("big-remux.bin").exists());

    run(Step::Db);
    let spec = workload::db::DbSpec {
        transactions: ctx.db_transactions,
        data_pages: ctx.db_pages,
        seed: ctx.seed,
    };
    assert_eq!(
        std::fs::metadata(mnt.join("db.wal")).unwrap().len(),
        spec.wal_bytes()
    );
    assert_eq!(
        std::fs::metadata(mnt.join("db.data")).unwrap().len(),
        spec.data_pages * workload::db::PAGE
    );
    run(Step::Cpu);
    assert_eq!(std::fs::metadata(mnt.join("cpu.out")).unwrap().len(), 32);

    run(Step::SeqWrite);
    assert_eq!(
        std::fs::metadata(mnt.join("seq.bin")).unwrap().len(),
        ctx.big_size
    );

    // bonnie++ phases.
    let b = ctx.bonnie_spec();
    let dat = || std::fs::metadata(mnt.join("bonnie.dat")).unwrap().len();
    run(Step::BonniePutc);
    assert_eq!(dat(), b.file_size);
    run(Step::BonnieWrite);
    assert_eq!(dat(), b.file_size);
    run(Step::BonnieRewrite);
    assert_eq!(dat(), b.file_size);
    assert_eq!(workload::bonnie::getc(&mnt).unwrap(), b.file_size);
    assert_eq!(workload::bonnie::read_blocks(&mnt).unwrap(), b.file_size);
    run(Step::BonnieSeeks);
    for (random, root) in [(false, "bonnie-seq"), (true, "bonnie-random")] {
        let (create, stat, delete) = if random {
            (
                Step::BonnieRandCreate,
                Step::BonnieRandStat,
                Step::BonnieRandDelete,
            )
        } else {
            (
                Step::BonnieSeqCreate,
                Step::BonnieSeqStat,
                Step::BonnieSeqDelete,
            )
        };
        run(create);
        let set = workload::bonnie::file_set(&b, random);
        let want = tree::TreeTotals {
            dirs: b.dirs as u64,
            files: b.files as u64,
            bytes: set.iter().map(|f| f.1).sum(),
        };
        assert_eq!(tree::measure(&mnt.join(root)).unwrap(), want, "{root}");
        run(stat);
        run(delete);
        assert!(!mnt.join(root).exists());
    }

    // IOzone: one file per size of the matrix, each exactly that size.
    run(Step::IozoneWrite);
    for (size, _) in workload::iozone::matrix(ctx.iozone_max_file) {
        let len = std::fs::metadata(mnt.join(format!("iozone-{size}.tmp")))
            .unwrap()
            .len();
        assert_eq!(len, size);
    }
    for step in [
        Step::IozoneRewrite,
        Step::IozoneRead,
        Step::IozoneReread,
        Step::IozoneRandRead,
        Step::IozoneRandWrite,
        Step::IozoneLarge,
    ] {
        run(step);
    }
    let moved = workload::iozone::large(&mnt, ctx.iozone_large, 1).unwrap();
    assert_eq!(moved, 2 * (ctx.iozone_large / (128 << 10)) * (128 << 10));
}

pub fn capacity_matches_df() {
    for kind in [FsKind::Ext4, FsKind::Xfs, FsKind::Btrfs] {
        let fs = lab(kind, 1 << 30, "");
        std::fs::write(fs.mountpoint().join("f"), vec![7u8; 3 << 20]).unwrap();
        fs.syncfs().unwrap();
        let ours = Capacity::of(fs.mountpoint()).unwrap();
        let out = Command::new("df")
            .args(["-B1", "--output=size,used,avail"])
            .arg(fs.mountpoint())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<u64> = text
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(
            (ours.total_bytes, ours.used_bytes, ours.avail_bytes),
            (v[0], v[1], v[2]),
            "{kind}"
        );
    }
}

pub fn sigint_mid_run_leaves_nothing_and_a_valid_partial_file() {
    let json = tmp_json("sigint");
    let child = Command::new(fsprof_bin())
        .args(["run", "--fs", "ext4,xfs", "--passes", "3", "--json"])
        .arg(&json)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first finished step, then interrupt.
    let start = std::time::Instant::now();
    while !json.exists() && start.elapsed().as_secs() < 120 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let pid = child.id();
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let r = load_run(&json);
    assert!(
        !r.complete && r.interrupted.is_some(),
        "{:?}",
        r.interrupted
    );
    assert!(!r.filesystems[0].passes[0].steps.is_empty());
    assert_nothing_left_of(pid);
}

pub fn devices_in_use_or_with_data_are_refused() {
    let image = Image::create(Path::new("/var/tmp/fsprof-tests"), "guard", 256 << 20).unwrap();
    let dev = LoopDevice::attach(&image).unwrap();
    let run_on = |extra: &[&str]| {
        Command::new(fsprof_bin())
            .args(["run", "--fs", "ext4", "--passes", "1", "--device"])
            .arg(&dev.path)
            .args(extra)
            .output()
            .unwrap()
    };
    // Empty device: accepted (a real run on it).
    let json = tmp_json("guard");
    let ok = run_on(&["--scale", "0.005", "--json", json.to_str().unwrap()]);
    assert_success(&ok);
    checked(&[&json]);
    // Now it carries the ext4 fsprof made: refused without --force.
    let refused = run_on(&[]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("carries a ext4 signature") && err.contains("--force"),
        "{err}"
    );
    // Mounted: refused even with --force.
    let mnt = Path::new("/run/fsprof-tests-guard");
    std::fs::create_dir_all(mnt).unwrap();
    assert!(
        Command::new("mount")
            .arg(&dev.path)
            .arg(mnt)
            .status()
            .unwrap()
            .success()
    );
    let refused = run_on(&["--force"]);
    let _ = Command::new("umount").arg(mnt).status();
    let _ = std::fs::remove_dir(mnt);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is mounted at"), "{err}");
}

pub fn bad_names_are_one_line_errors() {
    let out = Command::new(fsprof_bin())
        .args(["run", "--fs", "ext4,zfs"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("unknown filesystem \"zfs\"") && err.contains("known: ext2"),
        "{err}"
    );
}

pub fn missing_mkfs_tools_are_one_line_errors() {
    // mkfs.xfs lives in /usr/sbin: without it on PATH the error names the package.
    let out = Command::new(fsprof_bin())
        .args(["run", "--fs", "xfs"])
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("mkfs.xfs not found") && err.contains("apt-get install xfsprogs"),
        "{err}"
    );
    let out = Command::new(fsprof_bin())
        .args(["run", "--fs", "jfs"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("has no jfs filesystem driver"), "{err}");
}

pub fn external_and_pgbench_steps_are_traced() {
    let json = tmp_json("external");
    let said = run_to(
        &json,
        &[
            "--suite",
            "none",
            "--fs",
            "xfs",
            "--passes",
            "1",
            "--pgbench",
            "1,2,3",
            "--step",
            "fill=dd if=/dev/zero of={mnt}/zeros bs=1M count=32 status=none",
        ],
    );
    let r = load_run(&json);
    assert_no_invented_frames(&json.with_extension("flames"));
    let steps = &r.filesystems[0].passes[0].steps;
    let names: Vec<&str> = steps.iter().map(|s| s.step.as_str()).collect();
    assert_eq!(names, ["fill", "pgbench"]);
    // The template ran on the fs under test: its 32 MiB reached the loop device.
    let written = fsprof_tests::block_bytes(&steps[0].trace, "write");
    assert!(written >= 32 << 20, "{written}");
    // pgbench: the server's processes were followed (they do the fsyncs), and tps parsed.
    let pg = &steps[1];
    assert!(
        pg.metrics.get("tps").is_some_and(|&t| t > 0.0),
        "{:?}",
        pg.metrics
    );
    // Its summary row is its rate (pgbench ran for the 3 s it was given), and its average
    // latency is kept: clients / latency is the rate, as pgbench computes it.
    let tps = pg.metrics["tps"];
    let latency_ms = pg.metrics["latency_ms"];
    assert!(
        said.contains(&format!("{tps:.1} tps, {latency_ms:.3} ms avg")),
        "{said}"
    );
    let latency_s = latency_ms / 1e3;
    let implied = 2.0 / latency_s;
    assert!((implied - tps).abs() <= 0.05 * tps, "{:?}", pg.metrics);
    let fsyncs: u64 = pg
        .trace
        .profile
        .syscalls
        .iter()
        .filter(|s| s.op == "sync")
        .map(|s| s.count)
        .sum();
    assert!(fsyncs > 0, "no fsync/fdatasync from the server");
    // PostgreSQL's and pgbench's user stacks are whole (unwound without frame pointers).
    let u = &pg.trace.stacks.as_ref().unwrap().user_stacks;
    assert!(u.on_cpu > 100 && u.on_cpu_share().unwrap() >= 0.95, "{u:?}");
    // And it is stopped: nothing holds the filesystem, which was unmounted.
    assert!(r.filesystems[0].passes[0].umount_ns.is_some());
    // explain's heaviest wait is a wait of the work, not runuser's for pgbench (its
    // children's time, which the classes leave out too).
    let explain = Command::new(fsprof_bin())
        .args(["explain", json.to_str().unwrap(), "--step", "pgbench"])
        .args(["--fs", "xfs"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&explain.stdout);
    assert!(explain.status.success(), "{text}");
    assert!(!text.contains("do_wait"), "{text}");
    // compare judges pgbench by its tps, not by the bytes its calls moved in the 3 s.
    let cmp = TempDir::new("pgbench-compare");
    let rows = cmp.0.join("cmp.json");
    let out = Command::new(fsprof_bin())
        .args([
            "compare",
            json.to_str().unwrap(),
            json.to_str().unwrap(),
            "--json",
        ])
        .arg(&rows)
        .output()
        .unwrap();
    assert_success(&out);
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&rows).unwrap()).unwrap();
    let of_pgbench: Vec<(&str, &str)> = (c["rows"].as_array().unwrap().iter())
        .filter(|r| r["step"] == "pgbench")
        .map(|r| (r["metric"].as_str().unwrap(), r["unit"].as_str().unwrap()))
        .collect();
    assert!(of_pgbench.contains(&("tps", "/s")), "{of_pgbench:?}");
    assert!(
        !of_pgbench.iter().any(|(m, _)| *m == "throughput"),
        "{of_pgbench:?}"
    );
}

pub fn report_rerenders_results_and_rejects_broken_files() {
    let json = tmp_json("report");
    let stdout = run_to(
        &json,
        &[
            "--suite",
            "none",
            "--fs",
            "ext4",
            "--passes",
            "1",
            "--step",
            "touch=touch {mnt}/a",
        ],
    );
    let report = |args: &[&str], file: &Path| {
        Command::new(fsprof_bin())
            .arg("report")
            .arg(file)
            .args(args)
            .output()
            .unwrap()
    };
    let table = report(&[], &json);
    assert!(table.status.success());
    // The same table `run` printed, from the file alone.
    assert_eq!(String::from_utf8_lossy(&table.stdout), stdout);
    // -v: per step, the time classes as columns and a row per pass.
    let verbose = String::from_utf8(report(&["-v"], &json).stdout).unwrap();
    let header = verbose.lines().find(|l| l.contains("I/O wait"));
    for class in [
        "user",
        "sys",
        "kernel bg",
        "I/O wait",
        "run-queue",
        "syncfs",
    ] {
        assert!(
            header.is_some_and(|h| h.contains(class)),
            "{class}: {verbose}"
        );
    }
    let rows: Vec<&str> = verbose
        .lines()
        .filter(|l| l.split_whitespace().take(2).eq(["ext4", "1"]))
        .collect();
    assert_eq!(rows.len(), 1, "{verbose}");
    let csv = String::from_utf8(report(&["--format", "csv"], &json).stdout).unwrap();
    assert!(
        csv.starts_with("fs,pass,step,")
            && csv.lines().nth(1).unwrap().starts_with("ext4,1,touch,")
    );

    // Truncated, then not JSON, then another schema: one line each, exit 2.
    let text = std::fs::read_to_string(&*json).unwrap();
    let broken = json.with_extension("broken.json");
    for (content, needle) in [
        (&text[..text.len() / 2], "is not valid JSON"),
        ("hello", "is not valid JSON"),
        ("{\"schema_version\": 99}", "results schema 99"),
        ("{\"a\": 1}", "not an fsprof results file"),
    ] {
        std::fs::write(&broken, content).unwrap();
        let out = report(&[], &broken);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    }
}

/// A step that fails on one filesystem (ENOSPC on a small one) marks its cell and the cells
/// that need it, and the study goes on; `--fail-fast` stops at it.
pub fn a_failed_cell_does_not_stop_the_study() {
    let json = tmp_json("keep-going");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "run",
            "--fs",
            "ext4",
            "--size",
            "64M",
            "--passes",
            "2",
            "--no-stacks",
            "--only",
            "extract-tree,find",
            "--scale",
            "0.2",
            "--step",
            "after=ls {mnt}",
            "--json",
        ];
        a.push(json.to_str().unwrap());
        a.extend(extra);
        Command::new(fsprof_bin()).args(a).output().unwrap()
    };
    let out = args(&[]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("4 cells failed"), "{stderr}");
    let r = load_run(&json);
    assert!(r.complete, "{:?}", r.interrupted);
    let f = &r.filesystems[0];
    assert_eq!(f.passes.len(), 2, "both passes ran");
    for p in &f.passes {
        let by: std::collections::BTreeMap<&str, &fsprof::results::StepRun> =
            p.steps.iter().map(|s| (s.step.as_str(), s)).collect();
        let extract = by["extract-tree"].error.as_deref().unwrap_or_default();
        assert!(extract.starts_with("exited with status"), "{extract}");
        assert_eq!(
            by["find"].error.as_deref(),
            Some("not run: needs extract-tree, which failed")
        );
        assert_eq!(by["after"].error, None, "after ran and worked");
        assert_eq!(by["after"].trace.exit_code, Some(0));
    }
    // The summary shows the cell that worked and lists the failed ones; the CSV says why.
    assert!(stdout.contains("FAILED: 4 cells"), "{stdout}");
    assert!(
        stdout.contains("ext4 find pass 2: not run: needs extract-tree"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(json.with_extension("csv")).unwrap();
    assert!(
        csv.lines()
            .next()
            .unwrap()
            .ends_with(",error,rate,rate_unit,latency_ms"),
        "{csv}"
    );
    assert!(csv.contains("exited with status"), "{csv}");
    // Explain says the cell failed; compare leaves it out and says so.
    let explain = Command::new(fsprof_bin())
        .args([
            "explain",
            json.to_str().unwrap(),
            "--step",
            "find",
            "--fs",
            "ext4",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&explain.stderr);
    assert!(err.contains("failed on ext4 in every pass"), "{err}");
    let cmp = Command::new(fsprof_bin())
        .args(["compare", json.to_str().unwrap(), json.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&cmp.stdout);
    assert!(
        said.contains("ext4 find: failed in 2 passes of the base side"),
        "{said}"
    );
    assert!(said.contains("not compared"), "{said}");

    // --fail-fast: the first failure ends the run, with what it finished saved.
    let out = args(&["--fail-fast"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("step extract-tree failed on ext4 (pass 1)"),
        "{err}"
    );
    let r = load_run(&json);
    assert_eq!(r.filesystems[0].passes[0].steps.len(), 1);
}

/// A one-pass run of `args` on `fs` ending in a step `look` that runs `listing` (a shell
/// command, `{mnt}` = the mount point): what it printed, per line, and the results.
fn looked(tag: &str, fs: &str, args: &[&str], listing: &str) -> (Vec<String>, RunResult) {
    let out = std::env::temp_dir().join(format!("fsprof-{tag}-{}.txt", std::process::id()));
    let step = format!("look={} > {}", listing, out.display());
    let mut all = vec!["--fs", fs, "--passes", "1", "--step", &step];
    all.extend_from_slice(args);
    let json = tmp_json(tag);
    run_to(&json, &all);
    let r = load_run(&json);
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    (text.lines().map(String::from).collect(), r)
}

/// What an extra step after `extract-tree` wrote: its stdout file, per line.
fn after_extract(tag: &str, args: &[&str], listing: &str) -> Vec<String> {
    let mut all = vec!["--only", "extract-tree"];
    all.extend_from_slice(args);
    looked(tag, "ext4", &all, listing).0
}

/// `--seed`: the same seed makes the same tree (names and contents, hashed by md5sum, not by
/// fsprof's code), another seed another tree.
pub fn the_seed_decides_the_tree() {
    let hash = "cd {mnt} && find . -type f -exec md5sum {} + | sort | md5sum";
    let tree = |tag, seed| after_extract(tag, &["--scale", "0.02", "--seed", seed], hash);
    let (a, b, c) = (
        tree("seed-a", "7"),
        tree("seed-b", "7"),
        tree("seed-c", "8"),
    );
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a, b, "seed 7 twice made different trees");
    assert_ne!(a, c, "seeds 7 and 8 made the same tree");
}

/// `--jobs 3`: three copies ran, each in its own directory, and at once: the span of each
/// job's file modification times (find's, not fsprof's) overlaps every other's.
pub fn jobs_run_at_once() {
    let lines = after_extract(
        "jobs",
        &["--scale", "0.2", "--jobs", "3"],
        "find {mnt} -type f -path '*/job-*' -printf '%P %T@\\n'",
    );
    let mut spans: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    for l in &lines {
        let (path, t) = l.rsplit_once(' ').unwrap();
        let job = path
            .split('/')
            .find(|c| c.starts_with("job-"))
            .unwrap()
            .to_string();
        let t: f64 = t.parse().unwrap();
        let s = spans.entry(job).or_insert((t, t));
        *s = (s.0.min(t), s.1.max(t));
    }
    assert_eq!(spans.len(), 3, "{spans:?}");
    for (a, sa) in &spans {
        for (b, sb) in &spans {
            assert!(
                sa.0 <= sb.1 && sb.0 <= sa.1,
                "{a} {sa:?} and {b} {sb:?} did not run at once"
            );
        }
    }
    eprintln!("job spans (file mtimes): {spans:?}");
}

/// Regular files under a directory as `find` lists them: relative path → size.
type Files = std::collections::BTreeMap<String, u64>;

const FIND_FILES: &str = "find {mnt} -type f -printf '%P\\t%s\\n'";

fn files_of(lines: &[String]) -> Files {
    lines
        .iter()
        .filter_map(|l| l.split_once('\t'))
        .map(|(p, s)| (p.to_string(), s.parse().unwrap()))
        .collect()
}

/// The files of `all` under `dir/`, relative to it.
fn under(all: &Files, dir: &str) -> Files {
    all.iter()
        .filter_map(|(p, s)| Some((p.strip_prefix(dir)?.to_string(), *s)))
        .collect()
}

/// What a step of a suite leaves on the filesystem, as `find` sees it: files added under
/// these paths, the files under them removed, or the same names (then it must have read
/// or written the device).
enum Leaves {
    Adds(&'static [&'static str]),
    Removes(&'static [&'static str]),
    Same,
}

fn leaves(step: &str) -> Leaves {
    use Leaves::*;
    match step {
        "extract-tree" | "tree-in" => Adds(&["tree/"]),
        "copy-tree" => Adds(&["tree-copy/"]),
        "list-tree" => Adds(&["listing.txt"]),
        "delete-tree" => Removes(&["tree/", "tree-copy/"]),
        "big-in" => Adds(&["big.bin"]),
        "big-copy" => Adds(&["big-copy.bin"]),
        "remux" => Adds(&["big-remux.bin"]),
        "delete-big" => Removes(&["big.bin", "big-copy.bin", "big-remux.bin"]),
        "bonnie-putc" => Adds(&["bonnie.dat"]),
        "bonnie-seq-create" => Adds(&["bonnie-seq/"]),
        "bonnie-seq-delete" => Removes(&["bonnie-seq/"]),
        "bonnie-rand-create" => Adds(&["bonnie-random/"]),
        "bonnie-rand-delete" => Removes(&["bonnie-random/"]),
        "iozone-write" => Adds(&["iozone-"]),
        "seq-write" => Adds(&["seq.bin"]),
        "cpu" => Adds(&["cpu."]),
        "pgbench" => Adds(&["pgdata/"]),
        _ => Same,
    }
}

/// `step` took the filesystem from `before` to `after` as it should; `moved` = the bytes
/// it read and wrote on the device.
fn check_leaves(step: &str, before: &Files, after: &Files, moved: u64) {
    let is_under = |p: &str, dirs: &[&str]| dirs.iter().any(|d| p.starts_with(d));
    let added: Vec<&String> = after.keys().filter(|p| !before.contains_key(*p)).collect();
    let removed: Vec<&String> = before.keys().filter(|p| !after.contains_key(*p)).collect();
    match leaves(step) {
        Leaves::Adds(dirs) => {
            assert!(removed.is_empty(), "{step} removed {removed:?}");
            assert!(!added.is_empty(), "{step} added nothing");
            assert!(added.iter().all(|p| is_under(p, dirs)), "{step}: {added:?}");
        }
        Leaves::Removes(dirs) => {
            assert!(added.is_empty(), "{step} added {added:?}");
            let want: Vec<&String> = before.keys().filter(|p| is_under(p, dirs)).collect();
            assert!(!want.is_empty() && removed == want, "{step}: {removed:?}");
        }
        Leaves::Same => {
            assert!(
                added.is_empty() && removed.is_empty(),
                "{step}: +{added:?} -{removed:?}"
            );
            assert!(moved > 0, "{step} moved no data on the device");
        }
    }
}

/// What a copy step copied is its source, by find's names and stat's sizes.
fn check_copies(step: &str, after: &Files, sources: &Path) {
    let source = |prefix: &str| {
        std::fs::read_dir(sources)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix}* in {}", sources.display()))
    };
    match step {
        "tree-in" => {
            let src = Command::new("find")
                .arg(source("tree-"))
                .args(["-type", "f", "-printf", "%P\t%s\n"])
                .output()
                .unwrap();
            let lines: Vec<String> = String::from_utf8(src.stdout)
                .unwrap()
                .lines()
                .map(String::from)
                .collect();
            assert_eq!(under(after, "tree/"), files_of(&lines));
        }
        "copy-tree" => assert_eq!(under(after, "tree-copy/"), under(after, "tree/")),
        "big-in" => {
            let len = std::fs::metadata(source("big-")).unwrap().len();
            assert_eq!(after["big.bin"], len);
        }
        "big-copy" => assert_eq!(after["big-copy.bin"], after["big.bin"]),
        "remux" => assert_eq!(after["big-remux.bin"], after["big.bin"]),
        _ => {}
    }
}

/// A bonnie++ or iozone step has its rate; a writing one's rate over its time is the data
/// its write syscalls moved (fsprof's syscall figures, which syscalls.rs holds to strace).
fn check_rate(step: &str, s: &fsprof::results::StepRun) {
    if !(step.starts_with("bonnie-") || step.starts_with("iozone-")) {
        return;
    }
    let (unit, rate) = fsprof::workload::rate::of(&s.metrics)
        .unwrap_or_else(|| panic!("{step}: no rate in {:?}", s.metrics));
    assert!(rate > 0.0, "{step}: {rate}");
    if !["bonnie-write", "iozone-write"].contains(&step) {
        return;
    }
    assert_eq!(unit.shown, "KiB/s");
    let kib = rate * s.trace.wall_ns as f64 / 1e9;
    let written: u64 = (s.trace.profile.syscalls.iter())
        .filter(|c| c.name == "write")
        .filter_map(|c| c.bytes)
        .sum();
    let written = written as f64 / 1024.0;
    assert!(
        (kib - written).abs() <= 0.001 * written,
        "{step}: {rate} KiB/s over {} ns is {kib} KiB, its writes moved {written} KiB",
        s.trace.wall_ns
    );
}

/// A directory on the host disk (not tmpfs, as `--dir` must be), removed with the guard.
fn host_dir(tag: &str) -> TempDir {
    let dir = format!("/var/tmp/fsprof-test-{tag}-{}", std::process::id());
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir.into())
}

/// Every suite at a tiny scale: after each step (a run of the suite's steps up to it, then
/// a look with find) the filesystem holds what the step should have left (copies equal to
/// their sources by find and stat, deletes gone), and a step that leaves the same files
/// read or wrote the device (fsprof's block figures, which block.rs holds to /sys/block).
pub fn every_suite_at_tiny_scale_does_each_step() {
    let base = host_dir("suites");
    for name in ["desktop", "build-tree", "file-server", "iozone", "distro"] {
        let suite = Suite::find(name).unwrap();
        let mut steps: Vec<&str> = suite.steps.iter().map(|s| s.name()).collect();
        if suite.pgbench.is_some() {
            steps.push("pgbench");
        }
        let dir = base.0.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let dir_arg = dir.to_string_lossy().into_owned();
        let mut before = Files::new();
        for k in 1..=steps.len() {
            let only = steps[..k].join(",");
            let args = [
                "--suite",
                name,
                "--scale",
                "0.002",
                "--only",
                &only,
                "--dir",
                &dir_arg,
                "--no-history",
                "--no-stacks",
            ];
            let (lines, r) = looked(&format!("suite-{name}"), "ext4", &args, FIND_FILES);
            let after = files_of(&lines);
            let step = steps[k - 1];
            let trace = &r.filesystems[0].passes[0].steps[k - 1];
            assert_eq!(trace.step, step);
            let moved = block_bytes(&trace.trace, "read") + block_bytes(&trace.trace, "write");
            check_leaves(step, &before, &after, moved);
            check_rate(step, trace);
            check_copies(step, &after, &dir.join("sources"));
            eprintln!("{name} {step}: {} files, {moved} bytes moved", after.len());
            before = after;
        }
    }
}

/// Each step ends in one freeze and thaw of the filesystem (counted by strace, not by
/// fsprof), with its time in the results; `--no-quiesce` makes none and records none.
pub fn quiesce_freezes_once_per_step_and_no_quiesce_never() {
    let steps = ["extract-tree", "delete-tree"];
    for (flag, want) in [(None, steps.len()), (Some("--no-quiesce"), 0)] {
        let json = tmp_json("quiesce");
        let log = json.with_extension("strace");
        let out = Command::new("strace")
            .args(["-f", "--seccomp-bpf", "-e", "trace=ioctl", "-o"])
            .arg(&log)
            .arg(fsprof_bin())
            .args(["run", "--fs", "xfs", "--scale", "0.002", "--passes", "1"])
            .args(["--only", &steps.join(","), "--no-history", "--no-stacks"])
            .args(flag)
            .arg("--json")
            .arg(&*json)
            .output()
            .unwrap();
        assert_success(&out);
        let text = std::fs::read_to_string(&log).unwrap();
        let _ = std::fs::remove_file(&log);
        let calls = |op: &str| text.lines().filter(|l| l.contains(op)).count();
        assert_eq!(
            (calls("FIFREEZE"), calls("FITHAW")),
            (want, want),
            "{flag:?}"
        );
        let r = load_run(&json);
        for s in &r.filesystems[0].passes[0].steps {
            assert_eq!(
                s.trace.quiesce_ns.is_some(),
                want > 0,
                "{flag:?} {}",
                s.step
            );
        }
    }
}

/// A run on ntfs-3g (FUSE): the quick suite at a tiny scale fills every cell, the tree it
/// copied in last is its source by find and stat, and ntfs-3g's work is background work.
pub fn a_run_on_ntfs_3g_fills_every_cell() {
    FsKind::Ntfs.check_available().unwrap();
    let dir = host_dir("ntfs");
    let d = dir.0.to_string_lossy().into_owned();
    let args = ["--scale", "0.002", "--dir", &d, "--no-history"];
    let (lines, r) = looked("ntfs", "ntfs", &args, FIND_FILES);
    assert!(r.complete);
    let pass = &r.filesystems[0].passes[0];
    let mut want: Vec<&str> = quick_step_names();
    want.push("look");
    let names: Vec<&str> = pass.steps.iter().map(|s| s.step.as_str()).collect();
    assert_eq!(names, want);
    for s in &pass.steps {
        assert_eq!(s.trace.exit_code, Some(0), "{}", s.step);
    }
    check_copies("tree-in", &files_of(&lines), &dir.0.join("sources"));
    let copy = pass.steps.iter().find(|s| s.step == "copy-tree").unwrap();
    let bg = copy.trace.background.as_ref().unwrap();
    assert!(fs_daemon_ns(bg, "ntfs-3g") > 0, "{bg:?}");
}

/// `--only delete-tree` extracts the tree it deletes first, and `--prepare` writes the file a
/// `--step` reads: both untraced on each pass's fresh filesystem, recorded as preparation,
/// not as results.
pub fn a_step_alone_gets_its_preparation_untraced() {
    let json = tmp_json("prepare");
    let out = Command::new(fsprof_bin())
        .args(["run", "--fs", "ext4", "--scale", "0.002", "--passes", "2"])
        .args(["--only", "delete-tree", "--no-history", "--no-stacks"])
        .args([
            "--prepare",
            "fill=dd if=/dev/zero of={mnt}/f bs=1M count=8 conv=fsync status=none",
            "--step",
            "read-f=cat {mnt}/f > /dev/null",
            "--json",
        ])
        .arg(&*json)
        .output()
        .unwrap();
    assert_success(&out);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("(not results): extract-tree, fill"), "{said}");
    let r = load_run(&json);
    for p in &r.filesystems[0].passes {
        let prepared: Vec<(&str, Option<&str>)> = (p.prepared.iter())
            .map(|x| (x.step.as_str(), x.error.as_deref()))
            .collect();
        assert_eq!(prepared, [("extract-tree", None), ("fill", None)]);
        let steps: Vec<&str> = p.steps.iter().map(|s| s.step.as_str()).collect();
        assert_eq!(steps, ["delete-tree", "read-f"]);
        let (delete, read) = (&p.steps[0].trace, &p.steps[1].trace);
        let unlinks = (delete.profile.syscalls.iter())
            .find(|c| c.name == "unlinkat")
            .map_or(0, |c| c.count);
        assert!(unlinks > 10, "delete-tree unlinked {unlinks} names");
        // The file came from the disk (caches are dropped before a step), written before.
        assert!(
            block_bytes(read, "read") >= 8 << 20,
            "{:?}",
            read.profile.block
        );
        assert!(
            block_bytes(read, "write") < 1 << 20,
            "{:?}",
            read.profile.block
        );
    }
}
