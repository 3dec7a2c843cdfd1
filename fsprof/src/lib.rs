//! fsprof: a tracing profiler for filesystem workloads.
//!
//! The pipeline, one module per stage: `lab` (fresh filesystems on loop devices) →
//! `workload` (what runs on them) → `probes` (eBPF programs in the kernel) → `aggregate`
//! (maps → profile, folded stacks) → `trace` (one traced command: lab, probes, target and
//! aggregation together) → `results` (the saved model of a run) → `analysis` (compare,
//! explain) → `report` (tables, HTML, flame graph pictures) → `history` (every run recorded,
//! compared with its past) → `check` (the invariants that tie any output's figures
//! together); `run` drives suites of steps
//! over filesystems and passes and writes all of it; `cli` parses the command line and calls
//! them. `os`, `signals` and `units` are leaves.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod aggregate;
pub mod analysis;
pub mod check;
pub mod cli;
pub mod history;
pub mod lab;
pub mod os;
pub mod probes;
pub mod report;
pub mod results;
pub mod run;
pub mod signals;
pub mod suite;
pub mod syscall_table;
pub mod target;
pub mod trace;
pub mod units;
pub mod vm;
pub mod workload;

#[cfg(test)]
mod circles;
#[cfg(test)]
mod layering;

#[cfg(test)]
mod json_docs;

#[cfg(test)]
mod test_support;
