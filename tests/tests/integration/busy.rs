//! Only the target's figures on a busy machine: beside a neighbour that writes and syncs an
//! ext4 loop filesystem in a loop, `trace` shows the neighbour's device apart, charges no
//! ext4 work to an xfs target, and `compare` names the machine; `trace -p` follows the tree
//! it is given.

use std::{path::Path, process::Command};

use fsprof::trace::TraceResult;
use fsprof_tests::*;

fn load(json: &Path) -> TraceResult {
    checked(&[json]);
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// `trace -- du` reads the root filesystem only: the neighbour's loop device is shown
/// apart, with what /sys says it moved meanwhile, and is in no figure of the target's.
pub fn trace_shows_a_neighbours_device_apart() {
    let n = Neighbour::start();
    let dir = TempDir::new("busy-du");
    let json = dir.0.join("t.json");
    drop_caches();
    let before = sysfs_block_stat(n.fs.device_path());
    let out = Command::new(fsprof_bin())
        .args(["trace", "--no-stacks", "--json"])
        .arg(&json)
        .args(["--", "du", "-s", "/usr/share"])
        .output()
        .unwrap();
    let after = sysfs_block_stat(n.fs.device_path());
    assert_success(&out);
    let t = load(&json);
    let dev = n.dev();
    assert!(
        t.profile.block.iter().all(|b| b.dev != dev),
        "{:?}",
        t.profile.block
    );
    let theirs: u64 = t
        .profile
        .other_block
        .iter()
        .filter(|b| b.dev == dev)
        .map(|b| b.bytes)
        .sum();
    // /sys counts sectors written over a span a little longer than the trace's.
    let sysfs = (after[6] - before[6]) * 512;
    assert!(
        theirs > 0 && theirs <= sysfs,
        "neighbour {theirs} B, /sys {sysfs} B"
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("other processes (devices of no filesystem the target used"),
        "{said}"
    );
}

/// An xfs `rm -rf` beside the ext4 neighbour: no ext4 or jbd2 work in its background.
pub fn another_filesystems_background_work_is_not_the_targets() {
    let n = Neighbour::start();
    let dir = TempDir::new("busy-rm");
    let (_, t) = trace_sh(
        &[
            "--fs",
            "xfs",
            "--size",
            "512M",
            "--prepare",
            "cp -a /usr/share/doc .",
        ],
        &dir.0.join("t.json"),
        "rm -rf doc",
    );
    let bg = t.background.as_ref().expect("background work");
    for (class, ns) in &bg.by_class {
        assert!(
            !class.starts_with("ext4") && !class.starts_with("jbd2"),
            "{class} {ns}"
        );
    }
    // A loop worker runs ext4 for the lab's xfs too (its image is a file on the root
    // filesystem): that is the target's; no other stack may do ext4's work.
    let ext4 = |f: &String| f.starts_with("ext4_") || f.starts_with("jbd2_");
    let looped = |f: &String| f.starts_with("lo_") || f.starts_with("loop_");
    for s in (bg.top.iter()).filter(|s| s.class != "loop" && !s.frames.iter().any(looped)) {
        assert!(!s.frames.iter().any(ext4), "{s:?}");
    }
    drop(n);
}

/// A parent whose busy child already ran when it was given to `trace -p`: the child is
/// followed, its CPU time the kernel's (/proc/PID/schedstat).
pub fn trace_p_follows_the_busy_child_it_is_given() {
    let spin = env!("CARGO_BIN_EXE_spawner");
    let mut parent = Command::new("sh")
        .args(["-c", &format!("{spin} spin 4000 & wait")])
        .spawn()
        .unwrap();
    let child = || {
        let o = Command::new("pgrep")
            .args(["-P", &parent.id().to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u32>()
            .ok()
    };
    wait_until(
        "the child spinning",
        std::time::Duration::from_secs(30),
        || child().is_some_and(|c| schedstat(c).0 > 0),
    );
    let c = child().unwrap();
    let dir = TempDir::new("busy-p");
    let json = dir.0.join("t.json");
    let before = schedstat(c).0;
    let out = Command::new(fsprof_bin())
        .args([
            "trace",
            "-p",
            &parent.id().to_string(),
            "--duration",
            "1",
            "--json",
        ])
        .arg(&json)
        .arg("--flames")
        .arg(dir.0.join("flames"))
        .output()
        .unwrap();
    let ran = schedstat(c).0 - before;
    let _ = parent.kill();
    let _ = Command::new("kill").arg(c.to_string()).status();
    let _ = parent.wait();
    assert_success(&out);
    checked(&[&dir.0.join("flames")]);
    let t = load(&json);
    let on = t.profile.time.on_cpu.ns;
    // Within the window the scheduler's figure spans (it starts before the probes attach).
    assert!(
        on > ran / 2 && on <= ran + 20_000_000,
        "on-CPU {on} ns, child ran {ran} ns"
    );
    assert!(
        t.profile.time.followed_ns >= 2 * t.wall_ns * 9 / 10,
        "{:?}",
        t.profile.time
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("(% of their time)"), "{said}");
}
