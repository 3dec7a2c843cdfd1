//! fsprof: a tracing profiler for filesystem workloads.
//!
//! The pipeline, one module per stage: `lab` (fresh filesystems on loop devices) →
//! `workload` (what runs on them) → `probes` (eBPF programs in the kernel) → `aggregate`
//! (maps → profile) → `report` (tables, JSON, flame graphs); `analysis` (compare, explain)
//! reasons over saved results. `trace` ties probes, a target and
//! aggregation together; `run` drives suites of steps over filesystems and passes.

pub mod aggregate;
pub mod analysis;
pub mod lab;
pub mod os;
pub mod probes;
pub mod report;
pub mod run;
pub mod signals;
pub mod suite;
pub mod syscall_table;
pub mod target;
pub mod trace;
pub mod workload;
