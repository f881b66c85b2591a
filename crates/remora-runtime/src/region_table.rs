//! The region table (§3.3): region index → the far-memory region backing it
//! (its memory node and capability). Far pointer words name regions by this
//! 16-bit index rather than by the manager's global id.
//!
//! Each memory node gets two connections, two lanes: swap-ins read on one,
//! eviction and everything else writes on the other. A memory node serves
//! each connection in order on its own thread, so on a single connection a
//! swap-in READ would queue behind every pipelined eviction WRITE sent
//! before it; on its own lane it is served at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use remora_proto::{ConnOptions, MemNodeClient, RegionGrant};

use crate::error::RuntimeError;

/// One region this compute node holds.
pub(crate) struct FarRegion {
    /// Its grant from the manager (node, address, capability, size).
    pub(crate) grant: RegionGrant,
    /// The data-path connection to its memory node for eviction and control
    /// (shared by regions of that node).
    pub(crate) client: MemNodeClient,
    /// The swap-in lane to the same node.
    pub(crate) reader: MemNodeClient,
}

/// Which connection to a memory node a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Lane {
    /// Swap-ins and degraded reads.
    Swap,
    /// Eviction writes, rebuilds and everything else.
    Evict,
}

/// All regions, by index.
pub(crate) struct RegionTable {
    regions: RwLock<Vec<Arc<FarRegion>>>,
    clients: Mutex<HashMap<(String, Lane), MemNodeClient>>,
    opts: ConnOptions,
}

impl RegionTable {
    pub(crate) fn new(opts: ConnOptions) -> Self {
        Self {
            regions: RwLock::new(Vec::new()),
            clients: Mutex::new(HashMap::new()),
            opts,
        }
    }

    /// Adds a granted region and returns its index.
    pub(crate) fn add(&self, grant: RegionGrant) -> Result<u16, RuntimeError> {
        let client = self.client_for(&grant.addr, Lane::Evict)?;
        let reader = self.client_for(&grant.addr, Lane::Swap)?;
        let mut r = self.regions.write().unwrap_or_else(|p| p.into_inner());
        let idx = u16::try_from(r.len()).map_err(|_| RuntimeError::FarMemoryExhausted("region table full".into()))?;
        r.push(Arc::new(FarRegion { grant, client, reader }));
        Ok(idx)
    }

    /// The region at `idx`.
    pub(crate) fn get(&self, idx: u16) -> Arc<FarRegion> {
        Arc::clone(&self.regions.read().unwrap_or_else(|p| p.into_inner())[idx as usize])
    }

    /// Points index `idx` at a new region (after its old node died and the
    /// region was rebuilt elsewhere). Far words keep naming `idx`.
    pub(crate) fn rebind(&self, idx: u16, grant: RegionGrant) -> Result<(), RuntimeError> {
        let client = self.client_for(&grant.addr, Lane::Evict)?;
        let reader = self.client_for(&grant.addr, Lane::Swap)?;
        let mut r = self.regions.write().unwrap_or_else(|p| p.into_inner());
        r[idx as usize] = Arc::new(FarRegion { grant, client, reader });
        Ok(())
    }

    fn client_for(&self, addr: &str, lane: Lane) -> Result<MemNodeClient, RuntimeError> {
        let mut c = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        match c.get(&(addr.to_string(), lane)) {
            Some(cl) if !cl.conn().is_broken() => Ok(cl.clone()),
            _ => {
                let cl = MemNodeClient::connect(addr, self.opts)?;
                c.insert((addr.to_string(), lane), cl.clone());
                Ok(cl)
            }
        }
    }

    /// A live connection to the node holding `idx` (reconnecting if the old
    /// one broke, e.g. after a transient failure).
    pub(crate) fn client(&self, idx: u16) -> Result<(Arc<FarRegion>, MemNodeClient), RuntimeError> {
        self.lane(idx, Lane::Evict)
    }

    /// As [`RegionTable::client`], on the swap-in lane.
    pub(crate) fn reader(&self, idx: u16) -> Result<(Arc<FarRegion>, MemNodeClient), RuntimeError> {
        self.lane(idx, Lane::Swap)
    }

    fn lane(&self, idx: u16, lane: Lane) -> Result<(Arc<FarRegion>, MemNodeClient), RuntimeError> {
        let r = self.get(idx);
        let own = match lane {
            Lane::Swap => &r.reader,
            Lane::Evict => &r.client,
        };
        if !own.conn().is_broken() {
            let c = own.clone();
            return Ok((r, c));
        }
        let c = self.client_for(&r.grant.addr, lane)?;
        Ok((r, c))
    }

    /// Number of regions held.
    pub(crate) fn len(&self) -> usize {
        self.regions.read().unwrap_or_else(|p| p.into_inner()).len()
    }
}
