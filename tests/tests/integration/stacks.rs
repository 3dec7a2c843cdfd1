//! Stacks and flame graphs against the real kernel: the hot function of a CPU-bound binary
//! tops its on-CPU graph; a direct-I/O writer waits in io_schedule, woken by block
//! completions; pipe and child waits name the thread that woke them; an xfs tree delete
//! waits in xfs code and leaves xfs background work; stack weights add up to the tracer's
//! time classes; every SVG is XML naming its cell; a self-diff shows no change.

use std::{path::Path, process::Command};

use fsprof::{lab::FsKind, probes::StackOptions};
use fsprof_tests::*;

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn within(a: f64, b: f64, frac: f64) -> bool {
    (a - b).abs() <= frac * b.max(1.0)
}

/// Total weight of the folded stacks that satisfy `pred`.
fn weight_where(
    folded: &std::collections::BTreeMap<String, u64>,
    pred: impl Fn(&str) -> bool,
) -> u64 {
    folded.iter().filter(|(k, _)| pred(k)).map(|(_, v)| v).sum()
}

pub fn cpu_bound_binary_hot_function_tops_on_cpu_graph() {
    let out = TempDir::new("hot");
    let bin = env!("CARGO_BIN_EXE_spawner");
    let r = trace_with_stacks(argv(&[bin, "spin", "1500"]), None, None, &out.0);
    let on = read_folded(Path::new(&r.flames["on-cpu.folded"]));
    let total: u64 = on.values().sum();
    // Samples whose leaf (top) frame is the spin loop.
    let hot: u64 = on
        .iter()
        .filter(|(k, _)| {
            k.rsplit(';')
                .next()
                .is_some_and(|leaf| leaf.contains("spin"))
        })
        .map(|(_, v)| v)
        .sum();
    assert!(
        hot as f64 > 0.8 * total as f64,
        "spin on top in {hot} of {total} µs: {on:#?}"
    );
    // Sampled on-CPU time vs the tracer core's exact on-CPU time: within 5 %.
    let s = r.stacks.as_ref().unwrap();
    assert!(
        within(
            s.on_cpu_sampled_ns as f64,
            r.profile.time.on_cpu.ns as f64,
            0.05
        ),
        "sampled {} vs traced {}",
        s.on_cpu_sampled_ns,
        r.profile.time.on_cpu.ns
    );
    assert!(
        within(total as f64, us(r.profile.time.on_cpu.ns), 0.05),
        "folded {total} µs vs traced {} ns",
        r.profile.time.on_cpu.ns
    );
    assert!(
        !s.capture_problems.contains_key("stack_table_full"),
        "{s:?}"
    );
}

/// fsprof's own programs as the README says: on-CPU samples inside them are one
/// `[fsprof probes]` frame (a `dd bs=1` makes a syscall every microsecond or so, and its
/// hooks take a tenth of its time), no frame is named by a symbol that does not hold it,
/// and a BPF function is named as the kernel names it in /proc/kallsyms, at its address.
pub fn own_programs_are_one_frame_and_named_as_the_kernel_names_them() {
    let out = TempDir::new("own-frames");
    let dd = argv(&[
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=1",
        "count=1000000",
        "status=none",
    ]);
    let r = trace_with_stacks(dd, None, None, &out.0);
    let on = read_folded(Path::new(&r.flames["on-cpu.folded"]));
    let ours: u64 = on
        .iter()
        .filter(|(k, _)| k.contains("[fsprof probes]"))
        .map(|(_, v)| v)
        .sum();
    assert!(ours > 0, "no sample in fsprof's programs: {on:#?}");
    for k in on.keys() {
        assert!(!k.contains("_einittext") && !k.contains("bpf_prog_"), "{k}");
    }
    // While its programs are loaded, the traced spawner lists them both ways.
    let names = out.0.join("names");
    let bin = env!("CARGO_BIN_EXE_spawner");
    trace(argv(&[bin, "bpf-names", names.to_str().unwrap()]), None);
    let text = std::fs::read_to_string(&names).unwrap();
    let (ours, kernels) = text.split_once("--\n").unwrap();
    let ours: std::collections::BTreeMap<u64, (u64, &str)> = ours
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                u64::from_str_radix(f[0], 16).unwrap(),
                (f[1].parse().unwrap(), f[2]),
            )
        })
        .collect();
    let mut matched = 0;
    for l in kernels.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let addr = u64::from_str_radix(f[0], 16).unwrap();
        if !f[2].starts_with("bpf_prog_") {
            continue; // trampolines and dispatchers are not programs
        }
        let (len, name) = ours.get(&addr).unwrap_or_else(|| panic!("{l}: not listed"));
        assert_eq!(*name, f[2], "{l}");
        assert!(*len > 0, "{l}");
        matched += 1;
    }
    assert!(
        ours.values().any(|(_, n)| n.ends_with("_sys_enter")),
        "{ours:?}"
    );
    assert!(
        matched >= ours.len() / 2 && matched > 5,
        "{matched} of {}",
        ours.len()
    );
}

/// Both ways of taking off-CPU stacks: sampled (the default: a stack per millisecond of
/// short waits, unwound at switch-in, which leaves out scheduler functions) and one at
/// every switch-out (period 0). Totals are exact either way.
pub fn direct_io_off_cpu_is_io_wait_under_io_schedule() {
    let fs = lab(FsKind::Ext4, 512 << 20, "");
    for (period, waited_in) in [
        (StackOptions::default().off_cpu_period_ns, "iomap_dio_rw"),
        (0, "io_schedule"),
    ] {
        let out = TempDir::new(&format!("dio{period}"));
        let stacks = StackOptions {
            off_cpu_period_ns: period,
            ..StackOptions::default()
        };
        let r = trace_with_stack_options(
            argv(&[
                "dd",
                "if=/dev/zero",
                "of=data",
                "bs=64k",
                "count=2000",
                "oflag=direct",
                "status=none",
            ]),
            Some(fs.mountpoint()),
            Some(&fs),
            &out.0,
            stacks,
        );
        direct_io_waits_in(&r, waited_in);
    }
}

fn direct_io_waits_in(r: &fsprof::trace::TraceResult, waited_in: &str) {
    let off = read_folded(Path::new(&r.flames["off-cpu.folded"]));
    let total: u64 = off.values().sum();
    let io_sched = weight_where(&off, |k| {
        k.contains(";[I/O wait];") && k.contains(waited_in)
    });
    assert!(
        io_sched as f64 > 0.5 * total as f64,
        "I/O wait under {waited_in} {io_sched} of {total} µs: {off:#?}"
    );
    // Off-CPU weights are the tracer's off-CPU intervals: equal, but for µs rounding.
    let traced = r.profile.time.off_cpu_ns();
    let s = r.stacks.as_ref().unwrap();
    assert_eq!(s.off_cpu_ns, traced, "stack off-CPU ns vs time classes");
    assert!(
        within(total as f64, us(traced), 0.05),
        "{total} µs vs {traced} ns"
    );
    assert_eq!(
        s.off_cpu_by_class["io_wait"], r.profile.time.io_wait.ns,
        "{s:?}"
    );
    // What ended the waits: block completions, run from interrupt context.
    assert_eq!(waited_total(s), s.off_cpu_ns, "{:?}", s.waited_for);
    let disk = waited(s, "disk I/O");
    assert!(
        disk as f64 > 0.8 * r.profile.time.io_wait.ns as f64,
        "disk I/O {disk} ns of {} ns I/O wait: {:?}",
        r.profile.time.io_wait.ns,
        s.waited_for
    );
    let top = &s.top_wakes[0];
    assert_eq!(
        (top.what.as_str(), top.waker.as_str()),
        ("disk I/O", "interrupt"),
        "{top:?}"
    );
    // The off-wake graph: blocked stacks with the completion that woke them on top.
    let wake = read_folded(Path::new(&r.flames["off-wake.folded"]));
    let by_disk = weight_where(&wake, |k| {
        k.contains(";[disk I/O];") && k.contains("blk_mq_end_request_[k]")
    });
    assert!(
        by_disk as f64 > 0.8 * us(r.profile.time.io_wait.ns),
        "{by_disk} µs under [disk I/O]: {wake:#?}"
    );
}

/// Off-CPU ns attributed to `what`.
fn waited(s: &fsprof::aggregate::stacks::StackSummary, what: &str) -> u64 {
    s.waited_for
        .iter()
        .filter(|w| w.what == what)
        .map(|w| w.ns)
        .sum()
}

fn waited_total(s: &fsprof::aggregate::stacks::StackSummary) -> u64 {
    s.waited_for.iter().map(|w| w.ns).sum()
}

pub fn pipe_and_child_waits_name_the_thread_that_woke_them() {
    let out = TempDir::new("wake");
    // cat waits on the pipe until sleep exits; sh waits for both; sleep waits for a timer.
    let r = trace_with_stacks(argv(&["sh", "-c", "sleep 0.3 | cat"]), None, None, &out.0);
    let s = r.stacks.as_ref().unwrap();
    assert_eq!(waited_total(s), s.off_cpu_ns, "{:?}", s.waited_for);
    let own = waited(s, "the target's own threads");
    let timer = waited(s, "sleep or timer");
    assert!(
        own >= 250_000_000 && timer >= 250_000_000,
        "{:?}",
        s.waited_for
    );
    let cat = s
        .top_wakes
        .iter()
        .find(|t| t.comm == "cat")
        .unwrap_or_else(|| panic!("{:?}", s.top_wakes));
    assert_eq!(cat.waker, "target", "{cat:?}");
    assert!(
        cat.blocked.iter().any(|f| f.contains("pipe_read")),
        "{cat:?}"
    );
    assert!(cat.ns >= 250_000_000, "{cat:?}");
}

pub fn xfs_delete_tree_waits_in_xfs_and_leaves_background_work() {
    let out = TempDir::new("xfsrm");
    let fs = lab(FsKind::Xfs, 1 << 30, "");
    make_tree(&fs.mountpoint().join("tree"), 300, 40).unwrap();
    fs.syncfs().unwrap();
    drop_caches();
    let r = trace_with_stacks(
        argv(&["rm", "-rf", "tree"]),
        Some(fs.mountpoint()),
        Some(&fs),
        &out.0,
    );
    assert_eq!(r.exit_code, Some(0));
    let off = read_folded(Path::new(&r.flames["off-cpu.folded"]));
    let xfs = weight_where(&off, |k| k.split(';').any(|f| f.starts_with("xfs_")));
    assert!(xfs > 0, "no xfs_ frames off-CPU: {off:#?}");
    // rm blocks in thousands of distinct user stacks (no frame pointers: garbage past the
    // libc wrapper) but the kernel resolves build ids only for the first through each leaf;
    // the others' wrapper frames must still be named, after rm is gone.
    let user_leaf = |k: &str| {
        let frames: Vec<&str> = k.split(';').collect();
        let entry = frames.iter().position(|f| f.starts_with("entry_SYSCALL"))?;
        (entry > 2).then(|| frames[entry - 1].to_string())
    };
    let in_syscalls = weight_where(&off, |k| k.starts_with("rm;") && user_leaf(k).is_some());
    let unnamed = weight_where(&off, |k| {
        k.starts_with("rm;") && user_leaf(k).is_some_and(|f| f.starts_with("[unknown]"))
    });
    assert!(
        in_syscalls > 0 && (unnamed as f64) < 0.05 * in_syscalls as f64,
        "{unnamed} of {in_syscalls} µs with an unnamed syscall wrapper: {off:#?}"
    );
    // After rm returns, xfs inactivates the unlinked inodes in its inodegc workers; the
    // quiesce after syncfs waits for them, so their work lands in this trace.
    let bg = r.background.as_ref().unwrap();
    let bg_folded = read_folded(Path::new(&r.flames["background.folded"]));
    assert!(
        bg_folded.keys().any(|k| k.contains("xfs_inodegc_worker")),
        "no inodegc work in background: {bg:?}"
    );
    assert!(r.quiesce_ns.is_some());
    // Part of rm's blocked time ends when an xfs kernel thread (ioend, inodegc, CIL push)
    // releases what rm waited for.
    let s = r.stacks.as_ref().unwrap();
    assert_eq!(waited_total(s), s.off_cpu_ns, "{:?}", s.waited_for);
    let by_xfs: u64 = s
        .waited_for
        .iter()
        .filter(|w| w.what.contains("by xfs-"))
        .map(|w| w.ns)
        .sum();
    let blocked = r.profile.time.uninterruptible.ns + r.profile.time.io_wait.ns;
    assert!(
        by_xfs as f64 > 0.05 * blocked as f64,
        "{by_xfs} of {blocked} ns blocked released by xfs threads: {:?}",
        s.waited_for
    );
    let f = r.profile.fs_events.as_ref().unwrap();
    assert!(
        f.events
            .iter()
            .any(|e| e.name.starts_with("xfs:") && e.filtered)
    );
}

pub fn fs_events_count_only_the_filesystem_under_test() {
    let out = TempDir::new("fsev");
    let fs = lab(FsKind::Ext4, 256 << 20, "");
    // Five fsyncs on the lab filesystem, three on a host ext4 (/var/tmp, where the lab's
    // images are: a disk filesystem, not tmpfs): the host's fire the same ext4 events, so
    // the filter is what keeps them out.
    let host_dir = Path::new("/var/tmp");
    assert_eq!(
        fs_kind_of(host_dir),
        "ext4",
        "the host fsyncs must go to another ext4 for this test to mean anything"
    );
    let host = host_dir.join(format!("fsprof-host-fsync-{}", std::process::id()));
    let script = format!(
        "for i in 1 2 3 4 5; do dd if=/dev/zero of=f$i bs=4k count=4 conv=fsync status=none; done; \
         for i in 1 2 3; do dd if=/dev/zero of={h}$i bs=4k count=4 conv=fsync status=none; done; rm -f {h}*",
        h = host.display()
    );
    let r = trace_with_stacks(
        argv(&["sh", "-c", &script]),
        Some(fs.mountpoint()),
        Some(&fs),
        &out.0,
    );
    let calls: u64 = r
        .profile
        .syscalls
        .iter()
        .filter(|s| s.name == "fsync")
        .map(|s| s.count)
        .sum();
    assert_eq!(calls, 8, "fsync syscalls");
    let f = r.profile.fs_events.as_ref().unwrap();
    let count = |n: &str| f.events.iter().find(|e| e.name == n).map(|e| e.count);
    assert_eq!(count("ext4:ext4_sync_file_enter"), Some(5), "{f:#?}");
    let pair = f.pairs.iter().find(|p| p.name == "ext4_sync_file").unwrap();
    assert_eq!(pair.count, 5);
    assert!(pair.latency.max > 0 && pair.total_ns >= pair.latency.p50);
    let commits = f.pairs.iter().find(|p| p.name == "jbd2_commit");
    assert!(commits.is_some_and(|c| c.count >= 1), "{f:#?}");
    // jbd2's statistics events carry the journal's dev_t as a value: one per commit of the
    // lab's journal, none of the host's three.
    let stats = f.events.iter().find(|e| e.name == "jbd2:jbd2_run_stats");
    assert!(stats.is_some_and(|e| e.filtered), "{f:#?}");
    assert_eq!(
        count("jbd2:jbd2_run_stats"),
        commits.map(|c| c.count),
        "{f:#?}"
    );
}

fn parse(text: &str) -> Result<roxmltree::Document<'_>, roxmltree::Error> {
    // inferno's SVGs carry the SVG 1.1 DOCTYPE.
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(text, opts)
}

fn svg_title(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = parse(&text).unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    doc.descendants()
        .find(|n| n.has_tag_name("text") && n.attribute("id") == Some("title"))
        .and_then(|n| n.text())
        .unwrap_or_default()
        .to_string()
}

fn frame_fills(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = parse(&text).unwrap();
    doc.descendants()
        .filter(|n| n.has_tag_name("rect"))
        .filter_map(|n| n.attribute("fill"))
        .filter(|f| f.starts_with("rgb("))
        .map(String::from)
        .collect()
}

pub fn run_graphs_are_xml_named_by_cell_and_self_diff_is_neutral() {
    let out = TempDir::new("runflames");
    let json = out.0.join("r.json");
    let pprof = out.0.join("pprof");
    let st = Command::new(fsprof_bin())
        .args([
            "run", "--suite", "none", "--fs", "ext4,xfs", "--passes", "1",
        ])
        .args([
            "--step",
            "write=dd if=/dev/zero of={mnt}/f bs=64k count=800 oflag=direct status=none",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--pprof")
        .arg(&pprof)
        .output()
        .unwrap();
    assert_success(&st);
    checked(&[&json, &pprof]);
    // --pprof: each pass's profiles beside its step, named as its folded files.
    for fs in ["ext4", "xfs"] {
        let p = pprof.join(format!("write/{fs}-pass1.off-cpu.pb.gz"));
        assert!(!go_pprof_raw(&p).samples.is_empty(), "{}", p.display());
    }
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cells = r["flames"]["cells"]["write"].as_object().unwrap();
    assert_eq!(cells.len(), 2, "{cells:?}");
    let mut svgs = 0;
    for (fs, files) in cells {
        for (kind, path) in files.as_object().unwrap() {
            if !kind.ends_with(".svg") {
                continue;
            }
            let title = svg_title(&out.0.join(path.as_str().unwrap()));
            assert!(
                title.contains(fs.as_str()) && title.contains("write"),
                "{title}"
            );
            assert!(title.contains("kernel"), "{title}");
            svgs += 1;
        }
    }
    assert!(svgs >= 6, "{svgs} SVGs");
    let diffs = r["flames"]["diffs"].as_array().unwrap();
    assert!(!diffs.is_empty());
    for d in diffs {
        svg_title(&out.0.join(d["path"].as_str().unwrap()));
    }
    // A cell against itself: every frame white; against another filesystem: some are not.
    let ext4 = out
        .0
        .join(cells["ext4"]["off-cpu.folded"].as_str().unwrap());
    let xfs = out.0.join(cells["xfs"]["off-cpu.folded"].as_str().unwrap());
    let diff = |a: &Path, b: &Path, name: &str| {
        let svg = out.0.join(name);
        let st = Command::new(fsprof_bin())
            .arg("flame-diff")
            .args([a, b])
            .arg("-o")
            .arg(&svg)
            .output()
            .unwrap();
        assert_success(&st);
        frame_fills(&svg)
    };
    let same = diff(&ext4, &ext4, "self.svg");
    assert!(!same.is_empty());
    assert!(same.iter().all(|f| f == "rgb(250,250,250)"), "{same:?}");
    let other = diff(&ext4, &xfs, "other.svg");
    assert!(other.iter().any(|f| f != "rgb(250,250,250)"), "{other:?}");
}

pub fn fuse_daemon_work_is_background_work() {
    // `cargo xtask setup` installs ntfs-3g: without it this fails, it does not skip.
    FsKind::Ntfs.check_available().unwrap();
    let out = TempDir::new("fuse");
    let fs = lab(FsKind::Ntfs, 512 << 20, "");
    let daemon = fs
        .daemon_pid()
        .expect("the ntfs-3g process serving the lab mount");
    assert!(
        std::fs::read_to_string(format!("/proc/{daemon}/comm"))
            .unwrap()
            .starts_with("ntfs-3g")
    );
    let before = schedstat(daemon).0;
    let r = trace_with_stacks(
        argv(&[
            "dd",
            "if=/dev/zero",
            "of=data",
            "bs=1M",
            "count=64",
            "conv=fsync",
            "status=none",
        ]),
        Some(fs.mountpoint()),
        Some(&fs),
        &out.0,
    );
    let kernel_ns = schedstat(daemon).0 - before;
    let bg = r.background.as_ref().unwrap();
    let daemon_ns = fs_daemon_ns(bg, "ntfs-3g");
    // The daemon's sampled time against the on-CPU time the scheduler charged it meanwhile.
    // Each sample weighs the time charged since the thread's previous one, so they add up
    // to the charged time but for the ends: a period before the first sample, up to one
    // after the last, a tick of staleness. Weighed by the period instead, steal time counts
    // (in CI: 708 ms sampled of 462 ms charged) and ±11 % is one standard deviation.
    let period = r.stacks.as_ref().unwrap().sample_period_ns;
    let slack = 0.05 * kernel_ns as f64 + 4.0 * period as f64 + 10e6;
    eprintln!("ntfs-3g: sampled {daemon_ns} ns, schedstat {kernel_ns} ns");
    assert!(
        (daemon_ns as f64 - kernel_ns as f64).abs() <= slack,
        "ntfs-3g sampled {daemon_ns} ns, charged {kernel_ns} ns (±{slack:.0}): {bg:?}"
    );
    assert!(
        kernel_ns >= 50_000_000,
        "the daemon barely worked: {kernel_ns} ns"
    );
}

/// Where the test program's symbols are.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Names {
    /// In the program itself.
    InProgram,
    /// Only in `chain.debug` beside it, named by its .gnu_debuglink.
    DebugLink,
    /// Only in /usr/lib/debug/.build-id/xx/yyyy.debug, found by its build id (as Debian's
    /// -dbgsym packages install them).
    BuildIdDir,
}

/// A file the test put in a system directory, removed (with the directories it made) when
/// dropped, also when the test fails.
struct Installed(Vec<std::path::PathBuf>);

impl Drop for Installed {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir(p));
        }
    }
}

fn run_tool(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert_success(&out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// tests/c/chain.c built into `dir` as Debian builds its programs (-O2, no frame
/// pointers); unless `names` is InProgram, with -g and then split: the program stripped of
/// every symbol, its names only in a separate debug file.
fn build_chain(dir: &Path, names: Names) -> (std::path::PathBuf, Installed) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/chain.c");
    let bin = dir.join(format!("chain-{names:?}"));
    let mut cc = Command::new("gcc");
    cc.args(["-O2", "-fomit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src);
    if names != Names::InProgram {
        cc.arg("-g");
    }
    assert_success(&cc.output().expect("gcc (apt-get install gcc)"));
    let mut installed = Installed(Vec::new());
    if names == Names::InProgram {
        return (bin, installed);
    }
    let debug = match names {
        Names::DebugLink => dir.join("chain.debug"),
        _ => {
            let notes = run_tool(&["readelf".as_ref(), "-n".as_ref(), bin.as_ref()]);
            let id = notes
                .lines()
                .find_map(|l| l.trim().strip_prefix("Build ID: "))
                .expect("gcc wrote no build id")
                .to_string();
            let d = Path::new("/usr/lib/debug/.build-id").join(&id[..2]);
            for dir in d.ancestors().collect::<Vec<_>>().into_iter().rev() {
                if !dir.exists() {
                    std::fs::create_dir(dir).unwrap();
                    installed.0.push(dir.to_path_buf());
                }
            }
            d.join(format!("{}.debug", &id[2..]))
        }
    };
    // Debian's way: the program keeps a .gnu_debuglink (the name of its debug file, and a
    // CRC), and the -dbgsym package puts the file under /usr/lib/debug/.build-id.
    let split = dir.join("chain.debug");
    run_tool(&[
        "objcopy".as_ref(),
        "--only-keep-debug".as_ref(),
        bin.as_ref(),
        split.as_ref(),
    ]);
    run_tool(&["strip".as_ref(), "--strip-all".as_ref(), bin.as_ref()]);
    let link = format!("--add-gnu-debuglink={}", split.display());
    run_tool(&["objcopy".as_ref(), link.as_ref(), bin.as_ref()]);
    if debug != split {
        installed.0.push(debug.clone());
        std::fs::copy(&split, &debug).unwrap();
        std::fs::remove_file(&split).unwrap();
    }
    (bin, installed)
}

/// The user frames of a folded stack, root first (after the thread name and any class
/// frame, before the kernel's `_[k]` frames).
fn user_part(stack: &str) -> Vec<&str> {
    stack
        .split(';')
        .skip(1)
        .filter(|f| !f.starts_with('[') || f.starts_with("[stack ends"))
        .take_while(|f| !f.ends_with("_[k]"))
        .collect()
}

/// Share of the weight of `stacks` whose user part is `_start … main → rest…`.
fn whole_chain_share<'a>(
    stacks: impl Iterator<Item = (&'a String, &'a u64)>,
    rest: &[&str],
) -> (u64, u64) {
    let (mut whole, mut all) = (0, 0);
    for (stack, w) in stacks {
        let user = user_part(stack);
        all += w;
        let tail = user.len() > rest.len() && user[user.len() - rest.len() - 1] == "main";
        if user.first() == Some(&"_start") && tail && user.ends_with(rest) {
            whole += w;
        }
    }
    (whole, all)
}

/// A program without frame pointers gets whole user stacks, unwound from DWARF CFI in the
/// kernel: on-CPU samples in chain_c read `_start … main → chain_a → chain_b → chain_c`,
/// its waits in read() `… main → chain_a → chain_b → read`; the completeness figure says
/// so; no frame is made up. Stripped of its symbols, its names come from its debug file,
/// beside it by .gnu_debuglink or under /usr/lib/debug by build id.
pub fn user_stacks_are_whole_without_frame_pointers() {
    let out = TempDir::new("chain");
    for names in [Names::InProgram, Names::DebugLink, Names::BuildIdDir] {
        let (bin, _installed) = build_chain(&out.0, names);
        let flames = out.0.join(format!("fl-{names:?}"));
        let r = trace_with_stacks(
            argv(&[bin.to_str().unwrap(), "10", "60"]),
            Some(&out.0),
            None,
            &flames,
        );
        let on = read_folded(Path::new(&r.flames["on-cpu.folded"]));
        let total: u64 = on.values().sum();
        let leaf_c = on
            .iter()
            .filter(|(k, _)| user_part(k).last() == Some(&"chain_c"));
        let (whole, in_c) = whole_chain_share(leaf_c, &["chain_a", "chain_b", "chain_c"]);
        assert!(in_c * 2 > total, "chain_c in {in_c} of {total} µs: {on:#?}");
        assert!(
            whole * 100 >= in_c * 95,
            "whole {whole} of {in_c} µs: {on:#?}"
        );
        let off = read_folded(Path::new(&r.flames["off-cpu.folded"]));
        let reads = off.iter().filter(|(k, _)| k.contains("timerfd_read"));
        let (whole, waits) = whole_chain_share(reads, &["chain_a", "chain_b", "read"]);
        assert!(
            waits > 0 && whole * 100 >= waits * 95,
            "{whole} of {waits}: {off:#?}"
        );
        let u = &r.stacks.as_ref().unwrap().user_stacks;
        assert!(u.on_cpu_share().unwrap() >= 0.95, "{u:?}");
        assert!(
            u.on_cpu <= r.stacks.as_ref().unwrap().on_cpu_samples,
            "{u:?}"
        );
        for stack in on.keys().chain(off.keys()) {
            assert!(
                !stack.contains("[unknown]") && !stack.contains("[mapping not recorded]"),
                "{stack}"
            );
        }
    }
}

/// A pprof profile as `go tool pprof -raw` prints it (Go's own decoder of profile.proto).
struct Raw {
    /// "samples/count cpu/nanoseconds[dflt]".
    sample_types: String,
    /// (values, location ids leaf first, label text).
    samples: Vec<(Vec<u64>, Vec<u64>, String)>,
    /// id → function name.
    locations: std::collections::BTreeMap<u64, String>,
    /// "ID: start/limit/offset FILE BUILD_ID [FN]".
    mappings: Vec<String>,
}

fn go_pprof_raw(path: &Path) -> Raw {
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(path)
        .output()
        .expect("go tool pprof (cargo xtask setup installs golang-go)");
    assert_success(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    let mut raw = Raw {
        sample_types: String::new(),
        samples: Vec::new(),
        locations: Default::default(),
        mappings: Vec::new(),
    };
    let mut section = "";
    for line in text.lines() {
        match line {
            "Samples:" | "Locations" | "Mappings" => {
                section = line;
                continue;
            }
            _ => {}
        }
        match section {
            "Samples:" if raw.sample_types.is_empty() => raw.sample_types = line.to_string(),
            "Samples:" if line.starts_with("                ") => {
                raw.samples.last_mut().unwrap().2 += line.trim();
            }
            "Samples:" => {
                let (values, ids) = line.split_once(':').unwrap();
                let nums = |s: &str| s.split_whitespace().map(|v| v.parse().unwrap()).collect();
                raw.samples.push((nums(values), nums(ids), String::new()));
            }
            "Locations" => {
                // "     7: 0xffffffff8134a2b0 M=1 vfs_write :0 s=0"
                let (id, rest) = line.trim_start().split_once(": ").unwrap();
                let rest = rest.split_once(' ').unwrap().1;
                let rest = rest
                    .strip_prefix("M=")
                    .map_or(rest, |r| r.split_once(' ').unwrap().1);
                let name = rest.rsplit_once(" :0 s=0").unwrap().0;
                raw.locations.insert(id.parse().unwrap(), name.to_string());
            }
            "Mappings" => raw.mappings.push(line.to_string()),
            _ => {}
        }
    }
    raw
}

/// A folded file without the graph's marks (`_[k]`, `_[w]`), which pprof does not carry.
fn unmarked(
    folded: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for (k, v) in folded {
        let frames: Vec<&str> = k
            .split(';')
            .map(|f| f.trim_end_matches("_[k]").trim_end_matches("_[w]"))
            .collect();
        *out.entry(frames.join(";")).or_insert(0) += v;
    }
    out
}

/// `--pprof`: each profile, decoded by `go tool pprof`, holds the folded file's stacks with
/// their weights (pprof merges samples of one stack and labels, so per stack within the µs
/// rounding of each), on- and off-CPU time to the nanosecond of the trace's, its sample
/// types and labels, and mappings whose build ids are the files' (as readelf reads them).
pub fn pprof_profiles_hold_the_folded_stacks() {
    let out = TempDir::new("pprof");
    let d = out.0.display().to_string();
    let script =
        "dd if=/dev/zero of=f bs=1M count=32 oflag=direct status=none; gzip -1 < f | cat > g";
    let (said, t) = trace_sh(
        &[
            "--fs", "ext4", "--size", "256M", "--flames", &d, "--pprof", &d,
        ],
        &out.0.join("t.json"),
        script,
    );
    assert!(said.contains("pprof profiles: "), "{said}");
    let st = t.stacks.unwrap();
    for (kind, types) in [
        ("on-cpu", "samples/count cpu/nanoseconds[dflt]"),
        ("off-cpu", "intervals/count off-cpu/nanoseconds[dflt]"),
        ("off-wake", "wakeups/count blocked/nanoseconds[dflt]"),
    ] {
        let raw = go_pprof_raw(&out.0.join(format!("sh.{kind}.pb.gz")));
        assert_eq!(raw.sample_types, types);
        let mut rebuilt = std::collections::BTreeMap::new();
        let ns: u64 = raw.samples.iter().map(|s| s.0[1]).sum();
        match kind {
            "on-cpu" => assert_eq!(ns, st.on_cpu_sampled_ns),
            "off-cpu" => assert_eq!(ns, st.off_cpu_ns),
            _ => assert!(ns > 0),
        }
        for (values, ids, labels) in &raw.samples {
            assert!(labels.contains("thread:["), "{kind}: {labels}");
            let names: Vec<String> = ids
                .iter()
                .rev()
                .map(|i| raw.locations[i].replace(';', ":"))
                .collect();
            let us = (values[1] + 500) / 1000;
            if us > 0 {
                *rebuilt.entry(names.join(";")).or_insert(0) += us;
            }
        }
        let folded = unmarked(&read_folded(&out.0.join(format!("sh.{kind}.folded"))));
        for stack in rebuilt.keys().chain(folded.keys()) {
            let (got, us) = (
                rebuilt.get(stack).unwrap_or(&0),
                folded.get(stack).unwrap_or(&0),
            );
            assert!(
                got.abs_diff(*us) <= 2 + us / 100,
                "{kind} {stack}: {got} vs {us} µs"
            );
        }
        assert!(folded.values().sum::<u64>() > 0, "{kind}");
        eprintln!(
            "{kind}: {} samples, {} stacks, {} mappings",
            raw.samples.len(),
            folded.len(),
            raw.mappings.len()
        );
        if kind == "on-cpu" {
            // gzip's code is named in its mapping by the build id readelf finds in it.
            let gzip = raw
                .mappings
                .iter()
                .find(|m| m.contains("/gzip "))
                .unwrap_or_else(|| panic!("{:?}", raw.mappings));
            let notes = Command::new("readelf")
                .args(["-n", "/usr/bin/gzip"])
                .output()
                .unwrap();
            let notes = String::from_utf8_lossy(&notes.stdout);
            let id = notes
                .lines()
                .find_map(|l| l.trim().strip_prefix("Build ID: "))
                .unwrap();
            assert!(gzip.contains(id), "{gzip} vs {id}");
            let kernel = raw
                .mappings
                .iter()
                .find(|m| m.contains("[kernel.kallsyms]"))
                .unwrap();
            let kid = kernel.split_whitespace().nth(3).unwrap_or("");
            assert!(
                kid.len() == 40 && kid.chars().all(|c| c.is_ascii_hexdigit()),
                "{kernel}"
            );
        }
    }
}
