//! The ways applications update a file, for the crash study: each pattern first leaves a
//! durable old version (written, fsynced, its directory fsynced), then updates it the way
//! real programs do, with or without the fsyncs that make the update durable. What a crash
//! leaves of the file is then classified against the old and the new content.

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::FileExt,
    path::Path,
};

use anyhow::{Context, Result};
use clap::ValueEnum;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strum::{IntoStaticStr, VariantArray};

/// The file an application cares about, and the temporary it writes first.
pub const FILE: &str = "conf";
const TMP: &str = "conf.tmp";
/// Bytes of each version: several blocks, so a partial write shows as mixed content.
const SIZE: usize = 64 << 10;

#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    ValueEnum,
    Serialize,
    Deserialize,
    JsonSchema,
    IntoStaticStr,
    VariantArray,
)]
#[strum(serialize_all = "kebab-case")]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Write `conf.tmp`, rename it over `conf`; no fsync (the ext4 delayed-allocation case).
    RenameNoFsync,
    /// Write `conf.tmp`, fsync it, rename it over `conf`.
    RenameFsync,
    /// Write `conf.tmp`, fsync it, rename it over `conf`, fsync the directory: durable.
    RenameFsyncDir,
    /// Open `conf` with O_TRUNC and write the new content; no fsync.
    TruncateWrite,
    /// Append to `conf`; no fsync.
    Append,
    /// Append to `conf` and fdatasync it: durable (the size is data fdatasync keeps).
    AppendFdatasync,
    /// Create `conf` (none before), write, fsync it; the directory is not fsynced.
    CreateFsync,
    /// Overwrite `conf` in place, same length; no fsync.
    Overwrite,
    /// A SQLite commit in WAL mode with synchronous=FULL, the connection closed without a
    /// checkpoint (as a running application leaves it): durable, SQLite promises.
    SqliteWal,
    /// A SQLite commit with a rollback journal (journal_mode=DELETE) and synchronous=FULL:
    /// atomic, but the commit is the journal's unlink, which SQLite does not fsync the
    /// directory for below synchronous=EXTRA.
    SqliteRollback,
}

impl Pattern {
    pub const ALL: &'static [Pattern] = <Pattern as strum::VariantArray>::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }

    /// POSIX (or SQLite) promises the new content once the pattern returns: a crash must
    /// never lose it.
    pub fn durable(self) -> bool {
        matches!(
            self,
            Pattern::RenameFsyncDir | Pattern::AppendFdatasync | Pattern::SqliteWal
        )
    }

    /// The journal mode of a SQLite pattern; None for the plain-file ones.
    fn sqlite_journal(self) -> Option<&'static str> {
        match self {
            Pattern::SqliteWal => Some("WAL"),
            Pattern::SqliteRollback => Some("DELETE"),
            _ => None,
        }
    }

    /// The content before the update (None: no file), and after it.
    pub fn versions(self) -> (Option<Vec<u8>>, Vec<u8>) {
        let (old, new) = (old_content().to_vec(), new_content().to_vec());
        match self {
            Pattern::CreateFsync => (None, new),
            Pattern::Append | Pattern::AppendFdatasync => {
                let appended = [old.as_slice(), &new].concat();
                (Some(old), appended)
            }
            _ => (Some(old), new),
        }
    }

    /// Leaves the old version durable in `dir`.
    pub fn prepare(self, dir: &Path) -> Result<()> {
        if let Some(mode) = self.sqlite_journal() {
            sqlite::prepare(dir, mode, old_content())?;
            return fsync_dir(dir);
        }
        if let (Some(old), _) = self.versions() {
            write_file(&dir.join(FILE), &old, true)?;
            fsync_dir(dir)?;
        }
        Ok(())
    }

    /// Makes the update, as an application would.
    pub fn update(self, dir: &Path) -> Result<()> {
        let (file, tmp) = (dir.join(FILE), dir.join(TMP));
        let new = new_content();
        match self {
            Pattern::RenameNoFsync | Pattern::RenameFsync | Pattern::RenameFsyncDir => {
                write_file(&tmp, new, self != Pattern::RenameNoFsync)?;
                fs::rename(&tmp, &file).context("rename")?;
                if self == Pattern::RenameFsyncDir {
                    fsync_dir(dir)?;
                }
            }
            Pattern::TruncateWrite => write_file(&file, new, false)?,
            Pattern::CreateFsync => write_file(&file, new, true)?,
            Pattern::Append | Pattern::AppendFdatasync => {
                let mut f = OpenOptions::new().append(true).open(&file)?;
                f.write_all(new)?;
                if self == Pattern::AppendFdatasync {
                    f.sync_data().context("fdatasync")?;
                }
            }
            Pattern::Overwrite => {
                let f = OpenOptions::new().write(true).open(&file)?;
                f.write_all_at(new, 0)?;
            }
            Pattern::SqliteWal | Pattern::SqliteRollback => sqlite::commit(dir, new)?,
        }
        Ok(())
    }
}

/// The SQLite patterns: one row of a table in `conf.db` holds the content.
mod sqlite {
    use std::path::Path;

    use anyhow::{Context, Result};
    use rusqlite::{Connection, OptionalExtension, config::DbConfig};

    pub const DB: &str = "conf.db";

    fn open(dir: &Path) -> Result<Connection> {
        let c = Connection::open(dir.join(DB)).context("opening the SQLite database")?;
        c.pragma_update(None, "synchronous", "FULL")?;
        // An application's connection stays open: the commit stays in the WAL, not
        // checkpointed into the database by a close.
        c.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        Ok(c)
    }

    /// A database in journal mode `mode` whose row holds `old`, checkpointed.
    pub fn prepare(dir: &Path, mode: &str, old: &[u8]) -> Result<()> {
        let c = Connection::open(dir.join(DB)).context("creating the SQLite database")?;
        c.pragma_update(None, "synchronous", "FULL")?;
        c.pragma_update(None, "journal_mode", mode)?;
        c.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB NOT NULL)", [])?;
        c.execute("INSERT INTO kv VALUES ('conf', ?1)", [old])?;
        Ok(())
    }

    /// Commits `new` as the row's value.
    pub fn commit(dir: &Path, new: &[u8]) -> Result<()> {
        let n = open(dir)?.execute("UPDATE kv SET v = ?1 WHERE k = 'conf'", [new])?;
        anyhow::ensure!(n == 1, "the row to update is missing");
        Ok(())
    }

    /// The row's value as SQLite recovers it (rolling a hot journal back, replaying the
    /// WAL); Ok(None): no row; Err: the database does not open or is not intact.
    pub fn read(dir: &Path) -> Result<Option<Vec<u8>>> {
        let path = dir.join(DB);
        if !path.exists() {
            return Ok(None);
        }
        let c = Connection::open(path)?;
        let check: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        anyhow::ensure!(check == "ok", "integrity check: {check}");
        Ok(
            c.query_row("SELECT v FROM kv WHERE k = 'conf'", [], |r| r.get(0))
                .optional()?,
        )
    }
}

/// Directory of the `i`th of many independent copies (the traced cost pass).
pub fn copy_dir(dir: &Path, i: u32) -> std::path::PathBuf {
    dir.join(format!("u{i}"))
}

/// Leaves `count` independent copies of the old version, each durable in its own directory.
pub fn prepare_copies(pattern: Pattern, dir: &Path, count: u32) -> Result<()> {
    for i in 0..count {
        let d = copy_dir(dir, i);
        fs::create_dir(&d)?;
        pattern.prepare(&d)?;
    }
    fsync_dir(dir)
}

/// Updates every copy `prepare_copies` left (what `fsprof crash` traces for the cost);
/// returns how long the updates took, the process's start and exit left out.
pub fn update_copies(pattern: Pattern, dir: &Path, count: u32) -> Result<std::time::Duration> {
    if let Ok(name) = std::ffi::CString::new(pattern.name()) {
        let _ = rustix::thread::set_name(&name);
    }
    let start = std::time::Instant::now();
    (0..count).try_for_each(|i| pattern.update(&copy_dir(dir, i)))?;
    Ok(start.elapsed())
}

/// `SIZE` bytes of a recognisable text: "old 000000 old 000008 …" marks every 8 bytes.
fn text(tag: &[u8; 4]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SIZE);
    while out.len() < SIZE {
        out.extend_from_slice(tag);
        out.extend_from_slice(format!("{:06x}\n", out.len() % 0x100_0000).as_bytes());
    }
    out.truncate(SIZE);
    out
}

/// The old and the new version, made once: the cost pass times updates, not this
/// (formatting 64 KiB took ~400 µs, ten times an unsynced update).
fn old_content() -> &'static [u8] {
    static V: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    V.get_or_init(|| text(b"old "))
}

fn new_content() -> &'static [u8] {
    static V: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    V.get_or_init(|| text(b"NEW "))
}

/// Creates or truncates `path`, writes `data`, fsyncs it if asked.
fn write_file(path: &Path, data: &[u8], fsync: bool) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(data)?;
    if fsync {
        f.sync_all().context("fsync")?;
    }
    Ok(())
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?
        .sync_all()
        .context("fsync of the directory")
}

/// What the application finds after the crash.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    IntoStaticStr,
    VariantArray,
)]
#[strum(serialize_all = "kebab-case")]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The new content, whole.
    New,
    /// The old content, whole (for a created file: still no file).
    Old,
    /// A file of length zero.
    Empty,
    /// The right length or less, all zero bytes.
    Zeros,
    /// Anything else: parts of both, a torn append, zeroed blocks within.
    Mixed,
    /// No file where there had been one.
    Missing,
    /// Reading it failed.
    Error,
}

impl Outcome {
    pub const ALL: &'static [Outcome] = <Outcome as strum::VariantArray>::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Whether the application lost its data: neither version is there whole.
    pub fn is_loss(self) -> bool {
        !matches!(self, Outcome::New | Outcome::Old)
    }
}

/// Classifies `conf` (or the SQLite row) in `dir` against the pattern's versions; an error
/// outcome comes with why (a database that does not open, a read that fails).
pub fn classify(pattern: Pattern, dir: &Path) -> (Outcome, Option<String>) {
    let (old, new) = pattern.versions();
    let found = if pattern.sqlite_journal().is_some() {
        match sqlite::read(dir) {
            Ok(Some(found)) => found,
            Ok(None) => return (Outcome::Missing, None),
            Err(e) => return (Outcome::Error, Some(format!("{e:#}"))),
        }
    } else {
        match fs::read(dir.join(FILE)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let absent = if old.is_none() {
                    Outcome::Old
                } else {
                    Outcome::Missing
                };
                return (absent, None);
            }
            Err(e) => return (Outcome::Error, Some(format!("reading {FILE}: {e}"))),
        }
    };
    (compare(&found, old.as_deref(), &new), None)
}

/// What `found` is against the old and the new version.
fn compare(found: &[u8], old: Option<&[u8]>, new: &[u8]) -> Outcome {
    if found == new {
        Outcome::New
    } else if old == Some(found) {
        Outcome::Old
    } else if found.is_empty() {
        Outcome::Empty
    } else if found.iter().all(|&b| b == 0) {
        Outcome::Zeros
    } else {
        Outcome::Mixed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("fsprof-crash-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn without_a_crash_every_pattern_leaves_the_new_version() {
        for &p in Pattern::ALL {
            let d = scratch(p.name());
            p.prepare(&d).unwrap();
            assert_eq!(classify(p, &d).0, Outcome::Old, "{p:?} before");
            p.update(&d).unwrap();
            assert_eq!(classify(p, &d).0, Outcome::New, "{p:?} after");
            fs::remove_dir_all(&d).unwrap();
        }
    }

    #[test]
    fn damaged_files_are_told_apart() {
        let d = scratch("damaged");
        let p = Pattern::RenameNoFsync;
        let path = d.join(FILE);
        for (bytes, want) in [
            (vec![], Outcome::Empty),
            (vec![0u8; SIZE], Outcome::Zeros),
            (
                [&old_content()[..SIZE / 2], &new_content()[SIZE / 2..]].concat(),
                Outcome::Mixed,
            ),
        ] {
            fs::write(&path, bytes).unwrap();
            assert_eq!(classify(p, &d), (want, None));
        }
        fs::remove_file(&path).unwrap();
        assert_eq!(classify(p, &d), (Outcome::Missing, None));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_error_says_why() {
        let d = scratch("error");
        let p = Pattern::SqliteWal;
        p.prepare(&d).unwrap();
        fs::write(d.join(sqlite::DB), vec![0x5a; 8192]).unwrap();
        let (outcome, why) = classify(p, &d);
        assert_eq!(outcome, Outcome::Error);
        assert!(
            why.as_deref().unwrap_or("").contains("not a database"),
            "{why:?}"
        );
        // A conf that is a directory cannot be read.
        let p = Pattern::RenameNoFsync;
        fs::create_dir_all(d.join(FILE)).unwrap();
        let (outcome, why) = classify(p, &d);
        assert_eq!(outcome, Outcome::Error);
        assert!(why.unwrap().starts_with("reading conf"));
        fs::remove_dir_all(&d).unwrap();
    }
}
