//! Block bytes must equal the kernel's own accounting in /sys/block/<dev>/stat, exactly.

use fsprof::{
    aggregate,
    lab::FsKind,
    probes::{ProbeOptions, Probes},
    target,
};
use fsprof_tests::*;

#[test]
fn loop_device_bytes_equal_sysfs_stat() {
    if !root_or_skip("loop_device_bytes_equal_sysfs_stat") {
        return;
    }
    // noatime: reading must not dirty inodes that a later journal commit would write.
    let fs = lab(FsKind::Ext4, 256 << 20, "noatime");
    let mnt = fs.mountpoint().to_path_buf();
    let dev = fs.kernel_dev().unwrap();
    drop_caches();

    let mut probes = Probes::load(&ProbeOptions { devices: vec![dev] }).unwrap();
    let before = sysfs_rw_bytes(fs.device_path());
    let script = "dd if=/dev/urandom of=data bs=1M count=24 conv=fsync status=none && \
                  echo 3 > /proc/sys/vm/drop_caches && cat data > /dev/null && sync";
    let held = target::spawn_held(&argv(&["sh", "-c", script]), Some(&mnt)).unwrap();
    probes.follow(held.pid(), false).unwrap();
    let exit = held.run().unwrap();
    let after = sysfs_rw_bytes(fs.device_path());
    let profile = aggregate::collect(&probes).unwrap();
    assert_eq!(exit.code, Some(0));

    let bytes = |class: &str| -> u64 {
        profile
            .block
            .iter()
            .filter(|b| b.class == class)
            .map(|b| b.bytes)
            .sum()
    };
    let (read, written) = (after.0 - before.0, after.1 - before.1);
    assert!(
        written >= 24 << 20,
        "sysfs saw only {written} bytes written"
    );
    assert!(read >= 24 << 20, "sysfs saw only {read} bytes read");
    assert_eq!(bytes("read"), read, "read bytes: fsprof vs sysfs");
    assert_eq!(bytes("write"), written, "written bytes: fsprof vs sysfs");
    // Only the filtered device appears.
    let name = fs
        .device_path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        profile.block.iter().all(|b| b.name == name),
        "{:?}",
        profile.block
    );
    // Latency histograms were filled for the data classes.
    let w = profile.block.iter().find(|b| b.class == "write").unwrap();
    assert!(
        w.device_latency.count > 0 && w.device_latency.p50 > 0,
        "{w:?}"
    );
}
