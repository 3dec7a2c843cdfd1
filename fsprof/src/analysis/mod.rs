//! Reasoning over saved results: `compare` (A/B with significance, of runs and of crash
//! studies) and `explain` (where a cell's time went, and why one filesystem took longer
//! than another).

pub mod compare;
pub mod crash;
pub mod explain;
pub mod machine;
pub mod metrics;
pub mod stats;
pub mod verdict;
