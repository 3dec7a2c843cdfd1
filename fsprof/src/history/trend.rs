//! A figure over recorded runs: per run and filesystem the median over its passes, and
//! whether compare flagged it against the runs of the same configuration before it.

use std::collections::BTreeMap;

use anyhow::Result;

use super::{Filter, History, RunRow};
use crate::{
    analysis::{
        compare::{self, CompareOptions},
        stats::median_f64,
        verdict::Verdict,
    },
    report::{charts, escape, html::utc},
    units::{duration_ns, seconds},
};

/// One run of a trend.
pub struct Point {
    pub run: RunRow,
    /// Cell (filesystem column) → median over the run's passes.
    pub values: BTreeMap<String, f64>,
    /// Cell → what compare said against the runs before it (absent: nothing to compare).
    pub verdicts: BTreeMap<String, Verdict>,
}

/// How a trend judges each run: against this many runs of its configuration before it.
pub struct TrendOptions {
    pub base_runs: usize,
    pub compare: CompareOptions,
}

/// Compare's verdicts on one figure of every run: (step, cell) → verdict, by run id.
pub type Verdicts = BTreeMap<i64, BTreeMap<(String, String), Verdict>>;

/// Judges each of `runs` once against the complete runs of its configuration before it
/// (one comparison a run serves every step's trend).
pub fn verdicts(
    h: &mut History,
    runs: &[RunRow],
    metric: &str,
    opts: &TrendOptions,
) -> Result<Verdicts> {
    runs.iter()
        .map(|r| Ok((r.id, judge(h, r, metric, opts)?)))
        .collect()
}

/// The trend of `metric` of `step` over `runs` (oldest first), with their verdicts.
pub fn trend(
    h: &mut History,
    runs: &[RunRow],
    step: &str,
    metric: &str,
    verdicts: &Verdicts,
) -> Result<Vec<Point>> {
    let ids: Vec<i64> = runs.iter().map(|r| r.id).collect();
    let mut per_run: BTreeMap<i64, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for (id, cell, _, v) in h.figures(&ids, step, metric)? {
        per_run
            .entry(id)
            .or_default()
            .entry(cell)
            .or_default()
            .push(v);
    }
    Ok(runs
        .iter()
        .map(|r| Point {
            run: r.clone(),
            values: per_run
                .remove(&r.id)
                .unwrap_or_default()
                .into_iter()
                .map(|(cell, v)| (cell, median_f64(v)))
                .collect(),
            verdicts: verdicts
                .get(&r.id)
                .into_iter()
                .flatten()
                .filter(|((s, _), _)| s == step)
                .map(|((_, cell), v)| (cell.clone(), *v))
                .collect(),
        })
        .collect())
}

/// Compare's verdict on `metric` in run `r`, per (step, cell), against the complete runs of
/// its configuration before it.
fn judge(
    h: &mut History,
    r: &RunRow,
    metric: &str,
    opts: &TrendOptions,
) -> Result<BTreeMap<(String, String), Verdict>> {
    let base_rows = h.runs(&Filter {
        config: Some(r.config.clone()),
        complete_only: true,
        before: Some((r.started, r.id)),
        last: Some(opts.base_runs),
        ..Filter::default()
    })?;
    if base_rows.is_empty() {
        return Ok(BTreeMap::new());
    }
    let base = base_rows
        .iter()
        .map(|b| h.results(b.id))
        .collect::<Result<Vec<_>>>()?;
    let new = [h.results(r.id)?];
    let Ok(c) = compare::compare(&base, &new, &opts.compare) else {
        return Ok(BTreeMap::new());
    };
    Ok(c.rows
        .iter()
        .filter(|row| row.metric == metric)
        .map(|row| ((row.step.clone(), row.fs.clone()), row.verdict))
        .collect())
}

/// A value as the figure's unit shows it.
pub fn show(metric: &str, v: f64) -> String {
    if metric == "throughput" {
        format!("{:.1} MB/s", v / 1e6)
    } else if metric.ends_with(" p50") || metric.ends_with(" p99") {
        duration_ns(v as u64)
    } else {
        seconds(v as u64)
    }
}

fn mark(v: Option<&Verdict>) -> &'static str {
    match v {
        Some(Verdict::Regression) => " ▲",
        Some(Verdict::Improvement) => " ▼",
        _ => "",
    }
}

/// The terminal table: a row per run, a column per filesystem.
pub fn render(points: &[Point], step: &str, metric: &str, base_runs: usize) -> String {
    let cells: Vec<String> = cells(points);
    let mut header = vec!["run", "started", "kernel", "label"];
    header.extend(cells.iter().map(String::as_str));
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            let mut row = vec![
                format!("#{}", p.run.id),
                utc(p.run.started as u64),
                p.run.kernel.clone(),
                p.run.label.clone(),
            ];
            for c in &cells {
                row.push(match p.values.get(c) {
                    Some(v) => format!("{}{}", show(metric, *v), mark(p.verdicts.get(c))),
                    None => "-".to_string(),
                });
            }
            row
        })
        .collect();
    format!(
        "{metric} of {step}, median over each run's passes; ▲ regression, ▼ improvement: compare against the {base_runs} runs of the same configuration before it\n{}",
        crate::report::table::table(&header, &rows)
    )
}

fn cells(points: &[Point]) -> Vec<String> {
    let mut cells: Vec<String> = Vec::new();
    for p in points {
        for c in p.values.keys() {
            if !cells.contains(c) {
                cells.push(c.clone());
            }
        }
    }
    cells
}

/// An HTML page of trend charts, one per step.
pub fn html(charts_by_step: &[(String, String, Vec<Point>)], title: &str) -> String {
    let mut body = String::new();
    for (step, metric, points) in charts_by_step {
        let cells = cells(points);
        let series: Vec<charts::TrendSeries> = cells
            .iter()
            .map(|c| charts::TrendSeries {
                name: c.clone(),
                points: points
                    .iter()
                    .filter_map(|p| {
                        p.values.get(c).map(|v| charts::TrendPoint {
                            label: format!("#{}", p.run.id),
                            detail: format!(
                                "#{} {} {} {}",
                                p.run.id,
                                utc(p.run.started as u64),
                                p.run.kernel,
                                p.run.label
                            ),
                            value: *v,
                            shown: show(metric, *v),
                            flagged: p.verdicts.get(c).is_some_and(|v| {
                                matches!(v, Verdict::Regression | Verdict::Improvement)
                            }),
                        })
                    })
                    .collect(),
            })
            .collect();
        body.push_str(&format!(
            "<section><h2>{}</h2>{}</section>\n",
            escape(step),
            charts::trend(&format!("{metric} of {step}"), &series)
        ));
    }
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;margin:2em}} .chart{{margin:0.5em 0}}</style></head>\
         <body><h1>{t}</h1><p>Median over each run's passes; ringed points: compare flagged \
         the run against the runs of its configuration before it.</p>\n{body}</body></html>\n",
        t = escape(title)
    )
}
