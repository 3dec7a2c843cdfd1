//! The results history: real runs recorded into SQLite and into a real PostgreSQL server,
//! compared against their past, trended, imported and exported.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use fsprof::{
    history::{History, Location, Recorded},
    results::RunResult,
    workload::pgbench::PgServer,
};
use fsprof_tests::{TempDir, assert_success, checked, fsprof_bin, load_run, small_crash_study};

/// `fsprof ARGS`, its output.
fn fsprof(args: &[&str]) -> Output {
    Command::new(fsprof_bin()).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A one-step run on ext4 that writes `mib` MiB and fsyncs, three passes, recorded in
/// `history` (a path or a server; None: the tests' own) with `extra` arguments.
fn run_writing(mib: u32, json: &Path, history: Option<&str>, extra: &[&str]) -> Output {
    run_writing_cmd(mib, json, history, extra).output().unwrap()
}

/// The command of `run_writing`, to start it without waiting.
fn run_writing_cmd(mib: u32, json: &Path, history: Option<&str>, extra: &[&str]) -> Command {
    let step = format!("w=dd if=/dev/zero of={{mnt}}/f bs=1M count={mib} conv=fsync status=none");
    let mut args = vec![
        "run",
        "--suite",
        "none",
        "--fs",
        "ext4",
        "--passes",
        "3",
        "--no-stacks",
        "--step",
        &step,
        "--json",
        json.to_str().unwrap(),
    ];
    if let Some(h) = history {
        args.extend(["--history", h]);
    }
    args.extend(extra);
    let mut cmd = Command::new(fsprof_bin());
    cmd.args(args);
    cmd
}

pub fn runs_are_recorded_compared_with_their_past_and_trended() {
    let dir = TempDir::new("history");
    let db = dir.0.join("h.sqlite");
    let h = db.to_str().unwrap();
    let json = |i: usize| dir.0.join(format!("r{i}.json"));
    // Two runs alike, then one that writes sixteen times as much: a regression of `w` far
    // beyond the noise of three passes (with 4× one noisy pass once left it inconclusive).
    for (i, (mib, label)) in [(16, "base"), (16, "base"), (256, "big")]
        .iter()
        .enumerate()
    {
        let out = run_writing(*mib, &json(i), Some(h), &["--label", label]);
        assert_success(&out);
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("recorded as run #{} in the history", i + 1)),
            "{err}"
        );
    }
    // Not recorded when asked not to, though the store is named (by the variable: the
    // flags exclude each other).
    let out = run_writing(16, &json(3), Some(h), &[]);
    assert_success(&out);
    let out = run_writing_cmd(1, &json(4), None, &["--no-history"])
        .env(fsprof::history::HISTORY_ENV, h)
        .output()
        .unwrap();
    assert_success(&out);
    assert!(
        !text(&out.stderr).contains("recorded as"),
        "{}",
        text(&out.stderr)
    );
    let list = fsprof(&["history", "--history", h, "list"]);
    assert_success(&list);
    let listed = text(&list.stdout);
    assert!(listed.starts_with("4 runs"), "{listed}");
    // What is stored equals the results stored with it.
    checked(&[&db]);
    assert!(listed.contains("#3") && listed.contains("big"), "{listed}");

    // Every pass of every figure is in the store: the wall of each pass as in the files.
    let mut store = History::open(Location::Sqlite(db.clone())).unwrap();
    for i in 0..3 {
        let r = load_run(&json(i));
        let walls: Vec<f64> = r.filesystems[0]
            .passes
            .iter()
            .map(|p| p.steps[0].trace.wall_ns as f64)
            .collect();
        let stored: Vec<f64> = store
            .figures(&[i as i64 + 1], "w", "wall")
            .unwrap()
            .iter()
            .map(|f| f.3)
            .collect();
        assert_eq!(stored, walls, "run #{}", i + 1);
        assert!(store.figure_count(i as i64 + 1).unwrap() >= 3 * 8);
    }
    drop(store);

    // The big run against its past: the two runs before it of the same configuration.
    let cmp = fsprof(&[
        "compare",
        "--all",
        "--past",
        "2",
        "--history",
        h,
        json(2).to_str().unwrap(),
    ]);
    assert_success(&cmp);
    let (said, table) = (text(&cmp.stderr), text(&cmp.stdout));
    assert!(said.contains("2 runs (#1 #2)"), "{said}");
    let wall = table
        .lines()
        .find(|l| l.contains(" w ") && l.contains("wall"))
        .unwrap_or_else(|| panic!("no wall row for w:\n{table}"));
    assert!(wall.contains("REGRESSION"), "{table}");

    // The trend: four runs, the big one marked, and a chart with a point per run.
    let html = dir.0.join("trend.html");
    let out = fsprof(&[
        "history",
        "--history",
        h,
        "trend",
        "--step",
        "w",
        "--html",
        html.to_str().unwrap(),
    ]);
    assert_success(&out);
    let trend = text(&out.stdout);
    let row = |id: &str| {
        trend
            .lines()
            .find(|l| l.trim_start().starts_with(id))
            .unwrap_or_else(|| panic!("no {id} in\n{trend}"))
            .to_string()
    };
    assert!(row("#3").contains('▲'), "{trend}");
    assert!(!row("#2").contains('▲'), "{trend}");
    // #4 is like #1 and #2, and the 5 runs before it include the big one.
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("<circle").count(), 4, "{page}");
    assert!(page.matches("stroke=\"black\"").count() >= 1);

    // Import: a run already there is not added twice; export gives the run back.
    let out = fsprof(&[
        "history",
        "--history",
        h,
        "import",
        json(2).to_str().unwrap(),
    ]);
    assert_success(&out);
    assert!(text(&out.stdout).contains("already recorded as run #3"));
    let back = dir.0.join("back.json");
    assert_success(&fsprof(&[
        "history",
        "--history",
        h,
        "export",
        "1",
        "-o",
        back.to_str().unwrap(),
    ]));
    let (orig, again) = (load_run(&json(0)), load_run(&back));
    assert_eq!(orig.run_id, again.run_id);
    assert_eq!(
        serde_json::to_value(&orig).unwrap(),
        serde_json::to_value(&again).unwrap()
    );
    assert_success(&fsprof(&["report", back.to_str().unwrap()]));

    // A store that is no store: a one-line error, and the run's results are written.
    let junk = dir.0.join("junk.sqlite");
    std::fs::write(&junk, vec![b'x'; 4096]).unwrap();
    let out = run_writing(8, &json(5), junk.to_str(), &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(last.contains("not a database"), "{err}");
    assert!(load_run(&json(5)).complete);
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn two_machines_record_into_one_postgres_without_showing_its_password() {
    let dir = TempDir::new("history-pg");
    let port = free_port();
    let server = PgServer::start_in(&dir.0.join("pg"), Some(port)).unwrap();
    let password = format!("pw-{}-secret", std::process::id());
    server
        .psql(&format!("CREATE ROLE fsprof LOGIN PASSWORD '{password}'"))
        .unwrap();
    server.psql("CREATE DATABASE fsprof OWNER fsprof").unwrap();
    let url = format!("postgres://fsprof:{password}@127.0.0.1:{port}/fsprof");
    // Two runs at once, each with its own images, as two test machines would.
    let runs: Vec<(PathBuf, std::process::Child)> = (0..2)
        .map(|i| {
            let json = dir.0.join(format!("m{i}.json"));
            let images = dir.0.join(format!("images{i}"));
            let label = format!("machine{i}");
            let child = run_writing_cmd(
                16,
                &json,
                Some(&url),
                &["--label", &label, "--dir", images.to_str().unwrap()],
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
            (json, child)
        })
        .collect();
    let mut ids = Vec::new();
    for (json, child) in runs {
        let out = child.wait_with_output().unwrap();
        assert_success(&out);
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(!said.contains(&password), "{said}");
        assert!(
            said.contains(&format!("postgres://fsprof@127.0.0.1:{port}/fsprof")),
            "{said}"
        );
        let id: i64 = said
            .split("recorded as run #")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{said}"));
        let file = std::fs::read_to_string(&json).unwrap();
        assert!(!file.contains(&password));
        ids.push((id, json));
    }
    ids.sort();
    assert_eq!(ids.iter().map(|i| i.0).collect::<Vec<_>>(), [1, 2]);
    let list = fsprof(&["history", "--history", &url, "list"]);
    assert_success(&list);
    let listed = text(&list.stdout);
    assert!(listed.starts_with("2 runs"), "{listed}");
    assert!(listed.contains("machine0") && listed.contains("machine1"));
    assert!(!(listed + &text(&list.stderr)).contains(&password));
    // Each run complete on the server: as many figure rows as SQLite keeps for the same
    // results file.
    let mut shared = History::open(Location::Postgres(url.clone())).unwrap();
    let mut local = History::open(Location::Sqlite(dir.0.join("local.sqlite"))).unwrap();
    for (id, json) in &ids {
        let Recorded::New(lid) = local.record(&RunResult::load(json).unwrap()).unwrap() else {
            panic!("new in the local store")
        };
        let (n, expected) = (
            shared.figure_count(*id).unwrap(),
            local.figure_count(lid).unwrap(),
        );
        eprintln!("run #{id}: {n} figure rows on the server, {expected} in SQLite");
        assert!(
            n > 0 && n == expected,
            "run #{id}: {n} rows, {expected} expected"
        );
    }
    // A crash study goes to the same server, its outcome rows the file's counts.
    let json = dir.0.join("crash.json");
    let crash = small_crash_study(1, "rename-fsync-dir", &url, &json)
        .output()
        .unwrap();
    assert_success(&crash);
    assert!(text(&crash.stderr).contains("recorded as crash study c1"));
    let study = fsprof_tests::load_study(&json);
    let new = fsprof::workload::crash::Outcome::New;
    let in_file = study.cells[0].outcomes.get(&new).copied().unwrap_or(0);
    assert_eq!(
        shared.crash_outcome_total(1, new).unwrap(),
        i64::from(in_file)
    );
    drop(shared);
    // The server's rows equal the results stored with them (fsprof check by URL).
    checked(&[Path::new(&url)]);
    drop(server);
}

pub fn bad_stores_are_one_line_errors_and_the_results_stay() {
    let dir = TempDir::new("history-bad");
    let junk = dir.0.join("junk.sqlite");
    std::fs::write(&junk, vec![b'x'; 4096]).unwrap();
    let one_line = |out: &Output, needle: &str| {
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
        err
    };
    one_line(
        &fsprof(&["history", "--history", junk.to_str().unwrap(), "list"]),
        "not a database",
    );
    let err = one_line(
        &fsprof(&[
            "history",
            "--history",
            "postgres://fsprof:hush@127.0.0.1:1/x",
            "list",
        ]),
        "postgres://fsprof@127.0.0.1:1/x",
    );
    assert!(!err.contains("hush"), "{err}");
    // A valid SQLite file whose tables are damaged: said in one line, by list and import.
    let damaged = dir.0.join("damaged.sqlite");
    drop(History::open(Location::Sqlite(damaged.clone())).unwrap());
    let mut db = fsprof::history::sql::Db::open_sqlite(&damaged).unwrap();
    db.batch(
        "DROP TABLE fsprof_figures; DROP TABLE fsprof_runs; CREATE TABLE fsprof_runs (id INTEGER)",
    )
    .unwrap();
    drop(db);
    one_line(
        &fsprof(&["history", "--history", damaged.to_str().unwrap(), "list"]),
        "tables are not the ones fsprof makes",
    );
    let empty = dir.0.join("empty.sqlite");
    one_line(
        &fsprof(&[
            "history",
            "--history",
            empty.to_str().unwrap(),
            "export",
            "7",
        ]),
        "no run #7",
    );
    one_line(
        &fsprof(&[
            "history",
            "--history",
            empty.to_str().unwrap(),
            "list",
            "--since",
            "soon",
        ]),
        "not a date",
    );
}

/// A results file being rewritten (`history export` over an older file, through the same
/// atomic save as `run`) and killed with SIGKILL at any moment is the old file or the new
/// one, never a torn one.
pub fn a_results_file_survives_sigkill_mid_write() {
    use fsprof::results::{FsRun, PassRun, StepRun};
    let dir = TempDir::new("history-kill");
    let db = dir.0.join("h.sqlite");
    let big = |id: &str, wall: u64| RunResult {
        schema_version: fsprof::results::RUN_SCHEMA_VERSION,
        run_id: id.into(),
        complete: true,
        filesystems: vec![FsRun {
            fs: "ext4".into(),
            passes: (1..=400)
                .map(|pass| PassRun {
                    pass,
                    steps: vec![StepRun {
                        step: format!("step-{pass}"),
                        syncfs_ns: wall,
                        ..StepRun::default()
                    }],
                    ..PassRun::default()
                })
                .collect(),
            ..FsRun::default()
        }],
        ..RunResult::default()
    };
    let mut h = History::open(Location::Sqlite(db.clone())).unwrap();
    for (id, wall) in [("old", 1), ("new", 2)] {
        h.record(&big(id, wall)).unwrap();
    }
    drop(h);
    let file = dir.0.join("r.json");
    let export = |id: &str| {
        Command::new(fsprof_bin())
            .args([
                "history",
                "--history",
                db.to_str().unwrap(),
                "export",
                id,
                "-o",
            ])
            .arg(&file)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    assert!(export("1").wait().unwrap().success());
    let size = std::fs::metadata(&file).unwrap().len();
    let (mut old, mut new) = (0, 0);
    for i in 0..60u64 {
        let mut child = export("2");
        // Killed the moment the file changes size (a writer that truncates it in place is
        // caught half-way: old and new have the same size, so an atomic rename never
        // shows), else at a time spread over the process's life.
        let t0 = std::time::Instant::now();
        // The last one may finish: the new file must then be whole too.
        let deadline = match i {
            59 => std::time::Duration::MAX,
            _ => std::time::Duration::from_micros(i * 1000),
        };
        while t0.elapsed() < deadline
            && child.try_wait().unwrap().is_none()
            && std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) == size
        {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        let r = RunResult::load(&file).unwrap_or_else(|e| panic!("kill {i}: {e:#}"));
        match r.run_id.as_str() {
            "old" => old += 1,
            "new" => new += 1,
            other => panic!("{other}"),
        }
        if r.run_id == "new" {
            assert!(export("1").wait().unwrap().success());
        }
    }
    eprintln!("{size}-byte file, 60 kills: old {old}, new {new}");
    assert!(
        old > 0 && new > 0,
        "old {old}, new {new}: no kill landed before the write"
    );
}
