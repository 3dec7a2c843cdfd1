//! Crash studies in the history: each recorded whole (so compare and report read it back
//! exactly as from its file) with every cell's outcome counts as rows, so `compare --past`
//! pools a study's past and SQL follows outcomes over kernels without decoding JSON.

use anyhow::{Context, Result, bail};

use super::{Filter, History, Recorded, sql::Value};
use crate::{
    results::crash::{CrashCell, CrashStudy},
    workload::crash::Outcome,
};

/// The crash tables, in the store's column types (`id`, `int`); created by every fsprof
/// that knows them, in a new store or an older one alike.
pub(super) fn tables(id: &str, int: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS fsprof_crash_studies (id {id}, uid TEXT NOT NULL UNIQUE,
            recorded {int} NOT NULL, started {int} NOT NULL, config TEXT NOT NULL,
            filesystems TEXT NOT NULL, patterns TEXT NOT NULL, kernel TEXT NOT NULL,
            kernel_build TEXT NOT NULL, accel TEXT NOT NULL, host TEXT NOT NULL,
            fsprof_version TEXT NOT NULL, label TEXT NOT NULL, trials {int} NOT NULL,
            complete {int} NOT NULL, results TEXT NOT NULL);
         CREATE INDEX IF NOT EXISTS fsprof_crash_studies_config
            ON fsprof_crash_studies (config, started);
         CREATE TABLE IF NOT EXISTS fsprof_crash_outcomes (
            study_id {int} NOT NULL REFERENCES fsprof_crash_studies (id) ON DELETE CASCADE,
            fs TEXT NOT NULL, mkfs_opts TEXT NOT NULL, mount_opts TEXT NOT NULL,
            method TEXT NOT NULL, pattern TEXT NOT NULL, point TEXT NOT NULL,
            outcome TEXT NOT NULL, trials {int} NOT NULL);
         CREATE INDEX IF NOT EXISTS fsprof_crash_outcomes_study ON fsprof_crash_outcomes (study_id);"
    )
}

/// A recorded crash study as listed: its key and facts, not its cells.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CrashRow {
    pub id: i64,
    pub uid: String,
    pub started: i64,
    /// What must match for two studies to pool or compare: filesystems with their options,
    /// patterns, crash points, crash methods, accelerator, host.
    pub config: String,
    pub filesystems: String,
    pub patterns: String,
    pub kernel: String,
    pub kernel_build: String,
    pub accel: String,
    pub host: String,
    pub fsprof_version: String,
    pub label: String,
    pub trials: i64,
    pub complete: bool,
}

/// The table of crash studies.
const STUDIES: &str = "fsprof_crash_studies";

const CRASH_COLUMNS: &str = "id, uid, started, config, filesystems, patterns, kernel, \
     kernel_build, accel, host, fsprof_version, label, trials, complete";

/// The distinct values of `key` over the cells, in order of first appearance.
fn distinct(cells: &[CrashCell], key: impl Fn(&CrashCell) -> String) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in cells {
        let k = key(c);
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

impl CrashRow {
    fn from_row(r: &[Value]) -> CrashRow {
        CrashRow {
            id: r[0].int(),
            uid: r[1].text(),
            started: r[2].int(),
            config: r[3].text(),
            filesystems: r[4].text(),
            patterns: r[5].text(),
            kernel: r[6].text(),
            kernel_build: r[7].text(),
            accel: r[8].text(),
            host: r[9].text(),
            fsprof_version: r[10].text(),
            label: r[11].text(),
            trials: r[12].int(),
            complete: r[13].int() != 0,
        }
    }

    /// The row a crash study makes.
    pub fn of(s: &CrashStudy) -> CrashRow {
        CrashRow {
            id: 0,
            uid: if s.study_id.is_empty() {
                // Studies from before study ids: the same file always gets the same id.
                format!("started-{}-{}-{}", s.started, s.host, s.kernel)
            } else {
                s.study_id.clone()
            },
            started: s.started as i64,
            config: config_of(s),
            filesystems: distinct(&s.cells, |c| c.fs.clone()).join(","),
            patterns: distinct(&s.cells, |c| c.pattern.name().into()).join(","),
            kernel: s.kernel.clone(),
            kernel_build: s.kernel_build.clone(),
            accel: accel_of(s),
            host: s.host.clone(),
            fsprof_version: s.fsprof_version.clone(),
            label: s.label.clone().unwrap_or_default(),
            trials: i64::from(s.trials),
            complete: s.complete,
        }
    }
}

fn accel_of(s: &CrashStudy) -> String {
    match &s.vm {
        Some(vm) => format!("qemu-{}", vm.accel),
        None => "host".to_string(),
    }
}

/// The configuration key of a study: what its cells are (filesystems with options,
/// patterns, points, methods) and where it ran; not the kernel (what a history follows),
/// the label, or the trial count (counts of any size pool and compare).
pub fn config_of(s: &CrashStudy) -> String {
    let fs = distinct(&s.cells, |c| {
        format!("{}[mkfs:{}|mount:{}]", c.fs, c.mkfs_opts, c.mount_opts)
    });
    format!(
        "crash fs={} patterns={} points={} methods={} accel={} host={}",
        fs.join(","),
        distinct(&s.cells, |c| c.pattern.name().into()).join(","),
        distinct(&s.cells, |c| c.point.name().into()).join(","),
        distinct(&s.cells, |c| c.method.clone()).join(","),
        accel_of(s),
        s.host
    )
}

impl History {
    /// Records a crash study with its outcome counts, in one transaction; a study already
    /// recorded (same study id) is not recorded again.
    pub fn record_crash(&mut self, s: &CrashStudy) -> Result<Recorded> {
        let row = CrashRow::of(s);
        let results = serde_json::to_string(s)?;
        self.db.begin_exclusive()?;
        let done = self.record_crash_in_transaction(s, &row, results);
        self.finish(done)
    }

    fn record_crash_in_transaction(
        &mut self,
        s: &CrashStudy,
        row: &CrashRow,
        results: String,
    ) -> Result<Recorded> {
        if let Some(id) = self.id_of(STUDIES, &row.uid)? {
            return Ok(Recorded::Already(id));
        }
        let id = self.db.query(
            "INSERT INTO fsprof_crash_studies (uid, recorded, started, config, filesystems,
                patterns, kernel, kernel_build, accel, host, fsprof_version, label, trials,
                complete, results)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
             RETURNING id",
            &[
                row.uid.as_str().into(),
                super::unix_now().into(),
                row.started.into(),
                row.config.as_str().into(),
                row.filesystems.as_str().into(),
                row.patterns.as_str().into(),
                row.kernel.as_str().into(),
                row.kernel_build.as_str().into(),
                row.accel.as_str().into(),
                row.host.as_str().into(),
                row.fsprof_version.as_str().into(),
                row.label.as_str().into(),
                row.trials.into(),
                i64::from(row.complete).into(),
                results.into(),
            ],
        )?[0][0]
            .int();
        let outcomes = outcome_rows(id, s);
        let columns = [
            "study_id",
            "fs",
            "mkfs_opts",
            "mount_opts",
            "method",
            "pattern",
            "point",
            "outcome",
            "trials",
        ];
        self.insert_many("fsprof_crash_outcomes", &columns, &outcomes)?;
        Ok(Recorded::New(id))
    }

    /// Recorded crash studies the filter lets through, oldest first (none when it asks
    /// for a suite: studies have none).
    pub fn crash_studies(&mut self, f: &Filter) -> Result<Vec<CrashRow>> {
        if f.suite.is_some() {
            return Ok(Vec::new());
        }
        self.listed(STUDIES, CRASH_COLUMNS, f, CrashRow::from_row, |r| {
            (r.started, r.id)
        })
    }

    /// Where the studies before `s` end: its own place if recorded, else its start.
    pub fn crash_place_of(&mut self, s: &CrashRow) -> Result<(i64, i64)> {
        self.place(STUDIES, &s.uid, s.started)
    }

    /// The whole crash study `id`, as its JSON file had it.
    pub fn crash_study(&mut self, id: i64) -> Result<CrashStudy> {
        let rows = self.db.query(
            "SELECT results FROM fsprof_crash_studies WHERE id = $1",
            &[id.into()],
        )?;
        let Some(r) = rows.first() else {
            bail!(
                "no crash study c{id} in the history {}",
                self.location.describe()
            );
        };
        serde_json::from_str(&r[0].text()).with_context(|| format!("crash study c{id}"))
    }

    /// The outcome rows stored for study `id`, in the order they were inserted.
    pub fn stored_outcomes(&mut self, id: i64) -> Result<Vec<super::sql::Row>> {
        self.db.query(
            "SELECT study_id, fs, mkfs_opts, mount_opts, method, pattern, point, outcome, trials
             FROM fsprof_crash_outcomes WHERE study_id = $1",
            &[id.into()],
        )
    }

    /// Trials of `outcome` recorded for study `id`, over its cells.
    pub fn crash_outcome_total(&mut self, id: i64, outcome: Outcome) -> Result<i64> {
        Ok(self
            .db
            .query(
                // PostgreSQL sums BIGINT into NUMERIC: cast back.
                "SELECT CAST(COALESCE(SUM(trials), 0) AS BIGINT) FROM fsprof_crash_outcomes
                 WHERE study_id = $1 AND outcome = $2",
                &[id.into(), outcome.name().into()],
            )?
            .first()
            .map_or(0, |r| r[0].int()))
    }
}

/// The outcome rows of study `s` as stored under `id`, one per cell and outcome.
pub fn outcome_rows(id: i64, s: &CrashStudy) -> Vec<[Value; 9]> {
    s.cells
        .iter()
        .flat_map(|c| Outcome::ALL.iter().map(move |&o| outcome_row(id, c, o)))
        .collect()
}

fn outcome_row(id: i64, c: &CrashCell, o: Outcome) -> [Value; 9] {
    [
        id.into(),
        c.fs.as_str().into(),
        c.mkfs_opts.as_str().into(),
        c.mount_opts.as_str().into(),
        c.method.as_str().into(),
        c.pattern.name().into(),
        c.point.name().into(),
        o.name().into(),
        i64::from(c.outcomes.get(&o).copied().unwrap_or(0)).into(),
    ]
}

/// Records a finished (or stopped) crash study where the user asked, and says so on
/// stderr; a failure is one line and does not touch the study's own files.
pub fn record_study(s: &CrashStudy, location: Option<&str>) -> Result<()> {
    let mut h = History::open(super::Location::resolve(location)?)?;
    let name = h.location.describe();
    match h
        .record_crash(s)
        .with_context(|| format!("recording into the history {name}"))?
    {
        Recorded::New(id) => {
            eprintln!("fsprof: recorded as crash study c{id} in the history {name}")
        }
        Recorded::Already(id) => {
            eprintln!("fsprof: already in the history {name} as crash study c{id}")
        }
    }
    Ok(())
}
