//! Plain statistics over passes (statrs, with 0 for no values, as the tables print it), and
//! Benjamini–Hochberg q-values over a family of tests.

use statrs::statistics::{Data, Median, Statistics};

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.mean()
}

/// The median of real values (0 for none).
pub fn median_f64(v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    Data::new(v).median()
}

/// Median of integer figures (0 for none), kept integral: what the tables print over
/// passes.
pub fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

/// Benjamini–Hochberg q-values of `p`, in order: flagging every q ≤ alpha keeps the
/// expected share of false flags among the flags at most alpha (independent or positively
/// dependent tests), and with no real change any flag at all has probability ≤ alpha.
pub fn bh_qvalues(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut q = vec![1.0; m];
    let mut running: f64 = 1.0;
    for (rank, &i) in order.iter().enumerate().rev() {
        running = running.min(p[i] * m as f64 / (rank + 1) as f64);
        q[i] = running.min(1.0);
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bh_matches_reference() {
        // R: p.adjust(c(0.01, 0.04, 0.03, 0.005, 0.5), "BH") = 0.025 0.05 0.05 0.025 0.5
        let q = bh_qvalues(&[0.01, 0.04, 0.03, 0.005, 0.5]);
        let want = [0.025, 0.05, 0.05, 0.025, 0.5];
        for (a, b) in q.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{q:?}");
        }
    }
}
