//! The invariants of what keeps results: a crash study's cells, and a history store's
//! rows against the results stored with them (each stored run's traces are checked too).

use anyhow::Result;

use super::{CRASH_OUTCOMES, Checks, STORED_RUNS, trace::check_trace};
use crate::{
    history::{self, Filter, History, Location, sql::Value},
    results::{RunResult, crash::CrashStudy},
};

/// A crash study: outcomes against trials, and its costs' traces.
pub fn check_study(c: &mut Checks, item: &str, s: &CrashStudy) {
    for cell in &s.cells {
        let what = format!(
            "{item} {} {} {}",
            cell.fs,
            cell.pattern.name(),
            cell.point.name()
        );
        let found: u32 = cell.outcomes.values().sum();
        let timed = (cell.recovery_ns.len() as u32, cell.fsck_ns.len() as u32);
        let ok = if s.complete && found != s.trials {
            Err(format!("{found} outcomes of {} trials", s.trials))
        } else if found > s.trials {
            Err(format!(
                "{found} outcomes, more than the {} trials",
                s.trials
            ))
        } else if timed != (found, found) {
            Err(format!(
                "{found} outcomes but {} recovery and {} fsck times",
                timed.0, timed.1
            ))
        } else {
            Ok(())
        };
        c.holds(CRASH_OUTCOMES, &what, ok);
    }
    for cost in &s.costs {
        let what = format!("{item} cost {} {}", cost.fs, cost.pattern.name());
        check_trace(c, &what, &cost.trace);
    }
}

/// Every traced cell of a run.
pub fn check_run(c: &mut Checks, item: &str, r: &RunResult) {
    for f in &r.filesystems {
        for p in &f.passes {
            for s in p.steps.iter().filter(|s| s.error.is_none()) {
                let what = format!("{item} {}/{} pass {}", f.column(), s.step, p.pass);
                check_trace(c, &what, &s.trace);
            }
        }
    }
}

fn text(rows: &[Vec<Value>]) -> Vec<String> {
    let mut out: Vec<String> = rows
        .iter()
        .map(|r| r.iter().map(Value::text).collect::<Vec<_>>().join("|"))
        .collect();
    out.sort();
    out
}

/// Rows that differ between what is stored and what the stored results give.
fn compare<const N: usize>(
    stored: Vec<Vec<Value>>,
    derived: Vec<[Value; N]>,
) -> Result<(), String> {
    let derived: Vec<Vec<Value>> = derived.into_iter().map(Vec::from).collect();
    let (stored, derived) = (text(&stored), text(&derived));
    if stored == derived {
        return Ok(());
    }
    let first = derived
        .iter()
        .find(|d| !stored.contains(d))
        .or_else(|| stored.iter().find(|s| !derived.contains(s)));
    Err(format!(
        "{} rows stored, {} from its results; first that differs: {}",
        stored.len(),
        derived.len(),
        first.map_or("(order)", String::as_str)
    ))
}

/// A history store: each run's figures and each crash study's outcome rows against the
/// results stored with them, and those results' own invariants.
pub fn check_history(c: &mut Checks, location: Location) -> Result<()> {
    let name = location.describe();
    let mut h = History::open(location)?;
    for row in h.runs(&Filter::default())? {
        let item = format!("{name} run {}", row.id);
        let r = h.results(row.id)?;
        let stored = compare(h.stored_figures(row.id)?, history::figure_rows(row.id, &r));
        c.holds(STORED_RUNS, &item, stored);
        check_run(c, &item, &r);
    }
    for row in h.crash_studies(&Filter::default())? {
        let item = format!("{name} crash study c{}", row.id);
        let s = h.crash_study(row.id)?;
        let derived = history::crash::outcome_rows(row.id, &s);
        c.holds(
            STORED_RUNS,
            &item,
            compare(h.stored_outcomes(row.id)?, derived),
        );
        check_study(c, &item, &s);
    }
    Ok(())
}
