//! Reports for people, on real runs: the HTML report renders in headless Chromium with every
//! chart drawn and no script error; compare flags nothing against itself and flags a step
//! made slower on purpose (and exits non-zero for CI); two identical runs flag at most one
//! figure and ext4's data=journal is found where it costs; a busier machine is named, its waits
//! not flagged; explain names I/O wait and the
//! write path for a direct-I/O writer; broken inputs give one-line errors.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use fsprof_tests::*;

/// `fsprof run --suite none --fs FS --passes N --step …` into `dir/tag.json`.
fn run(dir: &Path, tag: &str, fs: &str, passes: u32, steps: &[&str], extra: &[&str]) -> PathBuf {
    let json = dir.join(format!("{tag}.json"));
    let mut cmd = Command::new(fsprof_bin());
    cmd.args(["run", "--suite", "none", "--fs", fs, "--passes"])
        .arg(passes.to_string())
        .args(extra)
        .arg("--json")
        .arg(&json);
    for s in steps {
        cmd.args(["--step", s]);
    }
    let out = cmd.output().unwrap();
    assert_success(&out);
    checked(&[&json]);
    json
}

fn fsprof(args: &[&str]) -> Output {
    Command::new(fsprof_bin()).args(args).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub fn html_report_renders_in_chromium() {
    let dir = TempDir::new("html");
    let json = run(
        &dir.0,
        "r",
        "ext4,xfs",
        2,
        &[
            "write=dd if=/dev/zero of={mnt}/f bs=64k count=400 oflag=direct status=none",
            // A quote in a name must not break the page's script or its links.
            "it's-delete=rm -f {mnt}/f",
        ],
        &[],
    );
    let html = json.with_extension("html");
    assert!(
        html.exists(),
        "run writes the HTML report beside the results"
    );
    let text = std::fs::read_to_string(&html).unwrap();
    for remote in ["src=\"http", "href=\"http", "url(http", "@import"] {
        assert!(!text.contains(remote), "the report fetches {remote}…");
    }
    let chrome = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--enable-logging=stderr",
    ];
    let url = format!("file://{}", html.display());
    let png = dir.0.join("report.png");
    let shot = Command::new(chrome[0])
        .args(&chrome[1..])
        .args(["--window-size=1400,2400", "--hide-scrollbars"])
        .arg(format!("--screenshot={}", png.display()))
        .arg(&url)
        .output()
        .expect("chromium (cargo xtask setup installs it)");
    assert_success(&shot);
    assert!(
        std::fs::metadata(&png).unwrap().len() > 10_000,
        "screenshot too small"
    );
    let dom_text = rendered_dom(&html);
    // The page counts its charts with a non-zero rendered size into data-charts.
    let charts: usize = dom_text
        .split("data-charts=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no data-charts in the DOM: {}",
                &dom_text[..dom_text.len().min(400)]
            )
        });
    let in_page = text.matches("<svg class=\"chart\"").count();
    assert!(in_page >= 4, "{in_page} charts in the page");
    assert_eq!(charts, in_page, "charts rendered with a size");
    // Every flame graph button points at a file that exists, and no name reaches script.
    let buttons: Vec<&str> = text.split("<button ").skip(1).collect();
    assert!(buttons.len() >= 8, "{} flame graph buttons", buttons.len());
    assert!(buttons.iter().any(|b| b.contains("it's-delete")));
    for b in buttons {
        let path = b
            .split("data-src=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let path = path.replace("&amp;", "&");
        assert!(
            dir.0.join(&path).exists() || Path::new(&path).exists(),
            "{path}"
        );
        let script = b
            .split("onclick=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert!(
            script.starts_with("show(") && !script.contains('\''),
            "{script}"
        );
    }
    // Per step and filesystem, what the off-CPU time waited for: the direct writes, the disk.
    let waits: Vec<&str> = text
        .split("<p class=\"waits\">")
        .skip(1)
        .filter_map(|p| p.split("</p>").next())
        .collect();
    assert!(
        waits
            .iter()
            .any(|p| p.starts_with("<b>ext4</b>") && p.contains("disk I/O")),
        "{waits:#?}"
    );
    // The summary on top links to each step's section.
    assert!(
        text.contains("<h2>Summary</h2>") && text.contains("<a href=\"#step1\">it's-delete</a>")
    );
    assert!(text.contains("<h2 id=\"step1\">it's-delete</h2>"));
    // On top, the matrix: a cell per step and filesystem, each a link to its step.
    let matrix = text
        .split("<table class=\"matrix\">")
        .nth(1)
        .and_then(|m| m.split("</table>").next())
        .expect("the summary matrix");
    assert_eq!(
        matrix.matches("<td style=\"background:hsl(").count(),
        4,
        "{matrix}"
    );
    assert!(matrix.contains("<a href=\"#step1\" title=\"it's-delete on xfs\">"));
    // Each step opens with explain's answer, slowest against fastest, and its diff graphs.
    let whys: Vec<&str> = text.split("<div class=\"why\">").skip(1).collect();
    assert_eq!(whys.len(), 2, "a why per step");
    for why in &whys {
        assert!(
            why.contains(" took ") && why.contains("fsprof explain "),
            "{why}"
        );
        let diff = why
            .split("<a class=\"diff\" href=\"")
            .nth(1)
            .and_then(|d| d.split('"').next())
            .unwrap_or_else(|| panic!("no diff graph linked: {why}"));
        assert!(dir.0.join(diff).exists(), "{diff}");
    }
    // As rendered, too.
    assert_eq!(dom_text.matches("<div class=\"why\">").count(), 2);
    assert!(dom_text.contains("<table class=\"matrix\">"));
    markdown_post_stands_alone(&json, &dir.0);
}

/// `report --format markdown -o DIR/post.md`: the post and its pictures in DIR, every image
/// and link relative to it and there.
fn markdown_post_stands_alone(json: &Path, dir: &Path) {
    let post = dir.join("post/post.md");
    std::fs::create_dir_all(post.parent().unwrap()).unwrap();
    let out = fsprof(&["report", s(json), "--format", "markdown", "-o", s(&post)]);
    assert_success(&out);
    // Moved elsewhere, the folder still has all it links.
    let moved = dir.join("moved");
    std::fs::rename(post.parent().unwrap(), &moved).unwrap();
    let text = std::fs::read_to_string(moved.join("post.md")).unwrap();
    assert!(
        text.starts_with("# fsprof run") && text.contains("Kernel "),
        "{text}"
    );
    assert!(
        text.contains("## write") && text.contains(" took "),
        "{text}"
    );
    let links: Vec<&str> = text
        .split("](")
        .skip(1)
        .filter_map(|l| l.split(')').next())
        .collect();
    assert!(
        links.iter().filter(|l| l.ends_with(".diff.svg")).count() >= 2,
        "{links:?}"
    );
    assert!(
        links.iter().filter(|l| !l.ends_with(".diff.svg")).count() >= 2,
        "{links:?}"
    );
    for l in &links {
        assert!(!l.starts_with('/'), "{l}");
        let svg = std::fs::read_to_string(moved.join(l)).unwrap_or_else(|e| panic!("{l}: {e}"));
        assert!(svg.contains("<svg"), "{l}");
    }
}

/// The DOM of `page` as headless Chromium leaves it after its scripts ran; fails on a
/// console error.
fn rendered_dom(page: &Path) -> String {
    let dom = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
        ])
        .args(["--virtual-time-budget=3000", "--dump-dom"])
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium (cargo xtask setup installs it)");
    let log = String::from_utf8_lossy(&dom.stderr);
    assert!(
        !log.lines()
            .any(|l| l.contains("CONSOLE") && (l.contains("Error") || l.contains("Uncaught"))),
        "console errors: {log}"
    );
    String::from_utf8_lossy(&dom.stdout).into_owned()
}

/// A `compare --json` file and its wall row.
fn wall_row(json: &Path) -> (serde_json::Value, serde_json::Value) {
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let wall = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metric"] == "wall")
        .unwrap()
        .clone();
    (c, wall)
}

pub fn compare_flags_at_most_one_figure_of_a_rerun_and_an_injected_slowdown() {
    let dir = TempDir::new("compare");
    let files = "files=for i in $(seq 200); do echo x > {mnt}/f$i; done";
    let base = run(&dir.0, "base", "ext4", 3, &[files], &[]);
    // The same runs again: nothing changed, so at most one figure is flagged (each
    // comparison flags any at all with probability ≤ 1 %, two far less).
    let again = run(&dir.0, "again", "ext4", 3, &[files], &[]);
    let same = fsprof(&["compare", s(&base), s(&again), "--fail-on-regression"]);
    let out = String::from_utf8_lossy(&same.stdout);
    assert!(out.contains("Benjamini–Hochberg q ≤ 0.01"), "{out}");
    let count = |what: &str| -> u32 {
        let at = out.find(what).unwrap_or_else(|| panic!("{what}: {out}"));
        let before = out[..at].split_whitespace().last().unwrap_or_default();
        before.parse().unwrap_or_else(|_| panic!("{what}: {out}"))
    };
    let (regressions, improvements) = (count(" regressions"), count(" improvements"));
    assert!(regressions + improvements <= 1, "{out}");
    assert_eq!(
        same.status.code(),
        Some(i32::from(regressions > 0)),
        "{out}"
    );
    // The same step forced to fsync every file.
    let slow = "files=for i in $(seq 200); do echo x > {mnt}/f$i; sync {mnt}/f$i; done";
    let new = run(&dir.0, "new", "ext4", 3, &[slow], &[]);
    let json = dir.0.join("cmp.json");
    let page = dir.0.join("cmp.html");
    let cmp = fsprof(&[
        "compare",
        s(&base),
        s(&new),
        "--fail-on-regression",
        "--json",
        s(&json),
        "--html",
        s(&page),
    ]);
    let out = String::from_utf8_lossy(&cmp.stdout);
    assert_eq!(cmp.status.code(), Some(1), "{out}");
    assert!(
        out.contains("ext4 files") && out.contains("REGRESSION"),
        "{out}"
    );
    let (c, wall) = wall_row(&json);
    assert_eq!(wall["verdict"], "regression", "{wall}");
    assert!(wall["q"].as_f64().unwrap() <= 0.01, "{wall}");
    assert_eq!(
        c["rule"]["figures"].as_u64(),
        Some(c["rows"].as_array().unwrap().len() as u64)
    );
    // ... and says what the extra time waited for (the syncs wait for commits and the disk).
    let waits: Vec<&serde_json::Value> = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["metric"].as_str().unwrap().starts_with("waited for "))
        .collect();
    assert!(
        waits.iter().any(|r| r["verdict"] == "regression"),
        "{waits:#?}"
    );
    // The page shows the flagged cell's differential flame graphs, which exist.
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("ext4 files: new against base"), "{html}");
    // ... and, rendered, every figure tested in the cell's forest plot (open: it has a
    // flag), the flagged ones red, with the rule's error rate and both sides' runs on top.
    let dom = rendered_dom(&page);
    assert!(dom.contains("Benjamini–Hochberg q ≤ 0.01") && dom.contains("base.json (kernel "));
    let forest = dom
        .split("<details class=\"forest\" open=\"\">")
        .nth(1)
        .unwrap_or_else(|| panic!("no open forest plot: {dom}"));
    let figures = c["rows"].as_array().unwrap().len();
    assert_eq!(forest.matches("class=\"dot\"").count(), figures, "{forest}");
    assert!(forest.contains("fill=\"#c0392b\"") && forest.contains(">REGRESSION<"));
    let diffs: Vec<&str> = html
        .split("data=\"")
        .skip(1)
        .map(|p| p.split('"').next().unwrap())
        .collect();
    assert!(!diffs.is_empty());
    for d in diffs {
        assert!(dir.0.join(d).exists(), "{d}");
    }
    // Without --fail-on-regression the status stays 0.
    assert_eq!(
        fsprof(&["compare", s(&base), s(&new)]).status.code(),
        Some(0)
    );
    // Several files a side pool their passes; --threshold and --alpha are the rule's.
    let pooled = fsprof(&[
        "compare",
        &format!("{},{}", s(&base), s(&base)),
        s(&new),
        "--threshold",
        "20",
        "--alpha",
        "0.05",
        "--json",
        s(&json),
    ]);
    assert_success(&pooled);
    let (c, wall) = wall_row(&json);
    assert_eq!(
        c["rule"]["threshold_pct"].as_f64(),
        Some(20.0),
        "{}",
        c["rule"]
    );
    assert_eq!(c["rule"]["fdr"].as_f64(), Some(0.05), "{}", c["rule"]);
    assert_eq!(
        (wall["n_base"].as_u64(), wall["n_new"].as_u64()),
        (Some(6), Some(3))
    );
    for r in c["rows"].as_array().unwrap() {
        let flagged = r["verdict"] == "regression" || r["verdict"] == "improvement";
        let change = r["change_pct"].as_f64().unwrap_or(f64::INFINITY).abs();
        assert!(!flagged || change >= 20.0, "{r}");
    }
    // The saved results again, as JSON and CSV: the same run, one CSV row per pass.
    let again = fsprof(&["report", s(&new), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(v["passes"].as_u64(), Some(3));
    let csv = fsprof(&["report", s(&new), "--format", "csv"]);
    let csv = String::from_utf8_lossy(&csv.stdout);
    let rows: Vec<&str> = csv.lines().filter(|l| l.contains(",files,")).collect();
    assert_eq!(rows.len(), 3, "{csv}");
    // Different mount options are compared, and said.
    let opts = run(
        &dir.0,
        "opts",
        "ext4",
        3,
        &[files],
        &["--mount-opts", "ext4:noatime"],
    );
    let cmp = fsprof(&["compare", s(&base), s(&opts)]);
    assert!(String::from_utf8_lossy(&cmp.stdout).contains("note: filesystem options differ"));
    // A different workload is refused in one line.
    let other = run(&dir.0, "other", "ext4", 1, &[files], &["--scale", "0.5"]);
    let bad = fsprof(&["compare", s(&base), s(&other)]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.contains("different workloads") && err.lines().count() == 1,
        "{err}"
    );
}

/// `passes` of quick-suite steps on ext4 and xfs into `dir/tag.json`.
fn quick(dir: &Path, tag: &str, passes: u32, extra: &[&str]) -> PathBuf {
    let json = dir.join(format!("{tag}.json"));
    let out = Command::new(fsprof_bin())
        .args([
            "run",
            "--fs",
            "ext4,xfs",
            "--only",
            "seq-write,seq-read,db,cpu",
            "--passes",
            &passes.to_string(),
        ])
        .args(extra)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert_success(&out);
    checked(&[&json]);
    json
}

/// `fsprof compare … --json`, several files a side: the exit status and the flagged rows.
fn flags(dir: &Path, base: &[PathBuf], new: &[PathBuf]) -> (Option<i32>, Vec<serde_json::Value>) {
    let json = dir.join("cmp.json");
    let side = |files: &[PathBuf]| -> String {
        let names: Vec<&str> = files.iter().map(|f| s(f)).collect();
        names.join(",")
    };
    let out = fsprof(&[
        "compare",
        &side(base),
        &side(new),
        "--fail-on-regression",
        "--json",
        s(&json),
    ]);
    let c: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(c["rule"]["figures"].as_u64().unwrap() > 50, "{c:#}");
    let flagged = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verdict"] == "regression" || r["verdict"] == "improvement")
        .cloned()
        .collect();
    (out.status.code(), flagged)
}

/// The calibration pair at test size (`cargo xtask verdicts` runs it on the whole suite):
/// A, A' and B take turns three times, one pass a run, so a mood of the machine that lasts a
/// run falls on one pass of a side, where the rule sees it as spread. (Three-pass runs one
/// after the other let a run's mood through: 1 of 8 rounds flagged xfs db, and one CI run
/// flagged two xfs steps; taking turns, 0 of 8.) B mounts ext4 with data=journal; xfs is
/// left as it was.
pub fn identical_runs_flag_at_most_one_figure_and_data_journal_is_found() {
    let dir = TempDir::new("verdicts");
    let (mut a, mut a2, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=3 {
        a.push(quick(&dir.0, &format!("a{round}"), 1, &[]));
        a2.push(quick(&dir.0, &format!("c{round}"), 1, &[]));
        let journal = ["--mount-opts", "ext4:data=journal"];
        b.push(quick(&dir.0, &format!("b{round}"), 1, &journal));
    }
    let (status, aa) = flags(&dir.0, &a, &a2);
    assert!(aa.len() <= 1, "identical runs: {aa:#?}");
    let regressed = aa.iter().any(|r| r["verdict"] == "regression");
    assert_eq!(status, Some(i32::from(regressed)));
    let (status, ab) = flags(&dir.0, &a, &b);
    assert_eq!(status, Some(1), "{ab:#?}");
    // Journalling the data costs the writers: seq-write is flagged as a regression on ext4
    // (in every round); db shows it in its write latency (flagged in 8 of 8 interleaved
    // rounds, 1–3 of 3 in the full suite's consecutive runs): never as an improvement.
    let ext4 = |step: &str| -> Vec<&serde_json::Value> {
        ab.iter()
            .filter(|r| r["fs"] == "ext4" && r["step"] == step)
            .collect()
    };
    assert!(
        ext4("seq-write")
            .iter()
            .any(|r| r["verdict"] == "regression"),
        "{ab:#?}"
    );
    for step in ["seq-write", "db"] {
        assert!(
            !ext4(step)
                .iter()
                .any(|r| r["metric"] == "wall" && r["verdict"] == "improvement"),
            "{ab:#?}"
        );
    }
    // xfs, untouched, is the control: at most one step's figures (a step's wall and its
    // throughput, the same bytes over that time, move together).
    let mut xfs: Vec<&serde_json::Value> = ab
        .iter()
        .filter(|r| r["fs"] == "xfs")
        .map(|r| &r["step"])
        .collect();
    xfs.dedup();
    assert!(xfs.len() <= 1, "{ab:#?}");
}

/// Busy loops that run while they live: another user's load on the machine.
struct Spinners(Vec<std::process::Child>);

impl Spinners {
    fn start(n: usize) -> Spinners {
        Spinners(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
    /// CPU time the loops have had so far (/proc/PID/schedstat), ns.
    fn cpu_ns(&self) -> u64 {
        self.0.iter().map(|c| schedstat(c.id()).0).sum()
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Two identical runs, the second beside two busy loops: compare names the machine that
/// differed, with a load the loops' own CPU time accounts for, and sets the flags of times
/// that include waiting aside (inconclusive) instead of calling them the filesystems'.
pub fn a_busier_machine_is_named_not_flagged() {
    let dir = TempDir::new("machine");
    let quiet = quick(&dir.0, "quiet", 3, &[]);
    let spinners = Spinners::start(2);
    let busy = quick(&dir.0, "busy", 3, &[]);
    let spun_ns = spinners.cpu_ns() as f64;
    drop(spinners);
    let (status, flagged) = flags(
        &dir.0,
        std::slice::from_ref(&quiet),
        std::slice::from_ref(&busy),
    );
    let c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("cmp.json")).unwrap()).unwrap();
    let m = &c["machine"];
    let (base, new) = (
        m["base_cpus"].as_f64().unwrap(),
        m["new_cpus"].as_f64().unwrap(),
    );
    assert!(m["differed"] == true && new - base >= 0.5, "{m}");
    // The others' CPU time within the busy cells cannot exceed what the loops had over the
    // whole run, plus a little for the rest of the machine.
    let run: serde_json::Value = serde_json::from_slice(&std::fs::read(&busy).unwrap()).unwrap();
    let wall: f64 = run["filesystems"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["passes"].as_array().unwrap())
        .flat_map(|p| p["steps"].as_array().unwrap())
        .map(|s| s["trace"]["wall_ns"].as_f64().unwrap())
        .sum();
    assert!(
        new * wall <= spun_ns + 0.1 * wall,
        "{m}: loops {spun_ns} ns, cells {wall} ns"
    );
    // Waits are set aside; only CPU time keeps a flag, and the gate says it cannot judge.
    let rows = c["rows"].as_array().unwrap();
    let set_aside = rows
        .iter()
        .filter(|r| r["machine_differed"] == true)
        .count();
    assert!(set_aside > 0 && m["set_aside"] == set_aside, "{m}");
    let cpu_time = ["user", "sys", "kernel_bg"];
    assert!(
        flagged
            .iter()
            .all(|r| cpu_time.contains(&r["kind"].as_str().unwrap())),
        "{flagged:#?}"
    );
    let regressed = flagged.iter().any(|r| r["verdict"] == "regression");
    assert_eq!(status, Some(if regressed { 1 } else { 3 }));
    // A neighbour busy in the kernel (writing and syncing an ext4 loop filesystem) is named
    // too: its time is system time, of its own and of kernel threads.
    let neighbour = Neighbour::start();
    let kernel_busy = quick(&dir.0, "kernel-busy", 3, &[]);
    drop(neighbour);
    flags(&dir.0, std::slice::from_ref(&quiet), &[kernel_busy]);
    let c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.0.join("cmp.json")).unwrap()).unwrap();
    assert!(c["machine"]["differed"] == true, "{}", c["machine"]);
}

pub fn explain_names_io_wait_and_the_write_path_of_direct_io() {
    let dir = TempDir::new("explain");
    let json = run(
        &dir.0,
        "r",
        "ext4,xfs",
        1,
        &[
            "direct=dd if=/dev/zero of={mnt}/d bs=64k count=1500 oflag=direct status=none",
            "buffered=dd if=/dev/zero of={mnt}/b bs=64k count=1500 status=none",
        ],
        &[],
    );
    let ex = fsprof(&["explain", s(&json), "--step", "direct", "--fs", "ext4"]);
    let text = String::from_utf8_lossy(&ex.stdout);
    assert_success(&ex);
    let spent = text
        .lines()
        .find(|l| l.starts_with("The target's threads spent"))
        .unwrap();
    assert!(
        spent.starts_with("The target's threads spent I/O wait"),
        "{text}"
    );
    let waits = text
        .lines()
        .find(|l| l.starts_with("Longest waits"))
        .unwrap();
    let first = waits.split(';').next().unwrap();
    assert!(
        first.contains("I/O wait in write") && first.contains("ext4_file_write_iter"),
        "{text}"
    );
    // The buffered writer is mostly on a CPU: explain must not say I/O wait there.
    let ex = fsprof(&["explain", s(&json), "--step", "buffered", "--fs", "ext4"]);
    let text = String::from_utf8_lossy(&ex.stdout);
    assert!(text.contains("The target's threads spent on-CPU"), "{text}");
    // Against another filesystem: the comparison carries both figures.
    let vs = fsprof(&[
        "explain",
        s(&json),
        "--step",
        "direct",
        "--fs",
        "xfs",
        "--vs",
        "ext4",
    ]);
    let text = String::from_utf8_lossy(&vs.stdout);
    assert!(
        text.starts_with("direct: xfs took") && text.contains("ext4 took"),
        "{text}"
    );
    // No line explains the difference with a change under a millisecond. The first line
    // states the wall difference itself, whatever its size (two cells can be within 1 ms).
    let reasons: String = text.lines().skip(1).collect::<Vec<_>>().join("\n");
    let tiny = reasons.split([' ', '(', ';', ',']).find(|w| {
        (w.starts_with('+') || w.starts_with('−'))
            && (w.ends_with("µs") || w.ends_with("ns") || *w == "+0.000s")
    });
    assert!(tiny.is_none(), "{tiny:?} in {text}");
    // Unknown cells are one-line errors.
    let bad = fsprof(&["explain", s(&json), "--step", "nope", "--fs", "ext4"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        err.contains("did not run") && err.lines().count() == 1,
        "{err}"
    );
}

pub fn broken_results_give_one_line_errors() {
    let dir = TempDir::new("broken");
    let json = run(&dir.0, "r", "ext4", 1, &["t=touch {mnt}/x"], &[]);
    let text = std::fs::read_to_string(&json).unwrap();
    let broken = dir.0.join("broken.json");
    std::fs::write(&broken, &text[..text.len() / 3]).unwrap();
    for args in [
        vec!["compare", s(&json), s(&broken)],
        vec!["explain", s(&broken), "--step", "t", "--fs", "ext4"],
        vec!["report", s(&broken), "--html", "/dev/null"],
    ] {
        let out = fsprof(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("is not valid JSON"), "{args:?}: {err}");
    }
}
