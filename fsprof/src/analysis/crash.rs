//! `compare` of two crash studies: per filesystem, pattern and crash point, how many trials
//! found the new content on each side, tested with Fisher's exact test (trials are
//! independent, each on a fresh filesystem); and what each pattern cost on each side.

use anyhow::{Result, bail};
use statrs::function::factorial::ln_binomial;

use crate::results::crash::{CrashCell, CrashCost, CrashStudy};
use crate::workload::crash::Outcome;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashVerdict {
    /// The new content was found significantly more often.
    Safer,
    LessSafe,
    /// Every outcome in the same share of the trials on both sides.
    Same,
    /// Different counts, but not significantly so at this many trials.
    Inconclusive,
}

impl CrashVerdict {
    pub fn name(self) -> &'static str {
        match self {
            CrashVerdict::Safer => "safer",
            CrashVerdict::LessSafe => "LESS SAFE",
            CrashVerdict::Same => "same",
            CrashVerdict::Inconclusive => "inconclusive",
        }
    }
}

/// A cell of both studies: (filesystem, pattern, crash point) with each side's options.
pub struct CrashRow<'a> {
    pub base: &'a CrashCell,
    pub new: &'a CrashCell,
    /// Two-sided p of Fisher's exact test on (new content, anything else) × side.
    pub p: f64,
    pub verdict: CrashVerdict,
}

pub struct CrashComparison<'a> {
    pub rows: Vec<CrashRow<'a>>,
    /// Each pattern's cost on both sides, by filesystem.
    pub costs: Vec<(&'a CrashCost, &'a CrashCost)>,
    /// The level each cell is tested at.
    pub alpha: f64,
}

fn found_new(c: &CrashCell) -> u32 {
    c.outcomes.get(&Outcome::New).copied().unwrap_or(0)
}

/// Two-sided p of Fisher's exact test on the 2×2 table (a, b; c, d): the probability,
/// with the margins fixed, of a table at most as likely as this one.
pub fn fisher_exact(a: u32, b: u32, c: u32, d: u32) -> f64 {
    let (row1, col1, n) = (a + b, a + c, a + b + c + d);
    let ln_p = |x: u32| {
        ln_binomial(col1 as u64, x as u64) + ln_binomial((n - col1) as u64, (row1 - x) as u64)
            - ln_binomial(n as u64, row1 as u64)
    };
    let lo = row1.saturating_sub(n - col1);
    let hi = row1.min(col1);
    let observed = ln_p(a);
    (lo..=hi)
        .map(ln_p)
        .filter(|&l| l <= observed + 1e-7)
        .map(f64::exp)
        .sum::<f64>()
        .min(1.0)
}

/// Cells of `base` and `new` paired by filesystem, pattern and crash point (the options
/// may differ: that is what such a comparison is for), each tested at `alpha`.
pub fn compare<'a>(
    base: &'a CrashStudy,
    new: &'a CrashStudy,
    alpha: f64,
) -> Result<CrashComparison<'a>> {
    let mut rows = Vec::new();
    for b in &base.cells {
        let Some(n) = new
            .cells
            .iter()
            .find(|n| (&n.fs, n.pattern, n.point) == (&b.fs, b.pattern, b.point))
        else {
            continue;
        };
        if n.method != b.method {
            bail!(
                "{} was crashed by {} on one side and by {} on the other: results of different \
                 crash methods are not compared",
                b.fs,
                b.method,
                n.method
            );
        }
        let (bn, nn) = (found_new(b), found_new(n));
        let p = fisher_exact(bn, b.trials() - bn, nn, n.trials() - nn);
        let share = |k: u32, c: &CrashCell| f64::from(k) / f64::from(c.trials().max(1));
        let verdict = if b.same_shares(n) {
            CrashVerdict::Same
        } else if p >= alpha {
            CrashVerdict::Inconclusive
        } else if share(nn, n) > share(bn, b) {
            CrashVerdict::Safer
        } else {
            CrashVerdict::LessSafe
        };
        rows.push(CrashRow {
            base: b,
            new: n,
            p,
            verdict,
        });
    }
    if rows.is_empty() {
        bail!("the two crash studies share no filesystem, pattern and crash point");
    }
    let costs = base
        .costs
        .iter()
        .filter_map(|b| {
            let n = new
                .costs
                .iter()
                .find(|n| (&n.fs, n.pattern) == (&b.fs, b.pattern))?;
            Some((b, n))
        })
        .collect();
    Ok(CrashComparison { rows, costs, alpha })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn study(mount: &str, new_found: &[u32]) -> CrashStudy {
        use crate::{results::crash::CrashPoint, workload::crash::Pattern};
        let cell = |pattern, k: u32| CrashCell {
            fs: "ext4".into(),
            mkfs_opts: String::new(),
            mount_opts: mount.into(),
            method: "shutdown-ioctl".into(),
            pattern,
            point: CrashPoint::Now,
            wait_ns: 0,
            durable: false,
            outcomes: [(Outcome::New, k), (Outcome::Old, 5 - k)]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            recovery_ns: Vec::new(),
            fsck_ns: Vec::new(),
            fsck_unclean: 0,
            fsck_detail: None,
            error_detail: None,
            recovery_unclean: 0,
            recovery_detail: None,
        };
        let patterns = [Pattern::RenameNoFsync, Pattern::Append, Pattern::Overwrite];
        CrashStudy {
            cells: patterns
                .iter()
                .zip(new_found)
                .map(|(&p, &k)| cell(p, k))
                .collect(),
            trials: 5,
            ..Default::default()
        }
    }

    #[test]
    fn cells_pair_by_fs_pattern_and_point_and_five_of_five_is_found() {
        let (base, new) = (study("", &[0, 3, 2]), study("data=journal", &[5, 3, 3]));
        let c = compare(&base, &new, 0.01).unwrap();
        let verdicts: Vec<CrashVerdict> = c.rows.iter().map(|r| r.verdict).collect();
        use CrashVerdict::*;
        assert_eq!(verdicts, [Safer, Same, Inconclusive]);
        let back = compare(&new, &base, 0.01).unwrap();
        assert_eq!(back.rows[0].verdict, LessSafe);
        let mut other = study("", &[0, 0, 0]);
        other.cells[0].method = "power-cut".into();
        assert!(compare(&base, &other, 0.01).is_err());
    }

    #[test]
    fn fisher_exact_matches_known_tables() {
        // 5/5 against 0/5: 2 / C(10,5) = 2/252.
        assert!((fisher_exact(5, 0, 0, 5) - 2.0 / 252.0).abs() < 1e-12);
        // Identical sides: nothing to see.
        assert!((fisher_exact(3, 2, 3, 2) - 1.0).abs() < 1e-9);
        // The tea-tasting table (3,1;1,3): p = 0.4857 two-sided.
        assert!((fisher_exact(3, 1, 1, 3) - 0.485_714).abs() < 1e-5);
    }
}
