//! Results history: every `fsprof run` recorded in a store — an SQLite file by default, or
//! a PostgreSQL database a team shares — with its configuration, kernel, host and label, its
//! whole results and every figure of every pass, so a new run compares against its own past
//! and a figure's trend shows over runs and kernels.

pub mod crash;
pub mod sql;
pub mod trend;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::{
    analysis::metrics::cell_metrics,
    results::{RunResult, StepRun},
};
use sql::{Db, Row, Type, Value};

/// Version of the history's tables. A newer fsprof migrates an older store (`MIGRATIONS`);
/// an older fsprof refuses a newer one. 2: crash studies.
pub const SCHEMA_VERSION: i64 = 2;

/// SQL that takes a store from version i + 1 to i + 2, by i. New tables are not here:
/// set-up creates every table that does not exist yet, in a new store or an old one.
const MIGRATIONS: &[&str] = &[""];

/// The environment variable that names the store when `--history` does not.
pub const HISTORY_ENV: &str = "FSPROF_HISTORY";

/// Where a history lives.
#[derive(Clone, Debug, PartialEq)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Location {
    /// `--history` if given, else $FSPROF_HISTORY, else the user's data directory.
    pub fn resolve(given: Option<&str>) -> Result<Location> {
        let env = std::env::var(HISTORY_ENV).ok().filter(|s| !s.is_empty());
        match given.map(str::to_string).or(env) {
            Some(s) => Ok(Location::parse(&s)),
            None => Ok(Location::Sqlite(default_path()?)),
        }
    }

    pub fn parse(s: &str) -> Location {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Location::Postgres(s.to_string())
        } else {
            Location::Sqlite(PathBuf::from(s))
        }
    }

    /// How messages name it: a server without its credentials.
    pub fn describe(&self) -> String {
        match self {
            Location::Sqlite(p) => p.display().to_string(),
            Location::Postgres(url) => redact(url),
        }
    }
}

/// `postgres://user:secret@host/db?password=x` → `postgres://user@host/db`.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let rest = rest.split('?').next().unwrap_or_default();
    let rest = match rest.rsplit_once('@') {
        Some((user, host)) => format!("{}@{host}", user.split(':').next().unwrap_or_default()),
        None => rest.to_string(),
    };
    format!("{scheme}://{rest}")
}

/// $XDG_DATA_HOME/fsprof/history.sqlite, or ~/.local/share/fsprof/history.sqlite.
fn default_path() -> Result<PathBuf> {
    let data = match std::env::var_os("XDG_DATA_HOME").filter(|s| !s.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").context(
            "no HOME to keep the history in: give --history PATH or set FSPROF_HISTORY",
        )?)
        .join(".local/share"),
    };
    Ok(data.join("fsprof/history.sqlite"))
}

/// A recorded run as listed: its key and facts, not its figures.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RunRow {
    pub id: i64,
    pub uid: String,
    pub started: i64,
    /// What must match for two runs to compare: suite, scale, steps, filesystems with
    /// their options, accelerator, host, CPUs.
    pub config: String,
    pub suite: String,
    pub scale: f64,
    pub steps: String,
    pub filesystems: String,
    pub kernel: String,
    pub kernel_build: String,
    pub accel: String,
    pub host: String,
    pub cpus: i64,
    pub fsprof_version: String,
    pub label: String,
    pub passes: i64,
    pub complete: bool,
}

/// The table of runs.
const RUNS: &str = "fsprof_runs";

const RUN_COLUMNS: &str = "id, uid, started, config, suite, scale, steps, filesystems, kernel, \
     kernel_build, accel, host, cpus, fsprof_version, label, passes, complete";

impl RunRow {
    fn from_row(r: &[Value]) -> RunRow {
        RunRow {
            id: r[0].int(),
            uid: r[1].text(),
            started: r[2].int(),
            config: r[3].text(),
            suite: r[4].text(),
            scale: r[5].real(),
            steps: r[6].text(),
            filesystems: r[7].text(),
            kernel: r[8].text(),
            kernel_build: r[9].text(),
            accel: r[10].text(),
            host: r[11].text(),
            cpus: r[12].int(),
            fsprof_version: r[13].text(),
            label: r[14].text(),
            passes: r[15].int(),
            complete: r[16].int() != 0,
        }
    }

    /// The row a results file makes.
    pub fn of(r: &RunResult) -> RunRow {
        let filesystems: Vec<String> = r.filesystems.iter().map(|f| f.column()).collect();
        RunRow {
            id: 0,
            uid: if r.run_id.is_empty() {
                // Results from before run ids: the same file always gets the same id.
                format!("started-{}-{}-{}", r.started, r.host, r.kernel)
            } else {
                r.run_id.clone()
            },
            started: r.started as i64,
            config: config_of(r),
            suite: r.suite.clone(),
            scale: r.scale,
            steps: r.step_names().join(","),
            filesystems: filesystems.join(","),
            kernel: r.kernel.clone(),
            kernel_build: r.kernel_build.clone(),
            accel: accel_of(r),
            host: r.host.clone(),
            cpus: r.cpus as i64,
            fsprof_version: r.fsprof_version.clone(),
            label: r.label.clone().unwrap_or_default(),
            passes: r.passes as i64,
            complete: r.complete,
        }
    }
}

/// `host`, or the VM's accelerator (`qemu-tcg`, `qemu-kvm`).
fn accel_of(r: &RunResult) -> String {
    match &r.vm {
        Some(vm) => format!("qemu-{}", vm.accel),
        None => "host".to_string(),
    }
}

/// The configuration key: everything that must be equal for two runs' figures to compare,
/// except the kernel (what a history usually follows) and the label.
pub fn config_of(r: &RunResult) -> String {
    let mut fs: Vec<String> = r
        .filesystems
        .iter()
        .map(|f| {
            format!(
                "{}[mkfs:{}|mount:{}]",
                f.fs,
                f.mkfs_opts.join(" "),
                f.mount_opts
            )
        })
        .collect();
    fs.dedup();
    format!(
        "suite={} scale={} steps={} jobs={} fs={} accel={} host={} cpus={}",
        r.suite,
        r.scale,
        r.step_names().join(","),
        r.jobs,
        fs.join(","),
        accel_of(r),
        r.host,
        r.cpus
    )
}

/// When a row is recorded, Unix time.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Which recorded runs a command wants.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub config: Option<String>,
    pub suite: Option<String>,
    pub fs: Option<String>,
    pub kernel: Option<String>,
    pub label: Option<String>,
    pub host: Option<String>,
    /// Unix time: runs started at or after it.
    pub since: Option<i64>,
    pub complete_only: bool,
    /// Leave out this run (the one being compared).
    pub except_uid: Option<String>,
    /// Only runs before this (started, id): a run's past.
    pub before: Option<(i64, i64)>,
    /// The newest this many (after the others).
    pub last: Option<usize>,
}

impl Filter {
    /// The WHERE clause and its parameters, on the columns runs and crash studies share
    /// (`suite` only where the table has one).
    fn sql(&self, has_suite: bool) -> (String, Vec<Value>) {
        let mut conds: Vec<String> = Vec::new();
        let mut params: Vec<Value> = Vec::new();
        let mut eq = |col: &str, v: &Option<String>| {
            if let Some(v) = v {
                params.push(v.as_str().into());
                conds.push(format!("{col} = ${}", params.len()));
            }
        };
        eq("config", &self.config);
        if has_suite {
            eq("suite", &self.suite);
        }
        eq("kernel", &self.kernel);
        eq("label", &self.label);
        eq("host", &self.host);
        if let Some(uid) = &self.except_uid {
            params.push(uid.as_str().into());
            conds.push(format!("uid <> ${}", params.len()));
        }
        if let Some(fs) = &self.fs {
            // A member of the comma-separated list.
            params.push(format!("%,{fs},%").into());
            conds.push(format!(
                "(',' || filesystems || ',') LIKE ${}",
                params.len()
            ));
        }
        if let Some(t) = self.since {
            params.push(t.into());
            conds.push(format!("started >= ${}", params.len()));
        }
        if self.complete_only {
            conds.push("complete = 1".to_string());
        }
        let filter = if conds.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conds.join(" AND "))
        };
        (filter, params)
    }

    /// `before` and `last` on rows in (started, id) order.
    fn trim<T>(&self, mut rows: Vec<T>, place: fn(&T) -> (i64, i64)) -> Vec<T> {
        if let Some(b) = self.before {
            rows.retain(|r| place(r) < b);
        }
        if let Some(n) = self.last {
            rows.drain(..rows.len().saturating_sub(n));
        }
        rows
    }
}

/// What `record` did.
pub enum Recorded {
    New(i64),
    /// The run was in the history already, under this id.
    Already(i64),
}

pub struct History {
    db: Db,
    pub location: Location,
}

impl History {
    /// Opens (creating or migrating) the store; one-line errors naming it.
    pub fn open(location: Location) -> Result<History> {
        let name = location.describe();
        let db = match &location {
            Location::Sqlite(p) => Db::open_sqlite(p),
            Location::Postgres(url) => Db::open_postgres(url),
        }
        .with_context(|| format!("history {name}"))?;
        let mut h = History { db, location };
        h.set_up().with_context(|| format!("history {name}"))?;
        Ok(h)
    }

    fn set_up(&mut self) -> Result<()> {
        let (id, int, real) = (
            self.db.ty(Type::Id),
            self.db.ty(Type::Int),
            self.db.ty(Type::Real),
        );
        self.db.begin_exclusive()?;
        let done = self.set_up_tables(id, int, real);
        self.finish(done)
    }

    fn set_up_tables(&mut self, id: &str, int: &str, real: &str) -> Result<()> {
        self.db.batch(&format!(
            "CREATE TABLE IF NOT EXISTS fsprof_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS fsprof_runs (id {id}, uid TEXT NOT NULL UNIQUE,
                recorded {int} NOT NULL, started {int} NOT NULL, config TEXT NOT NULL,
                suite TEXT NOT NULL, scale {real} NOT NULL, steps TEXT NOT NULL,
                filesystems TEXT NOT NULL, kernel TEXT NOT NULL, kernel_build TEXT NOT NULL,
                accel TEXT NOT NULL, host TEXT NOT NULL, cpus {int} NOT NULL,
                fsprof_version TEXT NOT NULL, label TEXT NOT NULL, passes {int} NOT NULL,
                complete {int} NOT NULL, results TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS fsprof_runs_config ON fsprof_runs (config, started);
             CREATE TABLE IF NOT EXISTS fsprof_figures (
                run_id {int} NOT NULL REFERENCES fsprof_runs (id) ON DELETE CASCADE,
                cell TEXT NOT NULL, step TEXT NOT NULL, metric TEXT NOT NULL,
                pass {int} NOT NULL, value {real} NOT NULL);
             CREATE INDEX IF NOT EXISTS fsprof_figures_run ON fsprof_figures (run_id, step, metric);
             {}",
            crash::tables(id, int)
        ))?;
        let version = self
            .db
            .query(
                "SELECT value FROM fsprof_meta WHERE key = 'schema_version'",
                &[],
            )?
            .first()
            .map(|r| r[0].text().parse::<i64>().unwrap_or(0));
        match version {
            None => {
                self.db.exec(
                    "INSERT INTO fsprof_meta (key, value) VALUES ('schema_version', $1)",
                    &[SCHEMA_VERSION.to_string().into()],
                )?;
            }
            Some(v) if v > SCHEMA_VERSION => bail!(
                "its schema is version {v}, newer than this fsprof's ({SCHEMA_VERSION}): use a newer fsprof"
            ),
            Some(v) => self.migrate(v)?,
        }
        Ok(())
    }

    fn migrate(&mut self, from: i64) -> Result<()> {
        for v in from..SCHEMA_VERSION {
            let sql = MIGRATIONS[(v - 1) as usize];
            if !sql.is_empty() {
                self.db.batch(sql)?;
            }
        }
        if from < SCHEMA_VERSION {
            self.db.exec(
                "UPDATE fsprof_meta SET value = $1 WHERE key = 'schema_version'",
                &[SCHEMA_VERSION.to_string().into()],
            )?;
        }
        Ok(())
    }

    /// Commits when `done` is Ok, else rolls back; passes `done` on.
    fn finish<T>(&mut self, done: Result<T>) -> Result<T> {
        match done {
            Ok(v) => {
                self.db.batch("COMMIT")?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.db.batch("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Records a run with every figure of every pass, in one transaction; a run already
    /// recorded (same run id) is not recorded again.
    pub fn record(&mut self, r: &RunResult) -> Result<Recorded> {
        let row = RunRow::of(r);
        let results = serde_json::to_string(r)?;
        self.db.begin_exclusive()?;
        let done = self.record_in_transaction(r, &row, results);
        self.finish(done)
    }

    fn record_in_transaction(
        &mut self,
        r: &RunResult,
        row: &RunRow,
        results: String,
    ) -> Result<Recorded> {
        if let Some(id) = self.id_of(RUNS, &row.uid)? {
            return Ok(Recorded::Already(id));
        }
        let id = self.db.query(
            "INSERT INTO fsprof_runs (uid, recorded, started, config, suite, scale, steps,
                filesystems, kernel, kernel_build, accel, host, cpus, fsprof_version, label,
                passes, complete, results)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
             RETURNING id",
            &[
                row.uid.as_str().into(),
                unix_now().into(),
                row.started.into(),
                row.config.as_str().into(),
                row.suite.as_str().into(),
                row.scale.into(),
                row.steps.as_str().into(),
                row.filesystems.as_str().into(),
                row.kernel.as_str().into(),
                row.kernel_build.as_str().into(),
                row.accel.as_str().into(),
                row.host.as_str().into(),
                row.cpus.into(),
                row.fsprof_version.as_str().into(),
                row.label.as_str().into(),
                row.passes.into(),
                i64::from(row.complete).into(),
                results.into(),
            ],
        )?[0][0]
            .int();
        self.insert_figures(id, r)?;
        Ok(Recorded::New(id))
    }

    /// The id of the row of `table` recorded under `uid`.
    fn id_of(&mut self, table: &str, uid: &str) -> Result<Option<i64>> {
        Ok(self
            .db
            .query(
                &format!("SELECT id FROM {table} WHERE uid = $1"),
                &[uid.into()],
            )?
            .first()
            .map(|r| r[0].int()))
    }

    /// Where the rows of `table` before the one recorded as `uid` end: its own place if
    /// recorded, else its start.
    fn place(&mut self, table: &str, uid: &str, started: i64) -> Result<(i64, i64)> {
        Ok(match self.id_of(table, uid)? {
            Some(id) => (started, id),
            None => (started, i64::MAX),
        })
    }

    /// The rows of `table` (`columns`, made by `from_row`) the filter lets through, oldest
    /// first.
    fn listed<T>(
        &mut self,
        table: &str,
        columns: &str,
        f: &Filter,
        from_row: fn(&[Value]) -> T,
        place: fn(&T) -> (i64, i64),
    ) -> Result<Vec<T>> {
        let (filter, params) = f.sql(table == RUNS);
        let sql = format!("SELECT {columns} FROM {table} {filter} ORDER BY started, id");
        let rows = self.db.query(&sql, &params)?;
        Ok(f.trim(rows.iter().map(|r| from_row(r)).collect(), place))
    }

    /// Every figure compare judges, per pass, as rows (cell, step, metric, pass, value).
    fn insert_figures(&mut self, id: i64, r: &RunResult) -> Result<()> {
        let columns = ["run_id", "cell", "step", "metric", "pass", "value"];
        self.insert_many("fsprof_figures", &columns, &figure_rows(id, r))
    }

    /// The figure rows stored for run `id` (run_id, cell, step, metric, pass, value), in
    /// the order `figure_rows` makes them.
    pub fn stored_figures(&mut self, id: i64) -> Result<Vec<Row>> {
        self.db.query(
            "SELECT run_id, cell, step, metric, pass, value FROM fsprof_figures
             WHERE run_id = $1 ORDER BY cell, step, metric, pass",
            &[id.into()],
        )
    }

    /// Inserts `rows` (one value per column each), many rows per statement: one round trip
    /// per 150 rows to a server.
    fn insert_many<const N: usize>(
        &mut self,
        table: &str,
        columns: &[&str; N],
        rows: &[[Value; N]],
    ) -> Result<()> {
        for chunk in rows.chunks(150) {
            let values: Vec<String> = (0..chunk.len())
                .map(|i| {
                    let marks: Vec<String> = (1..=N).map(|c| format!("${}", i * N + c)).collect();
                    format!("({})", marks.join(", "))
                })
                .collect();
            let sql = format!(
                "INSERT INTO {table} ({}) VALUES {}",
                columns.join(", "),
                values.join(", ")
            );
            let params: Vec<Value> = chunk.iter().flat_map(|r| r.iter().cloned()).collect();
            self.db.exec(&sql, &params)?;
        }
        Ok(())
    }

    /// Recorded runs the filter lets through, oldest first.
    pub fn runs(&mut self, f: &Filter) -> Result<Vec<RunRow>> {
        self.listed(RUNS, RUN_COLUMNS, f, RunRow::from_row, |r| {
            (r.started, r.id)
        })
    }

    /// Where the runs before `r` end: its own place if recorded, else its start.
    pub fn place_of(&mut self, r: &RunRow) -> Result<(i64, i64)> {
        self.place(RUNS, &r.uid, r.started)
    }

    pub fn run(&mut self, id: i64) -> Result<RunRow> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM fsprof_runs WHERE id = $1");
        match self.db.query(&sql, &[id.into()])?.first() {
            Some(r) => Ok(RunRow::from_row(r)),
            None => bail!("no run #{id} in the history {}", self.location.describe()),
        }
    }

    /// The whole results of run `id`, as its JSON file had them.
    pub fn results(&mut self, id: i64) -> Result<RunResult> {
        let rows = self.db.query(
            "SELECT results FROM fsprof_runs WHERE id = $1",
            &[id.into()],
        )?;
        let Some(r) = rows.first() else {
            bail!("no run #{id} in the history {}", self.location.describe());
        };
        serde_json::from_str(&r[0].text()).with_context(|| format!("run #{id}'s results"))
    }

    /// (run id, cell, pass, value) of one figure of one step over `ids`.
    pub fn figures(
        &mut self,
        ids: &[i64],
        step: &str,
        metric: &str,
    ) -> Result<Vec<(i64, String, i64, f64)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut params: Vec<Value> = vec![step.into(), metric.into()];
        let list: Vec<String> = ids
            .iter()
            .map(|&id| {
                params.push(id.into());
                format!("${}", params.len())
            })
            .collect();
        let sql = format!(
            "SELECT run_id, cell, pass, value FROM fsprof_figures
             WHERE step = $1 AND metric = $2 AND run_id IN ({}) ORDER BY run_id, cell, pass",
            list.join(", ")
        );
        Ok(self
            .db
            .query(&sql, &params)?
            .iter()
            .map(|r| (r[0].int(), r[1].text(), r[2].int(), r[3].real()))
            .collect())
    }

    /// Figure rows of one run (for checks and the closing count).
    pub fn figure_count(&mut self, id: i64) -> Result<i64> {
        Ok(self
            .db
            .query(
                "SELECT COUNT(*) FROM fsprof_figures WHERE run_id = $1",
                &[id.into()],
            )?
            .first()
            .map(|r| r[0].int())
            .unwrap_or(0))
    }
}

/// The figure rows of run `r` as stored under `id`: every figure compare judges, per pass,
/// sorted as `History::stored_figures` reads them back.
pub fn figure_rows(id: i64, r: &RunResult) -> Vec<[Value; 6]> {
    let mut rows: Vec<[Value; 6]> = Vec::new();
    for f in &r.filesystems {
        for step in r.step_names() {
            let (passes, runs): (Vec<u32>, Vec<&StepRun>) = f.pass_runs(&step).into_iter().unzip();
            for m in cell_metrics(&runs) {
                for (pass, v) in passes.iter().zip(&m.values) {
                    rows.push([
                        id.into(),
                        f.column().into(),
                        step.as_str().into(),
                        m.name.as_str().into(),
                        i64::from(*pass).into(),
                        (*v).into(),
                    ]);
                }
            }
        }
    }
    let key = |r: &[Value; 6]| (r[1].text(), r[2].text(), r[3].text(), r[4].int());
    rows.sort_by_key(key);
    rows
}

/// Records a finished (or stopped) run where the user asked, and says so on stderr. A
/// failure is one line and does not touch the run's own results file.
pub fn record_run(r: &RunResult, location: Option<&str>) -> Result<()> {
    let location = Location::resolve(location)?;
    let mut h = History::open(location)?;
    let name = h.location.describe();
    match h
        .record(r)
        .with_context(|| format!("recording into the history {name}"))?
    {
        Recorded::New(id) => eprintln!("fsprof: recorded as run #{id} in the history {name}"),
        Recorded::Already(id) => eprintln!("fsprof: already in the history {name} as run #{id}"),
    }
    Ok(())
}

/// What a recorded file holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Run,
    Crash,
}

/// Adds results files and crash studies to the history; a file's flame graphs stay where
/// the file is.
pub fn import(h: &mut History, files: &[PathBuf]) -> Result<Vec<(PathBuf, Recorded, Kind)>> {
    files
        .iter()
        .map(|p| {
            Ok(match crate::results::Saved::load(p)? {
                crate::results::Saved::Run(r) => (p.clone(), h.record(&r)?, Kind::Run),
                crate::results::Saved::Crash(s) => (p.clone(), h.record_crash(&s)?, Kind::Crash),
            })
        })
        .collect()
}

/// Writes run `id` back out as a results file.
pub fn export(h: &mut History, id: i64, path: &Path) -> Result<()> {
    h.results(id)?.save(path)
}

#[cfg(test)]
mod tests;
