//! Human formatting of durations, bytes and shares.

pub fn duration_ns(ns: u64) -> String {
    let v = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}µs", v / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", v / 1e6)
    } else {
        format!("{:.3}s", v / 1e9)
    }
}

/// A step-sized time in seconds with 3 decimals; below 10 ms, where that keeps one digit or
/// none, in the unit that keeps three (a 0.4 ms mount is not `0.000s`).
pub fn seconds(ns: u64) -> String {
    if ns == 0 || ns >= 10_000_000 {
        format!("{:.3}s", ns as f64 / 1e9)
    } else {
        duration_ns(ns)
    }
}

/// `1 pass`, `3 passes`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    format!("{:.1}%", 100.0 * part as f64 / whole as f64)
}

/// m:ss,cc as the studies printed it.
pub fn clock(ns: u64) -> String {
    let cs = ns / 10_000_000;
    format!("{}:{:02},{:02}", cs / 6000, (cs / 100) % 60, cs % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(duration_ns(999), "999ns");
        assert_eq!(duration_ns(1_500), "1.5µs");
        assert_eq!(duration_ns(2_500_000_000), "2.500s");
        assert_eq!(bytes(4096), "4.0KiB");
        assert_eq!(percent(1, 4), "25.0%");
        assert_eq!(seconds(420_000), "420.0µs");
        assert_eq!(seconds(3_250_000), "3.25ms");
        assert_eq!(seconds(12_345_678), "0.012s");
        assert_eq!(seconds(0), "0.000s");
        assert_eq!(count(1u32, "pass", "passes"), "1 pass");
        assert_eq!(count(3u32, "pass", "passes"), "3 passes");
    }

    #[test]
    fn clock_format() {
        assert_eq!(clock(83_456_000_000), "1:23,45");
        assert_eq!(clock(450_000_000), "0:00,45");
    }
}
