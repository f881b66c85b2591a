//! The regions a memory node lends, and the capability check on each access.
//!
//! A region's bytes are allocated zeroed when it is first granted (the OS
//! backs untouched pages lazily, so a large idle capacity costs nothing) and
//! dropped when it is revoked, so no owner ever sees a previous owner's data.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use remora_proto::{Cap, ComputeId, RegionId, RemoteError, Rights, Token};

/// Who may use a region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) owner: ComputeId,
    token: Token,
    read_only: Token,
}

/// A region's contents and grant, behind one lock.
#[derive(Debug, Default)]
pub(crate) struct RegionInner {
    pub(crate) mem: Vec<u8>,
    pub(crate) grant: Option<Grant>,
}

/// One far-memory region.
#[derive(Debug)]
pub(crate) struct Region {
    pub(crate) id: RegionId,
    pub(crate) size: u64,
    inner: RwLock<RegionInner>,
}

impl Region {
    pub(crate) fn new(id: RegionId, size: u64) -> Self {
        Self {
            id,
            size,
            inner: RwLock::new(RegionInner::default()),
        }
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, RegionInner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, RegionInner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives the region to `owner`; its memory starts zeroed.
    pub(crate) fn grant(&self, owner: ComputeId, token: Token) {
        let mut g = self.write();
        if g.mem.len() as u64 != self.size {
            g.mem = vec![0u8; self.size as usize];
        }
        g.grant = Some(Grant {
            owner,
            token,
            read_only: token.derive_read_only(self.id),
        });
    }

    /// Takes the region back and drops its memory; returns the old owner.
    pub(crate) fn revoke(&self) -> Option<ComputeId> {
        let mut g = self.write();
        g.mem = Vec::new();
        g.grant.take().map(|g| g.owner)
    }

    pub(crate) fn is_granted(&self) -> bool {
        self.read().grant.is_some()
    }
}

impl RegionInner {
    /// Checks a capability and bounds; returns the byte range to touch.
    pub(crate) fn check(
        &self,
        region: &Region,
        cap: &Cap,
        write: bool,
        offset: u64,
        len: u64,
    ) -> Result<std::ops::Range<usize>, RemoteError> {
        let refused = RemoteError::BadCapability { region: region.id };
        let g = self.grant.as_ref().ok_or(refused.clone())?;
        let ok = match cap.rights {
            Rights::ReadWrite => g.token.ct_eq(&cap.token),
            Rights::ReadOnly => !write && g.read_only.ct_eq(&cap.token),
        };
        if !ok {
            return Err(refused);
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= region.size)
            .ok_or(RemoteError::OutOfBounds {
                region: region.id,
                offset,
                len,
                size: region.size,
            })?;
        Ok(offset as usize..end as usize)
    }
}

/// All regions of this node, replaced wholesale when the node registers anew.
#[derive(Debug, Default)]
pub(crate) struct RegionTable {
    by_id: RwLock<HashMap<RegionId, Arc<Region>>>,
}

impl RegionTable {
    pub(crate) fn get(&self, id: RegionId) -> Result<Arc<Region>, RemoteError> {
        self.by_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
            .ok_or(RemoteError::NoSuchRegion { region: id })
    }

    /// Installs a fresh set of regions (after registering), dropping the old ones.
    pub(crate) fn replace(&self, ids: &[RegionId], size: u64) {
        let mut t = self.by_id.write().unwrap_or_else(|p| p.into_inner());
        for r in t.values() {
            let _ = r.revoke();
        }
        *t = ids.iter().map(|&id| (id, Arc::new(Region::new(id, size)))).collect();
    }

    pub(crate) fn granted_count(&self) -> usize {
        self.by_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| r.is_granted())
            .count()
    }

    pub(crate) fn len(&self) -> usize {
        self.by_id.read().unwrap_or_else(|p| p.into_inner()).len()
    }
}
