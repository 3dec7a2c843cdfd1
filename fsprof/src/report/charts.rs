//! Charts as plain generated SVG (no library, no script, no network): stacked bars of time
//! per filesystem with the pass-to-pass spread, and percentile plots of latencies.

use std::fmt::Write as _;

use super::escape as esc;
use crate::units::{duration_ns, seconds};

/// One bar: a label, segments (name, ns, color), and the min–max spread of the total.
pub struct Bar {
    pub label: String,
    pub segments: Vec<(&'static str, u64, &'static str)>,
    pub spread: Option<(u64, u64)>,
}

/// Colors of the series (one per filesystem) in the line charts.
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// The opening of a chart: `<svg class="chart">`, its tooltip title and the bold heading.
pub(super) fn open(w: f64, h: f64, left: f64, font: u32, title: &str) -> String {
    format!(
        r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" font-family="sans-serif" font-size="{font}"><title>{t}</title><text x="{left}" y="{ty}" font-size="{hf}" font-weight="bold">{t}</text>"#,
        t = esc(title),
        ty = font + 6,
        hf = font + 2
    )
}

/// The legend entry of series `i` along the bottom of a line chart.
fn legend(o: &mut String, i: usize, name: &str, left: f64, h: f64) {
    let _ = write!(
        o,
        r#"<rect x="{lx:.1}" y="{ly}" width="10" height="10" fill="{c}"/><text x="{tx:.1}" y="{ty}">{n}</text>"#,
        c = COLORS[i % COLORS.len()],
        lx = left + 70.0 * i as f64,
        ly = h - 16.0,
        tx = left + 70.0 * i as f64 + 14.0,
        ty = h - 7.0,
        n = esc(name)
    );
}

/// Five horizontal grid lines of a linear axis from 0 to `hi`, labelled at the left.
fn grid(
    o: &mut String,
    hi: f64,
    y: impl Fn(f64) -> f64,
    (x1, x2): (f64, f64),
    label: impl Fn(f64) -> String,
) {
    for k in 0..=4 {
        let v = hi * k as f64 / 4.0;
        let _ = write!(
            o,
            r##"<line x1="{x1}" y1="{yy:.1}" x2="{x2}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end" fill="#555">{l}</text>"##,
            yy = y(v),
            tx = x1 - 4.0,
            ty = y(v) + 4.0,
            l = label(v)
        );
    }
}

/// A "nice" axis maximum ≥ v: 1, 2 or 5 × a power of ten.
fn nice(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

/// Horizontal stacked bars, one per filesystem, with a legend and an axis in seconds.
pub fn stacked_bars(title: &str, bars: &[Bar]) -> String {
    let (w, left, right, row, top) = (760.0, 90.0, 20.0, 34.0, 46.0);
    let legend_h = 26.0;
    let h = top + row * bars.len() as f64 + 30.0 + legend_h;
    let max = bars
        .iter()
        .map(|b| {
            let sum: u64 = b.segments.iter().map(|s| s.1).sum();
            sum.max(b.spread.map(|s| s.1).unwrap_or(0))
        })
        .max()
        .unwrap_or(0) as f64;
    let axis = nice(max);
    let x = |ns: f64| left + (w - left - right) * ns / axis;
    let mut o = open(w, h, left, 12, title);
    let bottom = top + row * bars.len() as f64;
    for i in 0..=5 {
        let v = axis * i as f64 / 5.0;
        let xx = x(v);
        let _ = write!(
            o,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{bottom:.1}" stroke="#ddd"/><text x="{xx:.1}" y="{ty:.1}" text-anchor="middle" fill="#555">{l}</text>"##,
            ty = bottom + 14.0,
            l = seconds(v as u64)
        );
    }
    for (i, b) in bars.iter().enumerate() {
        let y = top + row * i as f64 + 6.0;
        let _ = write!(
            o,
            r#"<text x="{lx}" y="{ty:.1}" text-anchor="end">{l}</text>"#,
            lx = left - 8.0,
            ty = y + 15.0,
            l = esc(&b.label)
        );
        bar(&mut o, b, y, &x);
    }
    bars_legend(&mut o, bars, left, h - 10.0);
    o.push_str("</svg>");
    o
}

/// One bar's segments at height `y`, and its min–max whisker; `x` places nanoseconds.
fn bar(o: &mut String, b: &Bar, y: f64, x: &dyn Fn(f64) -> f64) {
    let mut acc = 0u64;
    for (name, ns, color) in &b.segments {
        if *ns == 0 {
            continue;
        }
        let (x0, x1) = (x(acc as f64), x((acc + ns) as f64));
        let _ = write!(
            o,
            r#"<rect class="seg" x="{x0:.1}" y="{y:.1}" width="{wd:.1}" height="20" fill="{color}"><title>{l}: {name} {v}</title></rect>"#,
            wd = (x1 - x0).max(0.5),
            l = esc(&b.label),
            v = seconds(*ns)
        );
        acc += ns;
    }
    if let Some((lo, hi)) = b.spread {
        let (x0, x1, ym) = (x(lo as f64), x(hi as f64), y + 10.0);
        let _ = write!(
            o,
            r##"<g stroke="#222" stroke-width="1.5"><line x1="{x0:.1}" y1="{ym:.1}" x2="{x1:.1}" y2="{ym:.1}"/><line x1="{x0:.1}" y1="{a:.1}" x2="{x0:.1}" y2="{b:.1}"/><line x1="{x1:.1}" y1="{a:.1}" x2="{x1:.1}" y2="{b:.1}"/><title>wall min–max over passes: {lo_s}–{hi_s}</title></g>"##,
            a = ym - 5.0,
            b = ym + 5.0,
            lo_s = seconds(lo),
            hi_s = seconds(hi)
        );
    }
}

/// Each segment name once, in order of first appearance, from `left` along `ly`.
fn bars_legend(o: &mut String, bars: &[Bar], left: f64, ly: f64) {
    let mut lx = left;
    let mut seen: Vec<&str> = Vec::new();
    for b in bars {
        for (name, _, color) in &b.segments {
            if seen.contains(name) {
                continue;
            }
            seen.push(name);
            let _ = write!(
                o,
                r#"<rect x="{lx:.1}" y="{ry:.1}" width="12" height="12" fill="{color}"/><text x="{tx:.1}" y="{ly:.1}">{name}</text>"#,
                ry = ly - 10.0,
                tx = lx + 16.0
            );
            lx += 24.0 + 7.0 * name.len() as f64;
        }
    }
}

/// Series of (x label, ns) points, e.g. p50 … max per filesystem, on a log y axis.
pub fn percentiles(title: &str, series: &[(String, Vec<(&'static str, u64)>)]) -> String {
    let (w, h, left, right, top, bottom) = (360.0, 220.0, 64.0, 12.0, 30.0, 44.0);
    let vals: Vec<u64> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.1))
        .filter(|&v| v > 0)
        .collect();
    let (lo, hi) = (
        vals.iter().copied().min().unwrap_or(1) as f64,
        vals.iter().copied().max().unwrap_or(10) as f64,
    );
    let (l0, l1) = (
        lo.log10().floor(),
        hi.log10().ceil().max(lo.log10().floor() + 1.0),
    );
    let npts = series.first().map(|s| s.1.len()).unwrap_or(1).max(2);
    let x = |i: usize| left + (w - left - right) * i as f64 / (npts - 1) as f64;
    let y = |v: u64| {
        let lv = (v.max(1) as f64).log10();
        top + (h - top - bottom) * (1.0 - (lv - l0) / (l1 - l0))
    };
    let mut o = open(w, h, left, 11, title);
    let mut e = l0;
    while e <= l1 {
        let v = 10f64.powf(e) as u64;
        let yy = y(v);
        let _ = write!(
            o,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{x2}" y2="{yy:.1}" stroke="#ddd"/><text x="{tx}" y="{ty:.1}" text-anchor="end" fill="#555">{l}</text>"##,
            x2 = w - right,
            tx = left - 4.0,
            ty = yy + 4.0,
            l = duration_ns(v)
        );
        e += 1.0;
    }
    if let Some((_, pts)) = series.first() {
        for (i, (label, _)) in pts.iter().enumerate() {
            let _ = write!(
                o,
                r##"<text x="{xx:.1}" y="{ty}" text-anchor="middle" fill="#555">{label}</text>"##,
                xx = x(i),
                ty = h - bottom + 16.0
            );
        }
    }
    for (k, (name, pts)) in series.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .enumerate()
            .map(|(i, (_, v))| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        let _ = write!(
            o,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for (i, (label, v)) in pts.iter().enumerate() {
            let _ = write!(
                o,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{c}"><title>{} {label}: {}</title></circle>"#,
                x(i),
                y(*v),
                esc(name),
                duration_ns(*v)
            );
        }
        legend(&mut o, k, name, left, h);
    }
    o.push_str("</svg>");
    o
}

/// Distributions by power of two as frequency polygons, one per series: share of events
/// (y) per latency bucket (x, log scale).
pub fn histograms(title: &str, series: &[(String, Vec<(u32, u64)>)]) -> String {
    let (w, h, left, right, top, bottom) = (360.0, 220.0, 44.0, 12.0, 30.0, 44.0);
    let ks: Vec<u32> = series
        .iter()
        .flat_map(|(_, b)| b.iter().map(|x| x.0))
        .collect();
    let (k0, k1) = (
        ks.iter().copied().min().unwrap_or(0),
        ks.iter()
            .copied()
            .max()
            .unwrap_or(1)
            .max(ks.iter().copied().min().unwrap_or(0) + 1),
    );
    let x = |k: u32| left + (w - left - right) * (k - k0) as f64 / (k1 - k0) as f64;
    let shares: Vec<Vec<(u32, f64)>> = series
        .iter()
        .map(|(_, b)| {
            let total: u64 = b.iter().map(|x| x.1).sum::<u64>().max(1);
            (k0..=k1)
                .map(|k| {
                    let n = b.iter().find(|x| x.0 == k).map(|x| x.1).unwrap_or(0);
                    (k, n as f64 / total as f64)
                })
                .collect()
        })
        .collect();
    let ymax = nice(
        shares
            .iter()
            .flatten()
            .map(|s| s.1)
            .fold(0.0, f64::max)
            .max(0.01),
    );
    let y = |v: f64| top + (h - top - bottom) * (1.0 - v / ymax);
    let mut o = open(w, h, left, 11, title);
    grid(&mut o, ymax, y, (left, w - right), |v| {
        format!("{:.0}%", 100.0 * v)
    });
    let step = ((k1 - k0) / 5).max(1);
    let mut k = k0;
    while k <= k1 {
        let _ = write!(
            o,
            r##"<text x="{xx:.1}" y="{ty}" text-anchor="middle" fill="#555">{l}</text>"##,
            xx = x(k),
            ty = h - bottom + 16.0,
            l = duration_ns(1u64 << k.min(62))
        );
        k += step;
    }
    for (i, ((name, _), pts)) in series.iter().zip(&shares).enumerate() {
        let c = COLORS[i % COLORS.len()];
        let p: Vec<String> = pts
            .iter()
            .map(|(k, v)| format!("{:.1},{:.1}", x(*k), y(*v)))
            .collect();
        let _ = write!(
            o,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
            p.join(" "),
            esc(name),
        );
        legend(&mut o, i, name, left, h);
    }
    o.push_str("</svg>");
    o
}

/// One run on a trend line.
pub struct TrendPoint {
    /// Under the axis (the run's id).
    pub label: String,
    /// In the tooltip (date, kernel, label).
    pub detail: String,
    pub value: f64,
    pub shown: String,
    /// Compare flagged it: drawn ringed.
    pub flagged: bool,
}

pub struct TrendSeries {
    pub name: String,
    pub points: Vec<TrendPoint>,
}

/// A figure over runs, a line per filesystem, on a linear axis from zero; flagged runs
/// ringed in black.
pub fn trend(title: &str, series: &[TrendSeries]) -> String {
    let (w, h, left, right, top, bottom) = (560.0, 240.0, 64.0, 12.0, 30.0, 44.0);
    let labels: Vec<&str> = {
        let mut l: Vec<&str> = Vec::new();
        for p in series.iter().flat_map(|s| &s.points) {
            if !l.contains(&p.label.as_str()) {
                l.push(&p.label);
            }
        }
        l
    };
    let hi = nice(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.value))
            .fold(0.0, f64::max),
    );
    let n = labels.len().max(2);
    let x = |label: &str| {
        let i = labels.iter().position(|l| *l == label).unwrap_or(0);
        left + (w - left - right) * i as f64 / (n - 1) as f64
    };
    let y = |v: f64| top + (h - top - bottom) * (1.0 - v / hi);
    let mut o = open(w, h, left, 11, title);
    grid(&mut o, hi, y, (left, w - right), |v| axis_label(v, series));
    for l in &labels {
        let _ = write!(
            o,
            r##"<text x="{xx:.1}" y="{ty}" text-anchor="middle" fill="#555">{l}</text>"##,
            xx = x(l),
            ty = h - bottom + 16.0,
            l = esc(l)
        );
    }
    for (k, s) in series.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(&p.label), y(p.value)))
            .collect();
        let _ = write!(
            o,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for p in &s.points {
            let ring = if p.flagged {
                r#" stroke="black" stroke-width="2.5""#
            } else {
                ""
            };
            let _ = write!(
                o,
                r#"<circle cx="{:.1}" cy="{:.1}" r="{}" fill="{c}"{ring}><title>{} {}: {}{}</title></circle>"#,
                x(&p.label),
                y(p.value),
                if p.flagged { 5.5 } else { 3.5 },
                esc(&s.name),
                esc(&p.detail),
                esc(&p.shown),
                if p.flagged { " (flagged)" } else { "" }
            );
        }
        legend(&mut o, k, &s.name, left, h);
    }
    o.push_str("</svg>");
    o
}

/// An axis value in the series' own unit (the first point's `shown` tells which).
fn axis_label(v: f64, series: &[TrendSeries]) -> String {
    let bytes = series
        .first()
        .and_then(|s| s.points.first())
        .is_some_and(|p| p.shown.ends_with("MB/s"));
    if bytes {
        format!("{:.0} MB/s", v / 1e6)
    } else {
        seconds(v as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed() {
        let b = stacked_bars(
            "t <1>",
            &[Bar {
                label: "xfs".into(),
                segments: vec![("user", 1_000_000, "#f00"), ("sys", 3_000_000, "#0f0")],
                spread: Some((3_000_000, 5_000_000)),
            }],
        );
        assert!(b.starts_with("<svg") && b.ends_with("</svg>") && b.contains("t &lt;1&gt;"));
        assert_eq!(b.matches("class=\"seg\"").count(), 2);
        assert_eq!(nice(3.2), 5.0);
        let p = percentiles(
            "p",
            &[("ext4".into(), vec![("p50", 1000), ("p99", 90_000)])],
        );
        assert!(p.contains("<polyline") && p.ends_with("</svg>"));
        let hgm = histograms("h", &[("xfs".into(), vec![(10, 5), (12, 15)])]);
        assert!(hgm.contains("<polyline") && hgm.ends_with("</svg>"));
    }
}
