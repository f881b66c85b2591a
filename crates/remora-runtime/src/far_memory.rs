//! Far memory as a compute node sees it: the regions it holds (region
//! table), their free pages (far page heap), the manager session that hands
//! out more regions, and the traffic counters the benchmarks report.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use remora_proto::{FarBackend, NodeId};

use crate::detector::Detector;
use crate::far_page_heap::FarPageHeap;
use crate::region_table::RegionTable;
use crate::scheme::SpanAddr;
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
    /// How long to wait out far memory that is unreachable but not lost
    /// (a manager outage, leases lapsed, a stripe short of readable members)
    /// before failing with [`crate::RuntimeError::Unavailable`].
    outage_deadline: Duration,
    /// Suspected memory nodes and read latency (failure detection).
    detector: Detector,
    /// The runtime is shutting down: retry loops stop waiting.
    stopping: AtomicBool,
    /// Memory nodes the manager declared dead: they never serve again.
    dead: Mutex<HashSet<NodeId>>,
    /// Far spans a scheme wants written again elsewhere ([`FarMemory::restripe`]).
    restripe: Mutex<Restripe>,
}

/// Far spans to re-stripe, in order, each queued once.
#[derive(Default)]
struct Restripe {
    queue: std::collections::VecDeque<SpanAddr>,
    queued: HashSet<SpanAddr>,
    /// Spans brought back to be written again so far.
    done: u64,
}

impl FarMemory {
    pub(crate) fn new(backend: Arc<dyn FarBackend>, patience: Duration, outage_deadline: Duration) -> Self {
        let traffic = Arc::new(Traffic::default());
        Self {
            regions: RegionTable::new(Arc::clone(&backend), Arc::clone(&traffic)),
            backend,
            pages: FarPageHeap::default(),
            traffic,
            patience,
            outage_deadline,
            detector: Detector::default(),
            stopping: AtomicBool::new(false),
            dead: Mutex::new(HashSet::new()),
            restripe: Mutex::new(Restripe::default()),
        }
    }

    /// Asks the runtime to bring the far spans `spans` back and evict them
    /// again, so that they are written anew on live memory nodes: a
    /// scheme whose stripe group cannot be rebuilt in place re-stripes it
    /// so. A far span's name (its region index) never changes while it is
    /// far, so moving it to another group takes the compute node's heap.
    pub(crate) fn restripe(&self, spans: impl IntoIterator<Item = SpanAddr>) {
        let mut r = self.restripe.lock().unwrap_or_else(|p| p.into_inner());
        for s in spans {
            if r.queued.insert(s) {
                r.queue.push_back(s);
            }
        }
    }

    /// Up to `n` spans to re-stripe, oldest first.
    pub(crate) fn take_restripe(&self, n: usize) -> Vec<SpanAddr> {
        let mut r = self.restripe.lock().unwrap_or_else(|p| p.into_inner());
        let n = n.min(r.queue.len());
        let out: Vec<SpanAddr> = r.queue.drain(..n).collect();
        for s in &out {
            r.queued.remove(s);
        }
        out
    }

    /// `n` spans taken with [`FarMemory::take_restripe`] are local again,
    /// to be written anew by eviction.
    pub(crate) fn restriped(&self, n: usize) {
        self.restripe.lock().unwrap_or_else(|p| p.into_inner()).done += n as u64;
    }

    /// Spans waiting to be re-striped, and spans brought back so far.
    pub(crate) fn restripe_counts(&self) -> (usize, u64) {
        let r = self.restripe.lock().unwrap_or_else(|p| p.into_inner());
        (r.queue.len(), r.done)
    }

    /// How long to wait out far memory that is unreachable but not lost
    /// before an operation fails with [`crate::RuntimeError::Unavailable`].
    pub(crate) fn outage_deadline(&self) -> Duration {
        self.outage_deadline
    }

    /// The runtime is shutting down: every wait on far memory ends.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// The manager declared `node` dead: what only it held is lost.
    pub(crate) fn declare_dead(&self, node: NodeId) {
        self.dead.lock().unwrap_or_else(|p| p.into_inner()).insert(node);
    }

    /// Whether the manager declared `node` dead (unreachable is not dead).
    pub(crate) fn is_dead(&self, node: NodeId) -> bool {
        self.dead.lock().unwrap_or_else(|p| p.into_inner()).contains(&node)
    }

    /// Whether the runtime is shutting down.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
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
