//! The two databases a history lives in, behind one small interface: SQLite (a file, the
//! default) and PostgreSQL (a server a team shares). The history's SQL is written once;
//! both accept `$1`-style parameters and `RETURNING`. Only the table definitions differ.

use anyhow::{Context, Result, anyhow};

/// A parameter or a column value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Real(f64),
    Text(String),
    Null,
}

impl Value {
    pub fn int(&self) -> i64 {
        match self {
            Value::Int(i) => *i,
            Value::Real(r) => *r as i64,
            _ => 0,
        }
    }
    pub fn real(&self) -> f64 {
        match self {
            Value::Real(r) => *r,
            Value::Int(i) => *i as f64,
            _ => 0.0,
        }
    }
    pub fn text(&self) -> String {
        match self {
            Value::Text(t) => t.clone(),
            Value::Int(i) => i.to_string(),
            Value::Real(r) => r.to_string(),
            Value::Null => String::new(),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Text(s.to_string())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Text(s)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Value {
        Value::Int(i)
    }
}
impl From<f64> for Value {
    fn from(r: f64) -> Value {
        Value::Real(r)
    }
}

pub type Row = Vec<Value>;

/// SQLite's error in one line: a statement it could not prepare says why, not the whole
/// statement (which is fsprof's, and spans lines). A store whose tables are not the
/// ones fsprof made is damaged, and says so.
fn sqlite_error(e: rusqlite::Error) -> anyhow::Error {
    let why = match &e {
        rusqlite::Error::SqlInputError { msg, .. } => msg.clone(),
        _ => e.to_string(),
    };
    let why = why.split_whitespace().collect::<Vec<_>>().join(" ");
    match why.starts_with("no such column")
        || why.starts_with("table ") && why.contains("has no column")
    {
        true => anyhow!(
            "its tables are not the ones fsprof makes (damaged, or another program's): {why}"
        ),
        false => anyhow!("{why}"),
    }
}

/// A connection to either database.
pub enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

/// How long a writer waits for another fsprof's transaction on the same SQLite file.
const SQLITE_BUSY_MS: u64 = 30_000;

/// Key of the PostgreSQL advisory lock that serialises schema set-up between machines.
const SCHEMA_LOCK: i64 = 0x6673_7072_6f66; // "fsprof"

impl Db {
    pub fn open_sqlite(path: &std::path::Path) -> Result<Db> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let c = rusqlite::Connection::open(path).map_err(|e| anyhow!("{e}"))?;
        c.busy_timeout(std::time::Duration::from_millis(SQLITE_BUSY_MS))?;
        c.pragma_update(None, "foreign_keys", "ON")?;
        Ok(Db::Sqlite(c))
    }

    pub fn open_postgres(url: &str) -> Result<Db> {
        let c = postgres::Client::connect(url, postgres::NoTls).map_err(|e| anyhow!("{e}"))?;
        Ok(Db::Postgres(Box::new(c)))
    }

    /// A column type of the table definitions, in this database's words.
    pub fn ty(&self, t: Type) -> &'static str {
        match (self, t) {
            (Db::Sqlite(_), Type::Id) => "INTEGER PRIMARY KEY",
            (Db::Sqlite(_), Type::Int) => "INTEGER",
            (Db::Sqlite(_), Type::Real) => "REAL",
            (Db::Postgres(_), Type::Id) => "BIGSERIAL PRIMARY KEY",
            (Db::Postgres(_), Type::Int) => "BIGINT",
            (Db::Postgres(_), Type::Real) => "DOUBLE PRECISION",
        }
    }

    /// Statements without parameters, in one transaction-free batch.
    pub fn batch(&mut self, sql: &str) -> Result<()> {
        match self {
            Db::Sqlite(c) => c.execute_batch(sql).map_err(sqlite_error),
            Db::Postgres(c) => c.batch_execute(sql).map_err(pg_error),
        }
    }

    /// Starts a transaction that holds the write lock from the start (SQLite) or the
    /// schema lock (PostgreSQL, for set-up): two fsprofs never interleave their writes.
    pub fn begin_exclusive(&mut self) -> Result<()> {
        match self {
            Db::Sqlite(_) => self.batch("BEGIN IMMEDIATE"),
            Db::Postgres(_) => {
                self.batch("BEGIN")?;
                self.exec("SELECT pg_advisory_xact_lock($1)", &[SCHEMA_LOCK.into()])
                    .map(|_| ())
            }
        }
    }

    pub fn exec(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        Ok(self.query(sql, params)?.len() as u64)
    }

    pub fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>> {
        match self {
            Db::Sqlite(c) => sqlite_query(c, sql, params).map_err(sqlite_error),
            Db::Postgres(c) => pg_query(c, sql, params).map_err(pg_error),
        }
    }
}

#[derive(Clone, Copy)]
pub enum Type {
    Id,
    Int,
    Real,
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, Value as V};
        Ok(ToSqlOutput::Owned(match self {
            Value::Int(i) => V::Integer(*i),
            Value::Real(r) => V::Real(*r),
            Value::Text(t) => V::Text(t.clone()),
            Value::Null => V::Null,
        }))
    }
}

fn sqlite_query(
    c: &rusqlite::Connection,
    sql: &str,
    params: &[Value],
) -> rusqlite::Result<Vec<Row>> {
    use rusqlite::types::ValueRef;
    let mut st = c.prepare_cached(sql)?;
    let n = st.column_count();
    let mut rows = st.query(rusqlite::params_from_iter(params))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let mut row = Vec::with_capacity(n);
        for i in 0..n {
            row.push(match r.get_ref(i)? {
                ValueRef::Integer(x) => Value::Int(x),
                ValueRef::Real(x) => Value::Real(x),
                ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                ValueRef::Blob(_) | ValueRef::Null => Value::Null,
            });
        }
        out.push(row);
    }
    Ok(out)
}

fn pg_query(
    c: &mut postgres::Client,
    sql: &str,
    params: &[Value],
) -> Result<Vec<Row>, postgres::Error> {
    use postgres::types::{ToSql, Type as T};
    let boxed: Vec<Box<dyn ToSql + Sync>> = params
        .iter()
        .map(|v| -> Box<dyn ToSql + Sync> {
            match v {
                Value::Int(i) => Box::new(*i),
                Value::Real(r) => Box::new(*r),
                Value::Text(t) => Box::new(t.clone()),
                Value::Null => Box::new(None::<String>),
            }
        })
        .collect();
    let refs: Vec<&(dyn ToSql + Sync)> = boxed.iter().map(|b| b.as_ref()).collect();
    let rows = c.query(sql, &refs)?;
    Ok(rows
        .iter()
        .map(|r| {
            r.columns()
                .iter()
                .enumerate()
                .map(|(i, col)| match *col.type_() {
                    T::INT8 => r.get::<_, Option<i64>>(i).map_or(Value::Null, Value::Int),
                    T::INT4 => r
                        .get::<_, Option<i32>>(i)
                        .map_or(Value::Null, |x| Value::Int(x.into())),
                    T::FLOAT8 => r.get::<_, Option<f64>>(i).map_or(Value::Null, Value::Real),
                    T::TEXT | T::VARCHAR => r
                        .get::<_, Option<String>>(i)
                        .map_or(Value::Null, Value::Text),
                    _ => Value::Null,
                })
                .collect()
        })
        .collect())
}

/// PostgreSQL's own message (the driver's Display says only "db error").
fn pg_error(e: postgres::Error) -> anyhow::Error {
    match e.as_db_error() {
        Some(db) => anyhow!("{}", db.message()),
        None => anyhow!("{e}"),
    }
}
