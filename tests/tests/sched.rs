//! Time split: rusage-based times agree with GNU time; I/O-bound and CPU-bound targets land
//! in the right scheduler class.

use std::process::Command;

use fsprof::lab::FsKind;
use fsprof_tests::*;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn close(ours: f64, theirs: f64) -> bool {
    (ours - theirs).abs() <= 0.10 * theirs + 0.05
}

#[test]
fn wall_user_sys_agree_with_gnu_time() {
    if !root_or_skip("wall_user_sys_agree_with_gnu_time") {
        return;
    }
    // User time (spinning) and system time (copying /dev/zero in 1 MiB calls: few
    // syscalls, so tracing overhead, measured by the bench, stays out of this comparison).
    let bin = env!("CARGO_BIN_EXE_spawner");
    let script =
        format!("{bin} spin 700 && dd if=/dev/zero of=/dev/null bs=1M count=20000 status=none");
    let cmd = argv(&["sh", "-c", &script]);
    // Alternate the two tools three times and compare medians: a single pair of runs can be
    // skewed by whatever the machine does in between (writeback from an earlier test).
    let (mut ours, mut gnu) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let r = trace(cmd.clone(), None);
        ours.push([secs(r.wall_ns), secs(r.user_ns), secs(r.sys_ns)]);
        let out = Command::new("/usr/bin/time")
            .args(["-f", "%e %U %S"])
            .args(&cmd)
            .output()
            .expect("GNU time (apt-get install time)");
        let t: Vec<f64> = String::from_utf8_lossy(&out.stderr)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        gnu.push([t[0], t[1], t[2]]);
    }
    let median = |v: &[[f64; 3]], k: usize| {
        let mut c: Vec<f64> = v.iter().map(|x| x[k]).collect();
        c.sort_by(f64::total_cmp);
        c[1]
    };
    let [wall, user, sys] = [0, 1, 2].map(|k| median(&ours, k));
    let t = [0, 1, 2].map(|k| median(&gnu, k));
    assert!(
        close(wall, t[0]),
        "wall {wall} vs {}: {ours:?} {gnu:?}",
        t[0]
    );
    assert!(
        close(user, t[1]),
        "user {user} vs {}: {ours:?} {gnu:?}",
        t[1]
    );
    assert!(close(sys, t[2]), "sys {sys} vs {}: {ours:?} {gnu:?}", t[2]);
    assert!(user > 0.5, "the spin must show as user time: {user}");
}

#[test]
fn direct_io_writer_is_mostly_io_wait() {
    if !root_or_skip("direct_io_writer_is_mostly_io_wait") {
        return;
    }
    let fs = lab(FsKind::Ext4, 512 << 20, "");
    let r = trace(
        argv(&[
            "dd",
            "if=/dev/zero",
            "of=data",
            "bs=64k",
            "count=3000",
            "oflag=direct",
            "status=none",
        ]),
        Some(fs.mountpoint()),
    );
    let io = r.profile.time.io_wait.ns;
    assert!(
        io as f64 > 0.5 * r.wall_ns as f64,
        "I/O wait {} of wall {}: {:?}",
        io,
        r.wall_ns,
        r.profile.time
    );
}

#[test]
fn cpu_bound_loop_is_on_cpu() {
    if !root_or_skip("cpu_bound_loop_is_on_cpu") {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_spawner");
    let r = trace(argv(&[bin, "spin", "1000"]), None);
    let on = r.profile.time.on_cpu.ns;
    assert!(
        on as f64 > 0.9 * r.wall_ns as f64,
        "on-CPU {on} of wall {}: {:?}",
        r.wall_ns,
        r.profile.time
    );
    // On- and off-CPU time of a single thread add up to its lifetime (≈ wall).
    let total = on + r.profile.time.off_cpu_ns();
    assert!(
        total <= r.wall_ns + 5_000_000,
        "{total} > wall {}",
        r.wall_ns
    );
}

#[test]
fn running_process_is_followed_with_pid() {
    if !root_or_skip("running_process_is_followed_with_pid") {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_spawner");
    let mut child = Command::new(bin).args(["spin", "4000"]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let opts = fsprof::trace::TraceOptions {
        pid: Some(child.id()),
        duration: Some(std::time::Duration::from_secs(1)),
        ..Default::default()
    };
    let r = fsprof::trace::run(&opts);
    let _ = child.kill();
    let _ = child.wait();
    let r = r.unwrap();
    let on = r.profile.time.on_cpu.ns;
    // A spinning process observed for about a second is on a CPU most of it.
    assert!(r.wall_ns >= 1_000_000_000, "{}", r.wall_ns);
    assert!(
        on as f64 > 0.8 * r.wall_ns as f64,
        "on-CPU {on} of {}",
        r.wall_ns
    );
    assert!(
        r.user_ns as f64 > 0.8 * r.wall_ns as f64,
        "user {} of {}",
        r.user_ns,
        r.wall_ns
    );
}
