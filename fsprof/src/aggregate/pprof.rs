//! pprof export: a trace's on-CPU, off-CPU and off-wake stacks as gzip-compressed
//! `profile.proto` (the format of `go tool pprof`, Grafana Pyroscope and Parca). The stacks
//! are the folded files' (the same frames, root to leaf), each with its count and time as
//! the two sample values, the thread, process and time class as labels, and its code's
//! place: ELF files by path and GNU build id, the kernel by its build id, at the offsets
//! and addresses the stacks were captured at. Frames fsprof names (the thread, the class,
//! what a wait waited for) are locations without a mapping.

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use fsprof_common::unwind::FileKey;
use prost::Message;

use super::{
    folded::{self, Kind, Sample},
    stacks::{Stacks, class_label},
    symbols::At,
};

/// The messages of profile.proto (github.com/google/pprof/proto/profile.proto) fsprof
/// writes, field numbers as there.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
    }
}

/// The kinds exported: (kind, what a sample counts, what its time is).
pub const EXPORTED: [(Kind, &str, &str); 3] = [
    (Kind::OnCpu, "samples", "cpu"),
    (Kind::OffCpu, "intervals", "off-cpu"),
    (Kind::OffWake, "wakeups", "blocked"),
];

/// Where a file mapping starts in the profile's address space: each file gets its own
/// terabyte, so an address is its mapping's start plus the file offset.
const FILE_SPAN: u64 = 1 << 40;
/// The kernel's mapping: the upper half of the address space, where its code is.
const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// Builds one profile: strings, functions, locations and mappings, each interned once.
struct Builder<'a> {
    files: &'a BTreeMap<FileKey, PathBuf>,
    p: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<String, u64>,
    locations: HashMap<(At, String), u64>,
    file_maps: HashMap<FileKey, (u64, u64)>,
    kernel_map: Option<u64>,
}

impl<'a> Builder<'a> {
    fn new(files: &'a BTreeMap<FileKey, PathBuf>) -> Self {
        let mut b = Builder {
            files,
            p: proto::Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            file_maps: HashMap::new(),
            kernel_map: None,
        };
        b.string(""); // string_table[0] must be ""
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn function(&mut self, name: &str) -> u64 {
        if let Some(&id) = self.functions.get(name) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        let n = self.string(name);
        self.p.function.push(proto::Function {
            id,
            name: n,
            system_name: n,
        });
        self.functions.insert(name.to_string(), id);
        id
    }

    fn mapping(&mut self, name: &str, build_id: &str, start: u64, limit: u64) -> u64 {
        let id = self.p.mapping.len() as u64 + 1;
        let (filename, build_id) = (self.string(name), self.string(build_id));
        self.p.mapping.push(proto::Mapping {
            id,
            memory_start: start,
            memory_limit: limit,
            file_offset: 0,
            filename,
            build_id,
            has_functions: true,
        });
        id
    }

    /// The mapping of a file, and where it starts.
    fn file_mapping(&mut self, f: FileKey) -> (u64, u64) {
        if let Some(&m) = self.file_maps.get(&f) {
            return m;
        }
        let start = (self.file_maps.len() as u64 + 1) * FILE_SPAN;
        let (name, build_id) = match self.files.get(&f) {
            Some(p) => (p.display().to_string(), elf_build_id(p).unwrap_or_default()),
            None => (format!("[dev {:x} inode {}]", f.dev, f.ino), String::new()),
        };
        let m = (
            self.mapping(&name, &build_id, start, start + FILE_SPAN),
            start,
        );
        self.file_maps.insert(f, m);
        m
    }

    fn location(&mut self, name: &str, at: At) -> u64 {
        let key = (at, name.to_string());
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let (mapping_id, address) = match at {
            At::Nowhere => (0, 0),
            At::Kernel(a) => {
                let m = match self.kernel_map {
                    Some(m) => m,
                    None => {
                        let id = kernel_build_id().unwrap_or_default();
                        let m = self.mapping("[kernel.kallsyms]", &id, KERNEL_START, u64::MAX);
                        *self.kernel_map.insert(m)
                    }
                };
                (m, a)
            }
            At::File(f, offset) => {
                let (m, start) = self.file_mapping(f);
                (m, start + offset)
            }
        };
        let id = self.p.location.len() as u64 + 1;
        let function_id = self.function(name);
        self.p.location.push(proto::Location {
            id,
            mapping_id,
            address,
            line: vec![proto::Line { function_id }],
        });
        self.locations.insert(key, id);
        id
    }

    fn label(&mut self, key: &str, text: Option<&str>, num: i64) -> proto::Label {
        proto::Label {
            key: self.string(key),
            str: text.map_or(0, |t| self.string(t)),
            num,
        }
    }

    fn sample(&mut self, s: &Sample, kind: Kind) {
        // Leaf first, as pprof lists a sample's locations.
        let location_id = s
            .frames
            .iter()
            .rev()
            .map(|(name, _, at)| self.location(name, *at))
            .collect();
        let mut label = vec![self.label("thread", Some(&s.comm), 0)];
        if s.tgid != 0 {
            label.push(self.label("pid", None, s.tgid as i64));
        }
        if kind != Kind::OnCpu {
            label.push(self.label("class", Some(class_label(s.class)), 0));
        }
        self.p.sample.push(proto::Sample {
            location_id,
            value: vec![s.count as i64, s.ns as i64],
            label,
        });
    }
}

/// The profile of one kind, None when it has no stacks.
fn profile(
    stacks: &Stacks,
    kind: Kind,
    count: &str,
    time: &str,
    what: &str,
) -> Option<proto::Profile> {
    let samples = folded::samples(stacks, kind);
    if samples.is_empty() {
        return None;
    }
    let mut b = Builder::new(&stacks.files);
    let count_type = b.value_type(count, "count");
    let time_type = b.value_type(time, "nanoseconds");
    b.p.default_sample_type = time_type.r#type;
    b.p.sample_type = vec![count_type, time_type.clone()];
    if kind == Kind::OnCpu {
        b.p.period = stacks.sample_period_ns as i64;
    }
    b.p.period_type = Some(time_type);
    let comment = b.string(&format!("fsprof {}: {what}", env!("CARGO_PKG_VERSION")));
    b.p.comment = vec![comment];
    b.p.time_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    for s in &samples {
        b.sample(s, kind);
    }
    Some(b.p)
}

/// Writes `{stem}.{kind}.pb.gz` of each exported kind with stacks into `dir`; `what` (the
/// traced command) goes into each profile's comment. Returns "{kind}.pb.gz" → path.
/// File extension of a gzip-compressed profile.proto, as pprof tools name them.
pub const PPROF_EXT: &str = "pb.gz";

pub fn write_all(
    stacks: &Stacks,
    dir: &Path,
    stem: &str,
    what: &str,
) -> Result<BTreeMap<String, PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = BTreeMap::new();
    for (kind, count, time) in EXPORTED {
        let Some(p) = profile(stacks, kind, count, time, what) else {
            continue;
        };
        let path = dir.join(format!("{stem}.{}.{PPROF_EXT}", kind.file_stem()));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&p.encode_to_vec())?;
        fs::write(&path, gz.finish()?).with_context(|| format!("writing {}", path.display()))?;
        out.insert(format!("{}.{PPROF_EXT}", kind.file_stem()), path);
    }
    Ok(out)
}

/// NT_GNU_BUILD_ID, in hex, of an ELF file ("" without one).
fn elf_build_id(path: &Path) -> Option<String> {
    use object::Object;
    let file = fs::File::open(path).ok()?;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    elf.build_id().ok().flatten().map(hex)
}

/// The running kernel's build id, from its ELF notes in /sys/kernel/notes.
fn kernel_build_id() -> Option<String> {
    build_id_in_notes(&fs::read("/sys/kernel/notes").ok()?)
}

/// The GNU build id among ELF notes: each a header (name size, descriptor size, type),
/// then the name and the descriptor, each padded to 4 bytes.
fn build_id_in_notes(mut notes: &[u8]) -> Option<String> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |b: &[u8], i: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
    };
    let pad = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let (namesz, descsz, kind) = (
            word(notes, 0)? as usize,
            word(notes, 4)? as usize,
            word(notes, 8)?,
        );
        let desc_at = 12 + pad(namesz);
        let desc = notes.get(desc_at..desc_at + descsz)?;
        if kind == NT_GNU_BUILD_ID && notes.get(12..12 + namesz)? == b"GNU\0" {
            return Some(hex(desc));
        }
        notes = notes.get(desc_at + pad(descsz)..)?;
    }
    None
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::stacks::WeightedStack;

    #[test]
    fn build_id_is_found_among_other_notes() {
        let note = |name: &[u8], kind: u32, desc: &[u8]| {
            let mut v = Vec::new();
            v.extend((name.len() as u32).to_ne_bytes());
            v.extend((desc.len() as u32).to_ne_bytes());
            v.extend(kind.to_ne_bytes());
            v.extend(name);
            v.resize(v.len().div_ceil(4) * 4, 0);
            v.extend(desc);
            v.resize(v.len().div_ceil(4) * 4, 0);
            v
        };
        let mut notes = note(b"Xen\0", 1, &[1, 2, 3]);
        notes.extend(note(b"GNU\0", 3, &[0xab, 0xcd, 0x01]));
        assert_eq!(build_id_in_notes(&notes).as_deref(), Some("abcd01"));
        assert_eq!(build_id_in_notes(&notes[..20]), None);
    }

    #[test]
    fn one_location_per_place_and_samples_leaf_first() {
        let stack = |kernel: &[(&str, u64)], ns| WeightedStack {
            comm: "dd".into(),
            tgid: 7,
            kernel: kernel.iter().map(|k| k.0.to_string()).collect(),
            kernel_at: kernel.iter().map(|k| At::Kernel(k.1)).collect(),
            ns,
            count: 1,
            ..Default::default()
        };
        let stacks = Stacks {
            target: vec![
                stack(
                    &[
                        ("vfs_write", 0xffff_ffff_8100_0010),
                        ("ext4_write", 0xffff_ffff_8100_0020),
                    ],
                    3_000,
                ),
                stack(&[("vfs_write", 0xffff_ffff_8100_0010)], 2_000),
            ],
            ..Default::default()
        };
        let p = profile(&stacks, Kind::OnCpu, "samples", "cpu", "test").unwrap();
        // dd, vfs_write, ext4_write: three places, the thread's frame without a mapping.
        assert_eq!(p.location.len(), 3);
        assert_eq!(p.mapping.len(), 1);
        let name = |loc: u64| {
            let l = &p.location[loc as usize - 1];
            let f = &p.function[l.line[0].function_id as usize - 1];
            p.string_table[f.name as usize].clone()
        };
        let first: Vec<String> = p.sample[0].location_id.iter().map(|&l| name(l)).collect();
        assert_eq!(first, ["ext4_write", "vfs_write", "dd"]);
        assert_eq!(p.sample[0].value, [1, 3_000]);
        let total: i64 = p.sample.iter().map(|s| s.value[1]).sum();
        assert_eq!(total, 5_000);
        assert_eq!(p.string_table[0], "");
    }
}
