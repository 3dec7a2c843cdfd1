//! The why of each step on the report pages: `fsprof explain`'s headline and leading reasons
//! for the step's slowest filesystem against its fastest, and the differential flame graphs
//! of that pair.

use std::{fmt::Write as _, path::Path};

use super::{
    escape as esc,
    run_summary::{self, SummaryRow},
};
use crate::{
    aggregate::folded::{self, Kind},
    analysis::explain,
    results::{FlameDiff, RunResult},
};

/// Reasons shown after the headline: the time classes, the waits and the wake behind them
/// lead explain's list; the rest is a command away.
const LEADING: usize = 4;

/// What a page says of one step.
pub struct Why<'r> {
    /// The headline (wall against wall, with its verdict).
    pub headline: String,
    pub reasons: Vec<String>,
    /// The slowest against the fastest, by kind ("off-cpu", …).
    pub diffs: Vec<&'r FlameDiff>,
    /// The command that says all of it.
    pub command: String,
}

/// The why of `step`; None where one filesystem ran it, or it failed on the slowest or
/// fastest. `results` is the results file (flame graph paths are relative to it).
pub fn step<'r>(
    r: &'r RunResult,
    results: &Path,
    rows: &[SummaryRow],
    step: &str,
) -> Option<Why<'r>> {
    let (slow, fast) = run_summary::slowest_and_fastest(rows, step)?;
    let lines = explain::explain(r, results, step, slow, Some(fast)).ok()?;
    let mut lines = lines.into_iter();
    let headline = lines.next()?;
    let diffs = (r.flames.diffs.iter())
        .filter(|d| d.step == step && d.fs == slow && d.base == fast)
        .collect();
    Some(Why {
        headline,
        reasons: lines.take(LEADING).collect(),
        diffs,
        command: shlex::try_join([
            "fsprof",
            "explain",
            &results.to_string_lossy(),
            "--step",
            step,
            "--fs",
            slow,
            "--vs",
            fast,
        ])
        .ok()?,
    })
}

impl Why<'_> {
    /// The step's opening on the HTML page; flame graph paths get `base` in front.
    pub fn html(&self, base: &str) -> String {
        let mut o = format!(
            "<div class=\"why\"><p><b>{}</b></p><ul>",
            esc(&self.headline)
        );
        for r in &self.reasons {
            let _ = write!(o, "<li>{}</li>", esc(r));
        }
        o.push_str("</ul><p class=\"waits\">");
        if let Some(first) = self.diffs.first() {
            let links: Vec<String> = (self.diffs.iter())
                .map(|d| {
                    format!(
                        "<a class=\"diff\" href=\"{}\">{}</a>",
                        esc(&format!("{base}{}", d.path)),
                        esc(kind_title(&d.kind))
                    )
                })
                .collect();
            let _ = write!(
                o,
                "Where the time differs ({} vs {}; red: more on {}): {}. ",
                esc(&first.fs),
                esc(&first.base),
                esc(&first.fs),
                links.join(" · ")
            );
        }
        let _ = write!(
            o,
            "All of it: <code>{}</code></p></div>",
            esc(&self.command)
        );
        o
    }

    /// The step's opening in markdown; `links[i]` is where the post finds `diffs[i]`. The
    /// combined graph is shown, the others linked.
    pub fn markdown(&self, links: &[String]) -> String {
        let mut o = format!("**{}**\n\n", self.headline);
        for r in &self.reasons {
            let _ = writeln!(o, "- {r}");
        }
        let pairs = || self.diffs.iter().zip(links);
        let linked: Vec<String> = pairs()
            .map(|(d, l)| format!("[{}]({l})", kind_title(&d.kind)))
            .collect();
        if let Some(first) = self.diffs.first() {
            let _ = write!(
                o,
                "\nWhere the time differs ({} vs {}; red: more on {}): {}.",
                first.fs,
                first.base,
                first.fs,
                linked.join(" · ")
            );
        }
        let _ = writeln!(o, " All of it: `{}`\n", self.command);
        if let Some((d, l)) = pairs().find(|(d, _)| d.kind == Kind::Combined.file_stem()) {
            let _ = writeln!(
                o,
                "![{}: {} vs {}, on- and off-CPU]({l})\n",
                d.step, d.fs, d.base
            );
        }
        o
    }
}

/// "off-cpu" → "off-CPU", as the flame graphs' titles say it.
fn kind_title(stem: &str) -> &str {
    match Kind::ALL.into_iter().find(|k| k.file_stem() == stem) {
        Some(k) => folded::kind_title(k),
        None => stem,
    }
}
