//! `ec-batch`: erasure-coded spansets (paper §3.4.1, §3.5), and
//! `replication`, which is the same engine with k = 1 (RS(1, m)'s parity
//! rows are all ones: each parity member is a verbatim copy).
//!
//! A spanset is k data spans plus m parity spans, one per position of a
//! stripe group ([`super::placement`]): k+m regions on k+m distinct memory
//! nodes. Each member sits at its own page of its position's region
//! (per-position spansets), so a later compaction can recombine the live
//! spans of two spansets position by position. Data spans may be shorter
//! than the spanset's row (zero-padded for the parity) or virtual (all zero,
//! never written) when fewer than k spans were evicted together.
//!
//! - **Swap-out**: encode, then one WRITE per member to its node; the caller
//!   releases local pages only after all k+m are acknowledged. A failed
//!   write re-places the spanset, avoiding the node that failed.
//! - **Swap-in**: one READ of the one span. Its far bytes become a *hole*:
//!   they stay, because the parity still covers them, until every data span
//!   of the spanset is a hole and the spanset is freed.
//! - **Degraded read**: when the span's node is dead (or unreachable, or its
//!   copy is corrupt) read k survivors of the spanset and decode.
//! - **Recovery**: when the manager declares a node dead, each affected
//!   group position gets a replacement region; every member at that
//!   position (holes included: other members' parity equations need them)
//!   is rebuilt there by the replacement node itself, then the region-table
//!   index is rebound, so far pointer words need no change.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use remora_proto::{NodeId, RebuildRow};

use super::recovery::{self, Lost};
use super::shards::{self, Shard, Stripes};
use super::{Scheme, SchemeReport, SpanAddr};
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::size_classes::PAGE_SIZE;

#[derive(Clone, Copy)]
struct Member {
    /// First page in its position's region (meaningless when virtual).
    page: u32,
    /// Length in pages; 0 for a virtual (all-zero, never written) member.
    pages: u32,
    /// Holds a live span (false: a hole, a kept copy, or virtual).
    live: bool,
    /// A hole whose span is local and clean: it may come back without a
    /// write (see [`Scheme::keep`]). It never keeps the spanset alive.
    kept: bool,
    /// Checksum of its bytes as written (a hole keeps its bytes, so its
    /// checksum stays valid until the spanset is freed).
    sum: u64,
}

struct Spanset {
    group: usize,
    /// Length of every parity member (the longest data member).
    row_pages: u32,
    members: Vec<Member>,
    /// Parity members: (first page, checksum).
    parity: Vec<(u32, u64)>,
}

impl Spanset {
    /// Page and length in bytes of the member at `pos` (data or parity).
    fn at(&self, pos: usize) -> (u32, usize) {
        match self.members.get(pos) {
            Some(m) => (m.page, bytes(m.pages)),
            None => (self.parity[pos - self.members.len()].0, bytes(self.row_pages)),
        }
    }

    fn sum(&self, pos: usize) -> u64 {
        match self.members.get(pos) {
            Some(m) => m.sum,
            None => self.parity[pos - self.members.len()].1,
        }
    }
}

#[derive(Default)]
struct State {
    /// Spanset id (unique over the scheme's life: names a spanset in keep
    /// tokens, so a token outlives neither its freeing nor reuse) → spanset.
    sets: HashMap<u64, Spanset>,
    /// Far span (region index, page) → (spanset, data position).
    by_span: HashMap<(u16, u32), (u64, usize)>,
    hole_pages: u64,
    kept_pages: u64,
    next_id: u64,
}

struct Shared {
    c: Stripes,
    st: Mutex<State>,
}

/// Erasure-coded spansets with RS(k, m).
pub struct EcBatch {
    sh: Arc<Shared>,
}

fn bytes(pages: u32) -> usize {
    pages as usize * PAGE_SIZE
}

fn offset(page: u32) -> u64 {
    page as u64 * PAGE_SIZE as u64
}

impl EcBatch {
    /// `ec-batch` with RS(k, m).
    pub fn new(k: usize, m: usize) -> Result<Self, RuntimeError> {
        Self::named("ec-batch", k, m)
    }

    /// `replication`: `copies` copies of each span on distinct nodes.
    pub fn replication(copies: usize) -> Result<Self, RuntimeError> {
        if copies < 2 {
            return Err(RuntimeError::Config(format!(
                "replication needs at least 2 copies, not {copies}"
            )));
        }
        Self::named("replication", 1, copies - 1)
    }

    fn named(name: &'static str, k: usize, m: usize) -> Result<Self, RuntimeError> {
        Ok(Self {
            sh: Arc::new(Shared {
                c: Stripes::new(name, k, m)?,
                st: Mutex::new(State::default()),
            }),
        })
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Far pages a kept copy of `pages` holds. With one data span per
    /// spanset (replication) the copy is the whole spanset, its replicas
    /// included; with k > 1 it is the member alone (parity stays alive for
    /// the live members, never for the copy).
    fn kept_weight(&self, pages: u64) -> u64 {
        if self.c.k == 1 {
            pages * self.c.n() as u64
        } else {
            pages
        }
    }

    /// A data member's span left far memory (swapped in, or freed): it
    /// becomes a hole, or a kept copy when `keep` (returning the token). The
    /// spanset is freed once no member is live; its kept copies are
    /// cancelled with it, so a kept copy never keeps other members alive.
    /// With one data span per spanset (replication) the kept copy is the
    /// spanset, so keeping it keeps nothing else alive.
    fn unlive(&self, far: &FarMemory, at: SpanAddr, keep: bool) -> Option<u64> {
        let mut st = self.lock();
        let &(id, pos) = st.by_span.get(&(at.region, at.page))?;
        let ss = st.sets.get_mut(&id)?;
        let mem = &mut ss.members[pos];
        if !mem.live {
            return None;
        }
        mem.live = false;
        let pages = mem.pages as u64;
        if ss.members.iter().any(|m| m.live) || (keep && self.c.k == 1) {
            if keep {
                ss.members[pos].kept = true;
                st.kept_pages += self.kept_weight(pages);
                return Some(id);
            }
            st.hole_pages += pages;
            return None;
        }
        // Every data span is gone: free the whole spanset.
        let ss = st.sets.remove(&id).expect("present");
        let regions = self.c.place.group(ss.group).regions;
        for (i, m) in ss.members.iter().enumerate() {
            if m.pages == 0 {
                continue;
            }
            st.by_span.remove(&(regions[i], m.page));
            if i == pos {
                continue;
            }
            if m.kept {
                st.kept_pages -= m.pages as u64;
            } else {
                st.hole_pages -= m.pages as u64;
            }
        }
        drop(st);
        self.free_far(far, &ss);
        None
    }

    /// Gives back the far space of a spanset already out of the table.
    fn free_far(&self, far: &FarMemory, ss: &Spanset) {
        for p in 0..self.c.n() {
            let (page, len) = ss.at(p);
            self.c.place.free(far, ss.group, p, page, (len / PAGE_SIZE) as u32);
        }
    }

    /// Reads the member at `want` of spanset `id` by decoding k survivors
    /// into `out` (the row length).
    fn decode(&self, far: &FarMemory, id: u64, want: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        let (group, row_pages, at, virt) = {
            let st = self.lock();
            let ss = st
                .sets
                .get(&id)
                .ok_or_else(|| RuntimeError::DataLost(format!("{}: no spanset {id}", self.c.name)))?;
            let at: Vec<(u32, usize)> = (0..self.c.n()).map(|p| ss.at(p)).collect();
            let virt: Vec<bool> = (0..self.c.n())
                .map(|p| p < self.c.k && ss.members[p].pages == 0)
                .collect();
            (ss.group, ss.row_pages, at, virt)
        };
        let g = self.c.place.group(group);
        let row_bytes = bytes(row_pages);
        debug_assert_eq!(out.len(), row_bytes);
        // Candidates: virtual members cost nothing, then data, then parity.
        let mut cands: Vec<usize> = (0..self.c.n()).filter(|&p| p != want && !g.failed[p]).collect();
        cands.sort_by_key(|&p| (!virt[p], p >= self.c.k));
        let cands: Vec<Shard> = cands
            .into_iter()
            .map(|p| Shard {
                pos: p,
                node: g.nodes[p],
                region: g.regions[p],
                offset: offset(at[p].0),
                len: at[p].1,
            })
            .collect();
        let mut space = vec![0u8; cands.len() * row_bytes];
        let mut dests: Vec<&mut [u8]> = space.chunks_mut(row_bytes.max(1)).collect();
        let got = shards::gather(
            far,
            &self.c.place.suspects,
            &cands,
            &mut dests,
            self.c.k,
            None,
            &mut |_, _| true,
        );
        if got.arrived.len() < self.c.k {
            return Err(RuntimeError::DataLost(format!(
                "{} spanset {id}: fewer than {} readable members (more failures than parity covers)",
                self.c.name, self.c.k
            )));
        }
        let present: Vec<(usize, &[u8])> = got.arrived.iter().map(|&i| (cands[i].pos, &*dests[i])).collect();
        self.c
            .codec
            .decode_data(&present, want, out)
            .map_err(|e| RuntimeError::DataLost(format!("decode of spanset {id}: {e}")))
    }

    /// Spanset, data position, row pages, and whether to read around the node.
    fn locate(&self, at: SpanAddr) -> Result<(u64, usize, u32, bool), RuntimeError> {
        let (id, pos, group, row_pages) = {
            let st = self.lock();
            let &(id, pos) = st.by_span.get(&(at.region, at.page)).ok_or_else(|| {
                RuntimeError::DataLost(format!("{}: no spanset holds r{}:p{}", self.c.name, at.region, at.page))
            })?;
            let ss = &st.sets[&id];
            (id, pos, ss.group, ss.row_pages)
        };
        Ok((id, pos, row_pages, self.c.place.unusable(group, pos)))
    }

    fn degraded(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<(), RuntimeError> {
        let (id, pos, row_pages, _) = self.locate(at)?;
        let mut out = vec![0u8; bytes(row_pages)];
        self.decode(far, id, pos, &mut out)?;
        dest.copy_from_slice(&out[..dest.len()]);
        self.c.degraded.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Rebuilds position `pos` of group `g` on a replacement region (every
    /// member there, holes included: other members' parity equations need
    /// them); returns the bytes rebuilt.
    fn recover(&self, far: &FarMemory, lost: &Lost) -> Result<u64, RuntimeError> {
        let (g, pos) = (lost.group, lost.pos);
        recovery::rebuild(far, &self.c.place, lost, |cands| {
            let st = self.lock();
            st.sets
                .values()
                .filter(|ss| ss.group == g)
                .filter_map(|ss| {
                    let (out_page, out_len) = ss.at(pos);
                    (out_len > 0).then(|| {
                        let r = RebuildRow {
                            offset: offset(out_page),
                            row_len: bytes(ss.row_pages) as u32,
                            offsets: cands.iter().map(|&p| offset(ss.at(p).0)).collect(),
                            lens: cands.iter().map(|&p| ss.at(p).1 as u32).collect(),
                            out_len: out_len as u32,
                        };
                        (r, Some(ss.sum(pos)))
                    })
                })
                .collect()
        })
    }

    /// Places and writes one spanset of up to k spans (`chunk` indexes
    /// `spans`); records it and returns its id.
    fn swap_out_one(
        &self,
        far: &FarMemory,
        spans: &[&[u8]],
        sums: &[u64],
        chunk: &[usize],
    ) -> Result<u64, RuntimeError> {
        let (k, m) = (self.c.k, self.c.m);
        let row_len = chunk.iter().map(|&i| spans[i].len()).max().unwrap_or(0);
        let row_pages = (row_len / PAGE_SIZE) as u32;
        // Zero-padded copies only for members shorter than the row.
        let padded: Vec<Option<Vec<u8>>> = (0..k)
            .map(|p| match chunk.get(p) {
                Some(&i) if spans[i].len() == row_len => None,
                Some(&i) => {
                    let mut v = vec![0u8; row_len];
                    v[..spans[i].len()].copy_from_slice(spans[i]);
                    Some(v)
                }
                None => Some(vec![0u8; row_len]),
            })
            .collect();
        let data: Vec<&[u8]> = (0..k)
            .map(|p| match (&padded[p], chunk.get(p)) {
                (Some(v), _) => v.as_slice(),
                (None, Some(&i)) => spans[i],
                (None, None) => unreachable!("missing members are padded"),
            })
            .collect();
        let mut parity = vec![vec![0u8; row_len]; m];
        {
            let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
            self.c
                .codec
                .encode(&data, &mut prefs)
                .map_err(|e| RuntimeError::LocalMemory(format!("encode: {e}")))?;
        }
        let shards: Vec<Option<&[u8]>> = (0..k)
            .map(|p| chunk.get(p).map(|&i| spans[i]))
            .chain(parity.iter().map(|v| Some(v.as_slice())))
            .collect();
        let sizes: Vec<u32> = shards
            .iter()
            .map(|s| s.map_or(0, |s| (s.len() / PAGE_SIZE) as u32))
            .collect();
        let (group, pages) = shards::place_and_write(far, &self.c.place, self.c.name, &sizes, |pages| {
            shards
                .iter()
                .enumerate()
                .filter_map(|(p, s)| s.map(|d| (p, vec![(offset(pages[p]), d)])))
                .collect()
        })?;
        let regions = self.c.place.group(group).regions;
        let members = (0..k)
            .map(|p| Member {
                page: pages[p],
                pages: sizes[p],
                live: chunk.get(p).is_some(),
                kept: false,
                sum: chunk.get(p).map_or(0, |&i| sums[i]),
            })
            .collect();
        let parity = parity
            .iter()
            .enumerate()
            .map(|(j, p)| (pages[k + j], remora_proto::checksum::checksum(p)))
            .collect();
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        self.c.count_batch(chunk.len());
        for p in 0..chunk.len() {
            st.by_span.insert((regions[p], pages[p]), (id, p));
        }
        st.sets.insert(
            id,
            Spanset {
                group,
                row_pages,
                members,
                parity,
            },
        );
        Ok(id)
    }

    /// Frees a spanset just written (a later one of the same swap-out failed).
    fn unplace(&self, far: &FarMemory, id: u64) {
        let Some(ss) = self.lock().sets.remove(&id) else { return };
        let regions = self.c.place.group(ss.group).regions;
        let mut st = self.lock();
        for (p, m) in ss.members.iter().enumerate() {
            if m.pages > 0 {
                st.by_span.remove(&(regions[p], m.page));
            }
        }
        drop(st);
        self.free_far(far, &ss);
    }
}

impl Scheme for EcBatch {
    fn name(&self) -> &'static str {
        self.sh.c.name
    }

    fn stripe_spans(&self) -> usize {
        self.sh.c.k
    }

    fn swap_out(&self, far: &FarMemory, spans: &[&[u8]], sums: &[u64]) -> Result<Vec<SpanAddr>, RuntimeError> {
        let sh = &*self.sh;
        // Spans of equal length batch together without padding.
        let mut order: Vec<usize> = (0..spans.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(spans[i].len()));
        let mut out = vec![SpanAddr { region: 0, page: 0 }; spans.len()];
        let mut placed: Vec<u64> = Vec::new();
        for chunk in order.chunks(sh.c.k) {
            match sh.swap_out_one(far, spans, sums, chunk) {
                Ok(id) => {
                    placed.push(id);
                    let st = sh.lock();
                    let ss = &st.sets[&id];
                    let regions = sh.c.place.group(ss.group).regions;
                    for (p, &i) in chunk.iter().enumerate() {
                        out[i] = SpanAddr {
                            region: regions[p],
                            page: ss.members[p].page,
                        };
                    }
                }
                Err(e) => {
                    // All or nothing: the caller keeps every span local.
                    for id in placed {
                        sh.unplace(far, id);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn swap_in(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<(), RuntimeError> {
        let (_, _, _, unusable) = self.sh.locate(at)?;
        if unusable {
            return self.sh.degraded(far, at, dest);
        }
        let (r, c) = match far.regions.reader(at.region) {
            Ok(x) => x,
            Err(_) => {
                self.sh.c.place.suspects.suspect(far.regions.get(at.region).grant.node);
                return self.sh.degraded(far, at, dest);
            }
        };
        match c.read(r.grant.cap, offset(at.page), dest) {
            Ok(()) => Ok(()),
            Err(e) if e.is_transport() => {
                tracing::debug!("swap-in from {} failed ({e}); degraded read", r.grant.addr);
                self.sh.c.place.suspects.suspect(r.grant.node);
                self.sh.degraded(far, at, dest)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn degraded_read(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<(), RuntimeError> {
        self.sh.degraded(far, at, dest)
    }

    fn repair(&self, far: &FarMemory, at: SpanAddr, good: &[u8]) -> Result<(), RuntimeError> {
        let (r, c) = far.regions.client(at.region)?;
        c.write(r.grant.cap, offset(at.page), good)?;
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
        let Some(ss) = st.sets.get_mut(&id) else {
            return false;
        };
        let mem = &mut ss.members[pos];
        if id != token || !mem.kept {
            return false;
        }
        mem.kept = false;
        mem.live = true;
        let pages = mem.pages as u64;
        st.kept_pages -= self.sh.kept_weight(pages);
        true
    }

    fn drop_kept(&self, far: &FarMemory, at: SpanAddr, _pages: u32, token: u64) {
        let mut st = self.sh.lock();
        let Some(&(id, pos)) = st.by_span.get(&(at.region, at.page)) else {
            return;
        };
        let Some(ss) = st.sets.get_mut(&id) else {
            return;
        };
        let mem = &mut ss.members[pos];
        if id != token || !mem.kept {
            return;
        }
        mem.kept = false;
        let pages = mem.pages as u64;
        st.kept_pages -= self.sh.kept_weight(pages);
        if self.sh.c.k == 1 {
            // The copy was the spanset: nothing else is live in it.
            let ss = st.sets.remove(&id).expect("present");
            let regions = self.sh.c.place.group(ss.group).regions;
            st.by_span.remove(&(regions[pos], ss.members[pos].page));
            drop(st);
            self.sh.free_far(far, &ss);
            return;
        }
        // A plain hole now; the spanset already has a live member (or it
        // would have been freed, cancelling this copy).
        st.hole_pages += pages;
    }

    fn node_failed(&self, far: &Arc<FarMemory>, node: NodeId) {
        let sh = &self.sh;
        let (me, far) = (Arc::clone(sh), Arc::clone(far));
        sh.c.recovery
            .node_failed(self.sh.c.name, (sh.c.k, sh.c.m), &sh.c.place, node, move |lost| {
                me.recover(&far, lost)
            });
    }

    fn stop(&self) {
        self.sh.c.recovery.stop();
    }

    fn remote_bytes_used(&self, far: &FarMemory) -> u64 {
        far.used_bytes()
    }

    fn report(&self) -> SchemeReport {
        let sh = &*self.sh;
        let (hole_pages, kept_pages) = {
            let st = sh.lock();
            (st.hole_pages, st.kept_pages)
        };
        SchemeReport {
            hole_bytes: hole_pages * PAGE_SIZE as u64,
            kept_bytes: kept_pages * PAGE_SIZE as u64,
            ..sh.c.report()
        }
    }
}
