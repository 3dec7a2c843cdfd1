use super::*;
use crate::{
    results::{FsRun, PassRun, StepRun},
    trace::TraceResult,
};

/// A scratch SQLite file, removed with its directory.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("fsprof-history-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }
    fn db(&self) -> Location {
        Location::Sqlite(self.0.join("h.sqlite"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A run of one step on ext4, with these walls (ms) as its passes.
fn run(id: &str, started: u64, kernel: &str, walls_ms: &[u64]) -> RunResult {
    let passes = walls_ms
        .iter()
        .enumerate()
        .map(|(i, &ms)| PassRun {
            pass: i as u32 + 1,
            steps: vec![StepRun {
                step: "extract-tree".into(),
                trace: TraceResult {
                    wall_ns: ms * 1_000_000,
                    ..TraceResult::default()
                },
                ..StepRun::default()
            }],
            ..PassRun::default()
        })
        .collect();
    RunResult {
        schema_version: crate::results::RUN_SCHEMA_VERSION,
        suite: "quick".into(),
        scale: 0.05,
        kernel: kernel.into(),
        host: "box".into(),
        cpus: 2,
        started,
        complete: true,
        passes: walls_ms.len() as u32,
        run_id: id.into(),
        filesystems: vec![FsRun {
            fs: "ext4".into(),
            passes,
            ..FsRun::default()
        }],
        ..RunResult::default()
    }
}

#[test]
fn runs_are_recorded_once_with_every_pass_and_found_by_their_key() {
    let s = Scratch::new("record");
    let mut h = History::open(s.db()).unwrap();
    let a = run("a", 100, "6.1", &[1000, 1010, 990]);
    let b = run("b", 200, "6.18", &[1500, 1490, 1510]);
    let Recorded::New(ia) = h.record(&a).unwrap() else {
        panic!("a was new")
    };
    assert!(matches!(h.record(&b).unwrap(), Recorded::New(_)));
    assert!(matches!(h.record(&a).unwrap(), Recorded::Already(i) if i == ia));
    // Reopened (as the next fsprof would): the same two runs.
    drop(h);
    let mut h = History::open(s.db()).unwrap();
    let all = h.runs(&Filter::default()).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].config, all[1].config, "the kernel is not in the key");
    let only = h
        .runs(&Filter {
            kernel: Some("6.18".into()),
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0].uid, "b");
    let fs = |f: &str| Filter {
        fs: Some(f.into()),
        ..Filter::default()
    };
    assert_eq!(h.runs(&fs("ext4")).unwrap().len(), 2);
    assert_eq!(h.runs(&fs("ext")).unwrap().len(), 0);
    // Every pass of the wall figure, as recorded.
    let walls: Vec<f64> = h
        .figures(&[ia], "extract-tree", "wall")
        .unwrap()
        .iter()
        .map(|f| f.3)
        .collect();
    assert_eq!(walls, [1e9, 1.01e9, 0.99e9]);
    // The whole results come back.
    assert_eq!(h.results(ia).unwrap().filesystems[0].passes.len(), 3);
}

#[test]
fn a_trend_marks_the_run_that_regressed() {
    let s = Scratch::new("trend");
    let mut h = History::open(s.db()).unwrap();
    let walls = [
        [1000, 1012, 995],
        [1004, 990, 1008],
        [998, 1006, 1001],
        [1500, 1490, 1510],
    ];
    for (i, w) in walls.iter().enumerate() {
        h.record(&run(&format!("r{i}"), 100 + i as u64, "6.18", w))
            .unwrap();
    }
    let runs = h.runs(&Filter::default()).unwrap();
    let opts = trend::TrendOptions {
        base_runs: 5,
        compare: Default::default(),
    };
    let judged = trend::verdicts(&mut h, &runs, "wall", &opts).unwrap();
    let points = trend::trend(&mut h, &runs, "extract-tree", "wall", &judged).unwrap();
    let verdicts: Vec<Option<crate::analysis::verdict::Verdict>> = points
        .iter()
        .map(|p| p.verdicts.get("ext4").copied())
        .collect();
    use crate::analysis::verdict::Verdict::*;
    assert_eq!(verdicts[0], None, "nothing before the first run");
    assert_ne!(verdicts[2], Some(Regression));
    assert_eq!(verdicts[3], Some(Regression), "{verdicts:?}");
    assert_eq!(points[3].values["ext4"], 1.5e9);
    let text = trend::render(&points, "extract-tree", "wall", 5);
    assert!(text.contains("1.500s ▲"), "{text}");
}

#[test]
fn a_newer_store_and_a_file_that_is_no_store_are_one_line_errors() {
    let s = Scratch::new("bad");
    let mut h = History::open(s.db()).unwrap();
    h.db.exec(
        "UPDATE fsprof_meta SET value = '99' WHERE key = 'schema_version'",
        &[],
    )
    .unwrap();
    drop(h);
    let e = format!("{:#}", History::open(s.db()).err().unwrap());
    assert!(e.contains("version 99") && !e.contains('\n'), "{e}");
    let junk = s.0.join("junk.sqlite");
    std::fs::write(&junk, vec![b'x'; 4096]).unwrap();
    let e = format!("{:#}", History::open(Location::Sqlite(junk)).err().unwrap());
    assert!(e.contains("not a database") && !e.contains('\n'), "{e}");
}

#[test]
fn server_addresses_lose_their_credentials() {
    assert_eq!(
        redact("postgres://fsprof:s3cret@db.example:5432/runs?password=x"),
        "postgres://fsprof@db.example:5432/runs"
    );
    assert_eq!(redact("postgresql://host/db"), "postgresql://host/db");
    assert!(matches!(
        Location::parse("postgres://a@b/c"),
        Location::Postgres(_)
    ));
    assert!(matches!(Location::parse("h.sqlite"), Location::Sqlite(_)));
}

/// A crash study of one ext4 cell: `new` trials of `of` found the new content.
fn study(
    id: &str,
    started: u64,
    kernel: &str,
    new: u32,
    of: u32,
) -> crate::results::crash::CrashStudy {
    use crate::{
        results::crash::{CrashCell, CrashPoint, CrashStudy},
        workload::crash::{Outcome, Pattern},
    };
    CrashStudy {
        schema_version: crate::results::crash::CRASH_SCHEMA_VERSION,
        study_id: id.into(),
        kernel: kernel.into(),
        host: "box".into(),
        started,
        trials: of,
        complete: true,
        cells: vec![CrashCell {
            fs: "xfs".into(),
            mkfs_opts: String::new(),
            mount_opts: String::new(),
            method: "shutdown-ioctl".into(),
            pattern: Pattern::RenameNoFsync,
            point: CrashPoint::AfterCommit,
            wait_ns: 31_000_000_000,
            durable: false,
            outcomes: [(Outcome::New, new), (Outcome::Old, of - new)]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            recovery_ns: vec![10_000_000; of as usize],
            fsck_ns: vec![20_000_000; of as usize],
            fsck_unclean: 0,
            fsck_detail: None,
            error_detail: None,
            recovery_unclean: 0,
            recovery_detail: None,
        }],
        ..CrashStudy::default()
    }
}

#[test]
fn crash_studies_are_recorded_once_beside_runs_and_pool_into_one_base() {
    use crate::{results::crash::CrashStudy, workload::crash::Outcome};
    let s = Scratch::new("crash");
    let mut h = History::open(s.db()).unwrap();
    h.record(&run("a", 100, "6.18", &[1000])).unwrap();
    let (a, b) = (
        study("sa", 110, "6.1", 2, 5),
        study("sb", 120, "6.18", 3, 5),
    );
    let Recorded::New(ia) = h.record_crash(&a).unwrap() else {
        panic!("a was new")
    };
    assert!(matches!(h.record_crash(&b).unwrap(), Recorded::New(_)));
    assert!(matches!(h.record_crash(&a).unwrap(), Recorded::Already(i) if i == ia));
    assert_eq!(h.runs(&Filter::default()).unwrap().len(), 1, "runs apart");
    let all = h.crash_studies(&Filter::default()).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].config, all[1].config, "the kernel is not in the key");
    assert!(
        all[0].config.contains("fs=xfs[mkfs:|mount:]"),
        "{}",
        all[0].config
    );
    let suite = Filter {
        suite: Some("quick".into()),
        ..Filter::default()
    };
    assert!(h.crash_studies(&suite).unwrap().is_empty());
    // Outcome rows: one per cell and outcome, summing to the cell's trials.
    assert_eq!(h.crash_outcome_total(ia, Outcome::New).unwrap(), 2);
    assert_eq!(h.crash_outcome_total(ia, Outcome::Old).unwrap(), 3);
    assert_eq!(h.crash_outcome_total(ia, Outcome::Mixed).unwrap(), 0);
    // The whole study comes back; pooled with the other, its trials add up.
    let back = h.crash_study(ia).unwrap();
    assert_eq!(
        serde_json::to_value(&back).unwrap(),
        serde_json::to_value(&a).unwrap()
    );
    let pooled = CrashStudy::pool(&[back, b.clone()]).unwrap();
    let cell = &pooled.cells[0];
    assert_eq!((cell.trials(), cell.outcomes[&Outcome::New]), (10, 5));
    assert_eq!(cell.fsck_ns.len(), 10);
    assert_eq!((pooled.kernel.as_str(), pooled.trials), ("6.18", 10));
    // 5 of 10 against 1 of 2: the same shares.
    assert!(cell.same_shares(&study("sc", 130, "6.18", 1, 2).cells[0]));
    assert!(!cell.same_shares(&b.cells[0]));
}

#[test]
fn a_version_1_store_gains_the_crash_tables() {
    let s = Scratch::new("migrate");
    let mut h = History::open(s.db()).unwrap();
    h.record(&run("a", 100, "6.18", &[1000])).unwrap();
    // What fsprof before crash studies left: version 1, no crash tables.
    h.db.batch(
        "DROP TABLE fsprof_crash_outcomes; DROP TABLE fsprof_crash_studies;
         UPDATE fsprof_meta SET value = '1' WHERE key = 'schema_version'",
    )
    .unwrap();
    drop(h);
    let mut h = History::open(s.db()).unwrap();
    let version =
        h.db.query(
            "SELECT value FROM fsprof_meta WHERE key = 'schema_version'",
            &[],
        )
        .unwrap();
    assert_eq!(version[0][0].text(), SCHEMA_VERSION.to_string());
    assert_eq!(h.runs(&Filter::default()).unwrap().len(), 1);
    assert!(matches!(
        h.record_crash(&study("s", 110, "6.18", 1, 1)).unwrap(),
        Recorded::New(1)
    ));
}
