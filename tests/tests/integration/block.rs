//! Block bytes must equal the kernel's own accounting in /sys/block/<dev>/stat, exactly.

use fsprof::{
    aggregate,
    lab::FsKind,
    probes::{ProbeOptions, Probes},
    target,
};
use fsprof_tests::*;

/// Requests and their time against the kernel's own per-request accounting: fields 1/5 count
/// requests done, 4/8 their milliseconds from arrival (`start_time_ns`) to done, which is
/// fsprof's queue + device latency per request. The kernel stamps "done" a little after the
/// completion tracepoint, so the times agree within a few µs per request.
fn assert_requests_and_ticks_match_sysfs(profile: &aggregate::Profile, delta: &[u64]) {
    for (class, ios, ticks_ms) in [("read", delta[0], delta[3]), ("write", delta[4], delta[7])] {
        let row = profile.block.iter().find(|b| b.class == class).unwrap();
        // At most two fewer: a request in flight when the probes attached was issued unseen,
        // and a data-less write with PREFLUSH (the journal commit of `conv=fsync`/`sync`) is
        // never issued itself: the flush machinery issues a separate flush request (class
        // flush for both) and completes the write at the end, which the kernel then counts
        // as a write done (33 of 34 here every time, the milliseconds equal to 1 ms).
        let done = row.device_latency.count;
        assert!(
            done <= ios && ios - done <= 2,
            "{class}: fsprof saw {done} requests done, sysfs {ios}: {row:?}"
        );
        let ours_ms = (row.queue_latency.mean * row.queue_latency.count as f64
            + row.device_latency.mean * done as f64)
            / 1e6;
        let slack = 0.05 * ticks_ms as f64 + 2.0 + 0.01 * ios as f64;
        eprintln!(
            "{class}: {done} requests, {ours_ms:.1} ms; sysfs {ios} requests, {ticks_ms} ms; issued {} completions {}",
            row.issued, row.completions
        );
        assert!(
            (ours_ms - ticks_ms as f64).abs() <= slack,
            "{class}: queue + device time {ours_ms:.1} ms, sysfs {ticks_ms} ms (±{slack:.1}): \
             {row:?}"
        );
    }
}

pub fn loop_device_bytes_equal_sysfs_stat() {
    // noatime: reading must not dirty inodes that a later journal commit would write. No
    // prefetch: after a mount ext4 reads block bitmaps in the background (ext4lazyinit), and
    // three such 1 KiB reads between the attach and the first sysfs reading once made fsprof
    // count 3,072 bytes more than the sysfs difference.
    let fs = lab(FsKind::Ext4, 256 << 20, "noatime,no_prefetch_block_bitmaps");
    let mnt = fs.mountpoint().to_path_buf();
    let dev = fs.kernel_dev().unwrap();
    drop_caches();

    // Exact equality is only defined when no event was lost; the kernel may skip a probe
    // that would nest in itself (reported as recursion_misses). So: up to three attempts,
    // retried only when something was lost; a loss-free attempt must be exact.
    let mut attempts = Vec::new();
    let profile = loop {
        let k = attempts.len();
        wait_block_idle(fs.device_path());
        let mut probes = Probes::load(&ProbeOptions {
            devices: vec![dev],
            ..Default::default()
        })
        .unwrap();
        let before = sysfs_block_stat(fs.device_path());
        let script = format!(
            "dd if=/dev/urandom of=data{k} bs=1M count=24 conv=fsync status=none && \
             echo 3 > /proc/sys/vm/drop_caches && cat data{k} > /dev/null && sync"
        );
        let held = target::spawn_held(&argv(&["sh", "-c", &script]), Some(&mnt)).unwrap();
        probes.follow(held.pid(), false).unwrap();
        let exit = held.run().unwrap();
        wait_block_idle(fs.device_path());
        let after = sysfs_block_stat(fs.device_path());
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
        let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        // Fields 3 and 7 (1-based): sectors read and written.
        let (read, written) = (delta[2] * 512, delta[6] * 512);
        assert!(
            written >= 24 << 20,
            "sysfs saw only {written} bytes written"
        );
        assert!(read >= 24 << 20, "sysfs saw only {read} bytes read");
        let ours = (bytes("read"), bytes("write"));
        if profile.lost.is_empty() {
            // Nothing lost: the counts must agree now, a retry would hide a counting error.
            assert_eq!(
                ours,
                (read, written),
                "fsprof read/written vs sysfs (sysfs delta {delta:?}; rows {:?}; programs' \
                 runs {:?})",
                profile.block,
                profile.probe_cost
            );
            // The device was idle when the figures were read: nothing is in flight, and
            // no tag was reused before its request was seen completing.
            assert!(
                profile.block.iter().all(|b| b.unseen + b.in_flight == 0),
                "{:?}",
                profile.block
            );
            assert_requests_and_ticks_match_sysfs(&profile, &delta);
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
