//! The regions a memory node lends, and the capability check on each access.
//!
//! A region's bytes are allocated zeroed when it is first granted (the OS
//! backs untouched pages lazily, so a large idle capacity costs nothing) and
//! dropped when it is revoked, so no owner ever sees a previous owner's data.
//!
//! **Epochs.** Each region remembers the epoch of its current assignment
//! (the manager's number, see `remora_proto::cap`). A grant moves it forward
//! and never back; a revoke moves it to the revoke's epoch. Every capability
//! check starts by comparing the request's epoch with it, so a request made
//! for an earlier owner (a zombie compute node, a late delta or rebuild read
//! a peer sends on its behalf) is refused with `StaleEpoch` whatever its
//! token, including while the region sits unowned between two owners.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::mem::{PopulateQueue, RegionMem};
use remora_proto::{Cap, ComputeId, Epoch, RegionId, RemoteError, Rights, Token, TxnId};

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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded value is replaced whole: a panic leaves nothing half done.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A region's contents and grant, behind one lock.
#[derive(Debug, Default)]
pub(crate) struct RegionInner {
    pub(crate) mem: RegionMem,
    pub(crate) grant: Option<Grant>,
    /// The epoch of the region's current assignment (0: never granted).
    pub(crate) epoch: Epoch,
    /// Members with a generation or a staged change, by offset.
    pub(crate) members: BTreeMap<u64, MemberState>,
    /// The longest member ever entered in `members`: a write at `start`
    /// can only overlap members from `start - widest` on, so it looks at
    /// those and not at every member below it.
    pub(crate) widest: u32,
}

/// One far-memory region.
#[derive(Debug)]
pub(crate) struct Region {
    pub(crate) id: RegionId,
    pub(crate) size: u64,
    inner: RwLock<RegionInner>,
    /// Requests refused for naming another epoch, and of those the parity
    /// deltas pushed by peers (apply-delta capabilities), for `Stats`.
    stale: AtomicU64,
    stale_deltas: AtomicU64,
}

impl Region {
    pub(crate) fn new(id: RegionId, size: u64) -> Self {
        Self {
            id,
            size,
            inner: RwLock::new(RegionInner::default()),
            stale: AtomicU64::new(0),
            stale_deltas: AtomicU64::new(0),
        }
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, RegionInner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, RegionInner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives the region to `owner` in assignment `epoch`; its memory starts
    /// zeroed. Returns the previous owner if the region was still granted
    /// (its revoke never arrived), whose staged transactions the caller
    /// drops. A repeat of the current grant changes nothing; a grant of an
    /// older epoch, or another grant of the current one, is refused.
    pub(crate) fn grant(&self, owner: ComputeId, token: Token, epoch: Epoch) -> Result<Option<ComputeId>, RemoteError> {
        let mut g = self.write();
        let stale = RemoteError::StaleEpoch {
            region: self.id,
            presented: epoch,
            current: g.epoch,
        };
        if epoch < g.epoch {
            return Err(stale);
        }
        if epoch == g.epoch {
            match g.grant {
                Some(old) if old.owner == owner && old.token.ct_eq(&token) => return Ok(None),
                Some(_) => return Err(stale),
                // The epoch came with a revoke, and no capability names a
                // revoke's epoch: this grant is the first to use it.
                None => {}
            }
        }
        // Always fresh memory: the previous owner's bytes may still be here
        // if its revoke was lost, and must never reach the new owner.
        g.mem = RegionMem::zeroed(self.size as usize).map_err(|e| {
            RemoteError::Internal(format!("cannot map {} bytes for region {}: {e}", self.size, self.id))
        })?;
        g.members.clear();
        g.epoch = epoch;
        let previous = g.grant.take().map(|p| p.owner);
        g.grant = Some(Grant {
            owner,
            token,
            read_only: token.derive_read_only(self.id, epoch),
            apply_delta: token.derive_apply_delta(self.id, epoch),
        });
        Ok(previous)
    }

    /// Takes the region back and drops its memory; the region enters
    /// `epoch` if that is newer. Returns the old owner.
    pub(crate) fn revoke(&self, epoch: Epoch) -> Option<ComputeId> {
        let mut g = self.write();
        g.mem = RegionMem::default();
        g.members.clear();
        g.epoch = g.epoch.max(epoch);
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
        self.check_epoch(region, cap)?;
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
    /// Refuses a capability issued in another assignment of the region.
    pub(crate) fn check_epoch(&self, region: &Region, cap: &Cap) -> Result<(), RemoteError> {
        if cap.epoch == self.epoch {
            Ok(())
        } else {
            region.stale.fetch_add(1, Ordering::Relaxed);
            if cap.rights == Rights::ApplyDelta {
                region.stale_deltas.fetch_add(1, Ordering::Relaxed);
            }
            Err(RemoteError::StaleEpoch {
                region: region.id,
                presented: cap.epoch,
                current: self.epoch,
            })
        }
    }

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
                self.check_epoch(region, cap)?;
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

    /// Enters (or updates) the member at `offset`.
    pub(crate) fn enter_member(&mut self, offset: u64, st: MemberState) {
        self.widest = self.widest.max(st.len);
        self.members.insert(offset, st);
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
            .take_while(|(off, _)| **off + u64::from(self.widest) > start)
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
    /// Where granted regions go to be mapped in ahead of use (a daemon's;
    /// none in an in-process node, whose pages fault in on use).
    populate: Mutex<Option<PopulateQueue>>,
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
            let _ = r.revoke(0);
        }
        *t = ids.iter().map(|&id| (id, Arc::new(Region::new(id, size)))).collect();
        drop(t);
        self.txns.clear();
    }

    /// Takes region `id` back, wiping it, and drops what its owner's
    /// transactions staged on it; the region enters `epoch` (if newer).
    /// Returns the old owner.
    pub(crate) fn revoke(&self, id: RegionId, epoch: Epoch) -> Result<Option<ComputeId>, RemoteError> {
        let owner = self.get(id)?.revoke(epoch);
        if let Some(o) = owner {
            self.txns.region_revoked(self, o, id);
        }
        Ok(owner)
    }

    /// Grants region `id` to `owner` in `epoch` (see [`Region::grant`]);
    /// what a previous owner still had staged on it is dropped.
    pub(crate) fn grant(&self, id: RegionId, owner: ComputeId, token: Token, epoch: Epoch) -> Result<(), RemoteError> {
        let region = self.get(id)?;
        if let Some(previous) = region.grant(owner, token, epoch)? {
            self.txns.region_revoked(self, previous, id);
        }
        if let Some(q) = lock(&self.populate).as_ref() {
            q.push(region, epoch);
        }
        Ok(())
    }

    /// Has granted regions mapped in ahead of use through `queue`.
    pub(crate) fn populate_through(&self, queue: PopulateQueue) {
        *lock(&self.populate) = Some(queue);
    }

    /// Stops queueing granted regions (the populator ends once it has
    /// seen the queue go).
    pub(crate) fn stop_populating(&self) {
        lock(&self.populate).take();
    }

    /// What this node holds, for `Stats`.
    pub(crate) fn stats(&self) -> remora_proto::MemNodeStats {
        remora_proto::MemNodeStats {
            regions: self.len() as u64,
            granted: self.granted_count() as u64,
            staged_txns: self.txns.staged() as u64,
            unanswered_writes: 0,
            deltas_in_flight: 0,
            stale_refused: self.sum(|r| r.stale.load(Ordering::Relaxed)),
            stale_deltas_refused: self.sum(|r| r.stale_deltas.load(Ordering::Relaxed)),
            peer: remora_proto::msg::PeerTraffic::default(),
        }
    }

    fn sum(&self, f: impl Fn(&Region) -> u64) -> u64 {
        self.by_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|r| f(r))
            .sum()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn owner_cap(token: Token, epoch: Epoch) -> Cap {
        Cap {
            region: RegionId(1),
            rights: Rights::ReadWrite,
            token,
            epoch,
        }
    }

    fn stale(presented: Epoch, current: Epoch) -> RemoteError {
        RemoteError::StaleEpoch {
            region: RegionId(1),
            presented,
            current,
        }
    }

    #[test]
    fn every_right_is_refused_in_another_epoch() {
        let r = Region::new(RegionId(1), 64);
        let t = Token([1; 16]);
        r.grant(ComputeId(1), t, 3).unwrap();
        let cap = owner_cap(t, 3);
        let g = r.read();
        assert!(g.check(&r, &cap, true, 0, 8).is_ok());
        assert!(g.check(&r, &cap.read_only(), false, 0, 8).is_ok());
        assert!(g.check_apply(&r, &cap.apply_delta(), 0, 8).is_ok());
        for epoch in [2, 4] {
            let other = Cap { epoch, ..cap };
            assert_eq!(g.check(&r, &other, true, 0, 8), Err(stale(epoch, 3)));
            assert_eq!(g.check(&r, &other.read_only(), false, 0, 8), Err(stale(epoch, 3)));
            assert_eq!(g.check_apply(&r, &other.apply_delta(), 0, 8), Err(stale(epoch, 3)));
            assert_eq!(g.check_apply(&r, &other, 0, 8), Err(stale(epoch, 3)));
        }
        drop(g);
        assert_eq!(r.stale.load(Ordering::Relaxed), 8, "refusals counted");
        assert_eq!(r.stale_deltas.load(Ordering::Relaxed), 2, "refused deltas counted");
        let g = r.read();
        // A delegate whose epoch is edited no longer matches its derivation.
        let moved = Cap {
            epoch: 3,
            ..owner_cap(t, 2).read_only()
        };
        assert_eq!(
            g.check(&r, &moved, false, 0, 8),
            Err(RemoteError::BadCapability { region: RegionId(1) })
        );
    }

    #[test]
    fn reassignment_refuses_the_old_owner_and_starts_zeroed() {
        let r = Region::new(RegionId(1), 64);
        let (ta, tb) = (Token([1; 16]), Token([2; 16]));
        r.grant(ComputeId(1), ta, 1).unwrap();
        r.write().mem[..4].copy_from_slice(b"AAAA");
        // Revoke (epoch 2): the old capability is stale even with no owner.
        assert_eq!(r.revoke(2), Some(ComputeId(1)));
        assert_eq!(r.read().check(&r, &owner_cap(ta, 1), false, 0, 4), Err(stale(1, 2)));
        // A grant may use the revoke's epoch, or a later one.
        r.grant(ComputeId(2), tb, 3).unwrap();
        let g = r.read();
        assert_eq!(g.check(&r, &owner_cap(ta, 1), false, 0, 4), Err(stale(1, 3)));
        let range = g.check(&r, &owner_cap(tb, 3), false, 0, 4).unwrap();
        assert_eq!(&g.mem[range], &[0; 4]);
    }

    #[test]
    fn grants_never_go_back_and_a_lost_revoke_still_wipes() {
        let r = Region::new(RegionId(1), 64);
        let (ta, tb) = (Token([1; 16]), Token([2; 16]));
        r.grant(ComputeId(1), ta, 5).unwrap();
        r.write().mem[..4].copy_from_slice(b"AAAA");
        // A repeat of the current grant is idempotent and keeps the bytes.
        assert_eq!(r.grant(ComputeId(1), ta, 5), Ok(None));
        assert_eq!(&r.read().mem[..4], b"AAAA");
        // Another grant of the same epoch, or an older one, is refused.
        assert_eq!(r.grant(ComputeId(2), tb, 5), Err(stale(5, 5)));
        assert_eq!(r.grant(ComputeId(2), tb, 4), Err(stale(4, 5)));
        // A newer grant whose revoke never came: the old owner is named
        // (its staged transactions go) and its bytes are gone.
        assert_eq!(r.grant(ComputeId(2), tb, 7), Ok(Some(ComputeId(1))));
        assert_eq!(&r.read().mem[..4], &[0; 4]);
        // A revoke never moves the epoch back.
        r.revoke(6);
        assert_eq!(r.read().epoch, 7);
    }

    #[test]
    fn a_write_supersedes_exactly_the_members_it_overlaps() {
        let mut g = RegionInner::default();
        let member = |len| MemberState {
            len,
            generation: 1,
            staged: None,
        };
        // Many short members below a long one: a write near the top must
        // not miss the long one that reaches it.
        for i in 0..100u64 {
            g.enter_member(i * 8, member(8));
        }
        g.enter_member(1000, member(4096));
        g.enter_member(8000, member(8));
        let offsets = |g: &RegionInner| g.members.keys().copied().collect::<Vec<_>>();
        let before = offsets(&g);
        g.wrote(&(5096..5100)); // just past the long member's end
        g.wrote(&(800..1000)); // between the short ones and the long one
        assert_eq!(offsets(&g), before, "nothing overlapped");
        g.wrote(&(5095..5096)); // the long member's last byte
        assert!(!g.members.contains_key(&1000));
        g.wrote(&(15..17)); // the ends of members 8 and 16
        assert!(!g.members.contains_key(&8) && !g.members.contains_key(&16));
        assert!(g.members.contains_key(&0) && g.members.contains_key(&24));
        g.wrote(&(7990..8001));
        assert!(!g.members.contains_key(&8000));
        assert_eq!(g.members.len(), 98);
    }
}
