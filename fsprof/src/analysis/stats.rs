//! Welch's t-test: the passes of two runs are two small samples with possibly different
//! variances; it gives the p-value of "the means differ" and a confidence interval of the
//! difference.

use statrs::distribution::{ContinuousCDF, StudentsT};

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// Sample variance (n − 1).
pub fn variance(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
}

/// Median of integer figures (0 for none): what the tables print over passes.
pub fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Welch {
    /// Two-sided p-value of "mean(b) ≠ mean(a)".
    pub p: f64,
    /// 95 % confidence interval of mean(b) − mean(a).
    pub ci: (f64, f64),
}

/// None with fewer than two values on a side (no variance to test against).
pub fn welch(a: &[f64], b: &[f64]) -> Option<Welch> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let (va, vb) = (variance(a) / na, variance(b) / nb);
    let diff = mean(b) - mean(a);
    let se = (va + vb).sqrt();
    if se == 0.0 {
        // Identical passes on both sides: any difference is exact.
        let p = if diff == 0.0 { 1.0 } else { 0.0 };
        return Some(Welch {
            p,
            ci: (diff, diff),
        });
    }
    let df = (va + vb).powi(2) / (va.powi(2) / (na - 1.0) + vb.powi(2) / (nb - 1.0));
    let t = StudentsT::new(0.0, 1.0, df).ok()?;
    let p = 2.0 * (1.0 - t.cdf((diff / se).abs()));
    let q = t.inverse_cdf(0.975);
    Some(Welch {
        p,
        ci: (diff - q * se, diff + q * se),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welch_matches_reference() {
        // t = 1.9757, df = 7.711: p = 0.08496 (the t density integrated numerically).
        let w = welch(&[1., 2., 3., 4., 5.], &[3., 4., 5., 6., 8.]).unwrap();
        assert!((w.p - 0.08496).abs() < 0.0005, "{w:?}");
        assert!(w.ci.0 < 2.2 && w.ci.1 > 2.2);
        assert_eq!(welch(&[1., 1.], &[1., 1.]).unwrap().p, 1.0);
        assert!(welch(&[1.0], &[2.0, 3.0]).is_none());
    }
}
