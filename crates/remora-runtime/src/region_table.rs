//! The region table (§3.3): region index → the far-memory region backing it
//! (its memory node and capability). Far pointer words name regions by this
//! 16-bit index rather than by the manager's global id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use remora_proto::{ConnOptions, MemNodeClient, RegionGrant};

use crate::error::RuntimeError;

/// One region this compute node holds.
pub(crate) struct FarRegion {
    /// Its grant from the manager (node, address, capability, size).
    pub(crate) grant: RegionGrant,
    /// The data-path connection to its memory node (shared by regions of that node).
    pub(crate) client: MemNodeClient,
}

/// All regions, by index.
pub(crate) struct RegionTable {
    regions: RwLock<Vec<Arc<FarRegion>>>,
    clients: Mutex<HashMap<String, MemNodeClient>>,
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
        let client = {
            let mut c = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            match c.get(&grant.addr) {
                Some(cl) if !cl.conn().is_broken() => cl.clone(),
                _ => {
                    let cl = MemNodeClient::connect(&grant.addr, self.opts)?;
                    c.insert(grant.addr.clone(), cl.clone());
                    cl
                }
            }
        };
        let mut r = self.regions.write().unwrap_or_else(|p| p.into_inner());
        let idx = u16::try_from(r.len()).map_err(|_| RuntimeError::FarMemoryExhausted("region table full".into()))?;
        r.push(Arc::new(FarRegion { grant, client }));
        Ok(idx)
    }

    /// The region at `idx`.
    pub(crate) fn get(&self, idx: u16) -> Arc<FarRegion> {
        Arc::clone(&self.regions.read().unwrap_or_else(|p| p.into_inner())[idx as usize])
    }

    /// Number of regions held.
    pub(crate) fn len(&self) -> usize {
        self.regions.read().unwrap_or_else(|p| p.into_inner()).len()
    }
}
