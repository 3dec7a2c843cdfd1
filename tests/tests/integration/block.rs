//! Block bytes must equal the kernel's own accounting in /sys/block/<dev>/stat, exactly.

use fsprof::{
    aggregate,
    lab::FsKind,
    probes::{ProbeOptions, Probes},
    target,
};
use fsprof_tests::*;

pub fn loop_device_bytes_equal_sysfs_stat() {
    // noatime: reading must not dirty inodes that a later journal commit would write.
    let fs = lab(FsKind::Ext4, 256 << 20, "noatime");
    let mnt = fs.mountpoint().to_path_buf();
    let dev = fs.kernel_dev().unwrap();
    drop_caches();

    // Exact equality is only defined when no event was lost; the kernel may skip a probe
    // that would nest in itself (reported as recursion_misses). So: up to three attempts,
    // retried only when something was lost; a loss-free attempt must be exact.
    let mut attempts = Vec::new();
    let profile = loop {
        let k = attempts.len();
        let mut probes = Probes::load(&ProbeOptions {
            devices: vec![dev],
            ..Default::default()
        })
        .unwrap();
        let before = sysfs_rw_bytes(fs.device_path());
        let script = format!(
            "dd if=/dev/urandom of=data{k} bs=1M count=24 conv=fsync status=none && \
             echo 3 > /proc/sys/vm/drop_caches && cat data{k} > /dev/null && sync"
        );
        let held = target::spawn_held(&argv(&["sh", "-c", &script]), Some(&mnt)).unwrap();
        probes.follow(held.pid(), false).unwrap();
        let exit = held.run().unwrap();
        let after = sysfs_rw_bytes(fs.device_path());
        let (profile, _) = aggregate::collect(&probes).unwrap();
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
        let ours = (bytes("read"), bytes("write"));
        if profile.lost.is_empty() {
            // Nothing lost: the counts must agree now, a retry would hide a counting error.
            assert_eq!(ours, (read, written), "fsprof read/written vs sysfs");
            break profile;
        }
        attempts.push(format!(
            "fsprof read/written {ours:?} vs sysfs {:?}, lost {:?}",
            (read, written),
            profile.lost
        ));
        assert!(
            attempts.len() < 3,
            "no exact, loss-free attempt: {attempts:#?}"
        );
    };
    if !attempts.is_empty() {
        eprintln!("attempts before the exact one: {attempts:#?}");
    }
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
