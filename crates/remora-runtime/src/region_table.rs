//! The region table (§3.3): region index → the far-memory region backing it
//! (its memory node and capability). Far pointer words name regions by this
//! 16-bit index rather than by the manager's global id. A region given back
//! to the manager leaves its index vacant, and the next region added takes
//! it: no far word names a vacant index (nothing lives in a region that is
//! given back), so 16 bits last however long regions come and go.
//!
//! Each memory node gets two connections, two lanes: swap-ins read on one,
//! eviction and everything else writes on the other. A memory node serves
//! each connection in order on its own thread, so on a single connection a
//! swap-in READ would queue behind every pipelined eviction WRITE sent
//! before it; on its own lane it is served at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use remora_proto::{FarBackend, MemTransport, RegionGrant};

use crate::error::RuntimeError;
use crate::traffic::{Counted, Traffic};

/// A counted connection to a memory node.
pub(crate) type Link = Arc<dyn MemTransport>;

/// One region this compute node holds.
pub(crate) struct FarRegion {
    /// Its grant from the manager (node, address, capability, size).
    pub(crate) grant: RegionGrant,
    /// The data-path connection to its memory node for eviction and control
    /// (shared by regions of that node).
    pub(crate) client: Link,
    /// The swap-in lane to the same node.
    pub(crate) reader: Link,
}

/// Which connection to a memory node a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    /// Swap-ins and degraded reads.
    Swap,
    /// Eviction writes, rebuilds and everything else.
    Evict,
}

/// One index of the table.
struct Slot {
    region: Arc<FarRegion>,
    /// False once the region went back to the manager: the index is free
    /// for the next region (the stale entry answers late lookups harmlessly:
    /// the memory node refuses its capability).
    held: bool,
}

/// All regions, by index.
pub(crate) struct RegionTable {
    regions: RwLock<Vec<Slot>>,
    clients: Mutex<HashMap<(String, Lane), Link>>,
    backend: Arc<dyn FarBackend>,
    traffic: Arc<Traffic>,
}

impl RegionTable {
    pub(crate) fn new(backend: Arc<dyn FarBackend>, traffic: Arc<Traffic>) -> Self {
        Self {
            regions: RwLock::new(Vec::new()),
            clients: Mutex::new(HashMap::new()),
            backend,
            traffic,
        }
    }

    /// Adds a granted region and returns its index.
    pub(crate) fn add(&self, grant: RegionGrant) -> Result<u16, RuntimeError> {
        let client = self.client_for(&grant.addr, Lane::Evict)?;
        let reader = self.client_for(&grant.addr, Lane::Swap)?;
        let region = Arc::new(FarRegion { grant, client, reader });
        let mut r = self.regions.write().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = r.iter().position(|s| !s.held) {
            r[i] = Slot { region, held: true };
            return Ok(i as u16);
        }
        // The last index marks an empty position of a short stripe group.
        let idx = u16::try_from(r.len())
            .ok()
            .filter(|&i| i != crate::scheme::NO_REGION)
            .ok_or_else(|| RuntimeError::FarMemoryExhausted("region table full".into()))?;
        r.push(Slot { region, held: true });
        Ok(idx)
    }

    /// Leaves index `idx` vacant; returns the grant to give back (`None` if
    /// it was vacant already).
    pub(crate) fn vacate(&self, idx: u16) -> Option<RegionGrant> {
        let mut r = self.regions.write().unwrap_or_else(|p| p.into_inner());
        let slot = r.get_mut(idx as usize).filter(|s| s.held)?;
        slot.held = false;
        Some(slot.region.grant.clone())
    }

    /// The region at `idx`.
    pub(crate) fn get(&self, idx: u16) -> Arc<FarRegion> {
        Arc::clone(&self.regions.read().unwrap_or_else(|p| p.into_inner())[idx as usize].region)
    }

    /// Every region held now, by index.
    pub(crate) fn held(&self) -> Vec<(u16, RegionGrant)> {
        let r = self.regions.read().unwrap_or_else(|p| p.into_inner());
        r.iter()
            .enumerate()
            .filter(|(_, s)| s.held)
            .map(|(i, s)| (i as u16, s.region.grant.clone()))
            .collect()
    }

    /// Points index `idx` at a new region (after its old node died or
    /// began to drain, and the region was rebuilt elsewhere). Far words
    /// keep naming `idx`. Returns the old region's grant.
    pub(crate) fn rebind(&self, idx: u16, grant: RegionGrant) -> Result<RegionGrant, RuntimeError> {
        let client = self.client_for(&grant.addr, Lane::Evict)?;
        let reader = self.client_for(&grant.addr, Lane::Swap)?;
        let mut r = self.regions.write().unwrap_or_else(|p| p.into_inner());
        let old = std::mem::replace(
            &mut r[idx as usize],
            Slot {
                region: Arc::new(FarRegion { grant, client, reader }),
                held: true,
            },
        );
        Ok(old.region.grant.clone())
    }

    /// The shared connection to `addr` on `lane`, opened if it is missing
    /// or broken. The connect happens outside the table's lock: a node that
    /// is slow to answer must not stall every other region's lookups.
    fn client_for(&self, addr: &str, lane: Lane) -> Result<Link, RuntimeError> {
        let key = (addr.to_string(), lane);
        let live = |c: &HashMap<(String, Lane), Link>| c.get(&key).filter(|cl| !cl.is_broken()).cloned();
        if let Some(cl) = live(&self.clients.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(cl);
        }
        let fresh = Counted::wrap(self.backend.connect(addr)?, Arc::clone(&self.traffic), lane);
        let mut c = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        // Another thread may have connected meanwhile: keep one connection per lane.
        if let Some(cl) = live(&c) {
            return Ok(cl);
        }
        c.insert(key, Arc::clone(&fresh));
        Ok(fresh)
    }

    /// Breaks the shared connections to `addr` (a node declared dead):
    /// requests waiting on them fail now instead of at their timeouts, so a
    /// write stuck on a paused node is placed again at once.
    pub(crate) fn sever(&self, addr: &str) {
        let gone: Vec<Link> = {
            let mut c = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            [Lane::Swap, Lane::Evict]
                .into_iter()
                .filter_map(|lane| c.remove(&(addr.to_string(), lane)))
                .collect()
        };
        for link in gone {
            link.close();
        }
    }

    /// A fresh connection to `addr`, not shared (a long rebuild request
    /// must not hold up the lanes).
    pub(crate) fn connect(&self, addr: &str) -> Result<Link, RuntimeError> {
        Ok(Counted::wrap(
            self.backend.connect(addr)?,
            Arc::clone(&self.traffic),
            Lane::Evict,
        ))
    }

    /// A live connection to the node holding `idx` (reconnecting if the old
    /// one broke, e.g. after a transient failure).
    pub(crate) fn client(&self, idx: u16) -> Result<(Arc<FarRegion>, Link), RuntimeError> {
        self.lane(idx, Lane::Evict)
    }

    /// As [`RegionTable::client`], on the swap-in lane.
    pub(crate) fn reader(&self, idx: u16) -> Result<(Arc<FarRegion>, Link), RuntimeError> {
        self.lane(idx, Lane::Swap)
    }

    fn lane(&self, idx: u16, lane: Lane) -> Result<(Arc<FarRegion>, Link), RuntimeError> {
        let r = self.get(idx);
        let own = match lane {
            Lane::Swap => &r.reader,
            Lane::Evict => &r.client,
        };
        if !own.is_broken() {
            let c = Arc::clone(own);
            return Ok((r, c));
        }
        let c = self.client_for(&r.grant.addr, lane)?;
        Ok((r, c))
    }

    /// Number of regions held.
    pub(crate) fn len(&self) -> usize {
        let r = self.regions.read().unwrap_or_else(|p| p.into_inner());
        r.iter().filter(|s| s.held).count()
    }
}
