//! The invariants of stack outputs: folded files (a trace's or a run cell's set of kinds)
//! and pprof profiles, against each other and the trace's stack totals; the names of
//! their frames.

use std::{
    collections::{BTreeMap, HashSet},
    io::Read,
    path::Path,
    sync::OnceLock,
};

use anyhow::{Context, Result};
use prost::Message;

use super::{Checks, FOLDED_TOTALS, KERNEL_FRAMES, PPROF_TOTALS, USER_FRAMES, Unit};
use crate::aggregate::{
    folded::{Folded, total_us},
    kallsyms,
    pprof::proto,
    stacks::{BackgroundSummary, StackSummary},
};

/// A frame's name without the graphs' mark (`_[k]` kernel, `_[w]` waiting).
fn base(frame: &str) -> (&str, bool) {
    match frame.strip_suffix("_[k]") {
        Some(b) => (b, true),
        None => (frame.strip_suffix("_[w]").unwrap_or(frame), false),
    }
}

/// A name no frame may have: a linker boundary mark, or an unnamed `[unknown]`.
pub fn not_a_function(name: &str) -> bool {
    kallsyms::is_boundary(name) || name == "[unknown]"
}

/// The running kernel's function names, when `release` is the running kernel and its
/// /proc/kallsyms shows addresses (root): the names a kernel frame may have.
fn kernel_functions(release: &str) -> Option<&'static HashSet<String>> {
    static FUNCTIONS: OnceLock<Option<(String, HashSet<String>)>> = OnceLock::new();
    let (running, names) = FUNCTIONS
        .get_or_init(|| {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
            let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
            let names: HashSet<String> = text
                .lines()
                .filter_map(kallsyms::code_symbol)
                .map(|(_, n)| n.to_string())
                .collect();
            Some((release.trim().to_string(), names))
        })
        .as_ref()?;
    (running == release && !names.is_empty()).then_some(names)
}

/// Whether a kernel frame's name is one the kernel can give: a function of `functions`,
/// a BPF program, or a frame fsprof names (`[fsprof probes]`, `[kernel] 0x…` for an
/// address no function held).
fn kernel_name_ok(name: &str, functions: &HashSet<String>) -> bool {
    functions.contains(name) || name.starts_with("bpf_prog_") || name.starts_with('[')
}

/// The frame names of one file that no frame may have (first few), checked against the
/// running kernel's functions when it is the one traced.
fn bad_frames<'a>(
    frames: impl Iterator<Item = &'a str>,
    release: Option<&str>,
) -> (Vec<String>, Vec<String>) {
    let functions = release.and_then(kernel_functions);
    let (mut kernel, mut user) = (Vec::new(), Vec::new());
    for f in frames {
        let (name, is_kernel) = base(f);
        if name == "[unknown]" {
            user.push(name.to_string());
        } else if kallsyms::is_boundary(name)
            || (is_kernel && functions.is_some_and(|fs| !kernel_name_ok(name, fs)))
        {
            kernel.push(name.to_string());
        }
    }
    (kernel, user)
}

fn verdict(bad: &[String], what: &str) -> Result<(), String> {
    match bad.first() {
        None => Ok(()),
        Some(f) => Err(format!("{} {what} like {f:?}", bad.len())),
    }
}

/// A trace's (or a run cell's) folded files by kind ("on-cpu", …), with the stack totals
/// they were folded from and the kernel traced, when known.
pub struct FoldedSet<'a> {
    pub item: String,
    pub files: BTreeMap<String, Folded>,
    /// (stack totals, background, µs of rounding allowed).
    pub totals: Option<(&'a StackSummary, Option<&'a BackgroundSummary>, u64)>,
    pub kernel: Option<&'a str>,
}

pub fn check_folded(c: &mut Checks, set: &FoldedSet) {
    for (kind, f) in &set.files {
        let item = format!("{} {kind}.folded", set.item);
        let frames = f.keys().flat_map(|k| k.split(';'));
        let (kernel, user) = bad_frames(frames, set.kernel);
        c.holds(
            KERNEL_FRAMES,
            &item,
            verdict(&kernel, "kernel frames not functions"),
        );
        c.holds(USER_FRAMES, &item, verdict(&user, "unnamed frames"));
    }
    let total = |k: &str| set.files.get(k).map(total_us);
    if let (Some(on), Some(off), Some(both)) =
        (total("on-cpu"), total("off-cpu"), total("combined"))
    {
        let item = format!("{} combined.folded", set.item);
        c.agree(
            FOLDED_TOTALS,
            &item,
            ("combined", both),
            ("on-CPU + off-CPU", on + off),
            0,
            Unit::Us,
        );
    }
    let Some((s, background, allowed)) = set.totals else {
        return;
    };
    let expected = [
        ("on-cpu", "on-CPU samples", Some(s.on_cpu_sampled_ns)),
        ("off-cpu", "off-CPU time", Some(s.off_cpu_ns)),
        ("background", "background work", background.map(|b| b.ns)),
    ];
    for (kind, what, ns) in expected {
        let (Some(ns), got) = (ns, total(kind).unwrap_or(0)) else {
            continue;
        };
        let item = format!("{} {kind}.folded", set.item);
        c.agree(
            FOLDED_TOTALS,
            &item,
            ("folded", got),
            (what, ns / 1000),
            allowed,
            Unit::Us,
        );
    }
}

/// A pprof profile: its user and kernel frames inside their mappings, its frame names,
/// and its time against its folded file's.
pub fn check_pprof(c: &mut Checks, path: &Path, folded: Option<&Folded>, kernel: Option<&str>) {
    let item = path.display().to_string();
    let p = match read_pprof(path) {
        Ok(p) => p,
        Err(e) => return c.unreadable.push((path.to_path_buf(), format!("{e:#}"))),
    };
    let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let functions: BTreeMap<u64, &str> = p.function.iter().map(|f| (f.id, s(f.name))).collect();
    let mappings: BTreeMap<u64, &proto::Mapping> = p.mapping.iter().map(|m| (m.id, m)).collect();
    let mut outside = Vec::new();
    let mut kernel_frames = Vec::new();
    for l in &p.location {
        let name = l
            .line
            .first()
            .and_then(|x| functions.get(&x.function_id))
            .copied()
            .unwrap_or("");
        if l.mapping_id == 0 {
            continue;
        }
        let Some(m) = mappings.get(&l.mapping_id) else {
            outside.push(format!("{name}: mapping {} missing", l.mapping_id));
            continue;
        };
        if !(m.memory_start..m.memory_limit).contains(&l.address)
            || !in_file(m, l.address, s(m.filename))
        {
            outside.push(format!("{name} at 0x{:x} in {}", l.address, s(m.filename)));
        }
        if s(m.filename) == "[kernel.kallsyms]" {
            kernel_frames.push(format!("{name}_[k]"));
        }
    }
    c.holds(
        USER_FRAMES,
        &item,
        verdict(&outside, "frames outside their mapping"),
    );
    let (bad, _) = bad_frames(kernel_frames.iter().map(String::as_str), kernel);
    c.holds(
        KERNEL_FRAMES,
        &item,
        verdict(&bad, "kernel frames not functions"),
    );
    let Some(f) = folded else {
        return;
    };
    // Value 1 is the time in ns; the folded file rounds each stack to µs (and leaves out
    // those that round to 0).
    let ns: i64 = p.sample.iter().filter_map(|x| x.value.get(1)).sum();
    let allowed = (p.sample.len() as u64).div_ceil(2) * 1000;
    c.agree(
        PPROF_TOTALS,
        &item,
        ("pprof", ns.max(0) as u64),
        ("folded", total_us(f) * 1000),
        allowed,
        Unit::Ns,
    );
}

/// A file mapping's address is its start plus the file offset: within the file when the
/// file is here to look at (a kernel or a file of another machine is not).
fn in_file(m: &proto::Mapping, address: u64, filename: &str) -> bool {
    if !filename.starts_with('/') {
        return true;
    }
    match std::fs::metadata(filename) {
        Ok(meta) => address - m.memory_start < meta.len(),
        Err(_) => true,
    }
}

fn read_pprof(path: &Path) -> Result<proto::Profile> {
    let gz = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut bytes)
        .context("not a gzip-compressed pprof profile")?;
    proto::Profile::decode(&bytes[..]).context("not a pprof profile")
}
