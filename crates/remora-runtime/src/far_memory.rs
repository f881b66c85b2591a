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
    backend: Arc<dyn FarBackend>,
    regions: RegionTable,
    pages: FarPageHeap,
    traffic: Arc<Traffic>,
    /// How long to keep asking the manager when it has no free region.
    patience: Duration,
    /// Suspected memory nodes and read latency (failure detection).
    detector: Detector,
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

    /// Where regions and connections come from.
    pub(crate) fn backend(&self) -> &Arc<dyn FarBackend> {
        &self.backend
    }

    /// The regions held, by region-table index.
    pub(crate) fn regions(&self) -> &RegionTable {
        &self.regions
    }

    /// Free and used far pages of every region held.
    pub(crate) fn pages(&self) -> &FarPageHeap {
        &self.pages
    }

    /// What crosses the wire, counted at the transport.
    pub(crate) fn traffic(&self) -> &Arc<Traffic> {
        &self.traffic
    }

    /// How long to keep asking the manager for a region, or waiting for a
    /// stripe to become readable again.
    pub(crate) fn patience(&self) -> Duration {
        self.patience
    }

    /// Suspects and latency bounds (failure detection).
    pub(crate) fn detector(&self) -> &Detector {
        &self.detector
    }

    /// Memory node `node` failed a request: read around it and place
    /// nothing new on it until the manager rules.
    pub(crate) fn suspect(&self, node: remora_proto::NodeId) {
        self.detector.suspects.suspect(node);
    }

    /// Whether `node` is suspected now.
    pub(crate) fn is_suspect(&self, node: remora_proto::NodeId) -> bool {
        self.detector.suspects.is_suspect(node)
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
