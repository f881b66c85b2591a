//! Far memory as a compute node sees it: the regions it holds (region
//! table), their free pages (far page heap), the manager session that hands
//! out more regions, and the traffic counters the benchmarks report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use remora_proto::{ComputeSession, RemoteError, RpcError};

use crate::error::RuntimeError;
use crate::far_page_heap::FarPageHeap;
use crate::region_table::RegionTable;
use crate::size_classes::PAGE_SIZE;

/// Counters of remote traffic.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    pub(crate) reads: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
}

/// Far memory as schemes see it: regions, free far pages and the way to get
/// more. Opaque outside the runtime.
pub struct FarMemory {
    pub(crate) session: Arc<ComputeSession>,
    pub(crate) regions: RegionTable,
    pub(crate) pages: FarPageHeap,
    pub(crate) traffic: Traffic,
    grow_lock: Mutex<()>,
    /// How long to keep asking the manager when it has no free region.
    pub(crate) patience: Duration,
}

impl FarMemory {
    pub(crate) fn new(session: Arc<ComputeSession>, regions: RegionTable, patience: Duration) -> Self {
        Self {
            session,
            regions,
            pages: FarPageHeap::default(),
            traffic: Traffic::default(),
            grow_lock: Mutex::new(()),
            patience,
        }
    }

    /// Takes `pages` far pages, asking the manager for another region when
    /// none has room (waiting up to `patience` while the pool is empty).
    pub(crate) fn alloc_pages(&self, pages: u32) -> Result<(u16, u32), RuntimeError> {
        if let Some(p) = self.pages.alloc(pages) {
            return Ok(p);
        }
        let _g = self.grow_lock.lock().unwrap_or_else(|p| p.into_inner());
        let start = Instant::now();
        loop {
            // Another thread may have grown the heap while we waited for the lock.
            if let Some(p) = self.pages.alloc(pages) {
                return Ok(p);
            }
            match self.session.alloc(1, false, &[]) {
                Ok(grants) => {
                    for g in grants {
                        let region_pages = u32::try_from(g.size / PAGE_SIZE as u64).unwrap_or(u32::MAX);
                        if (pages as u64) > region_pages as u64 {
                            return Err(RuntimeError::TooLarge {
                                size: pages as usize * PAGE_SIZE,
                            });
                        }
                        let idx = self.regions.add(g)?;
                        self.pages
                            .add_region(idx, region_pages.min(crate::pointer::MAX_FAR_PAGE + 1));
                        tracing::debug!("far memory grew to {} regions", self.regions.len());
                    }
                }
                Err(RpcError::Remote(RemoteError::NoCapacity { .. })) if start.elapsed() < self.patience => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(RpcError::Remote(RemoteError::NoCapacity { wanted, available })) => {
                    return Err(RuntimeError::FarMemoryExhausted(format!(
                        "manager has {available} free regions, wanted {wanted}"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Far bytes handed out to spans and not yet released.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.pages.used_pages() * PAGE_SIZE as u64
    }

    pub(crate) fn count_read(&self, bytes: usize) {
        self.traffic.reads.fetch_add(1, Ordering::Relaxed);
        self.traffic.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn count_write(&self, bytes: usize) {
        self.traffic.writes.fetch_add(1, Ordering::Relaxed);
        self.traffic.bytes_written.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}
