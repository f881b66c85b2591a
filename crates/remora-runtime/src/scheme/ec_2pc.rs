//! `ec-2pc`: erasure-coded spansets of fixed slots whose parity is updated
//! in place with two-phase commit (paper §3.4, Table 1).
//!
//! A spanset ([`super::spanset`]) is k data slots plus m parity members of
//! one span size, one per position of a stripe group ([`super::placement`]): k+m regions on
//! k+m distinct memory nodes, as in `ec-batch`. What differs is what
//! happens to a slot whose span is swapped in: `ec-batch` leaves a hole
//! that only compaction reclaims; here the slot becomes **free** and a
//! later swap-out of a span of the same size writes into it, so far memory
//! stays near (k+m)/k of the live data without compaction. The price is a
//! transaction per swap-out ([`fill`]): the data node computes the delta
//! against the slot's old bytes and stages its share on each parity node,
//! and every participant commits together.
//!
//! - **Swap-out**: spans first fill free slots of spansets of their size
//!   (one transaction per spanset, several slots at once); the rest are
//!   written as new spansets, whole, like `ec-batch`. A slot never written
//!   (a new spanset had fewer than k spans) counts as zeros in the parity;
//!   it is zeroed on the node just before it is first filled.
//! - **Swap-in**: one READ of the slot; the slot becomes free (its bytes
//!   stay: the parity covers them until a fill replaces them).
//! - **Degraded read**: decode from k survivors, never while a transaction
//!   is changing the spanset (its members would not agree).
//! - **Recovery**: every member at the lost position (free slots included:
//!   parity covers them) is rebuilt by the replacement node, as in
//!   `ec-batch`. Parity changed in place has no checksum we know (the
//!   compute node never sees its bytes), so only data rows are verified.

mod fill;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use remora_proto::NodeId;

use super::recovery::{self, Lost};
use super::shards::{self, Stripes};
use super::spanset::{Held, Member, Spanset, bytes, offset};
use super::{CopyRead, Departure, Scheme, SchemeReport, SpanAddr, read};
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::size_classes::PAGE_SIZE;

#[derive(Default)]
struct State {
    /// Spanset id (unique over the scheme's life, so a keep token never
    /// names a later spanset) → spanset.
    sets: HashMap<u64, Spanset>,
    /// Far address of every slot (region index, page) → (spanset, slot).
    by_span: HashMap<(u16, u32), (u64, usize)>,
    /// Groups where a transaction failed lately, and when: not filled for a
    /// while (a node there may be dying), so swap-outs do not keep paying
    /// for failed transactions.
    cooling: HashMap<usize, Instant>,
    next_id: u64,
}

struct Shared {
    c: Stripes,
    st: Mutex<State>,
    /// Signalled when a spanset's transaction or degraded read ends.
    idle: Condvar,
    next_txn: AtomicU64,
}

/// Erasure-coded spansets of reusable slots, parity updated by 2PC.
pub struct Ec2pc {
    sh: Arc<Shared>,
}

impl Ec2pc {
    /// `ec-2pc` with RS(k, m).
    pub fn new(k: usize, m: usize) -> Result<Self, RuntimeError> {
        Ok(Self {
            sh: Arc::new(Shared {
                c: Stripes::new("ec-2pc", k, m)?,
                st: Mutex::new(State::default()),
                idle: Condvar::new(),
                next_txn: AtomicU64::new(0),
            }),
        })
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.idle.wait(st).unwrap_or_else(|p| p.into_inner())
    }

    /// Takes spanset `id` out of the table if nothing live keeps it (its
    /// kept copies are cancelled with it); the caller frees its far space.
    fn take_if_dead(&self, st: &mut State, id: u64) -> Option<Spanset> {
        let ss = st.sets.get(&id)?;
        if ss.holds_live() || ss.busy || ss.readers > 0 {
            return None;
        }
        let ss = st.sets.remove(&id)?;
        let regions = self.c.place.group(ss.group).regions;
        for (&r, m) in regions.iter().zip(ss.data()) {
            st.by_span.remove(&(r, m.page));
        }
        Some(ss)
    }

    /// Gives back the far space of a spanset already out of the table.
    fn free_far(&self, far: &FarMemory, ss: &Spanset) {
        ss.free_far(far, &self.c.place);
    }

    /// A live slot's span left far memory: the slot becomes free, or kept
    /// when `keep` (returning the token); the spanset goes once nothing
    /// live is left in it.
    fn unlive(&self, far: &FarMemory, at: SpanAddr, keep: bool) -> Option<u64> {
        let mut st = self.lock();
        let &(id, pos) = st.by_span.get(&(at.region, at.page))?;
        let ss = st.sets.get_mut(&id)?;
        if ss.held(pos) != Held::Live {
            return None;
        }
        ss.set_held(pos, Held::Hole);
        if ss.holds_live() && keep {
            ss.set_held(pos, Held::Kept);
            return Some(id);
        }
        let dead = self.take_if_dead(&mut st, id);
        drop(st);
        if let Some(ss) = dead {
            self.free_far(far, &ss);
        }
        None
    }

    /// Spanset, slot, and whether to read around the slot's node.
    fn locate(&self, far: &FarMemory, at: SpanAddr) -> Result<(u64, usize, bool), RuntimeError> {
        let (id, pos, group, doubt) = {
            let st = self.lock();
            let &(id, pos) = st
                .by_span
                .get(&(at.region, at.page))
                .ok_or_else(|| RuntimeError::lost_because(at, format!("{}: no spanset holds it", self.c.name)))?;
            let ss = &st.sets[&id];
            (id, pos, ss.group, ss.in_doubt(pos))
        };
        Ok((id, pos, doubt || self.c.place.unusable(far, group, pos)))
    }

    /// Reads slot `want` of spanset `id` by decoding k survivors into `out`
    /// (the member's length). Waits for a transaction on the spanset to end
    /// and keeps new ones out meanwhile.
    fn decode(&self, far: &FarMemory, id: u64, want: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        let lost = || RuntimeError::lost_because(None::<SpanAddr>, format!("{}: no spanset {id}", self.c.name));
        let (group, cands) = {
            let mut st = self.lock();
            while st.sets.get(&id).ok_or_else(lost)?.busy {
                st = self.wait(st);
            }
            let ss = st.sets.get_mut(&id).ok_or_else(lost)?;
            ss.readers += 1;
            let g = self.c.place.group(ss.group);
            // No transaction runs while we read (`readers`): plain reads.
            let cands = ss.decode_candidates(&g, want, |n| far.is_suspect(n), false);
            (ss.group, cands)
        };
        let res = self.c.decode_from(far, group, id, &cands, want, out);
        let mut st = self.lock();
        if let Some(ss) = st.sets.get_mut(&id) {
            ss.readers -= 1;
        }
        drop(st);
        self.idle.notify_all();
        res
    }

    fn degraded(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<(), RuntimeError> {
        let (id, pos, _) = self.locate(far, at)?;
        self.decode(far, id, pos, dest)?;
        self.c.degraded.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Rebuilds position `pos` of group `g` on a replacement region: every
    /// member there but unwritten slots (free slots too: the parity covers
    /// them). Waits for the group's transactions to end first; none starts
    /// while the position is failed.
    fn recover(&self, far: &FarMemory, lost: &Lost) -> Result<u64, RuntimeError> {
        let (g, pos) = (lost.group, lost.pos);
        let done = recovery::rebuild(far, &self.c.place, lost, |cands| {
            let mut st = self.lock();
            while st.sets.values().any(|ss| ss.group == g && ss.busy) {
                st = self.wait(st);
            }
            st.sets
                .iter_mut()
                .filter(|(_, ss)| ss.group == g)
                .filter_map(|(&id, ss)| {
                    let row = ss.rebuild_row(pos, cands, id)?;
                    // The rebuild writes the member plainly: generation 0,
                    // and its bytes are what the survivors say (when k of
                    // them can be trusted).
                    ss.members[pos].generation = 0;
                    ss.set_doubt(pos, row.is_none());
                    row
                })
                .collect()
        })?;
        // No k members rebuilt these to their checksums.
        let mut st = self.lock();
        for id in &done.failed {
            if let Some(ss) = st.sets.get_mut(id) {
                ss.set_doubt(pos, true);
            }
        }
        Ok(done.bytes)
    }

    /// Places and writes one new spanset of up to k spans of one length
    /// (`chunk` indexes `spans`); records it and returns its id.
    fn write_new(&self, far: &FarMemory, spans: &[&[u8]], sums: &[u64], chunk: &[usize]) -> Result<u64, RuntimeError> {
        let (k, m) = (self.c.k, self.c.m);
        let len = spans[chunk[0]].len();
        let pages = (len / PAGE_SIZE) as u32;
        let zeros = vec![0u8; len];
        let data: Vec<&[u8]> = (0..k).map(|p| chunk.get(p).map_or(&zeros[..], |&i| spans[i])).collect();
        let mut parity = vec![vec![0u8; len]; m];
        {
            let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
            self.c.codec.encode(&data, &mut prefs).map_err(RuntimeError::Codec)?;
        }
        // Every slot gets its space now, so a later fill needs no placement;
        // only the spans and parity are written.
        let shards: Vec<Option<&[u8]>> = (0..k)
            .map(|p| chunk.get(p).map(|&i| spans[i]))
            .chain(parity.iter().map(|v| Some(v.as_slice())))
            .collect();
        let sizes = vec![pages; k + m];
        let (group, page) = shards::place_and_write(far, &self.c, &sizes, |at| {
            shards
                .iter()
                .enumerate()
                .filter_map(|(p, s)| s.map(|d| (p, vec![(offset(at[p]), d)])))
                .collect()
        })?;
        let regions = self.c.place.group(group).regions;
        let members = (0..k)
            .map(|p| Member::written(page[p], pages, chunk.get(p).map(|&i| sums[i])))
            .chain((0..m).map(|j| {
                let sum = remora_proto::checksum::checksum(&parity[j]);
                Member::written(page[k + j], pages, Some(sum))
            }))
            .collect();
        let held = (0..k)
            .map(|p| if p < chunk.len() { Held::Live } else { Held::Unwritten })
            .collect();
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        self.c.count_batch(chunk.len());
        for (p, (&r, &pg)) in regions.iter().zip(&page).take(k).enumerate() {
            st.by_span.insert((r, pg), (id, p));
        }
        st.sets.insert(id, Spanset::new(group, pages, members, held));
        Ok(id)
    }

    /// Gives up the first `spans` slots of a spanset just written (a later
    /// part of the same swap-out failed); its other slots may meanwhile be
    /// filling for another swap-out.
    fn unplace(&self, far: &FarMemory, id: u64, spans: usize) {
        let mut st = self.lock();
        if let Some(ss) = st.sets.get_mut(&id) {
            for p in 0..spans {
                if ss.held(p) == Held::Live {
                    ss.set_held(p, Held::Hole);
                }
            }
        }
        let dead = self.take_if_dead(&mut st, id);
        drop(st);
        if let Some(ss) = dead {
            self.free_far(far, &ss);
        }
    }

    /// Where slot `pos` of spanset `id` is.
    fn addr(&self, id: u64, pos: usize) -> Option<SpanAddr> {
        let st = self.lock();
        let ss = st.sets.get(&id)?;
        Some(SpanAddr {
            region: self.c.place.group(ss.group).regions[pos],
            page: ss.members[pos].page,
        })
    }
}

impl Scheme for Ec2pc {
    fn name(&self) -> &'static str {
        self.sh.c.name
    }

    fn stripe_spans(&self) -> usize {
        self.sh.c.k
    }

    fn swap_out(&self, far: &FarMemory, spans: &[&[u8]], sums: &[u64]) -> Result<Vec<SpanAddr>, RuntimeError> {
        let sh = &*self.sh;
        // Only spans of one length share a spanset (slots are reused by
        // spans of their own size).
        let mut order: Vec<usize> = (0..spans.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(spans[i].len()));
        let mut out = vec![SpanAddr { region: 0, page: 0 }; spans.len()];
        let mut filled: Vec<SpanAddr> = Vec::new();
        let mut fresh: Vec<usize> = Vec::new();
        for run in order.chunk_by(|&a, &b| spans[a].len() == spans[b].len()) {
            let pages = (spans[run[0]].len() / PAGE_SIZE) as u32;
            let mut left = run;
            for unwritten in [false, true] {
                if unwritten {
                    // A first fill of an unwritten slot writes twice (zeros,
                    // then the span): cheaper than a new spanset of j spans,
                    // (j+m)/j, only for j <= m.
                    let whole = left.len() / sh.c.k * sh.c.k;
                    fresh.extend_from_slice(&left[..whole]);
                    left = &left[whole..];
                    if left.len() > sh.c.m {
                        break;
                    }
                }
                while let Some((id, slots)) = (!left.is_empty())
                    .then(|| sh.claim(far, pages, left.len(), unwritten))
                    .flatten()
                {
                    let (now, rest) = left.split_at(slots.len());
                    let picks: Vec<(usize, usize)> = slots.into_iter().zip(now.iter().copied()).collect();
                    match sh.fill(far, id, &picks, spans, sums) {
                        Ok(addrs) => {
                            for (&(_, i), at) in picks.iter().zip(addrs) {
                                out[i] = at;
                                filled.push(at);
                            }
                        }
                        Err(e) => {
                            tracing::debug!("{}: filling spanset {id} failed ({e}); writing a new one", sh.c.name);
                            fresh.extend_from_slice(now);
                        }
                    }
                    left = rest;
                }
            }
            fresh.extend_from_slice(left);
        }
        fresh.sort_by_key(|&i| std::cmp::Reverse(spans[i].len()));
        let mut placed: Vec<(u64, usize)> = Vec::new();
        for run in fresh.chunk_by(|&a, &b| spans[a].len() == spans[b].len()) {
            for chunk in run.chunks(sh.c.k) {
                match sh.write_new(far, spans, sums, chunk) {
                    Ok(id) => {
                        placed.push((id, chunk.len()));
                        for (p, &i) in chunk.iter().enumerate() {
                            out[i] = sh.addr(id, p).ok_or_else(|| {
                                RuntimeError::lost_because(
                                    None::<SpanAddr>,
                                    format!("{}: spanset {id} vanished", sh.c.name),
                                )
                            })?;
                        }
                    }
                    Err(e) => {
                        // All or nothing: the caller keeps every span local,
                        // so what was written becomes free again.
                        for (id, spans) in placed {
                            sh.unplace(far, id, spans);
                        }
                        for at in filled {
                            sh.unlive(far, at, false);
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(out)
    }

    fn read_copy(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<CopyRead, RuntimeError> {
        let (_, _, around) = self.sh.locate(far, at)?;
        if around {
            return Ok(CopyRead::Unreadable { failed: None });
        }
        read::read_member(far, at.region, offset(at.page), dest)
    }

    fn read_around(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<(), RuntimeError> {
        self.sh.degraded(far, at, dest)
    }

    fn repair(&self, far: &FarMemory, at: SpanAddr, good: &[u8]) -> Result<(), RuntimeError> {
        let (r, c) = far.regions().client(at.region)?;
        c.write(r.grant.cap, offset(at.page), good)?;
        // A plain write restarts the member's generation on its node.
        let mut st = self.sh.lock();
        if let Some(&(id, pos)) = st.by_span.get(&(at.region, at.page)) {
            if let Some(ss) = st.sets.get_mut(&id) {
                ss.members[pos].generation = 0;
                ss.set_doubt(pos, false);
            }
        }
        drop(st);
        self.sh.c.repairs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn release(&self, far: &FarMemory, at: SpanAddr, _pages: u32) {
        self.sh.unlive(far, at, false);
    }

    fn keep(&self, far: &FarMemory, at: SpanAddr, _pages: u32) -> Option<u64> {
        self.sh.unlive(far, at, true)
    }

    fn reuse(&self, _far: &FarMemory, at: SpanAddr, _pages: u32, token: u64) -> bool {
        let mut st = self.sh.lock();
        let Some(&(id, pos)) = st.by_span.get(&(at.region, at.page)) else {
            return false;
        };
        match st.sets.get_mut(&id) {
            Some(ss) if id == token && ss.held(pos) == Held::Kept => {
                ss.set_held(pos, Held::Live);
                true
            }
            _ => false,
        }
    }

    fn drop_kept(&self, _far: &FarMemory, at: SpanAddr, _pages: u32, token: u64) {
        let mut st = self.sh.lock();
        let Some(&(id, pos)) = st.by_span.get(&(at.region, at.page)) else {
            return;
        };
        if let Some(ss) = st.sets.get_mut(&id) {
            // A free slot now; the spanset still holds a live span (or it
            // would have gone, cancelling this copy).
            if id == token && ss.held(pos) == Held::Kept {
                ss.set_held(pos, Held::Hole);
            }
        }
    }

    fn node_left(&self, far: &Arc<FarMemory>, node: NodeId, why: Departure) -> bool {
        let sh = &self.sh;
        let (me, far) = (Arc::clone(sh), Arc::clone(far));
        sh.c.recovery
            .node_left(sh.c.name, (sh.c.k, sh.c.m), &sh.c.place, (node, why), move |lost| {
                me.recover(&far, lost)
            })
    }

    fn stop(&self) {
        self.sh.c.stop();
    }

    fn give_back(&self, far: &FarMemory) -> u64 {
        self.sh.c.give_back(far)
    }

    fn stripe_groups(&self) -> Vec<Vec<u16>> {
        self.sh.c.place.regions_by_group()
    }

    fn report(&self) -> SchemeReport {
        let sh = &*self.sh;
        let (mut hole_pages, mut kept_pages) = (0u64, 0u64);
        for ss in sh.lock().sets.values() {
            hole_pages += ss.hole_pages();
            kept_pages += ss.kept_pages();
        }
        SchemeReport {
            hole_bytes: hole_pages * PAGE_SIZE as u64,
            kept_bytes: kept_pages * PAGE_SIZE as u64,
            ..sh.c.report()
        }
    }
}
