//! The crash study on the host's kernel: ext4 and xfs crashed by the shutdown ioctl keep
//! what the durable patterns wrote and lose what the others had not committed, fsck is run
//! and timed; a commit interval is waited out; a filesystem without the ioctl is a one-line
//! error; Ctrl-C mid-study leaves nothing behind and a valid partial file.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use fsprof::{
    lab::{FsKind, LabOptions},
    results::crash::{CrashPoint, CrashStudy},
    run::{crash::CrashOptions, crash_study::study},
    workload::crash::{Outcome, Pattern},
};
use fsprof_tests::*;

fn options(fs: &[FsKind], points: &[CrashPoint], trials: u32, mount_opts: &str) -> CrashOptions {
    CrashOptions {
        filesystems: fs.to_vec(),
        patterns: Pattern::ALL.to_vec(),
        points: points.to_vec(),
        trials,
        lab: LabOptions {
            size: 512 << 20,
            mount_opts: mount_opts.into(),
            ..LabOptions::default()
        },
        cost_updates: 0,
        label: None,
    }
}

fn run(opts: &CrashOptions) -> CrashStudy {
    study(opts, None, |_| {}, |_| Ok(())).unwrap()
}

pub fn shutdown_keeps_durable_updates_and_loses_uncommitted_ones() {
    let trials = 2;
    let s = run(&options(
        &[FsKind::Ext4, FsKind::Xfs],
        &[CrashPoint::Now],
        trials,
        "",
    ));
    assert!(s.complete);
    assert_eq!(s.cells.len(), 2 * Pattern::ALL.len());
    for fs in ["ext4", "xfs"] {
        let cells: Vec<_> = s.cells.iter().filter(|c| c.fs == fs).collect();
        for c in &cells {
            assert_eq!(c.trials(), trials, "{c:?}");
            assert_eq!(c.method, "shutdown-ioctl");
            // POSIX's promise, and the proof that what the test reads is what was written.
            if c.durable {
                assert_eq!(c.outcomes.get(&Outcome::New), Some(&trials), "{c:?}");
            }
            assert_eq!(c.recovery_ns.len(), trials as usize, "{c:?}");
            assert_eq!(c.fsck_ns.len(), trials as usize, "{c:?}");
            assert!(c.fsck_ns.iter().all(|&ns| ns > 0), "{c:?}");
            assert_eq!(c.fsck_unclean, 0, "{c:?}");
        }
        // The crash really cut off what was not yet committed: an append nobody synced is
        // gone at once on both (were the shutdown a clean unmount, it would be there).
        let append = cells.iter().find(|c| c.pattern == Pattern::Append).unwrap();
        assert_eq!(
            append.outcomes.get(&Outcome::Old),
            Some(&trials),
            "{fs}: {append:?}"
        );
    }
}

pub fn after_the_commit_interval_ext4_has_committed_the_rename() {
    // commit=1: the journal commits every second; the crash comes 2 s after the update.
    // Only the two patterns looked at: with all ten side by side (the SQLite ones fsync
    // on two more loop devices) a CI run once found the unsynced rename still old at 2 s.
    let s = run(&CrashOptions {
        patterns: vec![Pattern::RenameNoFsync, Pattern::RenameFsyncDir],
        ..options(&[FsKind::Ext4], &[CrashPoint::AfterCommit], 1, "commit=1")
    });
    for c in &s.cells {
        assert!(c.wait_ns >= 2_000_000_000, "{c:?}");
        assert_eq!(c.mount_opts, "commit=1");
    }
    let cell = |p: Pattern| s.cells.iter().find(|c| c.pattern == p).unwrap();
    // ext4 allocates a file's delayed blocks when it is renamed over another
    // (auto_da_alloc), so the commit carries the data with the rename: new content.
    assert_eq!(
        cell(Pattern::RenameNoFsync).outcomes.get(&Outcome::New),
        Some(&1),
        "{s:#?}"
    );
    assert_eq!(
        cell(Pattern::RenameFsyncDir).outcomes.get(&Outcome::New),
        Some(&1)
    );
}

/// The cost pass traces each pattern's updates: the syncs it makes are what its code makes,
/// each durable update forces journal commits and cache flushes, the unsafe one none.
pub fn cost_pass_counts_the_syncs_each_pattern_makes() {
    let updates: u32 = 20;
    // The traced helper is fsprof's own binary: through the command line.
    let dir = TempDir::new("crash-cost");
    let json = dir.0.join("c.json");
    let out = Command::new(fsprof_bin())
        .args([
            "crash", "--fs", "ext4", "--at", "now", "--trials", "1", "--size", "512M",
        ])
        .args([
            "--pattern",
            "rename-no-fsync,rename-fsync-dir,append-fdatasync",
        ])
        .args(["--cost-updates", &updates.to_string(), "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert_success(&out);
    let s: CrashStudy = load_study(&json);
    assert_eq!(s.costs.len(), 3);
    assert!(std::path::Path::new(&json.with_extension("csv")).exists());
    for c in &s.costs {
        let calls = |name: &str| {
            let rows = &c.trace.profile.syscalls;
            rows.iter().find(|r| r.name == name).map_or(0, |r| r.count)
        };
        // Per update: the code in workload::crash (independent of the tracer's figures).
        let (fsyncs, fdatasyncs, renames) = match c.pattern {
            Pattern::RenameNoFsync => (0, 0, 1),
            Pattern::RenameFsyncDir => (2, 0, 1),
            _ => (0, 1, 0),
        };
        let n = u64::from(updates);
        assert_eq!(calls("fsync"), fsyncs * n, "{:?}", c.pattern);
        assert_eq!(calls("fdatasync"), fdatasyncs * n, "{:?}", c.pattern);
        assert_eq!(calls("rename"), renames * n, "{:?}", c.pattern);
        assert!(
            c.updates_ns > 0 && c.updates_ns < c.trace.wall_ns,
            "{:?}",
            c.pattern
        );
        let (_, flushes) = c.written_and_flushes();
        if c.pattern.durable() {
            assert!(c.commits() >= n, "{:?}: {} commits", c.pattern, c.commits());
            assert!(flushes >= n, "{:?}: {flushes} flushes", c.pattern);
            assert!(c.sync_latency().is_some_and(|l| l.count >= n));
        } else {
            assert_eq!(flushes, 0, "{:?}", c.pattern);
            assert!(c.sync_latency().is_none());
        }
    }
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("what each pattern costs"), "{table}");
    // The saved study reads back: `report` prints the table `crash` printed, its markdown
    // has a row per cell and per cost, the HTML page beside the JSON colours each outcome
    // found.
    let report = |args: &[&str]| {
        let mut c = Command::new(fsprof_bin());
        c.arg("report").arg(&json).args(args).output().unwrap()
    };
    let again = report(&[]);
    assert_success(&again);
    assert_eq!(String::from_utf8_lossy(&again.stdout), table);
    let md = String::from_utf8(report(&["--format", "markdown"]).stdout).unwrap();
    let rows = md
        .lines()
        .filter(|l| l.starts_with("| rename-") || l.starts_with("| append-"))
        .count();
    assert_eq!(rows, s.cells.len() + s.costs.len(), "{md}");
    let html = std::fs::read_to_string(json.with_extension("html")).unwrap();
    let found_new = s
        .cells
        .iter()
        .filter(|c| c.outcomes.get(&Outcome::New).is_some_and(|&n| n > 0))
        .count();
    assert_eq!(
        html.matches("<td class=\"new\">").count(),
        found_new,
        "{html}"
    );
    // Against itself: every cell the same, p = 1, and the costs side by side.
    let cmp = Command::new(fsprof_bin())
        .arg("compare")
        .args([&json, &json])
        .arg("--fail-on-regression")
        .output()
        .unwrap();
    assert_success(&cmp);
    let text = String::from_utf8_lossy(&cmp.stdout);
    let same = text
        .lines()
        .filter(|l| l.ends_with("  same") && l.contains(" 1.0000 "))
        .count();
    assert_eq!(same, s.cells.len(), "{text}");
    assert!(
        text.contains("what each pattern costs, base → new"),
        "{text}"
    );
    // A crash study is not a run's results: one line.
    let run = Command::new(fsprof_bin())
        .args(["explain"])
        .arg(&json)
        .args(["--step", "x", "--fs", "ext4", "--vs", "xfs"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(
        err.lines().count() == 1 && err.contains("is a crash study"),
        "{err}"
    );
}

/// Two real studies recorded into a history of their own: listed with their label, the
/// second compared with the first as its past (one line says which), the outcome rows the
/// same as the file's counts, the first exported back as it was written, and an import of
/// it not recorded twice.
pub fn crash_studies_are_recorded_and_compared_with_their_past() {
    let dir = TempDir::new("crash-history");
    let history = dir.0.join("h.sqlite");
    let fsprof = |args: &[&str]| {
        let out = Command::new(fsprof_bin())
            .args(args)
            .arg("--history")
            .arg(&history)
            .output()
            .unwrap();
        assert_success(&out);
        out
    };
    let study = |name: &str| {
        let json = dir.0.join(name);
        let patterns = "rename-no-fsync,rename-fsync-dir";
        let out = small_crash_study(2, patterns, history.to_str().unwrap(), &json)
            .args(["--label", name])
            .output()
            .unwrap();
        assert_success(&out);
        (json, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (a, err_a) = study("a.json");
    assert!(
        err_a.contains("recorded as crash study c1 in the history"),
        "{err_a}"
    );
    let (b, err_b) = study("b.json");
    assert!(err_b.contains("recorded as crash study c2"), "{err_b}");
    let list = fsprof(&["history", "list"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("2 crash studies"), "{text}");
    assert!(text.contains("a.json") && text.contains("b.json"), "{text}");
    // b against its past: only a (b itself is left out), every cell tested; its page plots
    // each cell's two sides, named.
    let page = dir.0.join("cmp.html");
    let cmp = fsprof(&[
        "compare",
        "--past",
        "5",
        b.to_str().unwrap(),
        "--fail-on-regression",
        "--html",
        page.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("base: the history's last 5 of its kind"),
        "{html}"
    );
    assert!(
        html.contains(&format!("new: {} (kernel ", b.display())),
        "{html}"
    );
    assert_eq!(html.matches("<g class=\"cell\">").count(), 2, "{html}");
    // rename-fsync-dir found the new content in both trials on both sides.
    assert!(html.matches("<title>2 of 2</title>").count() >= 2, "{html}");
    let err = String::from_utf8_lossy(&cmp.stderr);
    assert!(err.contains("1 crash study (c1)"), "{err}");
    let table = String::from_utf8_lossy(&cmp.stdout);
    let rows = table.lines().filter(|l| l.starts_with("  ext4 ")).count();
    assert_eq!(rows, 2, "{table}");
    // The durable pattern found the new content in both trials of both studies.
    assert!(
        table
            .lines()
            .any(|l| l.contains("rename-fsync-dir") && l.contains("2/2") && l.ends_with("same")),
        "{table}"
    );
    // The store's outcome rows are the file's counts.
    let saved: CrashStudy = load_study(&a);
    let mut h =
        fsprof::history::History::open(fsprof::history::Location::Sqlite(history.clone())).unwrap();
    for o in Outcome::ALL {
        let in_file: u32 = saved.cells.iter().filter_map(|c| c.outcomes.get(o)).sum();
        assert_eq!(
            h.crash_outcome_total(1, *o).unwrap(),
            i64::from(in_file),
            "{o:?}"
        );
    }
    drop(h);
    let back = dir.0.join("back.json");
    fsprof(&["history", "export", "c1", "-o", back.to_str().unwrap()]);
    let value = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    assert_eq!(value(&back), value(&a));
    let again = fsprof(&["history", "import", a.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        text.contains("already recorded as crash study c1"),
        "{text}"
    );
}

pub fn a_filesystem_the_host_cannot_crash_is_a_one_line_error() {
    let out = Command::new(fsprof_bin())
        .args(["crash", "--fs", "btrfs", "--trials", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot crash btrfs") && err.contains("no shutdown ioctl"),
        "{err}"
    );
}

pub fn sigint_mid_crash_study_leaves_nothing_and_a_partial_file() {
    let dir = TempDir::new("crash-sigint");
    let json = dir.0.join("c.json");
    let child = Command::new(fsprof_bin())
        .args(["crash", "--fs", "ext4", "--at", "now,after-commit"])
        .args(["--mount-opts", "commit=30", "--trials", "2", "--json"])
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first trial (crash at once) is saved, the next ones wait out a 31 s commit
    // interval with eight filesystems mounted: interrupt them there. (The file appears
    // earlier, with the cost pass: a fixed sleep after it raced the trials under load.)
    let trial_saved = || {
        std::fs::read_to_string(&json)
            .ok()
            .and_then(|t| serde_json::from_str::<CrashStudy>(&t).ok())
            .is_some_and(|s| s.cells.iter().any(|c| c.trials() > 0))
    };
    let pid = child.id();
    wait_until("a first trial saved", Duration::from_secs(120), trial_saved);
    // The next trials mount their filesystems and wait out the commit interval.
    wait_until(
        "the next trials' filesystems mounted",
        Duration::from_secs(60),
        || mounts_of(pid) > 0,
    );
    // SAFETY: our own child, not yet reaped.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGINT), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    let s: CrashStudy = load_study(&json);
    assert!(!s.complete);
    assert!(s.cells.iter().any(|c| c.trials() > 0), "{s:#?}");
    assert_nothing_left_of(pid);
}
