//! The kernel's BPF run-time statistics, on for a share of fsprof's lifetime.
//!
//! While they are on (BPF_ENABLE_STATS), every run of every BPF program pays two
//! `sched_clock` reads: ~70 ns a run on these machines, as much as a syscall hook itself,
//! and invisible in the statistics they produce. So they are on in windows (by default
//! 20 ms of every 200, starting at attach), and a program's run time is estimated as
//! its exact run count (`PROGRAM_RUNS`) times its mean run time inside the windows.
//! Closing the fd ends a window; nothing global is left changed, even on SIGKILL.

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::{Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

/// Windows repeat once per this: short, so that a short command gets several and a
/// program's first runs (cold caches) weigh no more than its later ones.
const CYCLE: Duration = Duration::from_millis(200);

/// Share of the time the statistics are on, in percent (1–100; 100: always, exact).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostSampling(pub u8);

impl Default for CostSampling {
    fn default() -> Self {
        CostSampling(10)
    }
}

impl CostSampling {
    /// What this machine allows: under QEMU's emulator (TCG) switching the statistics on
    /// and off while programs run hung Debian 6.1 guests within seconds (the whole guest,
    /// 1 of 6 short traces), so there they stay on throughout. None: as asked.
    pub fn on_this_machine(self) -> (CostSampling, Option<&'static str>) {
        if self.0 < 100 && emulated_cpu() {
            let why = "under QEMU's emulator (TCG) the kernel times fsprof's programs \
                       throughout (~70 ns a run): switching its statistics on and off there \
                       hung 6.1 guests";
            return (CostSampling(100), Some(why));
        }
        (self, None)
    }

    /// How long each window lasts; None: one window, until finish.
    fn window(self) -> Option<Duration> {
        (self.0 < 100).then(|| CYCLE * u32::from(self.0.max(1)) / 100)
    }
}

/// What the windows measured, by kernel program id: (runs, run ns) while on.
#[derive(Clone, Debug, Default)]
pub struct WindowTotals {
    pub by_id: HashMap<u32, (u64, u64)>,
    /// Time the statistics were on, and since the first window opened.
    pub on: Duration,
    pub elapsed: Duration,
}

#[derive(Default)]
struct State {
    stop: bool,
    totals: WindowTotals,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    /// Sleeps up to `d` (None: until asked); true when asked to stop.
    fn wait(&self, d: Option<Duration>) -> bool {
        let guard = self.state.lock().unwrap();
        let guard = match d {
            Some(d) => {
                self.wake
                    .wait_timeout_while(guard, d, |s| !s.stop)
                    .unwrap()
                    .0
            }
            None => self.wake.wait_while(guard, |s| !s.stop).unwrap(),
        };
        guard.stop
    }
}

pub struct CostWindows {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl CostWindows {
    /// Opens the first window now (an error: the kernel keeps no statistics for us).
    pub fn start(program_ids: Vec<u32>, sampling: CostSampling) -> Result<CostWindows> {
        let first = enable().context("the kernel refused BPF_ENABLE_STATS")?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fsprof-cost".into())
            .spawn(move || run(&s, &program_ids, sampling, first))
            .context("starting the probe-cost thread")?;
        Ok(CostWindows {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Closes the open window and returns all windows' totals (again on later calls).
    pub fn finish(&self) -> WindowTotals {
        self.shared.state.lock().unwrap().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
        self.shared.state.lock().unwrap().totals.clone()
    }
}

impl Drop for CostWindows {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The CPU is QEMU's TCG emulator: its hypervisor leaf says "TCGTCGTCGTCG".
#[cfg(target_arch = "x86_64")]
fn emulated_cpu() -> bool {
    use std::arch::x86_64::__cpuid;
    // Leaf 1 ecx bit 31: the hypervisor leaves exist (cpuid is safe on every x86_64).
    if __cpuid(1).ecx & (1 << 31) == 0 {
        return false;
    }
    let v = __cpuid(0x4000_0000);
    let vendor: Vec<u8> = [v.ebx, v.ecx, v.edx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    vendor == b"TCGTCGTCGTCG"
}

#[cfg(not(target_arch = "x86_64"))]
fn emulated_cpu() -> bool {
    false
}

fn enable() -> Result<OwnedFd> {
    Ok(aya::sys::enable_stats(aya::sys::Stats::RunTime)?)
}

fn run(shared: &Shared, ids: &[u32], sampling: CostSampling, first: OwnedFd) {
    let started = Instant::now();
    let mut fd = Some(first);
    loop {
        let opened = Instant::now();
        let before = snapshot(ids);
        let stop = shared.wait(sampling.window());
        let after = snapshot(ids);
        let end = Instant::now();
        drop(fd.take());
        {
            let mut st = shared.state.lock().unwrap();
            let t = &mut st.totals;
            for (id, (runs, ns)) in after {
                let (r0, n0) = before.get(&id).copied().unwrap_or_default();
                let e = t.by_id.entry(id).or_default();
                e.0 += runs.saturating_sub(r0);
                e.1 += ns.saturating_sub(n0);
            }
            t.on += end - opened;
            t.elapsed = end - started;
        }
        if stop {
            return;
        }
        let off = CYCLE.saturating_sub(sampling.window().unwrap_or(CYCLE));
        if shared.wait(Some(off)) {
            shared.state.lock().unwrap().totals.elapsed = started.elapsed();
            return;
        }
        match enable() {
            Ok(f) => fd = Some(f),
            Err(_) => return, // refused now: keep what the earlier windows measured
        }
    }
}

/// (runs, run ns) so far of fsprof's programs, from the kernel's program info.
fn snapshot(ids: &[u32]) -> HashMap<u32, (u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ids.contains(&p.id()))
        .map(|p| (p.id(), (p.run_count(), p.run_time().as_nanos() as u64)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_is_the_share_of_a_cycle() {
        assert_eq!(
            CostSampling::default().window(),
            Some(Duration::from_millis(20))
        );
        assert_eq!(CostSampling(100).window(), None);
        assert_eq!(CostSampling(50).window(), Some(CYCLE / 2));
        assert_eq!(CostSampling(0).window(), Some(Duration::from_millis(2)));
    }
}
