//! The HTML report of a run: one self-contained file (inline CSS, SVG and a few lines of
//! script; nothing fetched) with, per step, the time per filesystem split into user / sys /
//! I/O wait / other waits and the kernel's background work, the pass-to-pass spread,
//! latency percentile plots per syscall and block class, and the flame graphs of every cell,
//! browsable (they are files beside the report, loaded when chosen).

use std::{fmt::Write as _, path::Path};

use super::{
    charts::{self, Bar},
    escape as esc, explain, matrix, run_summary,
    run_table::median_cells,
    table,
};
use fsprof_common::TimeClass;

use crate::units::{bytes, count, seconds};
use crate::{
    aggregate::{histogram::Summary, stacks::UserCompleteness, time_label},
    analysis::{metrics, stats::median},
    results::{FsRun, RunResult, StepRun, dir_of},
};

/// The time chart's segments: user and sys, then the off-CPU classes by their labels.
const SEGMENTS: [(&str, &str); 5] = [
    ("user", "#e4572e"),
    ("sys", "#f3a712"),
    (time_label(TimeClass::IoWait), "#2e86ab"),
    (time_label(TimeClass::Uninterruptible), "#7b2cbf"),
    (time_label(TimeClass::RunQueue), "#a8c686"),
];

fn med(runs: &[&StepRun], f: impl Fn(&StepRun) -> u64) -> u64 {
    median(runs.iter().map(|s| f(s)).collect())
}

/// The time chart of one step: per filesystem the target's time and, below it, the
/// kernel's background work for the filesystem.
pub fn time_chart(r: &RunResult, step: &str) -> String {
    let mut bars = Vec::new();
    for f in &r.filesystems {
        let runs = f.runs_of(step);
        if runs.is_empty() {
            continue;
        }
        let t = |g: &dyn Fn(&StepRun) -> u64| med(&runs, g);
        let walls: Vec<u64> = runs.iter().map(|s| s.trace.wall_ns).collect();
        let vals = [
            t(&|s| s.trace.user_ns),
            t(&|s| s.trace.sys_ns),
            t(&|s| s.trace.profile.time.io_wait.ns),
            t(&|s| s.trace.profile.time.uninterruptible.ns),
            t(&|s| s.trace.profile.time.run_queue.ns),
        ];
        bars.push(Bar {
            label: f.column(),
            segments: SEGMENTS
                .iter()
                .zip(vals)
                .map(|((n, c), v)| (*n, v, *c))
                .collect(),
            spread: (walls.len() > 1).then(|| {
                (
                    *walls.iter().min().unwrap_or(&0),
                    *walls.iter().max().unwrap_or(&0),
                )
            }),
        });
        bars.push(Bar {
            label: format!("{} kernel", f.column()),
            segments: vec![(
                "kernel background",
                t(&|s| s.trace.background.as_ref().map(|b| b.ns).unwrap_or(0)),
                "#555555",
            )],
            spread: None,
        });
    }
    charts::stacked_bars(
        &format!("{step}: median time per filesystem (whisker: wall min–max over passes)"),
        &bars,
    )
}

/// Percentile plots: the step's three syscalls with most time, and its block classes.
pub fn latency_charts(r: &RunResult, step: &str) -> Vec<String> {
    let cells: Vec<(&FsRun, Vec<&StepRun>)> = r
        .filesystems
        .iter()
        .map(|f| (f, f.runs_of(step)))
        .filter(|(_, runs)| !runs.is_empty())
        .collect();
    let mut names: Vec<(String, u64)> = Vec::new();
    for (_, runs) in &cells {
        for c in &runs[0].trace.profile.syscalls {
            match names.iter_mut().find(|(n, _)| *n == c.name) {
                Some(e) => e.1 += c.total_ns,
                None => names.push((c.name.clone(), c.total_ns)),
            }
        }
    }
    names.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
    let pts = |s: &Summary| {
        vec![
            ("p50", s.p50),
            ("p90", s.p90),
            ("p99", s.p99),
            ("p99.9", s.p999),
            ("max", s.max),
        ]
    };
    // One series per filesystem whose pass 1 has the summary `get` picks.
    let plot = |title: String, get: &dyn Fn(&StepRun) -> Option<Summary>| {
        let series: Vec<(String, Vec<(&'static str, u64)>)> = cells
            .iter()
            .filter_map(|(f, runs)| Some((f.column(), pts(&get(runs[0])?))))
            .collect();
        charts::percentiles(&title, &series)
    };
    let hist = |title: String, get: &dyn Fn(&StepRun) -> Option<Summary>| {
        let series: Vec<(String, Vec<(u32, u64)>)> = cells
            .iter()
            .filter_map(|(f, runs)| Some((f.column(), get(runs[0])?.log2)))
            .filter(|(_, b)| !b.is_empty())
            .collect();
        (!series.is_empty()).then(|| charts::histograms(&title, &series))
    };
    let mut out = Vec::new();
    for (name, _) in names.iter().take(3) {
        let get = |s: &StepRun| {
            let c = s.trace.profile.syscalls.iter().find(|c| &c.name == name)?;
            Some(c.latency.clone())
        };
        out.push(plot(format!("{name} latency percentiles (pass 1)"), &get));
        out.extend(hist(format!("{name} latency histogram (pass 1)"), &get));
    }
    let mut classes: Vec<String> = Vec::new();
    for (_, runs) in &cells {
        for b in &runs[0].trace.profile.block {
            if b.completions > 0 && !classes.contains(&b.class) {
                classes.push(b.class.clone());
            }
        }
    }
    for class in classes {
        out.push(plot(
            format!("block {class}: device latency (pass 1)"),
            &|s| {
                let b = s.trace.profile.block.iter().find(|b| b.class == class)?;
                Some(b.device_latency.clone())
            },
        ));
    }
    out
}

/// Unix time as "YYYY-MM-DD HH:MM UTC" (civil-from-days, proleptic Gregorian).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02} UTC")
}

fn facts(r: &RunResult) -> String {
    let mut o = String::from("<table class=\"facts\">");
    let mut row = |k: &str, v: String| {
        let _ = write!(o, "<tr><th>{k}</th><td>{}</td></tr>", esc(&v));
    };
    row("kernel", r.kernel.clone());
    if let Some(vm) = &r.vm {
        row("VM", vm.describe());
    }
    row("fsprof", r.fsprof_version.clone());
    row(
        "machine",
        format!("{} CPUs, {} memory", r.cpus, bytes(r.memory_bytes)),
    );
    row(
        "run",
        format!(
            "suite {}, scale {}, {}, {}, seed {}{}",
            r.suite,
            r.scale,
            count(r.passes, "pass", "passes"),
            count(r.jobs, "job", "jobs"),
            r.seed,
            if r.complete { "" } else { " — INCOMPLETE" }
        ),
    );
    row("started", utc(r.started));
    o.push_str("</table><table class=\"grid\"><tr><th>fs</th><th>mkfs options</th><th>mount options</th><th>device</th><th>mkfs</th><th>mount</th><th>umount</th><th>available after mkfs</th><th>used after last delete</th></tr>");
    for f in &r.filesystems {
        let m = |g: &dyn Fn(&crate::results::PassRun) -> Option<u64>| {
            seconds(median(f.passes.iter().filter_map(g).collect()))
        };
        let cap = f
            .passes
            .last()
            .map(|p| p.capacity_after_mkfs)
            .unwrap_or_default();
        let used = f
            .passes
            .last()
            .and_then(|p| p.steps.iter().rev().find_map(|s| s.capacity_after))
            .map(|c| bytes(c.used_bytes))
            .unwrap_or_else(|| "-".into());
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&f.column()),
            esc(&f.mkfs_opts.join(" ")),
            esc(&f.mount_opts),
            esc(&f.device),
            bytes(f.device_bytes),
            m(&|p| Some(p.mkfs_ns)),
            m(&|p| Some(p.mount_ns)),
            m(&|p| p.umount_ns),
            bytes(cap.avail_bytes),
            used
        );
    }
    o.push_str("</table>");
    o
}

fn table(r: &RunResult, step: &str) -> String {
    let mut o = String::from(
        "<table class=\"grid\"><tr><th>fs</th><th>wall (median)</th><th>min–max</th><th>CPU</th><th>user</th><th>sys</th><th>kernel bg</th><th>I/O wait</th><th>other D</th><th>run-queue</th><th>syncfs</th><th>quiesce</th><th title=\"fsprof's own kernel time (BPF run time)\">probes</th></tr>",
    );
    for f in &r.filesystems {
        let runs = f.runs_of(step);
        if runs.is_empty() {
            continue;
        }
        let walls: Vec<u64> = runs.iter().map(|s| s.trace.wall_ns).collect();
        let cpu = median(runs.iter().map(|s| s.trace.cpu_percent() as u64).collect());
        let m = median_cells(&runs).map(seconds);
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}–{}</td><td>{cpu}%</td><td>{}</td></tr>",
            esc(&f.column()),
            m[0],
            seconds(*walls.iter().min().unwrap_or(&0)),
            seconds(*walls.iter().max().unwrap_or(&0)),
            m[1..].join("</td><td>")
        );
    }
    o.push_str("</table>");
    o
}

/// Per filesystem, what the step's off-CPU time waited for (medians over passes).
fn waited_for(r: &RunResult, step: &str) -> String {
    let mut o = String::new();
    for f in &r.filesystems {
        let w = metrics::waited_for_medians(&f.runs_of(step));
        if w.is_empty() {
            continue;
        }
        let parts: Vec<String> = w
            .iter()
            .filter(|(_, ns)| *ns >= 1_000_000)
            .map(|(what, ns)| format!("{} {}", esc(what), seconds(*ns)))
            .collect();
        let _ = write!(
            o,
            "<p class=\"waits\"><b>{}</b> off-CPU, by what ended it: {}</p>",
            esc(&f.column()),
            parts.join(", ")
        );
    }
    o
}

/// The summary on top: per step and filesystem the median time, CPU, where the time went
/// and the ratio to the fastest, each step linking to its section; page-cache steps flagged.
fn summary(r: &RunResult, rows: &[run_summary::SummaryRow]) -> String {
    let steps = r.step_names();
    let mut o = String::from("<h2>Summary</h2>");
    o.push_str(&matrix::html(r, rows));
    o.push_str(
        "<table class=\"grid\"><tr><th>step</th><th>fs</th><th>time</th>\
         <th>CPU</th><th>mostly</th><th>vs fastest</th><th></th></tr>",
    );
    let mut last = "";
    for s in rows {
        let step = if s.step == last {
            String::new()
        } else {
            let i = steps.iter().position(|n| *n == s.step).unwrap_or(0);
            format!("<a href=\"#step{i}\">{}</a>", esc(&s.step))
        };
        let cache = if s.page_cache {
            "<span class=\"warn\" title=\"block I/O moved a small part of the bytes the step \
             read and wrote: this timed the page cache, not the disk\">page cache</span>"
        } else {
            ""
        };
        let _ = write!(
            o,
            "<tr><td>{step}</td><td>{}</td><td>{}</td><td>{:.0}%</td><td>{} {:.0}%</td>\
             <td>{:.2}×</td><td>{cache}</td></tr>",
            esc(&s.fs),
            match run_summary::side_rate(s) {
                Some(rate) => format!("{} · {rate}", run_summary::result(s)),
                None => run_summary::result(s),
            },
            s.cpu_percent,
            s.mostly,
            100.0 * s.mostly_share,
            s.vs_fastest
        );
        last = &s.step;
    }
    o.push_str("</table>");
    if let Some(line) = run_summary::prepared(r) {
        let _ = write!(o, "<p>{}</p>", esc(&line));
    }
    if rows.iter().any(|s| s.rate.is_some()) {
        let _ = write!(o, "<p>{}</p>", esc(run_summary::RATE_NOTE));
    }
    let failed = r.failures();
    if !failed.is_empty() {
        let _ = write!(
            o,
            "<h3 class=\"warn\">Failed cells ({}), left out of every figure</h3><ul>",
            failed.len()
        );
        for (fs, pass, step, why) in failed {
            let _ = write!(
                o,
                "<li>{} {} pass {pass}: {}</li>",
                esc(&fs),
                esc(step),
                esc(why)
            );
        }
        o.push_str("</ul>");
    }
    o
}

/// Per filesystem, how many of the step's user stacks are whole (all passes).
fn user_stacks(r: &RunResult, step: &str) -> String {
    let mut parts = Vec::new();
    for f in &r.filesystems {
        let mut u = UserCompleteness::default();
        for run in f.runs_of(step) {
            if let Some(s) = &run.trace.stacks {
                u.merge(&s.user_stacks);
            }
        }
        if let Some(line) = table::user_completeness(&u) {
            parts.push(format!("<b>{}</b> {}", esc(&f.column()), esc(&line)));
        }
    }
    if parts.is_empty() {
        return String::new();
    }
    format!("<p class=\"waits\">{}</p>", parts.join("<br>"))
}

/// Buttons that load a cell's flame graph into the frame below them.
fn flames(r: &RunResult, step: &str, base: &str, id: usize) -> String {
    let Some(cells) = r.flames.cells.get(step) else {
        return String::new();
    };
    let mut buttons = Vec::new();
    for (fs, files) in cells {
        for (kind, path) in files.iter().filter(|(k, _)| k.ends_with(".svg")) {
            buttons.push((
                format!("{fs} {}", kind.trim_end_matches(".svg")),
                format!("{base}{path}"),
            ));
        }
    }
    for d in r.flames.diffs.iter().filter(|d| d.step == step) {
        buttons.push((
            format!("{} vs {} {} (diff)", d.fs, d.base, d.kind),
            format!("{base}{}", d.path),
        ));
    }
    if buttons.is_empty() {
        return String::new();
    }
    let first = buttons
        .iter()
        .find(|(l, _)| l.ends_with("combined"))
        .unwrap_or(&buttons[0])
        .1
        .clone();
    let mut o = String::from("<div class=\"flames\"><div class=\"pick\">");
    for (label, path) in &buttons {
        // The path travels as an attribute, never inside script text, so no character
        // of it can end a string there.
        let _ = write!(
            o,
            "<button data-src=\"{}\" onclick=\"show({id}, this)\">{}</button>",
            esc(path),
            esc(label)
        );
    }
    let _ = write!(
        o,
        "</div><iframe id=\"flame{id}\" data-src=\"{}\" loading=\"lazy\"></iframe></div>",
        esc(&first)
    );
    o
}

pub(super) const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}\
h1{font-size:22px}h2{margin-top:36px;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:8px 0}th,td{padding:3px 8px;text-align:right;font-size:13px}\
th:first-child,td:first-child{text-align:left}.grid td,.grid th{border-bottom:1px solid #eee}\
.facts th{text-align:left;color:#555}.charts{display:flex;flex-wrap:wrap;gap:12px}\
.flames iframe{width:100%;height:620px;border:1px solid #ccc}\
.pick button{margin:2px;font-size:12px}.pick button.on{background:#2e86ab;color:#fff}\
.warn{color:#b00;font-weight:bold}.waits{font-size:13px;margin:4px 0}\
.why{background:#f6f8fa;border-left:4px solid #2e86ab;padding:4px 12px;margin:8px 0}\
.why ul{margin:4px 0;font-size:14px}.matrix td{text-align:center}.matrix a{color:#222;text-decoration:none}";

/// Loads a flame graph on demand; counts the rendered charts into `data-charts` (the
/// report's test reads it from the DOM).
const SCRIPT: &str = "function show(id,b){var f=document.getElementById('flame'+id);f.src=b.getAttribute('data-src');\
var p=b.parentNode.children;for(var i=0;i<p.length;i++)p[i].className='';b.className='on';}\
window.addEventListener('load',function(){var n=0;document.querySelectorAll('svg.chart').forEach(function(s){\
var r=s.getBoundingClientRect();if(r.width>0&&r.height>0)n++;});document.body.setAttribute('data-charts',n);\
document.querySelectorAll('iframe[data-src]').forEach(function(f){f.src=f.getAttribute('data-src');});});";

/// The report; flame graph paths are made relative to `html`'s directory.
pub fn render(r: &RunResult, results: &Path, html: &Path) -> String {
    // Paths in the results are relative to the results file; the report may be elsewhere.
    let (rdir, hdir) = (dir_of(results), dir_of(html));
    let base = if rdir == hdir {
        String::new()
    } else {
        format!(
            "{}/",
            std::fs::canonicalize(rdir)
                .unwrap_or_else(|_| rdir.to_path_buf())
                .display()
        )
    };
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>fsprof run: {}</title><style>{STYLE}</style><script>{SCRIPT}</script></head><body>",
        esc(&r.suite)
    );
    let fs: Vec<String> = r.filesystems.iter().map(|f| f.column()).collect();
    let _ = write!(
        o,
        "<h1>fsprof run: suite {} on {}</h1>{}",
        esc(&r.suite),
        esc(&fs.join(", ")),
        facts(r)
    );
    let rows = run_summary::rows(r);
    o.push_str(&summary(r, &rows));
    for (i, step) in r.step_names().iter().enumerate() {
        let _ = write!(o, "<h2 id=\"step{i}\">{}</h2>", esc(step));
        if let Some(why) = explain::step(r, results, &rows, step) {
            o.push_str(&why.html(&base));
        }
        o.push_str(&table(r, step));
        o.push_str(&waited_for(r, step));
        o.push_str("<div class=\"charts\">");
        o.push_str(&time_chart(r, step));
        for c in latency_charts(r, step) {
            o.push_str(&c);
        }
        o.push_str("</div>");
        o.push_str(&flames(r, step, &base, i));
        o.push_str(&user_stacks(r, step));
    }
    o.push_str("</body></html>\n");
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(super::utc(1_796_227_777), "2026-12-02 16:09 UTC");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00 UTC");
    }
}
