//! The verdict rule that `compare` and `explain` share: which changes of a family of figures
//! are clear, with the error over the whole family controlled. Why this rule, with the
//! measurements behind it: docs/design.md, "Verdicts".
//!
//! 1. Each figure's change on a log scale, offset by its kind's floor (tiny figures barely
//!    move), with the spread of its passes plus its resolution (a sampled figure is a Poisson
//!    count, a percentile a bucket).
//! 2. The spread of a figure from 3 passes is itself a guess from 2 degrees of freedom, so it
//!    is moderated (Smyth 2004, limma's moderated t): figures of one kind spread alike, and the
//!    typical spread of the kind (an F-distribution fitted to all of its figures' spreads) is
//!    mixed into each one's with the weight of its prior degrees of freedom. The prior comes
//!    from the passes only, so a real change, however broad, does not widen it.
//! 3. Benjamini–Hochberg q-values over every figure of the family: flagging q ≤ alpha keeps
//!    the expected share of false flags among flags at alpha, and with no real change the
//!    chance of any flag at alpha.
//! 4. Flagged: q ≤ alpha, |change| ≥ threshold and above the kind's floor. A change that large
//!    but not clear is inconclusive, with the passes a side that would settle it.

use serde::Serialize;
use statrs::{
    distribution::{ContinuousCDF, StudentsT},
    function::gamma::digamma,
};

use super::{
    metrics::{Kind, Metric, Resolution},
    stats::{bh_qvalues, mean},
};

#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// Relative change that counts, e.g. 0.05 for 5 %.
    pub threshold: f64,
    /// False discovery rate over the family: the expected share of false flags among flags.
    pub alpha: f64,
}

impl Default for Rule {
    fn default() -> Self {
        Rule {
            threshold: 0.05,
            alpha: 0.01,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Regression,
    Improvement,
    /// A change of at least the threshold that the noise does not let one call: too few
    /// passes, or a spread as wide as the change.
    Inconclusive,
    /// Smaller than the threshold or the kind's floor.
    Unchanged,
}

/// What the rule says of one figure.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Judged {
    pub p: Option<f64>,
    pub q: Option<f64>,
    /// 95 % interval of the change, % of base.
    pub ci_pct: Option<(f64, f64)>,
    pub verdict: Option<Verdict>,
    /// Inconclusive: passes a side that would settle the change if it is what it seems; None
    /// when it would take more than MAX_PASSES.
    pub passes_needed: Option<u32>,
}

/// The pass-to-pass spread learned for one kind of figure.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct KindSpread {
    pub kind: &'static str,
    pub figures: usize,
    /// The kind's typical spread of one pass, % of the figure (s₀).
    pub typical_pct: f64,
    /// How much that typical spread counts, in passes' degrees of freedom (d₀; null:
    /// unbounded, every figure of the kind spreads alike; 0: each figure stands alone).
    pub prior_df: Option<f64>,
}

/// The judged family: one `Judged` per figure, in order, and the spread per kind.
#[derive(Clone, Debug, Default)]
pub struct Family {
    pub judged: Vec<Judged>,
    pub spread: Vec<KindSpread>,
}

/// Fewer figures of a kind than this and no prior is learned: each stands alone.
const MIN_KIND: usize = 20;
/// Most passes a side that `passes_needed` proposes.
const MAX_PASSES: u32 = 50;
/// Prior degrees of freedom taken as unbounded.
const DF_INFINITE: f64 = 1e6;

/// One figure's change on the log scale and the spread of its passes.
#[derive(Clone, Copy, Debug)]
struct Change {
    /// ln((new + floor) / (base + floor)).
    d: f64,
    /// Pooled variance of one pass on the log scale, its degrees of freedom and the passes a
    /// side; None with fewer than two passes a side.
    spread: Option<(f64, f64, [f64; 2])>,
}

impl Change {
    fn of(base: &Metric, new: &Metric) -> Change {
        let f = base.kind.floor();
        let logs = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| (x + f).ln()).collect() };
        let (lb, ln) = (logs(&base.values), logs(&new.values));
        let (nb, nn) = (lb.len() as f64, ln.len() as f64);
        let spread = (nb >= 2.0 && nn >= 2.0).then(|| {
            // Sum of squares on the log scale, plus what the measurement's resolution adds.
            let side = |l: &[f64], v: &[f64]| -> f64 {
                let (ml, mv) = (mean(l), mean(v));
                let ss: f64 = l.iter().map(|x| (x - ml).powi(2)).sum();
                ss + (l.len() as f64 - 1.0) * resolution_variance(base.resolution, mv)
                    / (mv + f).powi(2)
            };
            let df = nb + nn - 2.0;
            let var = (side(&lb, &base.values) + side(&ln, &new.values)) / df;
            (var, df, [nb, nn])
        });
        Change {
            d: mean(&ln) - mean(&lb),
            spread,
        }
    }
}

/// Variance a value carries from how it is measured.
fn resolution_variance(r: Resolution, value: f64) -> f64 {
    match r {
        Resolution::Exact => 0.0,
        // A count of k samples of period T: Var = k T² = value T (at least one sample's).
        Resolution::Sampled(t) => value.max(t) * t,
        // Uniform within a bucket of width w·value.
        Resolution::Bucket(w) => (w * value).powi(2) / 12.0,
    }
}

/// Trigamma ψ₁(x), x > 0: the recurrence up to 6, then the asymptotic series.
fn trigamma(mut x: f64) -> f64 {
    let mut acc = 0.0;
    while x < 6.0 {
        acc += 1.0 / (x * x);
        x += 1.0;
    }
    let x2 = 1.0 / (x * x);
    acc + 1.0 / x
        + x2 / 2.0
        + (1.0 / x) * x2 * (1.0 / 6.0 - x2 * (1.0 / 30.0 - x2 * (1.0 / 42.0 - x2 / 30.0)))
}

/// ψ₁⁻¹(y) by bisection on the log scale (ψ₁ falls from ∞ to 0).
fn inverse_trigamma(y: f64) -> f64 {
    let (mut lo, mut hi) = (1e-8f64.ln(), 1e8f64.ln());
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if trigamma(mid.exp()) > y {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    ((lo + hi) / 2.0).exp()
}

/// The kind's prior: spreads s² with d degrees of freedom as s₀² · F(d, d₀) (Smyth 2004,
/// moment matching on log s²). (s₀², d₀); d₀ = 0 with too few figures.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Prior {
    /// s₀²: the kind's typical variance of one pass on the log scale.
    s0_sq: f64,
    d0: f64,
}

impl Prior {
    const NONE: Prior = Prior {
        s0_sq: 0.0,
        d0: 0.0,
    };

    fn fit(spreads: &[(f64, f64)]) -> Prior {
        let pos: Vec<(f64, f64)> = spreads.iter().copied().filter(|(v, _)| *v > 0.0).collect();
        if pos.len() < MIN_KIND {
            return Prior::NONE;
        }
        let n = pos.len() as f64;
        let e: Vec<f64> = pos
            .iter()
            .map(|(v, d)| v.ln() - digamma(d / 2.0) + (d / 2.0).ln())
            .collect();
        let emean = e.iter().sum::<f64>() / n;
        let evar = e.iter().map(|x| (x - emean).powi(2)).sum::<f64>() / (n - 1.0)
            - pos.iter().map(|(_, d)| trigamma(d / 2.0)).sum::<f64>() / n;
        if evar <= 0.0 {
            return Prior {
                s0_sq: emean.exp(),
                d0: DF_INFINITE,
            };
        }
        let d0 = (2.0 * inverse_trigamma(evar)).min(DF_INFINITE);
        Prior {
            s0_sq: (emean + digamma(d0 / 2.0) - (d0 / 2.0).ln()).exp(),
            d0,
        }
    }

    /// Moderated t-test of `c` with `n` passes a side (None: as measured): (two-sided p,
    /// half-width of the 95 % interval of d); None with fewer than two passes a side.
    fn test(&self, c: &Change, n: Option<f64>) -> Option<(f64, f64)> {
        let (var, df, [nb, nn]) = c.spread?;
        let (nb, nn) = n.map_or((nb, nn), |n| (n, n));
        let df = n.map_or(df, |n| 2.0 * n - 2.0);
        let post = (self.d0 * self.s0_sq + df * var) / (self.d0 + df);
        let se = (post * (1.0 / nb + 1.0 / nn)).sqrt();
        if se <= 0.0 {
            return Some((if c.d == 0.0 { 1.0 } else { 0.0 }, 0.0));
        }
        let t = StudentsT::new(0.0, 1.0, (self.d0 + df).min(DF_INFINITE)).expect("df > 0");
        Some((
            2.0 * (1.0 - t.cdf(c.d.abs() / se)),
            se * t.inverse_cdf(0.975),
        ))
    }
}

/// The prior of each kind, learned from that kind's figures.
fn priors(pairs: &[(&Metric, &Metric)], changes: &[Change]) -> Vec<(Kind, usize, Prior)> {
    let mut kinds: Vec<Kind> = pairs.iter().map(|(b, _)| b.kind).collect();
    kinds.sort();
    kinds.dedup();
    kinds
        .into_iter()
        .map(|k| {
            let spreads: Vec<(f64, f64)> = pairs
                .iter()
                .zip(changes)
                .filter(|((b, _), _)| b.kind == k)
                .filter_map(|(_, c)| c.spread.map(|(v, d, _)| (v, d)))
                .collect();
            let figures = pairs.iter().filter(|(b, _)| b.kind == k).count();
            (k, figures, Prior::fit(&spreads))
        })
        .collect()
}

/// Judges a family of (base, new) figures.
/// A q-value as the reports print it: three decimals, or "< 0.001" (not "0.000").
pub fn show_q(q: f64) -> String {
    match q < 0.0005 {
        true => "< 0.001".into(),
        false => format!("{q:.3}"),
    }
}

/// "q = 0.012", or "q < 0.001".
pub fn q_clause(q: f64) -> String {
    let shown = show_q(q);
    match shown.starts_with('<') {
        true => format!("q {shown}"),
        false => format!("q = {shown}"),
    }
}

pub fn judge(pairs: &[(&Metric, &Metric)], rule: &Rule) -> Family {
    let changes: Vec<Change> = pairs.iter().map(|(b, n)| Change::of(b, n)).collect();
    let kinds = priors(pairs, &changes);
    let prior_of = |k: Kind| kinds.iter().find(|n| n.0 == k).map_or(Prior::NONE, |n| n.2);
    let tests: Vec<Option<(f64, f64)>> = pairs
        .iter()
        .zip(&changes)
        .map(|((b, _), c)| prior_of(b.kind).test(c, None))
        .collect();
    let ps: Vec<f64> = tests.iter().map(|t| t.map_or(1.0, |t| t.0)).collect();
    let qs = bh_qvalues(&ps);
    let flags = pairs
        .iter()
        .zip(&qs)
        .filter(|((b, n), q)| **q <= rule.alpha && large(b, n, rule))
        .count();
    // A further flag would need p below the BH cut at rank flags + 1.
    let next_cut = rule.alpha * (flags + 1) as f64 / ps.len().max(1) as f64;
    let judged = pairs
        .iter()
        .zip(&changes)
        .zip(tests.iter().zip(&qs))
        .map(|(((b, n), c), (t, q))| {
            let mut j = Judged {
                p: t.map(|t| t.0),
                q: t.map(|_| *q),
                ci_pct: t.and_then(|(_, half)| interval(b, c, half)),
                ..Default::default()
            };
            j.verdict = Some(if !large(b, n, rule) {
                Verdict::Unchanged
            } else if t.is_some() && *q <= rule.alpha {
                let (mb, mn) = (mean(&b.values), mean(&n.values));
                if (mn > mb) == b.higher_is_worse {
                    Verdict::Regression
                } else {
                    Verdict::Improvement
                }
            } else {
                j.passes_needed = passes_needed(c, &prior_of(b.kind), next_cut);
                Verdict::Inconclusive
            });
            j
        })
        .collect();
    Family {
        judged,
        spread: kinds
            .iter()
            .map(|(k, figures, p)| KindSpread {
                kind: k.into(),
                figures: *figures,
                typical_pct: 100.0 * (p.s0_sq.sqrt().exp() - 1.0),
                prior_df: (p.d0 < DF_INFINITE).then_some(p.d0),
            })
            .collect(),
    }
}

/// |change| ≥ threshold and above the kind's floor.
fn large(b: &Metric, n: &Metric, rule: &Rule) -> bool {
    let (mb, mn) = (mean(&b.values), mean(&n.values));
    let change = if mb != 0.0 {
        (mn - mb) / mb
    } else if mn != 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    change.abs() >= rule.threshold && (mn - mb).abs() >= b.kind.floor()
}

/// The 95 % interval of the change as % of base (None for a zero base), from the
/// interval's half-width on the log scale.
fn interval(b: &Metric, c: &Change, half: f64) -> Option<(f64, f64)> {
    let mb = mean(&b.values);
    if mb == 0.0 {
        return None;
    }
    let f = b.kind.floor();
    // The log-scale means are geometric: anchor the interval on the arithmetic base.
    let pct = |d: f64| 100.0 * (((mb + f) * d.exp() - f) - mb) / mb;
    Some((pct(c.d - half), pct(c.d + half)))
}

/// Passes a side at which this change, as large and as spread as measured, would have p
/// below `cut`; None when that takes more than MAX_PASSES.
fn passes_needed(c: &Change, prior: &Prior, cut: f64) -> Option<u32> {
    if c.spread.is_none() {
        return Some(3);
    }
    (2..=MAX_PASSES).find(|&n| prior.test(c, Some(n as f64)).is_some_and(|(p, _)| p <= cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_q_values_are_not_printed_as_zero() {
        assert_eq!(q_clause(0.0), "q < 0.001");
        assert_eq!(q_clause(0.0004), "q < 0.001");
        assert_eq!(q_clause(0.0123), "q = 0.012");
        assert_eq!(show_q(0.5), "0.500");
    }

    fn m(kind: Kind, v: &[f64]) -> Metric {
        Metric {
            name: "wall".into(),
            kind,
            higher_is_worse: true,
            values: v.iter().map(|x| x * 1e9).collect(),
            resolution: Resolution::Exact,
        }
    }

    fn one(b: &[f64], n: &[f64]) -> Judged {
        let (b, n) = (m(Kind::Wall, b), m(Kind::Wall, n));
        judge(&[(&b, &n)], &Rule::default()).judged.remove(0)
    }

    #[test]
    fn verdicts_of_one_figure() {
        let same = one(&[1.0, 1.01, 0.99], &[1.0, 1.01, 0.99]);
        assert_eq!(same.verdict, Some(Verdict::Unchanged));
        let slow = one(&[1.0, 1.01, 0.99], &[1.5, 1.52, 1.49]);
        assert_eq!(slow.verdict, Some(Verdict::Regression));
        assert!(slow.q.unwrap() < 0.01, "{slow:?}");
        let fast = one(&[1.5, 1.52, 1.49], &[1.0, 1.01, 0.99]);
        assert_eq!(fast.verdict, Some(Verdict::Improvement));
        let noisy = one(&[1.0, 2.0, 0.5], &[1.5, 0.8, 2.2]);
        assert_eq!(noisy.verdict, Some(Verdict::Inconclusive));
        assert!(noisy.passes_needed.is_none_or(|n| n > 3), "{noisy:?}");
        let single = one(&[1.0], &[2.0]);
        assert_eq!(single.verdict, Some(Verdict::Inconclusive));
        assert_eq!((single.p, single.passes_needed), (None, Some(3)));
    }

    #[test]
    fn a_spread_change_says_how_many_passes_settle_it() {
        // +20 % with a 10 % spread: unclear in 3 passes, clear in more.
        let j = one(&[1.0, 1.1, 0.9], &[1.2, 1.32, 1.08]);
        assert_eq!(j.verdict, Some(Verdict::Inconclusive), "{j:?}");
        let n = j.passes_needed.expect("passes settle it");
        assert!((4..=20).contains(&n), "{j:?}");
    }

    #[test]
    fn trigamma_matches_reference() {
        let pi2 = std::f64::consts::PI.powi(2);
        assert!((trigamma(1.0) - pi2 / 6.0).abs() < 1e-9);
        assert!((trigamma(0.5) - pi2 / 2.0).abs() < 1e-9);
        assert!((inverse_trigamma(trigamma(2.5)) - 2.5).abs() < 1e-6);
    }

    /// Many figures of one kind spread ±10 % a pass. One whose three passes happen to agree
    /// closely, with a modest change, is not taken at its word: its spread is moderated
    /// toward the kind's. A change far beyond the kind's spread stands out.
    #[test]
    fn a_figure_is_judged_with_its_kinds_spread() {
        let mut rng = 7u64;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let mut figs = Vec::new();
        for i in 0..60 {
            let mut pass = |k: f64| {
                (0..3)
                    .map(|_| k * (1.0 + 0.35 * next()))
                    .collect::<Vec<_>>()
            };
            let (base, new) = match i {
                // Passes that agree to 0.1 %, 8 % apart: Welch alone would call it.
                0 => (vec![1.0, 1.001, 0.999], vec![1.08, 1.081, 1.079]),
                1 => (pass(1.0), pass(3.0)),
                _ => (pass(1.0), pass(1.0)),
            };
            figs.push((m(Kind::Wall, &base), m(Kind::Wall, &new)));
        }
        let pairs: Vec<(&Metric, &Metric)> = figs.iter().map(|(b, n)| (b, n)).collect();
        let f = judge(&pairs, &Rule::default());
        let flagged: Vec<usize> = (0..60)
            .filter(|&i| f.judged[i].verdict == Some(Verdict::Regression))
            .collect();
        assert_eq!(flagged, vec![1], "{:?}", f.spread);
        assert!(f.spread[0].typical_pct > 5.0, "{:?}", f.spread);
    }

    #[test]
    fn a_sampled_figure_is_a_count() {
        // 0 vs one 5 ms sample in each pass: identical passes, but one sample is no evidence.
        let period = 5.025e6;
        let mk = |v: f64| Metric {
            values: vec![v; 3],
            resolution: Resolution::Sampled(period),
            ..m(Kind::KernelBg, &[])
        };
        let (b, n) = (mk(0.0), mk(period));
        let j = judge(&[(&b, &n)], &Rule::default()).judged.remove(0);
        assert_eq!(j.verdict, Some(Verdict::Inconclusive), "{j:?}");
    }
}
