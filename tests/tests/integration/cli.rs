//! The command line: JSON output, exit status and one-line errors.

use std::{path::Path, process::Command};

use fsprof::lab::FsKind;

use fsprof_tests::*;

pub fn json_output_has_schema_and_figures() {
    let json = std::env::temp_dir().join(format!("fsprof-cli-{}.json", std::process::id()));
    let flames = TempDir::new("cli-flames");
    let out = Command::new(fsprof_bin())
        .args(["trace", "--fs", "xfs", "--size", "512M", "--flames"])
        .arg(&flames.0)
        .arg("--json")
        .arg(&json)
        .args([
            "--",
            "sh",
            "-c",
            "mkdir d && echo hi > d/f && sync && rm -r d",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The report goes to stderr; stdout belongs to the traced command.
    assert!(stderr.contains("syscalls, by total time") && stderr.contains("block I/O"));
    assert!(out.stdout.is_empty());
    checked(&[&json]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    assert_eq!(v["schema_version"], 1);
    let calls = v["profile"]["syscalls"].as_array().unwrap();
    let mkdir = calls
        .iter()
        .find(|c| c["name"] == "mkdir")
        .expect("mkdir traced");
    assert_eq!(mkdir["count"], 1);
    assert!(
        v["profile"]["block"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["class"] == "write")
    );
    assert!(v["wall_ns"].as_u64().unwrap() > 0);
}

pub fn exit_status_is_the_commands() {
    let st = Command::new(fsprof_bin())
        .args(["trace", "--no-stacks", "--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(7));
}

fn one_line_error(args: &[&str], needle: &str) {
    let out = Command::new(fsprof_bin()).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("fsprof: error"))
        .collect();
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: {needle:?} not in {err}"
    );
}

/// Bad input: one line that says what is wrong, status 2, and nothing written or run
/// (these need no root: each is refused before anything is loaded or mounted).
pub fn bad_input_gives_one_line_errors() {
    let dir = TempDir::new("bad-input");
    let out = |name: &str| dir.0.join(name).display().to_string();
    let json = out("r.json");
    let gone = {
        let mut c = Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        c.id().to_string()
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["trace", "--fs", "zfs", "--", "true"],
            "unknown filesystem \"zfs\"",
        ),
        (
            vec!["run", "--step", "fill", "--json", &json],
            "--step takes NAME=COMMAND",
        ),
        (
            vec!["run", "--suite", "nosuch", "--json", &json],
            "unknown suite \"nosuch\"",
        ),
        (
            vec!["run", "--only", "nosuch", "--json", &json],
            "step \"nosuch\" is not in suite quick",
        ),
        (
            vec!["run", "--device", "/dev/fsprof-none", "--json", &json],
            "/dev/fsprof-none",
        ),
        (
            vec!["run", "--force", "--json", &json],
            "not provided: --device <DEVICE> (usage: fsprof run",
        ),
        (
            vec!["run", "--passes", "0", "--json", &json],
            "'0' for '--passes",
        ),
        (
            vec!["run", "--jobs", "0", "--json", &json],
            "'0' for '--jobs",
        ),
        (
            vec!["crash", "--fs", "ext4", "--trials", "0", "--json", &json],
            "'0' for '--trials",
        ),
        (
            vec!["run", "--json", "/proc/fsprof-results.json"],
            "cannot write /proc/fsprof-results.json",
        ),
        (vec!["report", &json], "reading"),
        (vec!["report", "/proc"], "/proc"),
        (
            vec!["compare", &json],
            "not provided: <NEW> (usage: fsprof compare",
        ),
        (
            vec!["run", "--kernel", "deb:no-such-kernel", "--json", &json],
            "a Debian kernel package is linux-image-",
        ),
        (
            vec!["trace", "-p", &gone, "--duration", "1"],
            "no process with PID",
        ),
        (
            vec!["trace", "--user-depth", "0", "--", "true"],
            "0 is not in 1..=64",
        ),
        (
            vec!["trace", "--pprof", "p", "--no-stacks", "--", "true"],
            "cannot be used with '--no-stacks'",
        ),
        (vec!["check", &json], "reading"),
    ];
    for (args, needle) in cases {
        one_line_error(&args, needle);
        let left: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "{args:?} wrote {left:?}");
    }
}

pub fn missing_commands_and_filesystems_are_one_line_errors() {
    one_line_error(&["trace", "--", "/nonexistent/cmd"], "cannot run");
    // The host kernel has no jfs: the error names the way that works.
    for cmd in ["trace", "run"] {
        let mut args = vec![cmd, "--fs", "jfs"];
        if cmd == "trace" {
            args.extend(["--", "true"]);
        }
        one_line_error(&args, "--kernel deb:linux-image-amd64");
    }
    // A mount option the filesystem refuses: the kernel's own words say which.
    one_line_error(
        &[
            "trace",
            "--fs",
            "ext4",
            "--mount-opts",
            "nosuchopt",
            "--",
            "true",
        ],
        "(kernel: ",
    );
}

pub fn sigterm_mid_run_leaves_nothing_behind() {
    // The command leaves a grandchild behind in the lab filesystem: fsprof must kill it,
    // unmount and detach anyway.
    let flames = TempDir::new("sigterm-flames");
    let _cleanup = CleanupOnFailure;
    let t = Attached::spawn(&[
        "trace",
        "--fs",
        "ext4",
        "--size",
        "256M",
        "--flames",
        &flames.0.display().to_string(),
        "--",
        "sh",
        "-c",
        "sleep 60 & touch started; sleep 60",
    ]);
    let err = t.stderr.clone();
    let line = err
        .lines()
        .find(|l| l.contains(" mounted at "))
        .expect("lab line");
    let words: Vec<&str> = line.split_whitespace().collect();
    let dev = words[words.iter().position(|w| *w == "on").unwrap() + 1];
    let mnt = words[words.iter().position(|w| *w == "at").unwrap() + 1];
    // Mid-run: the command and its grandchild are running.
    let started = std::path::Path::new(mnt).join("started");
    let t0 = std::time::Instant::now();
    while !started.exists() {
        assert!(
            t0.elapsed().as_secs() < 30,
            "the command never started: {err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let status = t.signal(libc::SIGTERM);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{err}");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(mnt), "{mnt} still mounted");
    let name = dev.trim_start_matches("/dev/");
    assert!(
        !std::path::Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists(),
        "{dev} still attached"
    );
    assert!(!std::path::Path::new(mnt).exists(), "{mnt} left behind");
}

pub fn sigterm_before_the_command_starts_stops_it() {
    // SIGTERM as soon as the probes are attached, before or as the command starts: fsprof
    // ends like a command killed by it, at once (it once let the command run its minute).
    let t0 = std::time::Instant::now();
    let t = Attached::spawn(&["trace", "--no-stacks", "--", "sleep", "60"]);
    let status = t.signal(libc::SIGTERM);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert!(t0.elapsed().as_secs() < 30, "{:?}", t0.elapsed());
}

pub fn cleanup_removes_what_a_killed_run_left() {
    // SIGKILL gives fsprof no chance to clean up: the mount, loop device and image stay.
    let _cleanup = CleanupOnFailure;
    let t = Attached::spawn(&[
        "trace", "--fs", "ext4", "--size", "256M", "--", "sleep", "30",
    ]);
    let tag = format!("fsprof-{}-ext4", t.pid());
    t.signal(libc::SIGKILL);
    assert!(
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .contains(&tag)
    );
    // The orphaned `sleep` still has its cwd there; a killed run's leftovers include it.
    kill_processes_with_cwd_containing(&tag);

    let out = Command::new(fsprof_bin()).arg("cleanup").output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("unmounted") && said.contains("removed image"),
        "{said}"
    );
    assert!(
        !std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .contains(&tag)
    );
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    assert!(!String::from_utf8_lossy(&loops.stdout).contains(&tag));
    assert!(!std::path::Path::new(&format!("/var/tmp/fsprof/{tag}.img")).exists());
    // A second cleanup finds nothing of this run.
    let again = Command::new(fsprof_bin()).arg("cleanup").output().unwrap();
    assert!(!String::from_utf8_lossy(&again.stdout).contains(&tag));
}

/// SIGKILLs the processes whose working directory path contains `needle`: exactly the
/// leftovers of one run, never a same-named process of someone else.
fn kill_processes_with_cwd_containing(needle: &str) {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cwd = entry.path().join("cwd");
        if std::fs::read_link(&cwd).is_ok_and(|c| c.to_string_lossy().contains(needle)) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // Dead once its cwd is released; until then the mount stays busy.
            let start = std::time::Instant::now();
            while std::fs::read_link(&cwd).is_ok() && start.elapsed().as_secs() < 5 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

pub fn lab_options_reach_the_filesystem() {
    // The kernel's own view from inside the traced command: the block size statfs reports,
    // the mount's options in /proc/mounts, and the file --prepare made.
    let out = Command::new(fsprof_bin())
        .args([
            "trace",
            "--fs",
            "ext4",
            "--no-stacks",
            "--mkfs-opts",
            "-b 1024",
            "--mount-opts",
            "noatime,data=journal",
            "--prepare",
            "echo prepared > p",
            "--",
            "sh",
            "-c",
            "cat p && stat -f -c 'bsize=%S' . && grep \" $(pwd) \" /proc/mounts",
        ])
        .output()
        .unwrap();
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l == "prepared"), "{text}");
    assert!(text.lines().any(|l| l == "bsize=1024"), "{text}");
    let mount = text
        .lines()
        .find(|l| l.contains(" ext4 "))
        .expect("/proc/mounts line");
    assert!(
        mount.contains("noatime") && mount.contains("data=journal"),
        "{mount}"
    );
}

pub fn list_agrees_with_the_kernel_and_the_path() {
    // What `fsprof list` says of each filesystem against /proc/filesystems (after modprobe,
    // as fsprof loads drivers itself) and the mkfs program on PATH.
    let out = Command::new(fsprof_bin()).arg("list").output().unwrap();
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut available = 0;
    for kind in FsKind::ALL {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(kind.name()))
            .unwrap_or_else(|| panic!("{kind} missing: {text}"));
        let driver = kind.kernel_name();
        let _ = Command::new("modprobe").args(["-q", driver]).status();
        let in_kernel = std::fs::read_to_string("/proc/filesystems")
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().last() == Some(driver));
        let tool = Command::new("sh")
            .args(["-c", &format!("command -v {}", kind.mkfs().0)])
            .output()
            .unwrap()
            .status
            .success();
        if in_kernel && tool {
            assert!(line.ends_with(" available"), "{line}");
            available += 1;
        } else {
            assert!(line.contains(" unavailable: "), "{line}");
            if !in_kernel {
                // The way on is named in the same line.
                assert!(line.contains("--kernel deb:linux-image-amd64"), "{line}");
            }
        }
    }
    assert!(available >= 3, "{text}");
}

/// What a README command line must leave: every file it names (or writes by default) is
/// there and, when it is an output of fsprof, passes `fsprof check`; and its words say
/// what the command does (`said` is its stdout and stderr).
fn produced_what_it_says(command: &str, said: &str, dir: &Path) {
    let words: Vec<&str> = command.split_whitespace().collect();
    let mut files: Vec<std::path::PathBuf> = words
        .windows(2)
        .filter(|w| {
            [
                "--json",
                "--html",
                "-o",
                "--pprof",
                "--timeline",
                "--flames",
            ]
            .contains(&w[0])
        })
        .map(|w| dir.join(w[1]))
        .collect();
    let verb = words.get(1).copied().unwrap_or_default();
    let default = match verb {
        "run" => Some("fsprof-results.json"),
        "crash" => Some("fsprof-crash.json"),
        _ => None,
    };
    if let Some(d) = default.filter(|_| !words.contains(&"--json")) {
        files.push(dir.join(d));
    }
    for f in &files {
        let size = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        assert!(size > 0, "{command}: {} missing or empty", f.display());
    }
    // Outputs of fsprof (not compare's verdicts, nor pages and pictures) hold together.
    let checkable: Vec<&Path> = files
        .iter()
        .filter(|f| {
            verb != "compare"
                && !["html", "svg", "md"]
                    .iter()
                    .any(|e| f.extension() == Some(std::ffi::OsStr::new(e)))
        })
        .map(|f| f.as_path())
        .collect();
    if !checkable.is_empty() {
        checked(&checkable);
    }
    let has = |w: &str| words.contains(&w);
    let must = match verb {
        "list" => "available",
        "trace" => "fsprof trace: ",
        "run" => "×",
        "report" if has("--html") => "HTML report in",
        "report" if has("-o") => "report in",
        "report" => "|---|",
        "compare" => "fsprof compare: ",
        "explain" => " took ",
        "flame-diff" => "wrote diff.svg",
        "history" if has("import") => "already recorded",
        "history" if has("export") => "written to",
        "history" if has("trend") => "wrote trend.html",
        "history" => "runs",
        "crash" => "per update",
        "check" => "ok    time-classes-add-up",
        _ => "",
    };
    assert!(said.contains(must), "{command}: {must:?} not said:\n{said}");
}

/// Every `fsprof` line of the README's "Using it" block runs as written, in order, in an
/// empty directory with a history of its own: `run` lines at a tiny scale and one pass (the
/// only change made to them), VM lines left to the `vm` tests (they boot emulated kernels
/// for minutes).
pub fn readme_commands_run_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    // The first code block (indented lines) of the section.
    let section = readme.split("## Using it\n").nth(1).unwrap();
    let lines: Vec<&str> = section
        .lines()
        .skip_while(|l| !l.starts_with("    "))
        .take_while(|l| l.starts_with("    "))
        .map(|l| l.trim_start())
        .filter(|l| l.starts_with("fsprof "))
        .collect();
    assert!(lines.len() >= 20, "{lines:?}");
    let dir = TempDir::new("readme");
    let bin_dir = fsprof_bin().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let mut ran = 0;
    for line in lines {
        // Comments go; the command stays as written.
        let command = line.split("  #").next().unwrap().trim_end();
        if command.contains("--kernel") || command.contains("ab.json") {
            continue;
        }
        let command = if command.starts_with("fsprof run ") {
            let without_passes = command.replace("--passes 3", "");
            format!("{without_passes} --scale 0.005 --passes 1")
        } else {
            command.to_string()
        };
        let out = Command::new("sh")
            .args(["-c", &command])
            .current_dir(&dir.0)
            .env("PATH", &path)
            .env(fsprof::history::HISTORY_ENV, dir.0.join("history.sqlite"))
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{command}: {}\n{said}", out.status);
        produced_what_it_says(&command, &said, &dir.0);
        ran += 1;
    }
    eprintln!("{ran} README command lines ran");
    let history = Command::new(fsprof_bin())
        .args(["history", "list"])
        .env(fsprof::history::HISTORY_ENV, dir.0.join("history.sqlite"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&history.stdout);
    assert!(listed.starts_with("5 runs"), "{listed}");
}
