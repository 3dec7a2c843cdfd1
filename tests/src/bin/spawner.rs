//! Test target with a known syscall footprint.
//! - `spawner tree CHILDREN THREADS`: starts CHILDREN processes (each re-executes this
//!   binary as `child`, which calls getppid 3 times) one after another, and THREADS threads
//!   that call getppid 20 times each. Expected getppid total: 3*CHILDREN + 20*THREADS.
//! - `spawner spin MILLIS [FILE]`: burns CPU in user space; then copies its own
//!   /proc/self/schedstat (on-CPU ns, run-queue ns, timeslices) to FILE.
//! - `spawner bpf-names FILE`: writes the BPF functions loaded now as fsprof names them
//!   ("address length name" lines), then `--`, then /proc/kallsyms' `[bpf]` lines.
use std::{
    hint::black_box,
    process::Command,
    time::{Duration, Instant},
};

use fsprof_tests::{CHILD_CALLS, THREAD_CALLS};

fn getppid_n(n: u64) {
    for _ in 0..n {
        unsafe { libc::getppid() };
    }
}

#[inline(never)]
fn spin(d: Duration) -> u64 {
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < d {
        for i in 0..100_000u64 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("child") => getppid_n(CHILD_CALLS),
        Some("tree") => {
            let children: u32 = args[2].parse().unwrap();
            let threads: u32 = args[3].parse().unwrap();
            let me = std::env::current_exe().unwrap();
            let handles: Vec<_> = (0..threads)
                .map(|_| std::thread::spawn(|| getppid_n(THREAD_CALLS)))
                .collect();
            for _ in 0..children {
                let st = Command::new(&me).arg("child").status().unwrap();
                assert!(st.success());
            }
            for h in handles {
                h.join().unwrap();
            }
        }
        Some("bpf-names") => {
            let mut out = String::new();
            for f in fsprof::probes::prog_symbols::loaded().unwrap() {
                out.push_str(&format!("{:x} {} {}\n", f.start, f.len, f.name));
            }
            out.push_str("--\n");
            let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap();
            for l in kallsyms.lines().filter(|l| l.ends_with("[bpf]")) {
                out.push_str(l);
                out.push('\n');
            }
            std::fs::write(&args[2], out).unwrap();
        }
        Some("spin") => {
            let ms: u64 = args[2].parse().unwrap();
            black_box(spin(Duration::from_millis(ms)));
            if let Some(out) = args.get(3) {
                std::fs::copy("/proc/self/schedstat", out).unwrap();
            }
        }
        _ => {
            eprintln!("usage: spawner tree CHILDREN THREADS | spawner spin MILLIS [FILE]");
            std::process::exit(2);
        }
    }
}
