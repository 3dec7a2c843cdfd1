//! The timeline's one line on the terminal.

use crate::aggregate::timeline::TimelineSummary;

/// "timeline: FILE (12.3 MB: 40123 switch, …; 812 block requests; 0 records lost)".
pub fn line(t: &TimelineSummary) -> String {
    let records: Vec<String> = t.records.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let requests: u64 = t.block_requests.values().sum();
    let undecoded = match t.undecoded {
        0 => String::new(),
        n => format!("; {n} records not decoded"),
    };
    format!(
        "timeline: {} ({}: {}; {} block requests; {} threads of the target; {} records lost{}) — open it in ui.perfetto.dev",
        t.path,
        crate::units::bytes(t.bytes),
        records.join(", "),
        requests,
        t.threads,
        t.lost,
        undecoded
    )
}
