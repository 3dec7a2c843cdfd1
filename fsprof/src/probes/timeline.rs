//! The timeline's consumer: drains the TIMELINE ring buffer while the target runs, on a
//! tokio runtime of its own thread, and reads the page cache's dirty bytes at each drain.
//! The kernel side wakes it only when the ring is half full; otherwise it drains on a
//! timer, so fsprof's own thread switches (which are recorded too) stay a few per second.

use std::{
    mem::size_of,
    thread::{self, JoinHandle},
    time::Duration,
};

use anyhow::{Context, Result};
use aya::maps::{MapData, RingBuf};
use fsprof_common::timeline::{
    TimelineBlock, TimelineBlocked, TimelineFork, TimelineHeader, TimelineKind, TimelineSpan,
    TimelineStack, TimelineSwitch, TimelineWaking,
};
use tokio::{io::unix::AsyncFd, sync::oneshot};

/// What the timeline streams besides the scheduler and the block layer.
#[derive(Clone, Copy, Debug)]
pub struct TimelineOptions {
    /// The target's syscalls at least this long become slices (0: every one).
    pub syscall_min_ns: u64,
    /// Take the kernel stack of every thread that blocks in D state, to name the function
    /// it blocked in (~2 µs a wait: fsprof's kernel time on the db step 26 % of its wall
    /// against 12 % without).
    pub blocked_functions: bool,
}

/// Syscalls this long or longer are on the timeline by default: the waits worth seeing,
/// not the hundreds of thousands of microsecond calls a tree walk makes.
pub const DEFAULT_SYSCALL_MIN: &str = "1ms";

/// One record of the stream, as the kernel wrote it.
#[derive(Clone, Copy, Debug)]
pub enum Record {
    Switch(TimelineSwitch),
    Waking(TimelineWaking),
    Fork(TimelineFork),
    Block(TimelineBlock),
    Span(TimelineSpan),
    Blocked(TimelineBlocked),
    Stack(TimelineStack),
}

impl Record {
    pub fn head(&self) -> &TimelineHeader {
        match self {
            Record::Switch(r) => &r.head,
            Record::Waking(r) => &r.head,
            Record::Fork(r) => &r.head,
            Record::Block(r) => &r.head,
            Record::Span(r) => &r.head,
            Record::Blocked(r) => &r.head,
            Record::Stack(r) => &r.head,
        }
    }

    /// Decodes one ring buffer record; None for a record of unknown kind or size.
    fn parse(bytes: &[u8]) -> Option<Record> {
        fn read<T: Copy>(b: &[u8]) -> Option<T> {
            // SAFETY: plain-data #[repr(C)] structs without padding, length checked.
            (b.len() >= size_of::<T>()).then(|| unsafe { b.as_ptr().cast::<T>().read_unaligned() })
        }
        let head: TimelineHeader = read(bytes)?;
        Some(match TimelineKind::from_u32(head.kind)? {
            TimelineKind::Switch => Record::Switch(read(bytes)?),
            TimelineKind::Waking => Record::Waking(read(bytes)?),
            TimelineKind::Fork => Record::Fork(read(bytes)?),
            TimelineKind::BlockIssue | TimelineKind::BlockComplete => Record::Block(read(bytes)?),
            TimelineKind::FsPair | TimelineKind::Syscall => Record::Span(read(bytes)?),
            TimelineKind::Blocked => Record::Blocked(read(bytes)?),
            TimelineKind::OffCpuStack => Record::Stack(read(bytes)?),
        })
    }
}

/// How often the consumer drains the ring when not woken.
const DRAIN_EVERY: Duration = Duration::from_millis(50);

/// What the consumer read: the records in the order each CPU wrote them, and how many it
/// could not decode (of a kind or size this fsprof does not know: a bug, shown).
#[derive(Default)]
pub struct Stream {
    pub records: Vec<Record>,
    pub undecoded: u64,
    /// The page cache's dirty and writeback bytes, read at every drain.
    pub dirty: Vec<Dirty>,
}

/// The page cache's dirty and writeback bytes at `ts` (CLOCK_MONOTONIC).
#[derive(Clone, Copy, Debug)]
pub struct Dirty {
    pub ts: u64,
    pub dirty: u64,
    pub writeback: u64,
}

impl Stream {
    /// Reads what the kernel wrote since the last drain, and the dirty pages now.
    fn drain(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            match Record::parse(&item) {
                Some(r) => self.records.push(r),
                None => self.undecoded += 1,
            }
        }
        if let Some((dirty, writeback)) = crate::os::dirty_bytes() {
            self.dirty.push(Dirty {
                ts: crate::os::monotonic_ns(),
                dirty,
                writeback,
            });
        }
    }
}

/// The running consumer; `finish` stops it and hands over what it read.
pub struct Consumer {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<Stream>>>,
}

impl Consumer {
    pub fn start(ring: RingBuf<MapData>) -> Result<Consumer> {
        let (stop, stopped) = oneshot::channel();
        let thread = thread::Builder::new()
            .name("fsprof-timeline".into())
            .spawn(move || consume(ring, stopped))
            .context("starting the timeline consumer")?;
        Ok(Consumer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops the consumer after a last drain.
    pub fn finish(mut self) -> Result<Stream> {
        self.stop.take().map(|s| s.send(()));
        let thread = self
            .thread
            .take()
            .context("timeline consumer already finished")?;
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("the timeline consumer panicked"))?
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.take().map(|s| s.send(()));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn consume(ring: RingBuf<MapData>, stopped: oneshot::Receiver<()>) -> Result<Stream> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the timeline's runtime")?;
    runtime.block_on(async move {
        // SAFETY: the RingBuf owns its map's fd, which stays open and the same until the
        // AsyncFd (which owns the RingBuf) is dropped.
        let mut ring = unsafe { AsyncFd::register(ring) }
            .map_err(|e| anyhow::anyhow!("polling the timeline ring: {e}"))?;
        let mut stream = Stream::default();
        let mut tick = tokio::time::interval(DRAIN_EVERY);
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = tick.tick() => stream.drain(ring.get_mut()),
                ready = ring.readable_mut() => {
                    let mut ready = ready?;
                    stream.drain(ready.get_inner_mut());
                    ready.clear_ready();
                }
            }
        }
        stream.drain(ring.get_mut());
        Ok(stream)
    })
}
