//! Types shared by the eBPF programs (`fsprof-ebpf`) and userspace (`fsprof`).
//!
//! Everything here is `#[repr(C)]` plain data: the kernel side writes it into maps, the
//! user side reads the same bytes back. The `user` feature adds `aya::Pod` impls.
#![no_std]

pub mod config;
pub mod hist;
pub mod kdev;
#[cfg(feature = "user")]
pub mod map_names;
pub mod maps;
pub mod timeline;
pub mod unwind;

pub use config::ProbeConfig;
#[cfg(feature = "user")]
pub use map_names::MapName;
pub use maps::*;
