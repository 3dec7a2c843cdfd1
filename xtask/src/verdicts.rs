//! Calibration of `fsprof compare`'s verdicts on real runs: how many figures an A/A pair of
//! identical runs flags (the false flags), whether a real difference (an A/B pair with a
//! mount option) is found in the right cells and direction, and the power to find a change
//! of a given size (injected into one cell's wall time of an A/A pair's new side, so it
//! carries this machine's real noise).
//!
//! Rounds run A, B, A: the A/A pair spans the same time as the A/B pair, so both meet the
//! same drift of the machine.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::run;

const FSPROF: &str = "target/release/fsprof";

pub struct Plan {
    pub rounds: usize,
    pub fs: Vec<String>,
    /// The B side's extra `fsprof run` arguments, e.g. `--mount-opts ext4:data=journal`.
    pub b_args: Vec<String>,
    /// Steps the A/B difference is expected in, e.g. db,seq-write (regressions) or
    /// db:improvement.
    pub expect: Vec<String>,
    /// Injected wall-time changes, %.
    pub effects: Vec<f64>,
    /// Cells a side per A/A pair the power is measured on.
    pub cells: usize,
    /// Extra `fsprof run` arguments for both sides (e.g. `--only …`, `--passes 5`).
    pub run_args: Vec<String>,
    /// Where the runs stay between calls.
    pub dir: PathBuf,
    /// Also judge the first K passes of every run alone.
    pub first_passes: Option<usize>,
}

impl Plan {
    /// (step, verdict) of each expected difference.
    fn expected(&self) -> Vec<(&str, &str)> {
        self.expect
            .iter()
            .map(|e| match e.split_once(':') {
                Some((step, v)) => (step, v),
                None => (e.as_str(), "regression"),
            })
            .collect()
    }
}

/// Runs one side into `out`, unless a complete run is there already (a report can be made
/// again with another compare, `rm -r` the directory to start over).
fn fsprof_run(plan: &Plan, out: &Path, b: bool) -> Result<()> {
    let done = std::fs::read(out)
        .ok()
        .and_then(|t| serde_json::from_slice::<Value>(&t).ok())
        .is_some_and(|v| v["complete"] == true);
    if done {
        eprintln!("xtask: {} is there", out.display());
        return Ok(());
    }
    let mut cmd = Command::new(FSPROF);
    cmd.args(["run", "--fs", &plan.fs.join(",")])
        .args(&plan.run_args)
        .arg("--json")
        .arg(out)
        .arg("--flames")
        .arg(out.with_extension("flames"));
    if b {
        cmd.args(&plan.b_args);
    }
    eprintln!("xtask: {}", out.display());
    let log = std::fs::File::create(out.with_extension("log"))?;
    run(cmd.stdout(log.try_clone()?).stderr(log))
}

/// `fsprof compare BASE NEW --json`, parsed.
fn compare(base: &Path, new: &Path) -> Result<Value> {
    let json = base.with_file_name("cmp.json");
    let out = Command::new(FSPROF)
        .arg("compare")
        .args([base, new])
        .arg("--json")
        .arg(&json)
        .output()?;
    if !out.status.success() {
        bail!(
            "fsprof compare {} {}: {}",
            base.display(),
            new.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&std::fs::read(&json)?)?)
}

fn rows(c: &Value) -> &[Value] {
    c["rows"].as_array().map(Vec::as_slice).unwrap_or_default()
}

fn flagged(c: &Value) -> Vec<&Value> {
    rows(c)
        .iter()
        .filter(|r| r["verdict"] == "regression" || r["verdict"] == "improvement")
        .collect()
}

/// The machine check of a comparison: the CPUs others took on each side, and the flags
/// set aside when they differed.
fn machine(c: &Value) -> String {
    let m = &c["machine"];
    match (m["base_cpus"].as_f64(), m["new_cpus"].as_f64()) {
        (Some(b), Some(n)) if m["differed"] == true => format!(
            " (machine differed: {b:.2} vs {n:.2} CPUs taken by others, {} flags set aside)",
            m["set_aside"]
        ),
        (Some(b), Some(n)) => format!(" (machine alike: {b:.2} vs {n:.2} CPUs taken by others)"),
        _ => String::new(),
    }
}

fn describe(r: &Value) -> String {
    format!(
        "{} {} {} {:+.0} % q {:.3} {}",
        r["fs"].as_str().unwrap_or("?"),
        r["step"].as_str().unwrap_or("?"),
        r["metric"].as_str().unwrap_or("?"),
        r["change_pct"].as_f64().unwrap_or(f64::NAN),
        r["q"].as_f64().unwrap_or(f64::NAN),
        r["verdict"].as_str().unwrap_or("?")
    )
}

/// `new` with the wall time of every pass of (fs, step) multiplied by `factor`.
fn inject(new: &Value, fs: &str, step: &str, factor: f64) -> Value {
    let mut v = new.clone();
    for f in v["filesystems"].as_array_mut().into_iter().flatten() {
        if f["fs"] != fs {
            continue;
        }
        for p in f["passes"].as_array_mut().into_iter().flatten() {
            for s in p["steps"].as_array_mut().into_iter().flatten() {
                if s["step"] == step {
                    let w = s["trace"]["wall_ns"].as_f64().unwrap_or(0.0);
                    s["trace"]["wall_ns"] = Value::from((w * factor) as u64);
                }
            }
        }
    }
    v
}

/// Up to `n` (fs, step) cells spread evenly over the run's cells.
fn spread_cells(r: &Value, n: usize) -> Vec<(String, String)> {
    let mut all = Vec::new();
    for f in r["filesystems"].as_array().into_iter().flatten() {
        let fs = f["fs"].as_str().unwrap_or_default();
        let first = f["passes"][0]["steps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for s in first {
            all.push((
                fs.to_string(),
                s["step"].as_str().unwrap_or_default().into(),
            ));
        }
    }
    let step = (all.len() / n.max(1)).max(1);
    all.into_iter().step_by(step).take(n).collect()
}

/// How often an injected change of the wall time of one cell is flagged, per effect.
fn power(plan: &Plan, pairs: &[(PathBuf, PathBuf)]) -> Result<Vec<(f64, usize, usize)>> {
    let tmp = plan.dir.join("injected.json");
    let mut out = Vec::new();
    for &effect in &plan.effects {
        let (mut hits, mut trials) = (0, 0);
        for (base, new) in pairs {
            let v: Value = serde_json::from_slice(&std::fs::read(new)?)?;
            for (fs, step) in spread_cells(&v, plan.cells) {
                std::fs::write(
                    &tmp,
                    inject(&v, &fs, &step, 1.0 + effect / 100.0).to_string(),
                )?;
                let c = compare(base, &tmp)?;
                trials += 1;
                hits += usize::from(rows(&c).iter().any(|r| {
                    r["fs"] == fs.as_str()
                        && r["step"] == step.as_str()
                        && r["metric"] == "wall"
                        && r["verdict"] == "regression"
                }));
            }
        }
        out.push((effect, hits, trials));
    }
    Ok(out)
}

/// One indented line per row.
fn lines<'a>(rows: impl Iterator<Item = &'a Value>) -> String {
    rows.map(|r| format!("\n    {}", describe(r))).collect()
}

/// The false flags of the A/A pairs.
fn aa_report(aa: &[(PathBuf, PathBuf)], report: &mut String) -> Result<()> {
    let (mut tested, mut false_flags) = (0, 0);
    for (i, (a1, a2)) in aa.iter().enumerate() {
        let c = compare(a1, a2)?;
        let f = flagged(&c);
        tested += c["rule"]["figures"].as_u64().unwrap_or(0);
        false_flags += f.len();
        let _ = writeln!(
            report,
            "A/A round {}: {} figures tested, {} flagged{}{}",
            i + 1,
            c["rule"]["figures"],
            f.len(),
            machine(&c),
            lines(f.into_iter())
        );
    }
    let _ = writeln!(
        report,
        "A/A total: {false_flags} false flags in {tested} figures tested over {} pairs",
        aa.len()
    );
    Ok(())
}

/// What the A/B pairs flag, and whether every expected step is among the regressions.
fn ab_report(plan: &Plan, ab: &[(PathBuf, PathBuf)], report: &mut String) -> Result<()> {
    let mut found = 0;
    let expect = plan.expected();
    for (i, (a, b)) in ab.iter().enumerate() {
        let c = compare(a, b)?;
        let f = flagged(&c);
        let in_expected = |r: &&Value| expect.iter().any(|(s, _)| r["step"] == *s);
        let expected = expect
            .iter()
            .all(|(step, v)| f.iter().any(|r| r["step"] == *step && r["verdict"] == *v));
        found += usize::from(expected);
        let mut cells: Vec<(&Value, &Value)> = f.iter().map(|r| (&r["fs"], &r["step"])).collect();
        cells.dedup();
        let _ = writeln!(
            report,
            "A/B round {}: {} flagged ({} regressions) in {} cells{}; found in every expected step ({}): {}{}",
            i + 1,
            f.len(),
            f.iter().filter(|r| r["verdict"] == "regression").count(),
            cells.len(),
            machine(&c),
            plan.expect.join(", "),
            if expected { "yes" } else { "NO" },
            lines(f.iter().copied().filter(in_expected))
        );
    }
    let _ = writeln!(
        report,
        "A/B: every expected step flagged, in its direction, in {found} of {} pairs",
        ab.len()
    );
    Ok(())
}

/// `run` with only its first `k` passes of every filesystem, written beside it.
fn first_passes(run: &Path, k: usize) -> Result<PathBuf> {
    let mut v: Value = serde_json::from_slice(&std::fs::read(run)?)?;
    for f in v["filesystems"].as_array_mut().into_iter().flatten() {
        if let Some(p) = f["passes"].as_array_mut() {
            p.truncate(k);
        }
    }
    v["passes"] = Value::from(k);
    let out = run.with_extension(format!("first{k}.json"));
    std::fs::write(&out, v.to_string())?;
    Ok(out)
}

/// The A/A, A/B and power report of these pairs.
fn judge(
    plan: &Plan,
    aa: &[(PathBuf, PathBuf)],
    ab: &[(PathBuf, PathBuf)],
    report: &mut String,
) -> Result<()> {
    aa_report(aa, report)?;
    ab_report(plan, ab, report)?;
    for (effect, hits, trials) in power(plan, aa)? {
        let _ = writeln!(
            report,
            "power: wall +{effect:.0} % injected into one cell of an A/A pair's new side: flagged {hits} of {trials} ({:.0} %)",
            100.0 * hits as f64 / trials.max(1) as f64
        );
    }
    Ok(())
}

/// Runs the rounds (or finds them done) and prints the calibration.
pub fn calibrate(plan: &Plan) -> Result<()> {
    crate::build()?;
    std::fs::create_dir_all(&plan.dir).with_context(|| plan.dir.display().to_string())?;
    let file = |name: String| plan.dir.join(name);
    let (mut aa, mut ab) = (Vec::new(), Vec::new());
    for i in 1..=plan.rounds {
        let (a1, b, a2) = (
            file(format!("a{i}-1.json")),
            file(format!("b{i}.json")),
            file(format!("a{i}-2.json")),
        );
        fsprof_run(plan, &a1, false)?;
        fsprof_run(plan, &b, true)?;
        fsprof_run(plan, &a2, false)?;
        aa.push((a1.clone(), a2));
        ab.push((a1, b));
    }
    let mut report = format!(
        "verdicts calibration: {} rounds (A, B, A) of `fsprof run --fs {} {}`; B adds `{}`\n",
        plan.rounds,
        plan.fs.join(","),
        plan.run_args.join(" "),
        plan.b_args.join(" ")
    );
    judge(plan, &aa, &ab, &mut report)?;
    if let Some(k) = plan.first_passes {
        let cut = |pairs: &[(PathBuf, PathBuf)]| -> Result<Vec<(PathBuf, PathBuf)>> {
            pairs
                .iter()
                .map(|(x, y)| Ok((first_passes(x, k)?, first_passes(y, k)?)))
                .collect()
        };
        let _ = writeln!(report, "the same runs, their first {k} passes only:");
        judge(plan, &cut(&aa)?, &cut(&ab)?, &mut report)?;
    }
    print!("{report}");
    std::fs::write(file("report.txt".into()), report)?;
    Ok(())
}
