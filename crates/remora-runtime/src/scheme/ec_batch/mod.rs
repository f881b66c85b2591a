//! `ec-batch`: erasure-coded spansets (paper §3.4.1, §3.5), and
//! `replication`, which is the same engine with k = 1 (RS(1, m)'s parity
//! rows are all ones: each parity member is a verbatim copy).
//!
//! A spanset ([`super::spanset`]) is k data spans plus m parity spans, one
//! per position of a stripe group ([`super::placement`]): k+m regions on
//! k+m distinct memory nodes. Each member sits at its own page of its position's region
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
//!   copy is corrupt), the read path ([`super::read`]) asks for a decode
//!   from k survivors of the spanset.
//! - **Recovery**: when the manager declares a node dead, each affected
//!   group position gets a replacement region; every member at that
//!   position (holes included: other members' parity equations need them)
//!   is rebuilt there by the replacement node itself, then the region-table
//!   index is rebound, so far pointer words need no change.
//! - **Compaction** (`compaction`): folds a sparse spanset into one whose
//!   holes sit where its live spans are, updating parity in place by deltas
//!   computed by the compute node or the memory nodes; `adaptive` picks
//!   which by the memory nodes' CPU load.
//!
//! **Names.** The runtime knows a far span by a [`SpanAddr`]: its position's
//! region index and a *name* in that region's page space, which is the page
//! the span was first written at. A fold moves a span's bytes to another
//! page of the same region, so its name and its page part; the name stays
//! reserved (in `by_span`) as long as the span is far, and a new span whose
//! first page is a reserved name gets a free name instead. So far pointer
//! words never change when spans move.
//!
//! **Spanset lock.** A spanset being compacted, or read around a failure
//! (decode), is `busy`: the other waits. A normal swap-in never waits: it
//! counts itself a *reader* of the spanset it reads from, and a folded-away
//! spanset's pages are freed only when its last reader is done.

mod adaptive;
mod compaction;
mod degraded;
mod pairing;
mod repair;
mod restripe;
mod table;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use remora_proto::NodeId;

pub(crate) use adaptive::Policy;
pub(crate) use compaction::{Compaction, Mode};

use super::shards::{self, Stripes};
use super::spanset::{Held, Member, Spanset, bytes, offset};
use super::{CopyRead, Departure, Scheme, SchemeReport, SpanAddr, read};
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::size_classes::PAGE_SIZE;

#[derive(Default)]
struct State {
    /// Spanset id (unique over the scheme's life: names a spanset in keep
    /// tokens, so a token outlives neither its freeing nor reuse) → spanset.
    sets: HashMap<u64, Spanset>,
    /// Far span (region index, page) → (spanset, data position).
    by_span: HashMap<(u16, u32), (u64, usize)>,
    hole_pages: u64,
    kept_pages: u64,
    /// Fold opportunities made so far (holes made, spansets written): a
    /// walk of the spansets that found few folds is not repeated before
    /// some more exist (see `compaction`).
    made: u64,
    next_id: u64,
    /// Spansets folded away while swap-ins still read them: freed by their
    /// last reader.
    retired: HashMap<u64, Spanset>,
    /// Stripe groups being rebuilt: no compaction there meanwhile.
    recovering: HashSet<usize>,
    /// Stripe groups being re-striped (see `restripe`).
    restriping: HashSet<usize>,
    /// Per region index, where the search for a free name goes on.
    name_cursor: HashMap<u16, u32>,
    /// Spansets with a member in doubt, to repair (see `repair`).
    doubtful: HashSet<u64>,
}

struct Shared {
    c: Stripes,
    st: Mutex<State>,
    /// Signalled when a spanset stops being busy.
    idle: Condvar,
    compaction: Compaction,
}

/// Erasure-coded spansets with RS(k, m).
pub struct EcBatch {
    sh: Arc<Shared>,
    /// Compaction threads, joined by `stop`.
    threads: Mutex<Vec<JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
}

impl EcBatch {
    /// `ec-batch` with RS(k, m), without compaction (the scheme registered
    /// as `ec-batch` compacts: see [`super::make`]).
    pub fn new(k: usize, m: usize) -> Result<Self, RuntimeError> {
        Self::named("ec-batch", k, m)
    }

    /// A compacting `ec-batch` under `name`: `threads` compaction threads
    /// folding spansets in the mode `policy` chooses.
    pub(crate) fn compacting(
        name: &'static str,
        k: usize,
        m: usize,
        policy: Policy,
        threads: usize,
        trigger: f64,
    ) -> Result<Self, RuntimeError> {
        let threads = if k > 1 { threads } else { 0 };
        if !(0.0..1.0).contains(&trigger) {
            return Err(RuntimeError::Config(format!(
                "{name}: compaction trigger {trigger} is not a share in [0, 1)"
            )));
        }
        Self::build(name, k, m, Compaction::new(policy, threads, trigger))
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
        Self::build(name, k, m, Compaction::default())
    }

    fn build(name: &'static str, k: usize, m: usize, compaction: Compaction) -> Result<Self, RuntimeError> {
        let mut c = Stripes::new(name, k, m)?;
        c.place = c.place.shortening(k, m);
        Ok(Self {
            sh: Arc::new(Shared {
                c,
                st: Mutex::new(State::default()),
                idle: Condvar::new(),
                compaction,
            }),
            threads: Mutex::new(Vec::new()),
            stop: Arc::new(AtomicBool::new(false)),
        })
    }
}

impl Shared {
    /// Places and writes one spanset per chunk of up to k spans (`chunks`
    /// index `spans`), all written together with one request per memory
    /// node; records them, sets `out[i]` to where span `i` went and
    /// returns the spansets' ids (busy until released). All or nothing.
    fn swap_out_many(
        &self,
        far: &FarMemory,
        spans: &[&[u8]],
        sums: &[u64],
        chunks: &[&[usize]],
        out: &mut [SpanAddr],
    ) -> Result<Vec<u64>, RuntimeError> {
        let (k, m) = (self.c.k, self.c.m);
        let mut rows: Vec<Row<'_>> = Vec::with_capacity(chunks.len());
        for chunk in chunks {
            rows.push(Row::encode(&self.c, spans, chunk)?);
        }
        let sizes: Vec<&[u32]> = rows.iter().map(|r| r.sizes.as_slice()).collect();
        let placed = shards::place_and_write_many(far, &self.c, &sizes, |s, pages| {
            rows[s]
                .shards()
                .enumerate()
                .filter_map(|(p, d)| d.map(|d| (p, vec![(offset(pages[p]), d)])))
                .collect()
        })?;
        let mut ids = Vec::with_capacity(chunks.len());
        let mut st = self.lock();
        for ((row, chunk), (group, pages)) in rows.iter().zip(chunks).zip(placed) {
            let regions = self.c.place.group(group).regions;
            let mut members: Vec<Member> = (0..k)
                .map(|p| Member::written(pages[p], row.sizes[p], Some(chunk.get(p).map_or(0, |&i| sums[i]))))
                .collect();
            members.extend((0..m).map(|j| {
                let sum = remora_proto::checksum::checksum(&row.parity[j]);
                Member::written(pages[k + j], row.pages, Some(sum))
            }));
            let held = (0..k)
                .map(|p| if p < chunk.len() { Held::Live } else { Held::Unwritten })
                .collect();
            st.next_id += 1;
            let id = st.next_id;
            self.c.count_batch(chunk.len());
            for ((p, mb), &i) in members.iter_mut().enumerate().zip(chunk.iter()) {
                mb.name = self.name_for(&mut st, regions[p], mb.page);
                st.by_span.insert((regions[p], mb.name), (id, p));
                out[i] = SpanAddr {
                    region: regions[p],
                    page: mb.name,
                };
            }
            let mut ss = Spanset::new(group, row.pages, members, held);
            // Until the whole swap-out is placed (see `swap_out`): no fold
            // may take it before the caller has its names.
            ss.busy = true;
            st.sets.insert(id, ss);
            st.made += 1;
            ids.push(id);
        }
        Ok(ids)
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
        // Spansets take k spans, fewer while too few memory nodes live (a
        // placement that finds fewer than when we asked fails the swap-out,
        // which then goes again narrower).
        let mut width = sh.c.place.data_width(far).min(sh.c.k);
        let placed = loop {
            let chunks: Vec<&[usize]> = order.chunks(width).collect();
            // All or nothing: on an error the caller keeps every span local.
            match sh.swap_out_many(far, spans, sums, &chunks, &mut out) {
                Ok(p) => break p,
                Err(e) => {
                    let now = sh.c.place.data_width(far).min(sh.c.k);
                    if now >= width {
                        return Err(e);
                    }
                    width = now;
                }
            }
        };
        // Placed: compaction may fold them from now on.
        for id in placed {
            sh.release_busy(far, id);
        }
        Ok(out)
    }

    fn read_copy(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<CopyRead, RuntimeError> {
        // Counted among the spanset's readers while the read is in flight.
        let reading = self.sh.begin_read(far, at)?;
        if reading.around {
            return Ok(CopyRead::Unreadable { failed: None });
        }
        read::read_member(far, at.region, offset(reading.page), dest)
    }

    fn read_around(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<(), RuntimeError> {
        self.sh.degraded(far, at, dest)
    }

    fn repair(&self, far: &FarMemory, at: SpanAddr, good: &[u8]) -> Result<(), RuntimeError> {
        let sh = &*self.sh;
        let (id, pos, _) = sh.locate(at)?;
        if !sh.take_busy(id) {
            return Ok(()); // folded away meanwhile: the bad copy is gone
        }
        let page = sh.lock().sets.get(&id).map(|ss| ss.members[pos].page);
        let res = match page {
            Some(page) => far
                .regions()
                .client(at.region)
                .and_then(|(r, c)| Ok(c.write(r.grant.cap, offset(page), good)?)),
            None => Ok(()),
        };
        if res.is_ok() {
            // A plain write: the memory node restarts the member's generation.
            if let Some(ss) = sh.lock().sets.get_mut(&id) {
                ss.members[pos].generation = 0;
                ss.set_doubt(pos, false);
            }
            sh.c.repairs.fetch_add(1, Ordering::Relaxed);
        }
        sh.release_busy(far, id);
        res
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
        if ss.busy {
            return false; // its kept copies were cancelled by a compaction
        }
        if id != token || !ss.is_kept(pos) {
            return false;
        }
        let pages = ss.members[pos].pages as u64;
        ss.set_held(pos, Held::Live);
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
        if id != token || !ss.is_kept(pos) {
            return;
        }
        let pages = ss.members[pos].pages as u64;
        ss.set_held(pos, Held::Hole);
        st.kept_pages -= self.sh.kept_weight(pages);
        st.hole_pages += pages;
        st.made += 1;
        if self.sh.c.k == 1 {
            // The copy was the spanset: nothing else is live in it.
            let ss = self.sh.remove_set(&mut st, id);
            drop(st);
            if let Some(ss) = ss {
                self.sh.free_far(far, &ss);
            }
        }
        // Otherwise a plain hole now; the spanset already has a live member (or it
        // would have been freed, cancelling this copy).
    }

    fn node_left(&self, far: &Arc<FarMemory>, node: NodeId, why: Departure) -> bool {
        let sh = &self.sh;
        let (me, far) = (Arc::clone(sh), Arc::clone(far));
        sh.c.recovery.node_left(
            self.sh.c.name,
            (sh.c.k, sh.c.m),
            &sh.c.place,
            (node, why),
            move |lost| me.recover(&far, lost),
        )
    }

    fn start(&self, far: &Arc<FarMemory>) -> Result<(), RuntimeError> {
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        for i in 0..self.sh.compaction.threads() {
            let (sh, far, stop) = (Arc::clone(&self.sh), Arc::clone(far), Arc::clone(&self.stop));
            let h = std::thread::Builder::new()
                .name(format!("remora-compact-{i}"))
                .spawn(move || compaction::run(&sh, &far, &stop))
                .map_err(|e| RuntimeError::Config(format!("spawning a compaction thread: {e}")))?;
            threads.push(h);
        }
        Ok(())
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.sh.compaction.wake();
        for h in self.threads.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = h.join();
        }
        self.sh.c.stop();
    }

    fn pause(&self, paused: bool) {
        self.sh.compaction.pause(paused);
    }

    fn remote_bytes_used(&self, far: &FarMemory) -> u64 {
        far.used_bytes()
    }

    fn give_back(&self, far: &FarMemory) -> u64 {
        self.sh.c.give_back(far)
    }

    fn stripe_groups(&self) -> Vec<Vec<u16>> {
        self.sh.c.place.regions_by_group()
    }

    fn report(&self) -> SchemeReport {
        let sh = &*self.sh;
        let flags = sh.c.place.flags();
        let (hole_pages, kept_pages, short, below) = {
            let st = sh.lock();
            let (mut short, mut below) = (0, 0);
            for ss in st.sets.values() {
                let (s, d) = flags.get(ss.group).copied().unwrap_or_default();
                short += u64::from(s);
                below += u64::from(d || ss.doubt_mask() != 0);
            }
            (st.hole_pages, st.kept_pages, short, below)
        };
        SchemeReport {
            hole_bytes: hole_pages * PAGE_SIZE as u64,
            kept_bytes: kept_pages * PAGE_SIZE as u64,
            short_spansets: short,
            spansets_below_tolerance: below,
            ..sh.compaction.report(sh.c.report())
        }
    }
}

/// One spanset's row ready to write: its k data members (zero-padded
/// copies only where a member is shorter than the row, or missing) and its
/// m parity members.
struct Row<'a> {
    data: Vec<Option<&'a [u8]>>,
    parity: Vec<Vec<u8>>,
    /// Pages at each position (0 for a missing data member).
    sizes: Vec<u32>,
    /// Pages of the row.
    pages: u32,
}

impl<'a> Row<'a> {
    fn encode(c: &Stripes, spans: &[&'a [u8]], chunk: &[usize]) -> Result<Self, RuntimeError> {
        let (k, m) = (c.k, c.m);
        let row_len = chunk.iter().map(|&i| spans[i].len()).max().unwrap_or(0);
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
        let inputs: Vec<&[u8]> = (0..k)
            .map(|p| match (&padded[p], chunk.get(p)) {
                (Some(v), _) => v.as_slice(),
                (None, Some(&i)) => spans[i],
                (None, None) => unreachable!("missing members are padded"),
            })
            .collect();
        let mut parity = vec![vec![0u8; row_len]; m];
        {
            let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
            c.codec.encode(&inputs, &mut prefs).map_err(RuntimeError::Codec)?;
        }
        let data: Vec<Option<&'a [u8]>> = (0..k).map(|p| chunk.get(p).map(|&i| spans[i])).collect();
        let sizes = data
            .iter()
            .map(|d| d.map_or(0, |d| (d.len() / PAGE_SIZE) as u32))
            .chain(parity.iter().map(|v| (v.len() / PAGE_SIZE) as u32))
            .collect();
        Ok(Row {
            data,
            parity,
            sizes,
            pages: (row_len / PAGE_SIZE) as u32,
        })
    }

    /// The bytes to write at each position (`None`: nothing there).
    fn shards(&self) -> impl Iterator<Item = Option<&[u8]>> + '_ {
        self.data
            .iter()
            .copied()
            .chain(self.parity.iter().map(|v| Some(v.as_slice())))
    }
}
