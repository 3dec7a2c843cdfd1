//! Reports for people (terminal tables) and programs (versioned JSON).

pub mod charts;
pub mod compare_html;
pub mod compare_table;
pub mod crash;
pub mod crash_compare;
pub mod explain;
pub mod flame;
pub mod forest;
pub mod html;
pub mod markdown;
pub mod matrix;
pub mod run_summary;
pub mod run_table;
pub mod table;
pub mod timeline;

use std::path::Path;

use anyhow::Result;

use crate::trace::TraceResult;

/// Text made safe inside XML and HTML, attributes included.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes `result` as pretty JSON (schema in docs/json.md).
pub fn write_json(result: &TraceResult, path: &Path) -> Result<()> {
    // Atomic, as a run's results file: a kill mid-write leaves the old file whole.
    crate::os::write_atomic(path, &(serde_json::to_string_pretty(result)? + "\n"))
}
