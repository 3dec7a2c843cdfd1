//! Syscall counts must equal what strace sees, exactly.

use fsprof::lab::FsKind;
use fsprof_tests::*;

pub fn rm_rf_counts_equal_strace() {
    let fs = lab(FsKind::Ext4, 256 << 20, "");
    let mnt = fs.mountpoint();
    make_tree(&mnt.join("a"), 30, 40).unwrap();
    make_tree(&mnt.join("b"), 30, 40).unwrap();
    drop_caches();

    let ours = fsprof_counts(&trace(argv(&["rm", "-rf", "a"]), Some(mnt)));
    let theirs = strace_counts(&argv(&["rm", "-rf", "b"]), mnt).unwrap();
    assert!(!mnt.join("a").exists() && !mnt.join("b").exists());
    // rm -rf of 30 dirs x 40 files unlinks at least 1,200 entries: the table is not empty.
    assert!(
        ours.get("unlinkat").copied().unwrap_or(0) >= 1200,
        "{ours:?}"
    );
    assert_eq!(ours, theirs, "fsprof (left) vs strace -c -f (right)");
}

pub fn children_and_threads_are_all_followed() {
    let (children, threads) = (1000u64, 50u64);
    let bin = env!("CARGO_BIN_EXE_spawner");
    let r = trace(
        argv(&[bin, "tree", &children.to_string(), &threads.to_string()]),
        None,
    );
    assert_eq!(r.exit_code, Some(0));
    let counts = fsprof_counts(&r);
    assert_eq!(
        counts.get("getppid").copied(),
        Some(children * CHILD_CALLS + threads * THREAD_CALLS),
        "{counts:?}"
    );
    // The spawner's own exec plus one per child.
    assert_eq!(counts.get("execve").copied(), Some(children + 1));
    assert!(
        r.profile.tasks_forked >= children + threads,
        "{}",
        r.profile.tasks_forked
    );
    // Every forked task and the spawner itself exited.
    assert_eq!(r.profile.tasks_exited, r.profile.tasks_forked + 1);
    assert_nothing_lost(&r.profile, "spawner tree");
}
