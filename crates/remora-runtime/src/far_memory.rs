//! Far memory as a compute node sees it: the regions it holds (region
//! table), their free pages (far page heap), the manager session that hands
//! out more regions, and the traffic counters the benchmarks report.

use std::sync::Arc;
use std::time::Duration;

use remora_proto::FarBackend;

use crate::detector::Detector;
use crate::far_page_heap::FarPageHeap;
use crate::region_table::RegionTable;
use crate::size_classes::PAGE_SIZE;
use crate::traffic::Traffic;

/// Far memory as schemes see it: regions, free far pages and the way to get
/// more. Opaque outside the runtime.
pub struct FarMemory {
    /// Where regions and connections come from (the manager, or an in-process cluster).
    pub(crate) backend: Arc<dyn FarBackend>,
    pub(crate) regions: RegionTable,
    pub(crate) pages: FarPageHeap,
    pub(crate) traffic: Arc<Traffic>,
    /// How long to keep asking the manager when it has no free region.
    pub(crate) patience: Duration,
    /// Suspected memory nodes and read latency (failure detection).
    pub(crate) detector: Detector,
}

impl FarMemory {
    pub(crate) fn new(backend: Arc<dyn FarBackend>, patience: Duration) -> Self {
        let traffic = Arc::new(Traffic::default());
        Self {
            regions: RegionTable::new(Arc::clone(&backend), Arc::clone(&traffic)),
            backend,
            pages: FarPageHeap::default(),
            traffic,
            patience,
            detector: Detector::default(),
        }
    }

    /// Far bytes handed out to spans and not yet released.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.pages.used_pages() * PAGE_SIZE as u64
    }

    /// Bytes of every region held from the manager, in use or not.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.regions.held().iter().map(|(_, g)| g.size).sum()
    }

    /// Hands a region we cannot use back to the manager, so an error path
    /// never leaks what the manager just granted.
    pub(crate) fn give_back(&self, region: remora_proto::RegionId) {
        if let Err(e) = self.backend.free(region) {
            tracing::warn!("giving back region {region}: {e}");
        }
    }
}
