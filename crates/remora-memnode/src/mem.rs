//! A region's bytes, and the thread that maps them in ahead of use.
//!
//! Why: a region's memory is a fresh anonymous mapping, and the first write
//! to each 4 KiB page traps into the kernel to zero and map it. Without
//! help a memory node takes those traps on the data path, while a compute
//! node's eviction writes land: in `remora bench drain` the first scheme on
//! a cluster drained at 0.82–0.89 GB/s against 1.04–1.15 for a second
//! scheme writing into memory already mapped, and the profile put page
//! faults and page clearing at 70 % of the memory nodes' copy cost.
//!
//! Mapping a region in when it is granted (`MAP_POPULATE`) took the traps
//! off the data path but put 16 MiB of zeroing on the grant, which a
//! compute node waits for while it grows: ec-batch grows by six regions at
//! once and its drain fell from 0.96–1.07 to 0.78–0.87 GB/s. So a grant
//! returns at once and the [`Populator`] thread maps the region in behind
//! it, a chunk at a time (`MADV_POPULATE_WRITE`) under the region's read
//! lock: a write that comes first takes its page fault as before, and
//! none waits longer than one chunk. (Huge pages were tried first: with
//! `defrag` at `madvise` every fault compacted memory and the drain fell to
//! 0.35 GB/s.)

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;

use memmap2::{Advice, MmapMut};
use remora_proto::Epoch;

use crate::region::Region;

/// How much the populator maps in per hold of a region's read lock.
const CHUNK: usize = 1 << 20;

/// Zeroed memory of a fixed length (empty when the region is not granted).
#[derive(Debug, Default)]
pub(crate) struct RegionMem(Option<MmapMut>);

impl RegionMem {
    /// `len` zeroed bytes, mapped lazily. The kernel zeroes anonymous pages
    /// as it first maps them, so no byte of a previous owner can be seen.
    pub(crate) fn zeroed(len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Ok(Self(None));
        }
        Ok(Self(Some(MmapMut::map_anon(len)?)))
    }

    /// Maps `len` bytes from `offset` in now, writable, so that writes there
    /// take no page fault. An error (a kernel older than 5.14 has no
    /// `MADV_POPULATE_WRITE`) changes nothing: the pages fault in on use.
    fn populate(&self, offset: usize, len: usize) -> std::io::Result<()> {
        match &self.0 {
            Some(m) => m.advise_range(Advice::PopulateWrite, offset, len),
            None => Ok(()),
        }
    }
}

impl Deref for RegionMem {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl DerefMut for RegionMem {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or(&mut [])
    }
}

/// A region granted in `epoch`, to be mapped in.
type Job = (Arc<Region>, Epoch);

/// The thread that maps granted regions in (see the module docs). It ends
/// when the last [`PopulateQueue`] is dropped.
pub(crate) struct Populator {
    thread: thread::JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

/// Where grants queue their regions for the [`Populator`].
#[derive(Clone, Debug)]
pub(crate) struct PopulateQueue(Sender<Job>);

impl PopulateQueue {
    /// Queues `region`, just granted in `epoch`.
    pub(crate) fn push(&self, region: Arc<Region>, epoch: Epoch) {
        // A send fails only once the populator has stopped (shutdown): the
        // region then faults its pages in on use.
        let _ = self.0.send((region, epoch));
    }
}

impl Populator {
    /// Starts the thread; its queue is the second value.
    pub(crate) fn start() -> std::io::Result<(Self, PopulateQueue)> {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = thread::Builder::new()
            .name("memnode-populate".into())
            .spawn(move || run(&rx, &s))?;
        Ok((Self { thread, stop }, PopulateQueue(tx)))
    }

    /// Stops the thread, leaving what is still queued, and waits for it;
    /// every queue must be dropped first.
    pub(crate) fn join(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}

fn run(rx: &Receiver<Job>, stop: &AtomicBool) {
    while let Ok((region, epoch)) = rx.recv() {
        populate_region(&region, epoch, stop);
    }
}

/// Maps `region` in chunk by chunk while it stays granted in `epoch`.
fn populate_region(region: &Region, epoch: Epoch, stop: &AtomicBool) {
    let mut offset = 0;
    while !stop.load(Ordering::Acquire) {
        let g = region.read();
        if g.epoch != epoch || offset >= g.mem.len() {
            return;
        }
        let len = CHUNK.min(g.mem.len() - offset);
        if let Err(e) = g.mem.populate(offset, len) {
            tracing::debug!("cannot map region {} in ahead of use: {e}", region.id);
            return;
        }
        drop(g);
        offset += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_zeroed_and_keeps_what_is_written_around_a_populate() {
        let mut m = RegionMem::zeroed(4 << 20).unwrap();
        assert_eq!(m.len(), 4 << 20);
        m[5..9].copy_from_slice(b"abcd");
        m.populate(0, 2 << 20).unwrap();
        m.populate(2 << 20, 2 << 20).unwrap();
        assert_eq!(&m[5..9], b"abcd");
        assert!(m[9..].iter().all(|&b| b == 0));
        assert!(m[..5].iter().all(|&b| b == 0));
        assert!(RegionMem::zeroed(0).unwrap().is_empty());
        assert!(RegionMem::default().populate(0, 10).is_ok());
    }

    /// Resident kilobytes of the mapping that starts at `addr`, from
    /// `/proc/self/smaps`.
    fn resident_kib(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let head = format!("{addr:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head)).skip(1);
        let rss = lines.find(|l| l.starts_with("Rss:"))?;
        rss.split_whitespace().nth(1)?.parse().ok()
    }

    #[test]
    fn a_granted_region_is_mapped_in_behind_the_grant_and_a_regrant_starts_zeroed() {
        use crate::region::RegionTable;
        use remora_proto::{ComputeId, RegionId, Token};
        use std::time::{Duration, Instant};

        const SIZE: u64 = 8 << 20;
        let table = RegionTable::default();
        table.replace(&[RegionId(7)], SIZE);
        let (populator, queue) = Populator::start().unwrap();
        table.populate_through(queue);
        table.grant(RegionId(7), ComputeId(1), Token::random(), 1).unwrap();
        let region = table.get(RegionId(7)).unwrap();
        region.write().mem[100..104].copy_from_slice(b"data");
        let addr = region.read().mem.as_ptr() as usize;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let kib = resident_kib(addr).expect("the region's mapping is in smaps");
            if kib == SIZE >> 10 {
                break;
            }
            assert!(Instant::now() < deadline, "only {kib} KiB of {} mapped in", SIZE >> 10);
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(&region.read().mem[100..104], b"data");
        assert!(region.read().mem[104..].iter().all(|&b| b == 0));
        // The next owner gets fresh, zeroed memory.
        table.grant(RegionId(7), ComputeId(2), Token::random(), 2).unwrap();
        assert!(region.read().mem.iter().all(|&b| b == 0));
        table.stop_populating();
        populator.join();
    }
}
