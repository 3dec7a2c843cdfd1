//! Kernel bucket counts → hdrhistogram, and the percentile summary the reports print.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use fsprof_common::hist::{MAX_VALUE, bucket_mid};

/// Builds an hdrhistogram from (bucket, count) pairs, recording each bucket's midpoint.
pub fn from_buckets(buckets: impl IntoIterator<Item = (u32, u64)>) -> Histogram<u64> {
    // Fixed bounds: new(3) would start at a max of 2 and saturating_record would clamp.
    let mut h = Histogram::<u64>::new_with_bounds(1, MAX_VALUE + 1, 3).expect("valid bounds");
    for (b, n) in buckets {
        if n > 0 {
            h.saturating_record_n(bucket_mid(b), n);
        }
    }
    h
}

/// Percentiles of a histogram; values in the histogram's unit (ns or bytes).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Summary {
    pub count: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    /// The distribution by power of two: [k, count] of values in [2^k, 2^(k+1)); empty
    /// buckets left out.
    #[serde(default)]
    pub log2: Vec<(u32, u64)>,
}

impl Summary {
    pub fn of(h: &Histogram<u64>) -> Summary {
        if h.is_empty() {
            return Summary::default();
        }
        Summary {
            count: h.len(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            log2: log2_buckets(h),
        }
    }
}

fn log2_buckets(h: &Histogram<u64>) -> Vec<(u32, u64)> {
    let mut b: std::collections::BTreeMap<u32, u64> = Default::default();
    for v in h.iter_recorded() {
        let x = v.value_iterated_to().max(1);
        *b.entry(63 - x.leading_zeros()).or_insert(0) += v.count_at_value();
    }
    b.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsprof_common::hist::bucket_of;

    #[test]
    fn percentiles_within_two_percent() {
        // 1..=100_000 ns uniformly: exact p50 = 50_000, p99 = 99_000.
        let mut counts = std::collections::BTreeMap::new();
        for v in 1..=100_000u64 {
            *counts.entry(bucket_of(v)).or_insert(0u64) += 1;
        }
        let s = Summary::of(&from_buckets(counts));
        for (got, want) in [(s.p50, 50_000.0), (s.p90, 90_000.0), (s.p99, 99_000.0)] {
            let err = (got as f64 - want).abs() / want;
            assert!(err < 0.02, "got {got} want {want}");
        }
        assert_eq!(s.count, 100_000);
        // 2^k..2^(k+1) holds 2^k of the values 1..=100000 (bucket midpoints may shift
        // a bucket's edge by one).
        let total: u64 = s.log2.iter().map(|b| b.1).sum();
        assert_eq!(total, 100_000);
        let k10 = s.log2.iter().find(|b| b.0 == 10).unwrap().1;
        assert!((k10 as f64 - 1024.0).abs() < 0.03 * 1024.0, "{:?}", s.log2);
    }
}
