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
