//! The regions a memory node lends, and the capability check on each access.
//!
//! A region's bytes are allocated zeroed when it is first granted (the OS
//! backs untouched pages lazily, so a large idle capacity costs nothing) and
//! dropped when it is revoked, so no owner ever sees a previous owner's data.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use remora_proto::{Cap, ComputeId, RegionId, RemoteError, Rights, Token, TxnId};

/// Who may use a region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) owner: ComputeId,
    token: Token,
    read_only: Token,
    apply_delta: Token,
}

/// A spanset member that has been part of a transaction. Members never in
/// one have no entry: generation 0, nothing staged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemberState {
    pub(crate) len: u32,
    pub(crate) generation: u64,
    /// The transaction that has staged a change of it, if any.
    pub(crate) staged: Option<(ComputeId, TxnId)>,
}

/// A region's contents and grant, behind one lock.
#[derive(Debug, Default)]
pub(crate) struct RegionInner {
    pub(crate) mem: Vec<u8>,
    pub(crate) grant: Option<Grant>,
    /// Members with a generation or a staged change, by offset.
    pub(crate) members: BTreeMap<u64, MemberState>,
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
            apply_delta: token.derive_apply_delta(self.id),
        });
        g.members.clear();
    }

    /// Takes the region back and drops its memory; returns the old owner.
    pub(crate) fn revoke(&self) -> Option<ComputeId> {
        let mut g = self.write();
        g.mem = Vec::new();
        g.members.clear();
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
            // Opens only `check_apply`.
            Rights::ApplyDelta => false,
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

impl RegionInner {
    /// As [`RegionInner::check`] for staging a parity delta: the owner's
    /// capability or its apply-delta delegate.
    pub(crate) fn check_apply(
        &self,
        region: &Region,
        cap: &Cap,
        offset: u64,
        len: u64,
    ) -> Result<std::ops::Range<usize>, RemoteError> {
        match cap.rights {
            Rights::ApplyDelta => {
                let g = self
                    .grant
                    .as_ref()
                    .ok_or(RemoteError::BadCapability { region: region.id })?;
                if !g.apply_delta.ct_eq(&cap.token) {
                    return Err(RemoteError::BadCapability { region: region.id });
                }
                let rw = Cap {
                    rights: Rights::ReadWrite,
                    token: g.token,
                    ..*cap
                };
                self.check(region, &rw, true, offset, len)
            }
            _ => self.check(region, cap, true, offset, len),
        }
    }

    /// The owner of the region, if granted.
    pub(crate) fn owner(&self) -> Option<ComputeId> {
        self.grant.map(|g| g.owner)
    }

    /// The generation of the member at `offset` (0 if it never changed in place).
    pub(crate) fn generation(&self, offset: u64) -> u64 {
        self.members.get(&offset).map_or(0, |m| m.generation)
    }

    /// A plain write of `range` makes fresh members there: their generations
    /// restart at 0 and a change staged for them is superseded (its commit
    /// will be refused).
    pub(crate) fn wrote(&mut self, range: &std::ops::Range<usize>) {
        if self.members.is_empty() {
            return;
        }
        let (start, end) = (range.start as u64, range.end as u64);
        let gone: Vec<u64> = self
            .members
            .range(..end)
            .rev()
            .take_while(|(off, _)| **off + u64::from(remora_proto::frame::MAX_PAYLOAD_LEN) > start)
            .filter(|(off, m)| **off + u64::from(m.len) > start)
            .map(|(off, _)| *off)
            .collect();
        for off in gone {
            self.members.remove(&off);
        }
    }
}

/// All regions of this node, replaced wholesale when the node registers anew.
#[derive(Debug, Default)]
pub(crate) struct RegionTable {
    by_id: RwLock<HashMap<RegionId, Arc<Region>>>,
    /// Transactions staged on these regions.
    pub(crate) txns: crate::txn::Txns,
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
        drop(t);
        self.txns.clear();
    }

    /// Takes region `id` back, wiping it, and drops what its owner's
    /// transactions staged on it; returns the old owner.
    pub(crate) fn revoke(&self, id: RegionId) -> Result<Option<ComputeId>, RemoteError> {
        let owner = self.get(id)?.revoke();
        if let Some(o) = owner {
            self.txns.region_revoked(self, o, id);
        }
        Ok(owner)
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
