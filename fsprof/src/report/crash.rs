//! The crash study as people read and cite it: a table per filesystem and crash method
//! (pattern × crash point: what the application found in how many trials, recovery and
//! fsck times), and the same cells as CSV.

use std::fmt::Write;

use super::escape as esc;
use crate::{
    analysis::{
        crash::{CrashComparison, fisher_exact},
        stats,
    },
    results::crash::{CrashCell, CrashCost, CrashStudy},
    units::{bytes, duration_ns},
    workload::crash::Outcome,
};

/// Median of a cell's per-trial times; None when there are none.
fn median(v: &[u64]) -> Option<u64> {
    (!v.is_empty()).then(|| stats::median(v.to_vec()))
}

fn fsck_column(c: &CrashCell) -> String {
    match median(&c.fsck_ns) {
        None => "-".into(),
        Some(ns) if c.fsck_unclean == 0 => format!("{} clean", duration_ns(ns)),
        Some(ns) => format!("{} {} UNCLEAN", duration_ns(ns), c.fsck_unclean),
    }
}

/// `items` in groups of equal `key`, in order of first appearance.
fn group_by<T, K: PartialEq>(items: &[T], key: impl Fn(&T) -> K) -> Vec<Vec<&T>> {
    let mut out: Vec<Vec<&T>> = Vec::new();
    for x in items {
        match out.iter_mut().find(|g| key(g[0]) == key(x)) {
            Some(g) => g.push(x),
            None => out.push(vec![x]),
        }
    }
    out
}

/// The study's tables: the cells of one filesystem, options and crash method each.
fn groups(study: &CrashStudy) -> Vec<Vec<&CrashCell>> {
    group_by(&study.cells, |c| {
        (
            c.fs.clone(),
            c.mkfs_opts.clone(),
            c.mount_opts.clone(),
            c.method.clone(),
        )
    })
}

fn title(cells: &[&CrashCell]) -> String {
    let c = cells[0];
    let opts = |s: &str| {
        if s.is_empty() {
            "default".to_string()
        } else {
            s.to_string()
        }
    };
    format!(
        "{}  (crashed by {}; mkfs {}, mount {})",
        c.fs,
        c.method,
        opts(&c.mkfs_opts),
        opts(&c.mount_opts)
    )
}

/// A cell as every format shows it.
struct Row {
    /// The pattern, `*` when durable.
    pattern: String,
    point: String,
    counts: Vec<u32>,
    recovery: String,
    fsck: String,
    broken: bool,
}

fn row(c: &CrashCell) -> Row {
    Row {
        pattern: format!("{}{}", c.pattern.name(), if c.durable { "*" } else { "" }),
        point: format!("{} (+{})", c.point.name(), duration_ns(c.wait_ns)),
        counts: Outcome::ALL
            .iter()
            .map(|o| c.outcomes.get(o).copied().unwrap_or(0))
            .collect(),
        recovery: median(&c.recovery_ns).map_or("-".into(), duration_ns),
        fsck: fsck_column(c),
        broken: c.broken_promise(),
    }
}

/// Why a group's cells found an error or an unclean fsck: the first trial's words for each.
fn notes(cells: &[&CrashCell]) -> Vec<String> {
    let mut out = Vec::new();
    for c in cells {
        let at = format!("{} {}", c.pattern.name(), c.point.name());
        if let Some(e) = &c.error_detail {
            out.push(format!("{at}: error: {e}"));
        }
        if let Some(r) = &c.recovery_detail {
            let n = c.recovery_unclean;
            out.push(format!(
                "{at}: recovery ({n} of {} trials): {r}",
                c.trials()
            ));
        }
        if let Some(f) = &c.fsck_detail {
            out.push(format!("{at}: fsck: {f}"));
        }
    }
    out
}

const BROKEN: &str = "DURABLE PATTERN LOST DATA";
const FOOTNOTE: &str = "* durable: POSIX (SQLite, for sqlite-wal) promises the new content once the pattern returns. \
                        recovery: the mount after the crash (journal replay), median; fsck: \
                        the checker's read-only pass after it, median.";

fn headline(study: &CrashStudy) -> String {
    format!(
        "fsprof crash: kernel {}, {} trials per cell, each on a fresh filesystem{}",
        study.kernel,
        study.trials,
        if study.complete {
            ""
        } else {
            " (INTERRUPTED: partial)"
        }
    )
}

fn broken_cells(study: &CrashStudy) -> Vec<String> {
    study
        .cells
        .iter()
        .filter(|c| c.broken_promise())
        .map(|c| format!("{} {} {}", c.fs, c.pattern.name(), c.point.name()))
        .collect()
}

/// The study as text tables, one per (filesystem, options, method).
pub fn render(study: &CrashStudy) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{}", headline(study));
    if let Some(vm) = &study.vm {
        let _ = writeln!(o, "{}", vm.describe());
    }
    for g in groups(study) {
        let _ = writeln!(o, "\n{}", title(&g));
        let names: String = Outcome::ALL
            .iter()
            .map(|x| format!("{:>8}", x.name()))
            .collect();
        let _ = writeln!(
            o,
            "  {:<18} {:<24}{names}  {:>9}  fsck (read-only)",
            "pattern", "crash point", "recovery"
        );
        for r in g.iter().map(|c| row(c)) {
            let counts: String = r.counts.iter().map(|n| format!("{n:>8}")).collect();
            let mark = if r.broken {
                format!("  ← {BROKEN}")
            } else {
                String::new()
            };
            let _ = writeln!(
                o,
                "  {:<18} {:<24}{counts}  {:>9}  {}{mark}",
                r.pattern, r.point, r.recovery, r.fsck,
            );
        }
        for n in notes(&g) {
            let _ = writeln!(o, "    {n}");
        }
    }
    let _ = writeln!(o, "\n{FOOTNOTE}");
    render_costs(&mut o, &study.costs);
    let broken = broken_cells(study);
    if !broken.is_empty() {
        let _ = writeln!(
            o,
            "DATA LOST AFTER A DURABLE PATTERN (a filesystem bug, or fsprof's): {}",
            broken.join(", ")
        );
    }
    o
}

/// The costs of each (filesystem, options): its patterns' rows.
fn cost_groups(costs: &[CrashCost]) -> Vec<Vec<&CrashCost>> {
    group_by(costs, |c| {
        (c.fs.clone(), c.mkfs_opts.clone(), c.mount_opts.clone())
    })
}

const COST_HEADER: [&str; 7] = [
    "pattern",
    "per update",
    "sync p50",
    "sync p99",
    "commits",
    "written",
    "flushes",
];

fn cost_title(g: &[&CrashCost]) -> String {
    format!(
        "{}: what each pattern costs ({} updates traced, no crash; writeback left for later \
         not included)",
        g[0].fs, g[0].updates
    )
}

fn cost_row(c: &CrashCost) -> [String; 7] {
    let sync = c.sync_latency();
    let (written, flushes) = c.written_and_flushes();
    [
        c.pattern.name().to_string(),
        duration_ns(c.per_update_ns()),
        sync.map_or("-".into(), |s| duration_ns(s.p50)),
        sync.map_or("-".into(), |s| duration_ns(s.p99)),
        c.commits().to_string(),
        bytes(written),
        flushes.to_string(),
    ]
}

/// What each pattern costs the application, per filesystem and options.
fn render_costs(o: &mut String, costs: &[CrashCost]) {
    let line = |v: &[String]| {
        let rest: String = v[1..]
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let w = if matches!(i, 3 | 5) { 8 } else { 10 };
                format!(" {x:>w$}")
            })
            .collect();
        format!("  {:<18}{rest}", v[0])
    };
    for g in cost_groups(costs) {
        let _ = writeln!(o, "\n{}", cost_title(&g));
        let _ = writeln!(o, "{}", line(&COST_HEADER.map(String::from)));
        for c in g {
            let _ = writeln!(o, "{}", line(&cost_row(c)));
        }
    }
}

/// The study as a self-contained HTML page: a table per (filesystem, options, method),
/// each outcome count coloured by what it means, and the costs.
pub fn html(study: &CrashStudy) -> String {
    let mut o = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>fsprof crash</title>\
         <style>{}{CRASH_STYLE}</style></head><body><h1>{}</h1>",
        super::html::STYLE,
        esc(&headline(study))
    );
    if let Some(vm) = &study.vm {
        let _ = write!(o, "<p>{}</p>", esc(&vm.describe()));
    }
    for g in groups(study) {
        html_outcomes(&mut o, &g);
    }
    let _ = write!(o, "<p>{}</p>", esc(FOOTNOTE));
    for g in cost_groups(&study.costs) {
        html_costs(&mut o, &g);
    }
    let broken = broken_cells(study);
    if !broken.is_empty() {
        let _ = write!(
            o,
            "<p class=\"broken\">Data lost after a durable pattern (a filesystem bug, or fsprof's): {}</p>",
            esc(&broken.join(", "))
        );
    }
    o.push_str("</body></html>\n");
    o
}

/// One group's outcome table, with its notes under it.
fn html_outcomes(o: &mut String, g: &[&CrashCell]) {
    let head: String = Outcome::ALL
        .iter()
        .map(|x| format!("<th>{}</th>", x.name()))
        .collect();
    let _ = write!(
        o,
        "<h2>{}</h2><table class=\"grid\"><tr><th>pattern</th><th>crash point</th>{head}\
         <th>recovery</th><th>fsck (read-only)</th></tr>",
        esc(&title(g))
    );
    for r in g.iter().map(|c| row(c)) {
        let counts: String = r
            .counts
            .iter()
            .zip(Outcome::ALL)
            .map(|(n, x)| match n {
                0 => "<td class=\"none\">0</td>".to_string(),
                n => format!("<td class=\"{}\">{n}</td>", x.name()),
            })
            .collect();
        let mark = if r.broken {
            format!(" <b class=\"broken\">{BROKEN}</b>")
        } else {
            String::new()
        };
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td>{counts}<td>{}</td><td>{}{mark}</td></tr>",
            esc(&r.pattern),
            esc(&r.point),
            esc(&r.recovery),
            esc(&r.fsck)
        );
    }
    o.push_str("</table>");
    let notes: String = notes(g)
        .iter()
        .map(|n| format!("<li>{}</li>", esc(n)))
        .collect();
    if !notes.is_empty() {
        let _ = write!(o, "<ul>{notes}</ul>");
    }
}

/// One group's cost table.
fn html_costs(o: &mut String, g: &[&CrashCost]) {
    let _ = write!(
        o,
        "<h2>{}</h2><table class=\"grid\"><tr>",
        esc(&cost_title(g))
    );
    for h in COST_HEADER {
        let _ = write!(o, "<th>{h}</th>");
    }
    o.push_str("</tr>");
    for c in g {
        let cells: String = cost_row(c)
            .iter()
            .map(|x| format!("<td>{}</td>", esc(x)))
            .collect();
        let _ = write!(o, "<tr>{cells}</tr>");
    }
    o.push_str("</table>");
}

/// The study as markdown tables, for a write-up.
pub fn markdown(study: &CrashStudy) -> String {
    let line = |v: &[String]| format!("| {} |\n", v.join(" | "));
    let sep = |n: usize| format!("|{}\n", "---|".repeat(n));
    let mut o = format!("{}\n", headline(study));
    for g in groups(study) {
        let mut head = vec!["pattern".to_string(), "crash point".to_string()];
        head.extend(Outcome::ALL.iter().map(|x| x.name().to_string()));
        head.extend(["recovery".to_string(), "fsck (read-only)".to_string()]);
        let _ = write!(
            o,
            "\n### {}\n\n{}{}",
            title(&g),
            line(&head),
            sep(head.len())
        );
        for r in g.iter().map(|c| row(c)) {
            let mut v = vec![r.pattern.replace('*', "\\*"), r.point];
            v.extend(r.counts.iter().map(u32::to_string));
            let mark = if r.broken {
                format!(" **{BROKEN}**")
            } else {
                String::new()
            };
            v.extend([r.recovery, format!("{}{mark}", r.fsck)]);
            o.push_str(&line(&v));
        }
        let notes = notes(&g);
        if !notes.is_empty() {
            o.push('\n');
        }
        for n in notes {
            let _ = writeln!(o, "- {n}");
        }
    }
    let _ = writeln!(o, "\n{}", FOOTNOTE.replace('*', "\\*"));
    for g in cost_groups(&study.costs) {
        let head = COST_HEADER.map(String::from);
        let _ = write!(
            o,
            "\n### {}\n\n{}{}",
            cost_title(&g),
            line(&head),
            sep(head.len())
        );
        for c in g {
            o.push_str(&line(&cost_row(c)));
        }
    }
    o
}

/// A comparison of two crash studies as text: per cell each side's trials that found the
/// new content, Fisher's p and the verdict; then each pattern's cost on both sides.
pub fn compare_table(c: &CrashComparison) -> String {
    let mut o = compare_header(c);
    let _ = writeln!(
        o,
        "  {:<6} {:<18} {:<13} {:>9} {:>9} {:>7}  verdict",
        "fs", "pattern", "crash point", "base new", "new new", "p"
    );
    let mut sides: Vec<String> = Vec::new();
    for r in &c.rows {
        let side = format!(
            "{}: base {}; new {}",
            r.base.fs,
            options(r.base),
            options(r.new)
        );
        if !sides.contains(&side) {
            sides.push(side);
        }
        let frac = |cell: &CrashCell| {
            let n = cell.outcomes.get(&Outcome::New).copied().unwrap_or(0);
            format!("{n}/{}", cell.trials())
        };
        let _ = writeln!(
            o,
            "  {:<6} {:<18} {:<13} {:>9} {:>9} {:>7.4}  {}",
            r.base.fs,
            r.base.pattern.name(),
            r.base.point.name(),
            frac(r.base),
            frac(r.new),
            r.p,
            r.verdict.name()
        );
    }
    for s in sides {
        let _ = writeln!(o, "  {s}");
    }
    o + &compare_costs(c)
}

/// The comparison's first line: the test, its α, and the false flags it allows.
fn compare_header(c: &CrashComparison) -> String {
    let smallest = c
        .rows
        .iter()
        .map(|r| fisher_exact(r.base.trials(), 0, 0, r.new.trials()))
        .fold(1.0, f64::min);
    format!(
        "fsprof compare: two crash studies, {} cells; each side's trials that found the new \
         content, Fisher's exact test per cell at α = {} (when nothing changed a cell is \
         flagged with probability at most α: at most {:.2} false flags expected here; at these \
         trials the smallest p a cell can reach is {:.4})\n",
        c.rows.len(),
        c.alpha,
        c.alpha * c.rows.len() as f64,
        smallest
    )
}

/// A cell's mkfs and mount options, or "default".
fn options(cell: &CrashCell) -> String {
    let o = [("mkfs", &cell.mkfs_opts), ("mount", &cell.mount_opts)]
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>();
    if o.is_empty() {
        "default".to_string()
    } else {
        o.join(", ")
    }
}

/// Each pattern's cost, base → new; empty when the studies had no traced pass.
fn compare_costs(c: &CrashComparison) -> String {
    let mut o = String::new();
    if c.costs.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "\nwhat each pattern costs, base → new (one traced pass a side: shown, not tested)"
    );
    let _ = writeln!(
        o,
        "  {:<6} {:<18} {:>23} {:>23}",
        "fs", "pattern", "per update", "sync p50"
    );
    let p50 = |x: &CrashCost| x.sync_latency().map_or("-".into(), |s| duration_ns(s.p50));
    for (b, n) in &c.costs {
        let _ = writeln!(
            o,
            "  {:<6} {:<18} {:>23} {:>23}",
            b.fs,
            b.pattern.name(),
            format!(
                "{} → {}",
                duration_ns(b.per_update_ns()),
                duration_ns(n.per_update_ns())
            ),
            format!("{} → {}", p50(b), p50(n)),
        );
    }
    o
}

/// Outcome colours: the new content green, the old one amber, losses red.
const CRASH_STYLE: &str = "td.new{background:#cdeccd}td.old{background:#f6e3b4}\
td.empty,td.zeros,td.mixed,td.missing,td.error{background:#f4b6b6}td.none{color:#bbb}\
.broken{color:#b00}";

/// One row per cell: its keys, outcome counts, median recovery and fsck times.
pub fn to_csv(study: &CrashStudy) -> String {
    let mut o =
        String::from("fs,mkfs_opts,mount_opts,method,pattern,durable,crash_point,wait_ns,trials");
    for x in Outcome::ALL {
        let _ = write!(o, ",{}", x.name());
    }
    o.push_str(",recovery_median_ns,fsck_median_ns,fsck_unclean,error_detail,fsck_detail");
    o.push_str(",recovery_unclean,recovery_detail\n");
    for c in &study.cells {
        let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let _ = write!(
            o,
            "{},{},{},{},{},{},{},{},{}",
            c.fs,
            q(&c.mkfs_opts),
            q(&c.mount_opts),
            c.method,
            c.pattern.name(),
            c.durable,
            c.point.name(),
            c.wait_ns,
            c.trials()
        );
        for x in Outcome::ALL {
            let _ = write!(o, ",{}", c.outcomes.get(x).copied().unwrap_or(0));
        }
        let opt = |v: Option<u64>| v.map_or(String::new(), |n| n.to_string());
        let text = |v: &Option<String>| v.as_deref().map_or(String::new(), q);
        let _ = writeln!(
            o,
            ",{},{},{},{},{},{},{}",
            opt(median(&c.recovery_ns)),
            opt(median(&c.fsck_ns)),
            c.fsck_unclean,
            text(&c.error_detail),
            text(&c.fsck_detail),
            c.recovery_unclean,
            text(&c.recovery_detail)
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{results::crash::CrashPoint, workload::crash::Pattern};

    #[test]
    fn why_a_cell_failed_is_shown_under_its_table() {
        let cell = CrashCell {
            fs: "jfs".into(),
            mkfs_opts: String::new(),
            mount_opts: String::new(),
            method: "power-cut".into(),
            pattern: Pattern::Append,
            point: CrashPoint::Now,
            wait_ns: 0,
            durable: false,
            outcomes: [(Outcome::Error, 1), (Outcome::Old, 4)]
                .into_iter()
                .collect(),
            recovery_ns: vec![1_000_000; 4],
            fsck_ns: vec![2_000_000; 5],
            fsck_unclean: 1,
            fsck_detail: Some("logredo failed (rc=-220)".into()),
            error_detail: Some("jfs does not mount after the cut: EINVAL".into()),
            recovery_unclean: 4,
            recovery_detail: Some("fsck.jfs -a: logredo failed (rc=-220)".into()),
        };
        let study = CrashStudy {
            cells: vec![cell],
            trials: 5,
            ..Default::default()
        };
        let text = render(&study);
        assert!(text.contains("    append now: error: jfs does not mount after the cut: EINVAL\n"));
        assert!(text.contains("    append now: fsck: logredo failed (rc=-220)\n"));
        assert!(text.contains(
            "    append now: recovery (4 of 5 trials): fsck.jfs -a: logredo failed (rc=-220)\n"
        ));
        assert!(markdown(&study).contains("- append now: error: jfs does not mount"));
        assert!(html(&study).contains("<li>append now: fsck: logredo failed (rc=-220)</li>"));
        let csv = to_csv(&study);
        let (head, row) = csv.split_once('\n').unwrap();
        assert!(head.ends_with(",error_detail,fsck_detail,recovery_unclean,recovery_detail"));
        assert!(row.ends_with(
            ",\"jfs does not mount after the cut: EINVAL\",\"logredo failed (rc=-220)\",4,\
             \"fsck.jfs -a: logredo failed (rc=-220)\"\n"
        ));
    }
}
