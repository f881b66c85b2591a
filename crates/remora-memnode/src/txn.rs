//! Transactions on spanset members: the memory-node half of in-place parity
//! (paper §3.4: remote compaction) and of ec-2pc writes.
//!
//! A compute node changes members of a spanset in place with two-phase
//! commit. `prepare` checks one change and stages it without touching a
//! byte; `commit` applies everything a transaction staged on this node at
//! once; `abort` drops it. A data node computes `delta = new xor old` next to
//! the data, so two spans never cross the network to make one delta, and
//! either returns it (the compute node combines the parity updates: EC-Batch
//! Local) or multiplies it by each parity coefficient and stages it on the
//! parity nodes itself (EC-Batch Remote), with the apply-delta capability
//! the owner delegated.
//!
//! **Generations** (see `remora_proto::msg::Member`) make every change
//! conditional: a prepare names the generation each member holds, a commit
//! moves it one up, and anything naming an older one is refused. A member is
//! staged by at most one transaction at a time; several deltas for one parity
//! member under one transaction add up. A plain write of a member's range
//! supersedes what was staged for it, and a revoke drops every transaction
//! of the region's owner that touched the region.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use remora_ec::Codec;
use remora_proto::msg::{DeltaTarget, MAX_PREPARE_MANY, Member};
use remora_proto::{Cap, ComputeId, MemTransport, RegionId, RemoteError, Rights, TxnId, TxnOp};

use crate::peer_traffic::PeerCounters;
use crate::region::{MemberState, RegionTable};

/// How many committed transactions a node remembers, so a retried commit
/// whose first answer was lost is answered `Committed` again.
const REMEMBER_COMMITTED: usize = 4096;

/// One staged change of a member.
#[derive(Debug)]
enum Staged {
    /// The member becomes these bytes.
    Replace {
        region: RegionId,
        offset: u64,
        generation: u64,
        bytes: Vec<u8>,
    },
    /// These bytes are xored into the member.
    Xor {
        region: RegionId,
        offset: u64,
        generation: u64,
        delta: Vec<u8>,
    },
}

impl Staged {
    fn at(&self) -> (RegionId, u64, u64, usize) {
        match self {
            Staged::Replace {
                region,
                offset,
                generation,
                bytes,
            } => (*region, *offset, *generation, bytes.len()),
            Staged::Xor {
                region,
                offset,
                generation,
                delta,
            } => (*region, *offset, *generation, delta.len()),
        }
    }
}

/// The staged transactions of one memory node.
#[derive(Debug, Default)]
pub(crate) struct Txns {
    inner: Mutex<TxnsInner>,
}

#[derive(Debug, Default)]
struct TxnsInner {
    staged: HashMap<(ComputeId, TxnId), Vec<Staged>>,
    committed: VecDeque<(ComputeId, TxnId)>,
}

fn bad(msg: impl Into<String>) -> RemoteError {
    RemoteError::BadRequest(msg.into())
}

/// What a transaction request needs from its node.
pub(crate) struct TxnCtx<'a, P> {
    pub(crate) regions: &'a RegionTable,
    /// Reaches a peer memory node (TCP, or the in-process cluster).
    pub(crate) peer: P,
    pub(crate) counters: &'a PeerCounters,
}

impl<P> TxnCtx<'_, P>
where
    P: Fn(&str) -> Result<Arc<dyn MemTransport>, RemoteError>,
{
    /// Phase one: checks `op` and stages it under `txn`. Returns the delta
    /// when the op asks for it.
    pub(crate) fn prepare(&self, txn: TxnId, op: &TxnOp, payload: &[u8]) -> Result<Option<Vec<u8>>, RemoteError> {
        match op {
            TxnOp::Apply { to } => {
                if payload.len() != to.len as usize {
                    return Err(bad(format!(
                        "a delta of {} bytes for a member of {}",
                        payload.len(),
                        to.len
                    )));
                }
                self.stage_member(txn, to, true, |_| {
                    Ok(Staged::Xor {
                        region: to.cap.region,
                        offset: to.offset,
                        generation: to.generation,
                        delta: payload.to_vec(),
                    })
                })?;
                self.counters.staged_delta(to.cap.rights, payload.len() as u64);
                Ok(None)
            }
            TxnOp::Move { .. } | TxnOp::Put { .. } => {
                let (to, new, return_delta, targets) = self.replacement(op, payload)?;
                self.stage_replace(txn, to, new, return_delta, targets)
            }
        }
    }

    /// What a replacing op (`Move`, `Put`) stages: the member, its new
    /// bytes (read here, or the payload), whether the delta goes back, and
    /// the delta's targets.
    fn replacement<'o>(&self, op: &'o TxnOp, payload: &[u8]) -> Result<Replacement<'o>, RemoteError> {
        match op {
            TxnOp::Move {
                to,
                from_cap,
                from,
                return_delta,
                targets,
            } => Ok((to, self.read_owned(from_cap, *from, to.len)?, *return_delta, targets)),
            TxnOp::Put {
                to,
                return_delta,
                targets,
            } => {
                if payload.len() != to.len as usize {
                    return Err(bad(format!("{} new bytes for a member of {}", payload.len(), to.len)));
                }
                Ok((to, payload.to_vec(), *return_delta, targets))
            }
            TxnOp::Apply { .. } => Err(bad("a delta replaces nothing")),
        }
    }

    /// Phase one of several ops at once (see `MemRequest::PrepareMany`):
    /// stages them in order, then sends the delta shares of all of them,
    /// one request per peer, all in flight at once. Returns the deltas
    /// asked for, one after another. On a refusal, the replacements it
    /// staged are taken back (deltas staged for a parity member may add up
    /// with other requests' under the transaction: its abort drops them).
    pub(crate) fn prepare_many(&self, txn: TxnId, ops: &[TxnOp], payload: &[u8]) -> Result<Vec<u8>, RemoteError> {
        if ops.is_empty() || ops.len() > MAX_PREPARE_MANY {
            return Err(bad(format!(
                "{} ops in one PrepareMany (1 to {MAX_PREPARE_MANY})",
                ops.len()
            )));
        }
        let carried = |op: &TxnOp| carried(op) as usize;
        let need: usize = ops.iter().map(carried).sum();
        if need != payload.len() {
            return Err(bad(format!(
                "ops carrying {need} bytes with a payload of {}",
                payload.len()
            )));
        }
        let mut rest = payload;
        let mut out = Vec::new();
        let mut mine: Vec<(ComputeId, RegionId, u64)> = Vec::new();
        let mut shares = Shares::default();
        let staged = (|| -> Result<(), RemoteError> {
            for op in ops {
                let (bytes, r) = rest.split_at(carried(op));
                rest = r;
                if let TxnOp::Apply { .. } = op {
                    self.prepare(txn, op, bytes)?;
                    continue;
                }
                let (to, new, return_delta, targets) = self.replacement(op, bytes)?;
                let (owner, delta) = self.stage_local(txn, to, new, return_delta || !targets.is_empty())?;
                mine.push((owner, to.cap.region, to.offset));
                shares.add(&delta, targets)?;
                if return_delta {
                    out.extend_from_slice(&delta);
                }
            }
            self.send_grouped(txn, shares)
        })();
        if let Err(e) = staged {
            for (owner, region, offset) in mine {
                self.unstage(owner, txn, region, offset);
            }
            return Err(e);
        }
        Ok(out)
    }

    /// Sends each peer the shares meant for it as one request, all in
    /// flight before any is waited for.
    fn send_grouped(&self, txn: TxnId, shares: Shares) -> Result<(), RemoteError> {
        if shares.by_peer.is_empty() {
            return Ok(());
        }
        let _in_flight = self.counters.deltas_sent(shares.count);
        let mut sent = Vec::with_capacity(shares.by_peer.len());
        for (addr, ops, bytes) in shares.by_peer {
            let conn = (self.peer)(&addr)?;
            let ticket = conn
                .send_prepare_many(txn, ops, &[&bytes])
                .map_err(|e| peer_err(&addr, e))?;
            sent.push((conn, ticket, addr));
        }
        let mut first_err = None;
        for (conn, ticket, addr) in sent {
            if let Err(e) = conn.wait_prepare(ticket, None) {
                first_err.get_or_insert(peer_err(&addr, e));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Stages "member `to` becomes `new`", then sends each target its share
    /// of the delta; undoes its own staging if a target refuses.
    fn stage_replace(
        &self,
        txn: TxnId,
        to: &Member,
        new: Vec<u8>,
        return_delta: bool,
        targets: &[DeltaTarget],
    ) -> Result<Option<Vec<u8>>, RemoteError> {
        let (owner, delta) = self.stage_local(txn, to, new, return_delta || !targets.is_empty())?;
        if let Err(e) = self.send_shares(txn, &delta, targets) {
            self.unstage(owner, txn, to.cap.region, to.offset);
            return Err(e);
        }
        Ok(return_delta.then_some(delta))
    }

    /// Stages "member `to` becomes `new`" here; returns the region's owner
    /// and, when `want_delta`, the delta `new xor old` (else empty).
    fn stage_local(
        &self,
        txn: TxnId,
        to: &Member,
        new: Vec<u8>,
        want_delta: bool,
    ) -> Result<(ComputeId, Vec<u8>), RemoteError> {
        let mut delta = Vec::new();
        let owner = self.stage_member(txn, to, false, |mem| {
            if want_delta {
                delta = new.clone();
                remora_ec::xor_into(&mut delta, mem).map_err(|e| RemoteError::Internal(e.to_string()))?;
            }
            Ok(Staged::Replace {
                region: to.cap.region,
                offset: to.offset,
                generation: to.generation,
                bytes: new,
            })
        })?;
        Ok((owner, delta))
    }

    /// Stages `A_ij · delta` on each target, all sent before any is waited for.
    fn send_shares(&self, txn: TxnId, delta: &[u8], targets: &[DeltaTarget]) -> Result<(), RemoteError> {
        if targets.is_empty() {
            return Ok(());
        }
        let _in_flight = self.counters.deltas_sent(targets.len() as u64);
        let mut sent = Vec::with_capacity(targets.len());
        for t in targets {
            if t.member.len as usize != delta.len() {
                return Err(bad("a delta target's length differs from the member's"));
            }
            let mut share = vec![0u8; delta.len()];
            scale(t.coef, delta, &mut share)?;
            let conn = (self.peer)(&t.addr)?;
            let ticket = conn
                .send_prepare(txn, TxnOp::Apply { to: t.member }, &share)
                .map_err(|e| peer_err(&t.addr, e))?;
            sent.push((conn, ticket, &t.addr));
        }
        let mut first_err = None;
        for (conn, ticket, addr) in sent {
            if let Err(e) = conn.wait_prepare(ticket, None) {
                first_err.get_or_insert(peer_err(addr, e));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Checks member `to` (capability, bounds, generation, no other
    /// transaction) under its region's lock and stages what `make` builds
    /// from its current bytes. Returns the region's owner.
    fn stage_member(
        &self,
        txn: TxnId,
        to: &Member,
        apply: bool,
        make: impl FnOnce(&[u8]) -> Result<Staged, RemoteError>,
    ) -> Result<ComputeId, RemoteError> {
        let region = self.regions.get(to.cap.region)?;
        let mut g = region.write();
        let range = if apply {
            g.check_apply(&region, &to.cap, to.offset, u64::from(to.len))?
        } else {
            g.check(&region, &to.cap, true, to.offset, u64::from(to.len))?
        };
        let owner = g.owner().ok_or(RemoteError::BadCapability { region: region.id })?;
        let key = (owner, txn);
        let st = g.members.get(&to.offset).copied().unwrap_or(MemberState {
            len: to.len,
            generation: 0,
            staged: None,
        });
        if st.len != to.len {
            return Err(bad(format!(
                "member at {} has {} bytes, not {}",
                to.offset, st.len, to.len
            )));
        }
        if st.generation != to.generation {
            return Err(RemoteError::StaleGeneration {
                region: region.id,
                offset: to.offset,
                expected: to.generation,
                found: st.generation,
            });
        }
        match st.staged {
            Some(k) if k != key || !apply => {
                return Err(RemoteError::TxnConflict {
                    region: region.id,
                    offset: to.offset,
                });
            }
            _ => {}
        }
        let staged = make(&g.mem[range])?;
        g.enter_member(
            to.offset,
            MemberState {
                staged: Some(key),
                ..st
            },
        );
        drop(g);
        let mut t = self.regions.txns.inner.lock().unwrap_or_else(|p| p.into_inner());
        let ops = t.staged.entry(key).or_default();
        match (
            staged,
            ops.iter_mut()
                .find(|s| s.at().0 == to.cap.region && s.at().1 == to.offset),
        ) {
            (Staged::Xor { delta, .. }, Some(Staged::Xor { delta: sum, .. })) => {
                remora_ec::xor_into(sum, &delta).map_err(|e| RemoteError::Internal(e.to_string()))?;
            }
            (staged, None) => ops.push(staged),
            (_, Some(_)) => return Err(bad("a member staged twice in one transaction")),
        }
        drop(t);
        // A revoke (or a grant to a new owner) that ran between the two
        // locks above found nothing to drop yet: look again, or what was
        // staged for an owner that lost the region would stay forever.
        let still_ours = region
            .read()
            .members
            .get(&to.offset)
            .is_some_and(|m| m.staged == Some(key));
        if !still_ours {
            self.unstage(owner, txn, region.id, to.offset);
            let current = region.read().epoch;
            return Err(if current != to.cap.epoch {
                RemoteError::StaleEpoch {
                    region: region.id,
                    presented: to.cap.epoch,
                    current,
                }
            } else {
                // A plain write of the member superseded it meanwhile.
                RemoteError::TxnConflict {
                    region: region.id,
                    offset: to.offset,
                }
            });
        }
        Ok(owner)
    }

    /// Copies `len` bytes at `offset` of an owned region.
    fn read_owned(&self, cap: &Cap, offset: u64, len: u32) -> Result<Vec<u8>, RemoteError> {
        let region = self.regions.get(cap.region)?;
        let g = region.read();
        if cap.rights != Rights::ReadWrite {
            return Err(RemoteError::BadCapability { region: region.id });
        }
        let range = g.check(&region, cap, false, offset, u64::from(len))?;
        Ok(g.mem[range].to_vec())
    }

    /// Takes back one member's staging (its delta targets refused).
    fn unstage(&self, owner: ComputeId, txn: TxnId, region_id: RegionId, offset: u64) {
        let mut t = self.regions.txns.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ops) = t.staged.get_mut(&(owner, txn)) {
            ops.retain(|s| (s.at().0, s.at().1) != (region_id, offset));
            if ops.is_empty() {
                t.staged.remove(&(owner, txn));
            }
        }
        drop(t);
        clear_staged(self.regions, (owner, txn), region_id, offset);
    }

    /// The owner `cap` proves: an owner capability of a region here.
    fn owner_of(&self, cap: &Cap) -> Result<ComputeId, RemoteError> {
        let region = self.regions.get(cap.region)?;
        let g = region.read();
        if cap.rights != Rights::ReadWrite {
            return Err(RemoteError::BadCapability { region: region.id });
        }
        g.check(&region, cap, true, 0, 0)?;
        g.owner().ok_or(RemoteError::BadCapability { region: region.id })
    }

    /// Phase two: applies everything `txn` staged here, or nothing if any
    /// member changed since (then the transaction is dropped).
    pub(crate) fn commit(&self, cap: &Cap, txn: TxnId) -> Result<(), RemoteError> {
        let owner = self.owner_of(cap)?;
        let key = (owner, txn);
        let mut t = self.regions.txns.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(ops) = t.staged.remove(&key) else {
            return if t.committed.contains(&key) {
                Ok(())
            } else {
                Err(RemoteError::UnknownTxn(txn.0))
            };
        };
        // Held across both passes: no prepare, commit or abort interleaves,
        // and region locks are taken one at a time, after it.
        let still = |s: &Staged| -> Result<(), RemoteError> {
            let (rid, offset, generation, _) = s.at();
            let region = self.regions.get(rid)?;
            let g = region.read();
            match g.members.get(&offset) {
                Some(m) if m.staged == Some(key) && m.generation == generation && g.owner() == Some(owner) => Ok(()),
                Some(m) if m.generation != generation => Err(RemoteError::StaleGeneration {
                    region: rid,
                    offset,
                    expected: generation,
                    found: m.generation,
                }),
                _ => Err(RemoteError::UnknownTxn(txn.0)),
            }
        };
        if let Err(e) = ops.iter().try_for_each(still) {
            drop(t);
            for s in &ops {
                let (rid, offset, _, _) = s.at();
                clear_staged(self.regions, key, rid, offset);
            }
            return Err(e);
        }
        for s in &ops {
            let (rid, offset, _, len) = s.at();
            let region = self.regions.get(rid)?;
            let mut g = region.write();
            // A revoke between the passes (it does not take the transactions'
            // lock) dropped the region's memory and members: nothing is left
            // there to apply to, and indexing the empty memory would panic.
            if g.members.get(&offset).is_none_or(|m| m.staged != Some(key)) {
                continue;
            }
            let range = offset as usize..offset as usize + len;
            match s {
                Staged::Replace { bytes, .. } => g.mem[range].copy_from_slice(bytes),
                Staged::Xor { delta, .. } => {
                    remora_ec::xor_into(&mut g.mem[range], delta).map_err(|e| RemoteError::Internal(e.to_string()))?
                }
            }
            if let Some(m) = g.members.get_mut(&offset) {
                m.generation += 1;
                m.staged = None;
            }
        }
        if t.committed.len() == REMEMBER_COMMITTED {
            t.committed.pop_front();
        }
        t.committed.push_back(key);
        Ok(())
    }

    /// Drops what `txn` staged here (nothing staged is not an error).
    pub(crate) fn abort(&self, cap: &Cap, txn: TxnId) -> Result<(), RemoteError> {
        let owner = self.owner_of(cap)?;
        let ops = self
            .regions
            .txns
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .staged
            .remove(&(owner, txn));
        for s in ops.iter().flatten() {
            let (rid, offset, _, _) = s.at();
            clear_staged(self.regions, (owner, txn), rid, offset);
        }
        Ok(())
    }

    /// Reads a member and its generation.
    pub(crate) fn read_member(&self, cap: &Cap, offset: u64, len: u32) -> Result<(u64, Vec<u8>), RemoteError> {
        let region = self.regions.get(cap.region)?;
        let g = region.read();
        let range = g.check(&region, cap, false, offset, u64::from(len))?;
        Ok((g.generation(offset), g.mem[range].to_vec()))
    }
}

impl Txns {
    /// Drops every transaction of `owner` that staged a change in `region`
    /// (called when the region is revoked: its prepared state goes with it).
    pub(crate) fn region_revoked(&self, regions: &RegionTable, owner: ComputeId, region: RegionId) {
        let mut t = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let doomed: Vec<(ComputeId, TxnId)> = t
            .staged
            .iter()
            .filter(|(k, ops)| k.0 == owner && ops.iter().any(|s| s.at().0 == region))
            .map(|(k, _)| *k)
            .collect();
        for key in doomed {
            if let Some(ops) = t.staged.remove(&key) {
                for s in &ops {
                    let (rid, offset, _, _) = s.at();
                    clear_staged(regions, key, rid, offset);
                }
            }
        }
    }

    /// Forgets everything (the node registered anew: all regions are fresh).
    pub(crate) fn clear(&self) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = TxnsInner::default();
    }

    /// Transactions staged now (for tests and status).
    pub(crate) fn staged(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).staged.len()
    }
}

/// Clears a member's staged mark if `key` still holds it.
fn clear_staged(regions: &RegionTable, key: (ComputeId, TxnId), region: RegionId, offset: u64) {
    if let Ok(r) = regions.get(region) {
        let mut g = r.write();
        if let Some(m) = g.members.get_mut(&offset) {
            if m.staged == Some(key) {
                m.staged = None;
            }
        }
    }
}

/// A replacing op's member, new bytes, whether its delta goes back, and the
/// delta's targets.
type Replacement<'o> = (&'o Member, Vec<u8>, bool, &'o [DeltaTarget]);

/// The payload bytes `op` carries: a delta or the new bytes (a move reads
/// its bytes here).
pub(crate) fn carried(op: &TxnOp) -> u32 {
    match op {
        TxnOp::Apply { to } | TxnOp::Put { to, .. } => to.len,
        TxnOp::Move { .. } => 0,
    }
}

/// Delta shares gathered for several ops, grouped by the peer they go to.
#[derive(Default)]
struct Shares {
    /// Per peer address: its `Apply` ops and their shares, one after another.
    by_peer: Vec<(String, Vec<TxnOp>, Vec<u8>)>,
    count: u64,
}

impl Shares {
    /// Adds `A_ij · delta` for each target.
    fn add(&mut self, delta: &[u8], targets: &[DeltaTarget]) -> Result<(), RemoteError> {
        for t in targets {
            if t.member.len as usize != delta.len() {
                return Err(bad("a delta target's length differs from the member's"));
            }
            let i = match self.by_peer.iter().position(|(a, _, _)| *a == t.addr) {
                Some(i) => i,
                None => {
                    self.by_peer.push((t.addr.clone(), Vec::new(), Vec::new()));
                    self.by_peer.len() - 1
                }
            };
            let (_, ops, bytes) = &mut self.by_peer[i];
            let at = bytes.len();
            bytes.resize(at + delta.len(), 0);
            scale(t.coef, delta, &mut bytes[at..])?;
            ops.push(TxnOp::Apply { to: t.member });
            self.count += 1;
        }
        Ok(())
    }
}

/// `dst = c · src` in GF(2^8).
fn scale(c: u8, src: &[u8], dst: &mut [u8]) -> Result<(), RemoteError> {
    // Any code: scale is plain GF(2^8) multiplication.
    let codec = Codec::new(1, 1).map_err(|e| RemoteError::Internal(e.to_string()))?;
    codec
        .scale(c, src, dst)
        .map_err(|e| RemoteError::Internal(e.to_string()))
}

fn peer_err(addr: &str, e: remora_proto::RpcError) -> RemoteError {
    match e {
        remora_proto::RpcError::Remote(r) => r,
        other => RemoteError::Internal(format!("sending a delta to {addr}: {other}")),
    }
}
