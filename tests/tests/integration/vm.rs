//! `fsprof run --kernel`: a Debian 6.1 guest under qemu (TCG here) runs the suite on
//! filesystems this host kernel lacks.

use std::process::Command;

use fsprof::results::RunResult;
use fsprof_tests::{TempDir, fsprof_bin};

pub fn debian_guest_fills_jfs_and_reiserfs_cells_and_leaves_nothing() {
    let dir = TempDir::new("vm");
    let json = dir.0.join("r.json");
    let out = Command::new(fsprof_bin())
        .args([
            "run",
            "--kernel",
            "deb:linux-image-amd64",
            "--fs",
            "jfs,reiserfs",
            "--only",
            "extract-tree",
            "--scale",
            "0.02",
            "--passes",
            "1",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", err);
    let r = RunResult::load(&json).unwrap();
    assert!(r.complete, "{:?}", r.interrupted);
    assert!(r.kernel.starts_with("6.1."), "guest kernel {}", r.kernel);
    let vm = r.vm.as_ref().expect("vm facts");
    assert_eq!((vm.accel.as_str(), vm.emulated), ("tcg", true));
    assert_eq!(vm.disk_cache, "none");
    assert!(vm.boot_s.is_some_and(|b| b > 0.0), "{:?}", vm.boot_s);
    let fs: Vec<&str> = r.filesystems.iter().map(|f| f.fs.as_str()).collect();
    assert_eq!(fs, ["jfs", "reiserfs"]);
    for f in &r.filesystems {
        assert_eq!(f.device, "/dev/vda", "{}", f.fs);
        let cells = f.runs_of("extract-tree");
        assert_eq!(cells.len(), 1, "{}", f.fs);
        let t = &cells[0].trace;
        let syscalls: u64 = t.profile.syscalls.iter().map(|s| s.count).sum();
        assert!(
            t.wall_ns > 0 && syscalls > 1000,
            "{}: {syscalls} syscalls",
            f.fs
        );
        // The tree went through the guest's block layer to the virtio disk.
        let written = fsprof_tests::block_bytes(t, "write");
        assert!(written > 1 << 20, "{}: {written} bytes written", f.fs);
    }
    // Nothing of the VM stays: no qemu, no scratch share or disk image (tests run one at a
    // time, so any such leftover is this run's).
    let left: Vec<String> = std::fs::read_dir("/var/tmp/fsprof")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fsprof-") && n.contains("-vm"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let ps = Command::new("pgrep")
        .args(["-af", "qemu-system"])
        .output()
        .unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(!ps.contains("fsprof-"), "{ps}");
}
