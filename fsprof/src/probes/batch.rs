//! Reading a whole map in a few syscalls (BPF_MAP_LOOKUP_BATCH, Linux 5.6), which aya 0.14
//! does not offer: its lookups take a syscall an entry (and an iteration two), and reading
//! the per-CPU arrays that way (1,024 syscalls for SYSCALLS, 201 of 22 KB for DENSE_HISTS)
//! was most of the ~10 ms of collecting at the end of every trace.

use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Result, bail};
use aya::{
    Pod,
    maps::{Map, MapData},
};

/// `union bpf_attr` for the batch commands.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Entries asked for per call: a hash answers with whole buckets, and a bucket never
/// holds this many.
const CHUNK: u32 = 4096;
/// At most this much room for a call's values, reused through the walk: a buffer for all
/// of DENSE_HISTS (4.5 MB on 2 CPUs) cost more in page faults than the syscalls it saved.
const VALUES_ROOM: usize = 256 << 10;

/// Every entry of an array or hash map, made into an `A` by `f` from its key and values:
/// one per possible CPU for a per-CPU array, one otherwise. An entry's values are dropped
/// before the next is read (DENSE_HISTS holds 4.5 MB on 2 CPUs).
pub fn entries<K: Pod, V: Pod, A>(map: &Map, mut f: impl FnMut(K, Vec<V>) -> A) -> Result<Vec<A>> {
    let (data, per_cpu) = match map {
        Map::PerCpuArray(d) => (d, true),
        Map::Array(d) | Map::HashMap(d) => (d, false),
        _ => bail!("batch lookups read arrays and hashes only"),
    };
    let info = data.info()?;
    if (info.key_size() as usize, info.value_size() as usize) != (size_of::<K>(), size_of::<V>()) {
        bail!("map {:?}: key or value size differs", info.name_as_str());
    }
    let (cpus, stride) = match per_cpu {
        true => (super::possible_cpus()?, size_of::<V>().next_multiple_of(8)),
        false => (1, size_of::<V>()),
    };
    let chunk = (VALUES_ROOM / (stride * cpus)).clamp(1, CHUNK as usize) as u32;
    let mut batch = Batch::new(
        data,
        size_of::<K>(),
        stride * cpus,
        chunk.min(info.max_entries()),
    );
    let mut out = Vec::new();
    while let Some(n) = batch.next()? {
        for i in 0..n {
            let key = read::<K>(&batch.keys, i * size_of::<K>());
            let at = i * stride * cpus;
            let values = (0..cpus)
                .map(|c| read::<V>(&batch.values, at + c * stride))
                .collect();
            out.push(f(key, values));
        }
    }
    Ok(out)
}

fn read<T: Pod>(bytes: &[u8], at: usize) -> T {
    let b = &bytes[at..at + size_of::<T>()];
    // SAFETY: T is Pod (any bytes are a value) and `b` holds size_of::<T>() bytes.
    unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) }
}

/// One walk through a map, a chunk of entries at a time.
struct Batch<'a> {
    map: &'a MapData,
    keys: Vec<u8>,
    values: Vec<u8>,
    chunk: u32,
    /// Where the kernel left off (an array's last key, a hash's next bucket); None before
    /// the first call and after the last.
    token: Option<Vec<u8>>,
    started: bool,
}

impl<'a> Batch<'a> {
    fn new(map: &'a MapData, key_len: usize, value_len: usize, chunk: u32) -> Batch<'a> {
        Batch {
            map,
            keys: vec![0; key_len * chunk as usize],
            values: vec![0; value_len * chunk as usize],
            chunk,
            token: None,
            started: false,
        }
    }

    /// The entries of the next chunk now in `keys` and `values`; None at the end.
    fn next(&mut self) -> Result<Option<usize>> {
        if self.started && self.token.is_none() {
            return Ok(None);
        }
        self.started = true;
        let key_len = self.keys.len() / self.chunk as usize;
        let mut out_token = vec![0u8; key_len.max(8)];
        let mut attr = BatchAttr {
            in_batch: self.token.as_ref().map_or(0, |t| t.as_ptr() as u64),
            out_batch: out_token.as_mut_ptr() as u64,
            keys: self.keys.as_mut_ptr() as u64,
            values: self.values.as_mut_ptr() as u64,
            count: self.chunk,
            map_fd: self.map.fd().as_fd().as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // aya 0.14 has no batch call. SAFETY: `attr` is a bpf_attr prefix of the size
        // passed; its buffers hold `count` keys and values and a key-sized token each.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>() as u32,
            )
        };
        let err = std::io::Error::last_os_error();
        self.token = match (r, err.raw_os_error()) {
            (0, _) => Some(out_token),
            // The walk is over; `count` still says what this call copied.
            (_, Some(libc::ENOENT)) => None,
            _ => return Err(anyhow::Error::new(err).context("BPF_MAP_LOOKUP_BATCH")),
        };
        Ok(Some(attr.count as usize))
    }
}
