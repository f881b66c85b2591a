//! `ec-batch`: erasure-coded spansets (paper §3.4.1, §3.5).
//!
//! A **stripe group** is k+m regions on k+m distinct memory nodes. A spanset
//! occupies one *row* of a group, the same pages in each of its regions:
//! positions 0..k hold the k data spans, k..k+m the parity spans, so a later
//! compaction can pair spansets position by position. Data spans of a row
//! may be shorter than the row (they are zero-padded for the parity) or
//! virtual (all zero, never written) when fewer than k spans were evicted
//! together.
//!
//! - **Swap-out**: encode, then one WRITE per member to its node; the caller
//!   releases local pages only after all k+m are acknowledged. A failed
//!   write re-places the spanset in another group.
//! - **Swap-in**: one READ of the one span. Its far bytes become a *hole*:
//!   they stay, because the parity still covers them, until every data span
//!   of the row is a hole and the row is freed.
//! - **Degraded read**: when the span's node is dead (or unreachable, or its
//!   copy is corrupt) read k survivors of the row and decode.
//! - **Recovery**: when the manager declares a node dead, each affected
//!   group position gets a replacement region; every row of it (holes
//!   included: other members' parity equations need them) is rebuilt there,
//!   then the region-table index is rebound, so far pointer words need no change.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use remora_ec::Codec;
use remora_proto::{NodeId, RebuildRow, RebuildSource, RemoteError, RpcError};

use super::{Scheme, SchemeReport, SpanAddr};
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::size_classes::PAGE_SIZE;

/// Row bytes per offloaded rebuild request.
const REBUILD_REQUEST_BYTES: u64 = 32 << 20;

struct Group {
    regions: Vec<u16>,
    nodes: Vec<NodeId>,
    free: BTreeMap<u32, u32>,
    failed: Vec<bool>,
    /// No new rows (a write to one of its nodes failed).
    retired: bool,
}

#[derive(Clone, Copy)]
struct Member {
    /// Length in pages; 0 for a virtual (all-zero, never written) member.
    pages: u32,
    /// Holds a live span (false: a hole, a kept copy, or virtual).
    live: bool,
    /// A hole whose span is local and clean: it may come back without a
    /// write (see [`Scheme::keep`]). It never keeps the row alive.
    kept: bool,
    /// Checksum of its bytes as written (a hole keeps its bytes, so its
    /// checksum stays valid until the row is freed).
    sum: u64,
}

struct Spanset {
    /// Unique over the scheme's life: names this spanset in keep tokens, so a
    /// token outlives neither the row's freeing nor its reuse.
    id: u64,
    pages: u32,
    members: Vec<Member>,
    /// Checksums of the parity shards.
    parity_sums: Vec<u64>,
}

#[derive(Default)]
struct State {
    groups: Vec<Group>,
    /// (group, row page) → spanset.
    rows: HashMap<(usize, u32), Spanset>,
    /// Region index → (group, position).
    position: HashMap<u16, (usize, usize)>,
    used_pages: u64,
    hole_pages: u64,
    kept_pages: u64,
    next_spanset: u64,
}

struct Shared {
    codec: Codec,
    k: usize,
    m: usize,
    st: Mutex<State>,
    degraded: AtomicU64,
    rebuilt: AtomicU64,
    rebuild_nanos: AtomicU64,
    recoveries: AtomicU64,
    recovering: AtomicU64,
    repairs: AtomicU64,
    rebuild_retries: AtomicU64,
    /// Nodes that failed a request recently: read around them until the
    /// manager's verdict (or a quiet period) settles it.
    suspects: Mutex<HashMap<NodeId, Instant>>,
    /// Held while a stripe group is requested: threads that find every
    /// group full at once must not each take k+m regions (the manager would
    /// run out of distinct nodes, and they would wait out `patience`).
    growing: Mutex<()>,
}

/// How long a node that failed a request is read around.
const SUSPECT_FOR: Duration = Duration::from_secs(3);

/// The EC-Batch scheme with RS(k, m).
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
    /// RS(k, m) spansets.
    pub fn new(k: usize, m: usize) -> Result<Self, RuntimeError> {
        let codec = Codec::new(k, m).map_err(|e| RuntimeError::LocalMemory(format!("codec: {e}")))?;
        Ok(Self {
            sh: Arc::new(Shared {
                codec,
                k,
                m,
                st: Mutex::new(State::default()),
                degraded: AtomicU64::new(0),
                rebuilt: AtomicU64::new(0),
                rebuild_nanos: AtomicU64::new(0),
                recoveries: AtomicU64::new(0),
                recovering: AtomicU64::new(0),
                repairs: AtomicU64::new(0),
                rebuild_retries: AtomicU64::new(0),
                suspects: Mutex::new(HashMap::new()),
                growing: Mutex::new(()),
            }),
        })
    }
}

impl Shared {
    /// A data member's span left far memory (swapped in, or freed): it
    /// becomes a hole, or a kept copy when `keep` (returning the token). The
    /// row is freed once no member is live; its kept copies are cancelled
    /// with it, so a kept copy never keeps a row alive.
    fn unlive(&self, at: SpanAddr, keep: bool) -> Option<u64> {
        let mut st = self.lock();
        let &(g, pos) = st.position.get(&at.region)?;
        let ss = st.rows.get_mut(&(g, at.page))?;
        let mem = &mut ss.members[pos];
        if !mem.live {
            return None;
        }
        mem.live = false;
        let pages = mem.pages as u64;
        if ss.members.iter().any(|m| m.live) {
            let id = ss.id;
            if keep {
                ss.members[pos].kept = true;
                st.kept_pages += pages;
                return Some(id);
            }
            st.hole_pages += pages;
            return None;
        }
        // Every data span of the row is gone: the whole row is free again.
        let ss = st.rows.remove(&(g, at.page)).expect("present");
        let (mut holes, mut kept) = (0, 0);
        for (i, m) in ss.members.iter().enumerate() {
            if i == pos {
                continue;
            }
            if m.kept {
                kept += m.pages as u64;
            } else {
                holes += m.pages as u64;
            }
        }
        st.hole_pages -= holes;
        st.kept_pages -= kept;
        self.free_row(&mut st, g, at.page, ss.pages);
        None
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn n(&self) -> usize {
        self.k + self.m
    }

    fn suspect(&self, node: NodeId) {
        self.suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node, Instant::now());
    }

    fn is_suspect(&self, node: NodeId) -> bool {
        let mut s = self.suspects.lock().unwrap_or_else(|p| p.into_inner());
        match s.get(&node) {
            Some(t) if t.elapsed() < SUSPECT_FOR => true,
            Some(_) => {
                s.remove(&node);
                false
            }
            None => false,
        }
    }

    /// A row of `pages` in a healthy group, if one has room.
    fn alloc_row(&self, st: &mut State, pages: u32) -> Option<(usize, u32)> {
        for (gi, g) in st.groups.iter_mut().enumerate() {
            if g.retired || g.failed.iter().any(|&f| f) || g.nodes.iter().any(|n| self.is_suspect(*n)) {
                continue;
            }
            let found = g.free.iter().find(|(_, l)| **l >= pages).map(|(s, l)| (*s, *l));
            if let Some((start, len)) = found {
                g.free.remove(&start);
                if len > pages {
                    g.free.insert(start + pages, len - pages);
                }
                st.used_pages += pages as u64 * self.n() as u64;
                return Some((gi, start));
            }
        }
        None
    }

    fn free_row(&self, st: &mut State, group: usize, start: u32, pages: u32) {
        st.used_pages -= pages as u64 * self.n() as u64;
        let free = &mut st.groups[group].free;
        let (mut s, mut len) = (start, pages);
        if let Some((&ps, &pl)) = free.range(..start).next_back() {
            if ps + pl == start {
                free.remove(&ps);
                s = ps;
                len += pl;
            }
        }
        if let Some(&nl) = free.get(&(start + pages)) {
            free.remove(&(start + pages));
            len += nl;
        }
        free.insert(s, len);
    }

    /// Adds a stripe group unless another thread added one since the caller
    /// saw `seen` groups (then the caller just tries again).
    fn grow(&self, far: &FarMemory, exclude: &[NodeId], seen: usize) -> Result<(), RuntimeError> {
        let _one = self.growing.lock().unwrap_or_else(|p| p.into_inner());
        if self.lock().groups.len() != seen {
            return Ok(());
        }
        self.new_group(far, exclude)
    }

    /// Asks the manager for k+m regions on distinct nodes and makes them a group.
    fn new_group(&self, far: &FarMemory, exclude: &[NodeId]) -> Result<(), RuntimeError> {
        let n = self.n() as u32;
        let start = Instant::now();
        let grants = loop {
            match far.session.alloc(n, true, exclude) {
                Ok(g) => break g,
                Err(RpcError::Remote(RemoteError::NoCapacity { available, .. })) => {
                    if start.elapsed() > far.patience {
                        return Err(RuntimeError::FarMemoryExhausted(format!(
                            "{} needs {n} regions on distinct live memory nodes; {available} available",
                            "ec-batch"
                        )));
                    }
                    // Fewer than k+m live nodes: wait for capacity, never drop data.
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let pages = grants
            .iter()
            .map(|g| g.size / PAGE_SIZE as u64)
            .min()
            .unwrap_or(0)
            .min(crate::pointer::MAX_FAR_PAGE as u64 + 1) as u32;
        let mut regions = Vec::with_capacity(grants.len());
        let mut nodes = Vec::with_capacity(grants.len());
        for g in grants {
            nodes.push(g.node);
            regions.push(far.regions.add(g)?);
        }
        let mut st = self.lock();
        let gi = st.groups.len();
        for (pos, r) in regions.iter().enumerate() {
            st.position.insert(*r, (gi, pos));
        }
        let mut free = BTreeMap::new();
        free.insert(0, pages);
        st.groups.push(Group {
            regions,
            nodes,
            free,
            failed: vec![false; self.n()],
            retired: false,
        });
        tracing::debug!("ec-batch: stripe group {gi} of {pages} pages per position");
        Ok(())
    }

    /// Writes one spanset's members; returns the failing node on error.
    fn write_row(
        &self,
        far: &FarMemory,
        group: usize,
        row: u32,
        shards: &[Option<&[u8]>],
    ) -> Result<(), (NodeId, RuntimeError)> {
        let (regions, nodes) = {
            let st = self.lock();
            (st.groups[group].regions.clone(), st.groups[group].nodes.clone())
        };
        let mut inflight = Vec::new();
        let mut first_err: Option<(NodeId, RuntimeError)> = None;
        for (pos, shard) in shards.iter().enumerate() {
            let Some(data) = shard else { continue };
            match far.regions.client(regions[pos]) {
                Ok((r, c)) => match c.send_write(r.grant.cap, offset(row), data) {
                    Ok(t) => inflight.push((pos, c, t, data.len())),
                    Err(e) => {
                        first_err.get_or_insert((nodes[pos], e.into()));
                    }
                },
                Err(e) => {
                    first_err.get_or_insert((nodes[pos], e));
                }
            }
        }
        for (pos, c, t, len) in inflight {
            match c.wait_write(t) {
                Ok(()) => far.count_write(len),
                Err(e) => {
                    first_err.get_or_insert((nodes[pos], e.into()));
                }
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Reads `want`'s bytes of row (`group`, `row`) by decoding k survivors
    /// into `out` (the row length). Returns the remote reads issued.
    fn decode_row(
        &self,
        far: &FarMemory,
        group: usize,
        row: u32,
        want: usize,
        avoid: &[usize],
        out: &mut [u8],
    ) -> Result<u32, RuntimeError> {
        let (regions, failed, ss_pages, members, nodes) = {
            let st = self.lock();
            let g = &st.groups[group];
            let ss = st
                .rows
                .get(&(group, row))
                .ok_or_else(|| RuntimeError::DataLost(format!("no spanset at group {group} row {row}")))?;
            (
                g.regions.clone(),
                g.failed.clone(),
                ss.pages,
                ss.members.clone(),
                g.nodes.clone(),
            )
        };
        let row_bytes = bytes(ss_pages);
        debug_assert_eq!(out.len(), row_bytes);
        // Candidates: virtual members cost nothing, then data, then parity.
        let mut cands: Vec<usize> = (0..self.n())
            .filter(|&p| p != want && !failed[p] && !avoid.contains(&p))
            .collect();
        cands.sort_by_key(|&p| {
            if p < self.k && members[p].pages == 0 {
                0
            } else if p < self.k {
                1
            } else {
                2
            }
        });
        let mut bufs: Vec<(usize, Vec<u8>)> = Vec::with_capacity(self.k);
        let mut reads = 0u32;
        let mut next = 0;
        while bufs.len() < self.k {
            // Send reads for as many candidates as are still needed, all in flight.
            let need = self.k - bufs.len();
            let batch: Vec<usize> = cands[next..].iter().copied().take(need).collect();
            next += batch.len();
            if batch.is_empty() {
                return Err(RuntimeError::DataLost(format!(
                    "row {row} of stripe group {group}: fewer than {} readable members (more failures than parity covers)",
                    self.k
                )));
            }
            let mut inflight = Vec::new();
            for p in batch {
                let len = if p < self.k { bytes(members[p].pages) } else { row_bytes };
                if len == 0 {
                    bufs.push((p, vec![0u8; row_bytes]));
                    continue;
                }
                match far.regions.reader(regions[p]) {
                    Ok((r, c)) => match c.send_read(r.grant.cap, offset(row), len) {
                        Ok(t) => inflight.push((p, c, t, len)),
                        Err(e) => tracing::debug!("degraded read: member {p} unreachable: {e}"),
                    },
                    Err(e) => tracing::debug!("degraded read: member {p} unreachable: {e}"),
                }
            }
            for (p, c, t, len) in inflight {
                let mut b = vec![0u8; row_bytes];
                match c.wait_read(t, &mut b[..len]) {
                    Ok(()) => {
                        reads += 1;
                        far.count_read(len);
                        bufs.push((p, b));
                    }
                    Err(e) => {
                        if e.is_transport() {
                            self.suspect(nodes[p]);
                        }
                        tracing::debug!("degraded read: member {p} failed: {e}");
                    }
                }
            }
        }
        let present: Vec<(usize, &[u8])> = bufs.iter().map(|(p, b)| (*p, b.as_slice())).collect();
        self.codec
            .decode_data(&present, want, out)
            .map_err(|e| RuntimeError::DataLost(format!("decode of row {row}: {e}")))?;
        Ok(reads)
    }

    /// Group, position, row pages, and whether to read around the node.
    fn locate(&self, at: SpanAddr) -> Result<(usize, usize, u32, bool), RuntimeError> {
        let st = self.lock();
        let &(g, pos) = st
            .position
            .get(&at.region)
            .ok_or_else(|| RuntimeError::DataLost(format!("region {} is not in a stripe group", at.region)))?;
        let ss = st
            .rows
            .get(&(g, at.page))
            .ok_or_else(|| RuntimeError::DataLost(format!("no spanset at r{}:p{}", at.region, at.page)))?;
        let (pages, node, failed) = (ss.pages, st.groups[g].nodes[pos], st.groups[g].failed[pos]);
        drop(st);
        Ok((g, pos, pages, failed || self.is_suspect(node)))
    }

    fn degraded(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<u32, RuntimeError> {
        let (g, pos, row_pages, _) = self.locate(at)?;
        let mut out = vec![0u8; bytes(row_pages)];
        let reads = self.decode_row(far, g, at.page, pos, &[pos], &mut out)?;
        dest.copy_from_slice(&out[..dest.len()]);
        self.degraded.fetch_add(1, Ordering::Relaxed);
        Ok(reads)
    }

    /// Rebuilds position `pos` of group `g` on a replacement region.
    fn recover(&self, far: &FarMemory, g: usize, pos: usize, attempt: usize) -> Result<(), RuntimeError> {
        let start = Instant::now();
        let exclude = self.lock().groups[g].nodes.clone();
        let grant = loop {
            match far.session.alloc(1, false, &exclude) {
                Ok(mut v) => break v.remove(0),
                Err(RpcError::Remote(RemoteError::NoCapacity { .. })) if start.elapsed() < far.patience => {
                    thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let region = grant.cap.region;
        let res = self.rebuild_on(far, g, pos, attempt, grant, start);
        if res.is_err() {
            // Give the unused replacement back; a retry asks for another.
            if let Err(e) = far.session.free(region) {
                tracing::warn!("freeing replacement region {region}: {e}");
            }
        }
        res
    }

    fn rebuild_on(
        &self,
        far: &FarMemory,
        g: usize,
        pos: usize,
        attempt: usize,
        grant: remora_proto::RegionGrant,
        start: Instant,
    ) -> Result<(), RuntimeError> {
        let client = remora_proto::MemNodeClient::connect(&grant.addr, Default::default())?;
        // The replacement node does the work: it reads k survivors of every
        // row with read-only capabilities delegated from ours and decodes.
        let (sources, rows) = {
            let st = self.lock();
            let grp = &st.groups[g];
            let mut cands: Vec<usize> = (0..self.n()).filter(|&p| p != pos && !grp.failed[p]).collect();
            cands.sort_by_key(|&p| if p < self.k { 0 } else { 1 });
            if cands.len() < self.k {
                return Err(RuntimeError::DataLost(format!(
                    "stripe group {g}: {} survivors, {} needed (more failures than parity covers)",
                    cands.len(),
                    self.k
                )));
            }
            // A retry (after a rebuilt shard failed its checksum) tries
            // another set of survivors: one of them was corrupt.
            let spare = cands.len() - self.k;
            cands.rotate_left(attempt % (spare + 1));
            cands.truncate(self.k);
            let sources: Vec<RebuildSource> = cands
                .iter()
                .map(|&p| {
                    let r = far.regions.get(grp.regions[p]);
                    RebuildSource {
                        index: p as u8,
                        addr: r.grant.addr.clone(),
                        cap: r.grant.cap.read_only(),
                    }
                })
                .collect();
            let mut rows: Vec<(RebuildRow, u64)> = st
                .rows
                .iter()
                .filter(|((gg, _), _)| *gg == g)
                .filter_map(|((_, row), ss)| {
                    let expect = if pos < self.k {
                        ss.members[pos].sum
                    } else {
                        ss.parity_sums[pos - self.k]
                    };
                    let member_bytes = |p: usize| {
                        if p < self.k {
                            bytes(ss.members[p].pages)
                        } else {
                            bytes(ss.pages)
                        }
                    };
                    let out_len = member_bytes(pos);
                    (out_len > 0).then(|| {
                        let r = RebuildRow {
                            offset: offset(*row),
                            row_len: bytes(ss.pages) as u32,
                            lens: cands.iter().map(|&p| member_bytes(p) as u32).collect(),
                            out_len: out_len as u32,
                        };
                        (r, expect)
                    })
                })
                .collect();
            rows.sort_by_key(|(r, _)| r.offset);
            (sources, rows)
        };
        let mut rebuilt = 0u64;
        let mut batch: Vec<(RebuildRow, u64)> = Vec::new();
        let mut batch_bytes = 0u64;
        // Every rebuilt shard is checked against the checksum recorded when
        // its row was written, as reported by the node that rebuilt it.
        let flush = |batch: &mut Vec<(RebuildRow, u64)>| -> Result<u64, RuntimeError> {
            if batch.is_empty() {
                return Ok(0);
            }
            let (rows, expect): (Vec<RebuildRow>, Vec<u64>) = std::mem::take(batch).into_iter().unzip();
            let offsets: Vec<u64> = rows.iter().map(|r| r.offset).collect();
            let (n, sums) = client.rebuild(
                grant.cap,
                self.k as u8,
                self.m as u8,
                pos as u8,
                sources.clone(),
                rows,
                Duration::from_secs(120),
            )?;
            if let Some(i) = (0..expect.len()).find(|&i| sums.get(i) != Some(&expect[i])) {
                return Err(RuntimeError::DataLost(format!(
                    "rebuilt shard {pos} of group {g} at offset {} failed its checksum",
                    offsets[i]
                )));
            }
            Ok(n)
        };
        for r in &rows {
            batch_bytes += r.0.row_len as u64;
            batch.push(r.clone());
            if batch_bytes >= REBUILD_REQUEST_BYTES {
                rebuilt += flush(&mut batch)?;
                batch_bytes = 0;
            }
        }
        rebuilt += flush(&mut batch)?;
        let idx = self.lock().groups[g].regions[pos];
        let node = grant.node;
        far.regions.rebind(idx, grant)?;
        {
            let mut st = self.lock();
            st.groups[g].nodes[pos] = node;
            st.groups[g].failed[pos] = false;
        }
        self.rebuilt.fetch_add(rebuilt, Ordering::Relaxed);
        tracing::info!(
            "ec-batch: rebuilt group {g} position {pos} ({} rows, {rebuilt} bytes) on {node} in {:?}",
            rows.len(),
            start.elapsed()
        );
        Ok(())
    }
}

impl Scheme for EcBatch {
    fn name(&self) -> &'static str {
        "ec-batch"
    }

    fn swap_out(&self, far: &FarMemory, spans: &[&[u8]], sums: &[u64]) -> Result<Vec<SpanAddr>, RuntimeError> {
        let sh = &*self.sh;
        let (k, m) = (sh.k, sh.m);
        // Spans of equal length batch together without padding.
        let mut order: Vec<usize> = (0..spans.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(spans[i].len()));
        let mut out = vec![SpanAddr { region: 0, page: 0 }; spans.len()];
        let mut placed: Vec<(usize, u32)> = Vec::new();
        let mut exclude: Vec<NodeId> = Vec::new();
        let result = (|| -> Result<(), RuntimeError> {
            for chunk in order.chunks(k) {
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
                    sh.codec
                        .encode(&data, &mut prefs)
                        .map_err(|e| RuntimeError::LocalMemory(format!("encode: {e}")))?;
                }
                let shards: Vec<Option<&[u8]>> = (0..k)
                    .map(|p| chunk.get(p).map(|&i| spans[i]))
                    .chain(parity.iter().map(|v| Some(v.as_slice())))
                    .collect();
                let mut attempts = 0;
                let (g, row) = loop {
                    let (slot, seen) = {
                        let mut st = sh.lock();
                        (sh.alloc_row(&mut st, row_pages), st.groups.len())
                    };
                    let (g, row) = match slot {
                        Some(s) => s,
                        None => {
                            sh.grow(far, &exclude, seen)?;
                            continue;
                        }
                    };
                    match sh.write_row(far, g, row, &shards) {
                        Ok(()) => break (g, row),
                        Err((node, e)) => {
                            attempts += 1;
                            tracing::warn!("ec-batch: write to {node} failed ({e}); re-placing the spanset");
                            sh.suspect(node);
                            let mut st = sh.lock();
                            sh.free_row(&mut st, g, row, row_pages);
                            st.groups[g].retired = true;
                            drop(st);
                            exclude.push(node);
                            if attempts >= 3 {
                                return Err(e);
                            }
                        }
                    }
                };
                let mut st = sh.lock();
                let members = (0..k)
                    .map(|p| match chunk.get(p) {
                        Some(&i) => Member {
                            pages: (spans[i].len() / PAGE_SIZE) as u32,
                            live: true,
                            kept: false,
                            sum: sums[i],
                        },
                        None => Member {
                            pages: 0,
                            live: false,
                            kept: false,
                            sum: 0,
                        },
                    })
                    .collect();
                let parity_sums = parity.iter().map(|p| remora_proto::checksum::checksum(p)).collect();
                st.next_spanset += 1;
                let id = st.next_spanset;
                st.rows.insert(
                    (g, row),
                    Spanset {
                        id,
                        pages: row_pages,
                        members,
                        parity_sums,
                    },
                );
                placed.push((g, row));
                for (p, &i) in chunk.iter().enumerate() {
                    out[i] = SpanAddr {
                        region: st.groups[g].regions[p],
                        page: row,
                    };
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(out),
            Err(e) => {
                // All or nothing: the caller keeps every span local.
                let mut st = sh.lock();
                for (g, row) in placed {
                    if let Some(ss) = st.rows.remove(&(g, row)) {
                        sh.free_row(&mut st, g, row, ss.pages);
                    }
                }
                Err(e)
            }
        }
    }

    fn swap_in(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<u32, RuntimeError> {
        let (_, _, _, failed) = self.sh.locate(at)?;
        if failed {
            return self.sh.degraded(far, at, dest);
        }
        let (r, c) = match far.regions.reader(at.region) {
            Ok(x) => x,
            Err(_) => {
                self.sh.suspect(far.regions.get(at.region).grant.node);
                return self.sh.degraded(far, at, dest);
            }
        };
        match c.read(r.grant.cap, offset(at.page), dest) {
            Ok(()) => {
                far.count_read(dest.len());
                Ok(1)
            }
            Err(e) if e.is_transport() => {
                tracing::debug!("swap-in from {} failed ({e}); degraded read", r.grant.addr);
                self.sh.suspect(r.grant.node);
                self.sh.degraded(far, at, dest)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn degraded_read(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<u32, RuntimeError> {
        self.sh.degraded(far, at, dest)
    }

    fn repair(&self, far: &FarMemory, at: SpanAddr, good: &[u8]) -> Result<(), RuntimeError> {
        let (r, c) = far.regions.client(at.region)?;
        c.write(r.grant.cap, offset(at.page), good)?;
        far.count_write(good.len());
        self.sh.repairs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn release(&self, _far: &FarMemory, at: SpanAddr, _pages: u32) {
        self.sh.unlive(at, false);
    }

    fn keep(&self, _far: &FarMemory, at: SpanAddr, _pages: u32) -> Option<u64> {
        self.sh.unlive(at, true)
    }

    fn reuse(&self, _far: &FarMemory, at: SpanAddr, _pages: u32, token: u64) -> bool {
        let mut st = self.sh.lock();
        let Some(&(g, pos)) = st.position.get(&at.region) else {
            return false;
        };
        let Some(ss) = st.rows.get_mut(&(g, at.page)) else {
            return false;
        };
        let mem = &mut ss.members[pos];
        if ss.id != token || !mem.kept {
            return false;
        }
        mem.kept = false;
        mem.live = true;
        let pages = mem.pages as u64;
        st.kept_pages -= pages;
        true
    }

    fn drop_kept(&self, _far: &FarMemory, at: SpanAddr, _pages: u32, token: u64) {
        let mut st = self.sh.lock();
        let Some(&(g, pos)) = st.position.get(&at.region) else {
            return;
        };
        let Some(ss) = st.rows.get_mut(&(g, at.page)) else {
            return;
        };
        let mem = &mut ss.members[pos];
        if ss.id != token || !mem.kept {
            return;
        }
        // A plain hole now; the row already has a live member (or it would
        // have been freed, cancelling this copy).
        mem.kept = false;
        let pages = mem.pages as u64;
        st.kept_pages -= pages;
        st.hole_pages += pages;
    }

    fn node_failed(&self, far: &Arc<FarMemory>, node: NodeId) {
        let affected: Vec<(usize, usize)> = {
            let mut st = self.sh.lock();
            let mut v = Vec::new();
            for (gi, g) in st.groups.iter_mut().enumerate() {
                for pos in 0..g.nodes.len() {
                    if g.nodes[pos] == node && !g.failed[pos] {
                        g.failed[pos] = true;
                        v.push((gi, pos));
                    }
                }
            }
            v
        };
        if affected.is_empty() {
            return;
        }
        tracing::warn!(
            "ec-batch: {node} died; rebuilding {} stripe-group positions",
            affected.len()
        );
        let (sh, far) = (Arc::clone(&self.sh), Arc::clone(far));
        sh.recovering.fetch_add(1, Ordering::Relaxed);
        let spawned = thread::Builder::new().name("remora-recovery".into()).spawn(move || {
            let started = Instant::now();
            // Positions are independent (different replacement nodes): rebuild them in parallel.
            thread::scope(|s| {
                for (g, pos) in affected {
                    let (sh, far) = (&sh, &far);
                    s.spawn(move || {
                        let mut tries = 0;
                        while let Err(e) = sh.recover(far, g, pos, tries) {
                            tries += 1;
                            sh.rebuild_retries.fetch_add(1, Ordering::Relaxed);
                            tracing::error!("ec-batch: rebuilding group {g} position {pos} failed: {e}");
                            if tries >= 5 {
                                break;
                            }
                            thread::sleep(Duration::from_millis(200));
                        }
                    });
                }
            });
            sh.rebuild_nanos
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            sh.recovering.fetch_sub(1, Ordering::Relaxed);
            sh.recoveries.fetch_add(1, Ordering::Relaxed);
        });
        if let Err(e) = spawned {
            tracing::error!("cannot start recovery: {e}");
            self.sh.recovering.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn remote_bytes_used(&self, _far: &FarMemory) -> u64 {
        self.sh.lock().used_pages * PAGE_SIZE as u64
    }

    fn report(&self) -> SchemeReport {
        let sh = &*self.sh;
        let (hole_pages, kept_pages) = {
            let st = sh.lock();
            (st.hole_pages, st.kept_pages)
        };
        SchemeReport {
            degraded_reads: sh.degraded.load(Ordering::Relaxed),
            reconstructed_bytes: sh.rebuilt.load(Ordering::Relaxed),
            reconstruct_time: Duration::from_nanos(sh.rebuild_nanos.load(Ordering::Relaxed)),
            recoveries: sh.recoveries.load(Ordering::Relaxed),
            recovering: sh.recovering.load(Ordering::Relaxed),
            hole_bytes: hole_pages * PAGE_SIZE as u64,
            kept_bytes: kept_pages * PAGE_SIZE as u64,
            repairs: sh.repairs.load(Ordering::Relaxed),
            rebuild_retries: sh.rebuild_retries.load(Ordering::Relaxed),
        }
    }
}
