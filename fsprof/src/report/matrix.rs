//! The run at a glance, on top of the HTML report: step × filesystem, each cell the ratio to
//! the step's fastest (coloured from green to red at twice as slow) and the time class that
//! held most of its time; a cell links to its step's section.

use std::fmt::Write as _;

use super::{escape as esc, run_summary::SummaryRow};
use crate::results::RunResult;

/// A cell's background: green at the fastest, red from twice its time on (hue on a log
/// scale, so 1.41× sits halfway).
pub fn colour(vs_fastest: f64) -> String {
    let slower = (vs_fastest.max(1.0).log2()).min(1.0);
    format!("hsl({:.0},60%,82%)", 120.0 * (1.0 - slower))
}

pub fn html(r: &RunResult, rows: &[SummaryRow]) -> String {
    let columns: Vec<String> = r.filesystems.iter().map(|f| f.column()).collect();
    let mut o = String::from("<table class=\"matrix\"><tr><th>step</th>");
    for c in &columns {
        let _ = write!(o, "<th>{}</th>", esc(c));
    }
    o.push_str("</tr>");
    for (i, step) in r.step_names().iter().enumerate() {
        let _ = write!(o, "<tr><td><a href=\"#step{i}\">{}</a></td>", esc(step));
        for c in &columns {
            match rows.iter().find(|s| &s.step == step && &s.fs == c) {
                Some(s) => {
                    let _ = write!(
                        o,
                        "<td style=\"background:{}\"><a href=\"#step{i}\" title=\"{} on {}\">\
                         {:.2}×<br><small>{} {:.0}%</small></a></td>",
                        colour(s.vs_fastest),
                        esc(step),
                        esc(c),
                        s.vs_fastest,
                        esc(s.mostly),
                        100.0 * s.mostly_share
                    );
                }
                None => o.push_str("<td>–</td>"),
            }
        }
        o.push_str("</tr>");
    }
    o.push_str(
        "</table><p class=\"waits\">Each cell: the step's time on that filesystem over its \
         fastest (its rate for a step judged by one), and the class that held most of its \
         threads' time.</p>",
    );
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn green_at_the_fastest_red_from_twice() {
        assert_eq!(super::colour(1.0), "hsl(120,60%,82%)");
        assert_eq!(super::colour(2.0f64.sqrt()), "hsl(60,60%,82%)");
        assert_eq!(super::colour(2.0), "hsl(0,60%,82%)");
        assert_eq!(super::colour(5.0), "hsl(0,60%,82%)");
    }
}
