//! `ec-split`: Hydra's erasure coding (paper §3.4 and Table 1, "EC-Split"),
//! the baseline Carbink's spansets are measured against. Each span is cut
//! into k data fragments, RS(k, m) adds m parity fragments, and the k+m
//! fragments go to k+m distinct memory nodes (one stripe group,
//! [`super::placement`]). A swap-in reads the k data fragments in parallel:
//! k read requests where `ec-batch` needs one, which is the cost the paper
//! measures (more requests per swap-in, more exposure to stragglers). What
//! it buys: any k of the k+m fragments rebuild a span, so a dead, slow or
//! corrupt node is simply read around, and a span never shares parity with
//! another span, so swapping one in leaves no hole for parity to keep.
//!
//! # Layout
//!
//! The spans of one swap-out are packed into *rows* (up to 256 KiB a
//! member): the member at position
//! `i` of a row is fragment `i` of each of its spans, concatenated, so a
//! span's fragments sit at the same offset in every member, and the parity
//! members, encoded span by span, hold each span's parity at that offset
//! too. A fragment is `len / k` bytes (rounded up, the last data fragment
//! zero-padded), so packing keeps a 1-page span's 2 KiB fragments from
//! each taking a page. Far bytes written are exactly (k+m)/k of the data
//! (when k divides the span length); each member is rounded up to whole
//! pages. A span's pages are freed as soon as no live span's fragment
//! shares them.
//!
//! - **Swap-out**: one write per position (vectored on data positions, so
//!   spans are not copied into members); a node that fails a write is
//!   avoided and the row placed again.
//! - **Swap-in**: k reads; fragments land in the span's local memory and
//!   nothing is decoded while all k data fragments arrive. With
//!   `late_binding`, k+1 (one parity too) and the first k to arrive.
//! - **Degraded read**: a failed, suspect or dead node's fragment is
//!   replaced by a parity fragment and decoded. For a span that failed its
//!   checksum, each fragment read is checked against the checksum recorded
//!   at swap-out, so the corrupt one is found and read around; `repair`
//!   rewrites just that fragment.
//! - **Recovery**: each position a dead node held is rebuilt on a
//!   replacement region, which decodes the fragment of every live span
//!   there itself ([`super::recovery`]), each checked against the checksum
//!   recorded at swap-out.
//!
//! A clean span swapped in keeps its fragments ([`Scheme::keep`]) and goes
//! back without a write, as under every other scheme, so the comparison
//! measures splitting, not a missing optimisation. A kept span's fragments
//! are rebuilt with the live ones after a node dies.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use remora_proto::NodeId;
use remora_proto::checksum::checksum;

use super::recovery::{self, Lost};
use super::shards::{self, Shard, Stripes, Waiters};
use super::{CopyRead, Departure, Scheme, SchemeReport, SpanAddr};
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::size_classes::PAGE_SIZE;

const NAME: &str = "ec-split";

/// Member bytes per row at most (a larger span still gets a row of its own).
const ROW_BYTES: usize = 256 << 10;

/// One span of a row.
struct Frag {
    /// Byte offset of its fragment in every member of the row.
    at: usize,
    /// Bytes of each fragment.
    len: usize,
    /// The far address the runtime knows the span by.
    name: (u16, u32),
    /// Its far copy is held: live, or kept for a clean re-eviction.
    live: bool,
    /// Kept: the span is local and clean, and may go back without a write.
    kept: bool,
    /// Checksum of each of its k+m fragments as written.
    sums: Vec<u64>,
}

struct Row {
    group: usize,
    /// First page of the member at each position.
    pages: Vec<u32>,
    /// Pages of each member.
    len: u32,
    spans: Vec<Frag>,
    live: usize,
}

impl Row {
    /// Member pages the fragments of span `j` touch.
    fn touched(&self, j: usize) -> std::ops::Range<u32> {
        let f = &self.spans[j];
        (f.at / PAGE_SIZE) as u32..(f.at + f.len).div_ceil(PAGE_SIZE) as u32
    }
}

#[derive(Default)]
struct State {
    rows: HashMap<u64, Row>,
    /// Span name → (row, index in the row).
    by_span: HashMap<(u16, u32), (u64, usize)>,
    /// Positions whose fragment of a span failed its checksum in the last
    /// degraded read: what [`Scheme::repair`] rewrites.
    corrupt: HashMap<(u16, u32), Vec<usize>>,
    /// Far bytes held by kept copies (all k+m fragments of each).
    kept_bytes: u64,
    next_id: u64,
}

struct Shared {
    c: Stripes,
    st: Mutex<State>,
    /// Set with late binding.
    late: Option<Waiters>,
}

/// Hydra-style split spans with RS(k, m).
pub struct EcSplit {
    sh: Arc<Shared>,
}

fn offset(page: u32) -> u64 {
    page as u64 * PAGE_SIZE as u64
}

/// Where a span's fragments are, copied out of the state.
struct Located {
    group: usize,
    pages: Vec<u32>,
    at: usize,
    len: usize,
    sums: Vec<u64>,
}

impl EcSplit {
    /// `ec-split` with RS(k, m); `late_binding` reads k+1 fragments per
    /// swap-in and uses the first k to arrive.
    pub fn new(k: usize, m: usize, late_binding: bool) -> Result<Self, RuntimeError> {
        Ok(Self {
            sh: Arc::new(Shared {
                c: Stripes::new(NAME, k, m)?,
                st: Mutex::new(State::default()),
                late: late_binding.then(Waiters::default),
            }),
        })
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn locate(&self, at: SpanAddr) -> Result<Located, RuntimeError> {
        let st = self.lock();
        let lost = || RuntimeError::lost_because(at, format!("{NAME}: no row holds it"));
        let &(id, j) = st.by_span.get(&(at.region, at.page)).ok_or_else(lost)?;
        let row = st.rows.get(&id).ok_or_else(lost)?;
        let f = &row.spans[j];
        Ok(Located {
            group: row.group,
            pages: row.pages.clone(),
            at: f.at,
            len: f.len,
            sums: f.sums.clone(),
        })
    }

    /// Reads the span at `at` into `dest` from any k of its fragments,
    /// preferring the data fragments. With `verify`, each fragment must
    /// match its recorded checksum (the span failed its own), and the
    /// positions that did not are remembered for [`Scheme::repair`].
    fn read(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8], verify: bool) -> Result<(), RuntimeError> {
        let (k, n) = (self.c.k, self.c.n());
        let loc = self.locate(at)?;
        let f = loc.len;
        if dest.len().div_ceil(k) != f {
            return Err(RuntimeError::lost_because(
                at,
                format!("{NAME}: the span is {} bytes far, {} asked for", k * f, dest.len()),
            ));
        }
        let g = self.c.place.group(loc.group);
        let usable: Vec<bool> = (0..n).map(|p| !self.c.place.unusable(far, loc.group, p)).collect();
        let cands: Vec<Shard> = (0..n)
            .filter(|&p| usable[p])
            .map(|p| Shard {
                pos: p,
                node: g.nodes[p],
                region: g.regions[p],
                offset: offset(loc.pages[p]) + loc.at as u64,
                len: f,
                generation: None,
            })
            .collect();
        // Data fragments land in `dest` itself unless the span is padded.
        let direct = dest.len() == k * f;
        let mut work = if direct { Vec::new() } else { vec![0u8; k * f] };
        let buf: &mut [u8] = if direct { &mut *dest } else { &mut work };
        let mut parity = vec![0u8; self.c.m * f];
        let mut dests: Vec<&mut [u8]> = buf
            .chunks_mut(f)
            .chain(parity.chunks_mut(f))
            .zip(&usable)
            .filter_map(|(d, &u)| u.then_some(d))
            .collect();
        let mut bad = Vec::new();
        let late = if verify { None } else { self.late.as_ref() };
        let got = shards::gather(far, &cands, &mut dests, k, late, &mut |i, b| {
            let ok = !verify || checksum(b) == loc.sums[cands[i].pos];
            if !ok {
                bad.push(cands[i].pos);
            }
            ok
        });
        if got.arrived.len() < k {
            return Err(self.c.too_few(Some(at), loc.group, got.arrived.len()));
        }
        let missing: Vec<usize> = (0..k)
            .filter(|p| !got.arrived.iter().any(|&i| cands[i].pos == *p))
            .collect();
        if !usable[..k].iter().all(|&u| u) || got.failed > 0 || verify {
            self.c.degraded.fetch_add(1, Ordering::Relaxed);
        }
        if !missing.is_empty() {
            let mut out = vec![0u8; missing.len() * f];
            let present: Vec<(usize, &[u8])> = got.arrived.iter().map(|&i| (cands[i].pos, &*dests[i])).collect();
            for (&p, o) in missing.iter().zip(out.chunks_mut(f)) {
                self.c
                    .codec
                    .decode_data(&present, p, o)
                    .map_err(|e| RuntimeError::lost_because(at, format!("{NAME}: decode: {e}")))?;
            }
            for (&p, o) in missing.iter().zip(out.chunks(f)) {
                buf[p * f..(p + 1) * f].copy_from_slice(o);
            }
        }
        if !direct {
            dest.copy_from_slice(&work[..dest.len()]);
        }
        if verify {
            self.lock().corrupt.insert((at.region, at.page), bad);
        }
        Ok(())
    }

    /// Encodes, places and writes one row of `spans`; records it and
    /// returns its id and the spans' names.
    fn write_row(&self, far: &FarMemory, spans: &[&[u8]]) -> Result<(u64, Vec<SpanAddr>), RuntimeError> {
        let (k, m) = (self.c.k, self.c.m);
        let lens: Vec<usize> = spans.iter().map(|s| s.len().div_ceil(k)).collect();
        let ats: Vec<usize> = lens
            .iter()
            .scan(0, |acc, &l| {
                *acc += l;
                Some(*acc - l)
            })
            .collect();
        let used: usize = lens.iter().sum();
        // Zero-padded copies only of spans whose length k does not divide.
        let padded: Vec<Option<Vec<u8>>> = spans
            .iter()
            .zip(&lens)
            .map(|(s, &f)| {
                (s.len() != k * f).then(|| {
                    let mut v = vec![0u8; k * f];
                    v[..s.len()].copy_from_slice(s);
                    v
                })
            })
            .collect();
        let data = |j: usize, p: usize| -> &[u8] {
            let src = padded[j].as_deref().unwrap_or(spans[j]);
            &src[p * lens[j]..(p + 1) * lens[j]]
        };
        let mut parity = vec![vec![0u8; used]; m];
        for j in 0..spans.len() {
            let frags: Vec<&[u8]> = (0..k).map(|p| data(j, p)).collect();
            let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|v| &mut v[ats[j]..ats[j] + lens[j]]).collect();
            self.c.codec.encode(&frags, &mut outs).map_err(RuntimeError::Codec)?;
        }
        let sums: Vec<Vec<u64>> = (0..spans.len())
            .map(|j| {
                (0..k)
                    .map(|p| checksum(data(j, p)))
                    .chain(parity.iter().map(|q| checksum(&q[ats[j]..ats[j] + lens[j]])))
                    .collect()
            })
            .collect();
        let len = used.div_ceil(PAGE_SIZE) as u32;
        let sizes = vec![len; k + m];
        let (group, pages) = shards::place_and_write(far, &self.c, &sizes, |pages| {
            (0..k)
                .map(|p| {
                    let pieces = (0..spans.len()).map(|j| (offset(pages[p]) + ats[j] as u64, data(j, p)));
                    (p, pieces.collect())
                })
                .chain((0..m).map(|q| (k + q, vec![(offset(pages[k + q]), parity[q].as_slice())])))
                .collect()
        })?;
        // A span is named by a page its fragments cover (so the name is
        // never reused while it lives): the first page of its fragment, at
        // the c-th position for the c-th fragment starting in that page (at
        // most k do: a fragment is at least a k-th of a page).
        let regions = self.c.place.group(group).regions;
        let mut frags = Vec::with_capacity(spans.len());
        let mut names = Vec::with_capacity(spans.len());
        for (j, sums) in sums.into_iter().enumerate() {
            let q = (ats[j] / PAGE_SIZE) as u32;
            let c = ats[..j].iter().filter(|&&a| (a / PAGE_SIZE) as u32 == q).count();
            let name = (regions[c], pages[c] + q);
            names.push(SpanAddr {
                region: name.0,
                page: name.1,
            });
            frags.push(Frag {
                at: ats[j],
                len: lens[j],
                name,
                live: true,
                kept: false,
                sums,
            });
        }
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        // Every span is cut into k fragments, so a row is never a partial
        // stripe: only rounding members up to whole pages costs extra.
        self.c.count_batch(self.c.k);
        for (j, f) in frags.iter().enumerate() {
            st.by_span.insert(f.name, (id, j));
        }
        let live = frags.len();
        st.rows.insert(
            id,
            Row {
                group,
                pages,
                len,
                spans: frags,
                live,
            },
        );
        Ok((id, names))
    }

    /// Frees a row just written (a later one of the same swap-out failed).
    fn unplace(&self, far: &FarMemory, id: u64) {
        let mut st = self.lock();
        let Some(row) = st.rows.remove(&id) else { return };
        for f in &row.spans {
            st.by_span.remove(&f.name);
        }
        for (p, &page) in row.pages.iter().enumerate() {
            self.c.place.free(far, row.group, p, page, row.len);
        }
    }

    /// Span `at` left far memory: frees the member pages no live span's
    /// fragment shares any more, and the row with its last span.
    fn release(&self, far: &FarMemory, at: SpanAddr) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let key = (at.region, at.page);
        st.corrupt.remove(&key);
        let Some((id, j)) = st.by_span.remove(&key) else { return };
        let Some(row) = st.rows.get_mut(&id) else { return };
        if !std::mem::replace(&mut row.spans[j].live, false) {
            return;
        }
        if std::mem::replace(&mut row.spans[j].kept, false) {
            let bytes = self.c.n() as u64 * row.spans[j].len as u64;
            st.kept_bytes -= bytes;
        }
        row.live -= 1;
        let touched = row.touched(j);
        let free: Vec<u32> = touched
            .filter(|&q| (0..row.spans.len()).all(|i| !row.spans[i].live || !row.touched(i).contains(&q)))
            .collect();
        // Consecutive pages are freed as one run at every position.
        for run in free.chunk_by(|a, b| a + 1 == *b) {
            for (p, &page) in row.pages.iter().enumerate() {
                self.c.place.free(far, row.group, p, page + run[0], run.len() as u32);
            }
        }
        if row.live == 0 {
            st.rows.remove(&id);
        }
    }

    /// Span `at` was swapped in clean: its fragments stay, kept. A split
    /// span's fragments and parity are its own, so a kept copy holds only
    /// its own bytes (and whatever pages it shares with neighbours).
    fn keep(&self, at: SpanAddr) -> Option<u64> {
        let mut st = self.lock();
        let &(id, j) = st.by_span.get(&(at.region, at.page))?;
        let n = self.c.n() as u64;
        let f = &mut st.rows.get_mut(&id)?.spans[j];
        if !f.live || f.kept {
            return None;
        }
        f.kept = true;
        let bytes = n * f.len as u64;
        st.kept_bytes += bytes;
        Some(id)
    }

    /// Ends the kept state of `at` if `token` names it; true if it was kept.
    fn unkeep(&self, at: SpanAddr, token: u64) -> bool {
        let mut st = self.lock();
        let Some(&(id, j)) = st.by_span.get(&(at.region, at.page)) else {
            return false;
        };
        let n = self.c.n() as u64;
        let Some(row) = st.rows.get_mut(&id) else { return false };
        let f = &mut row.spans[j];
        if id != token || !f.kept {
            return false;
        }
        f.kept = false;
        let bytes = n * f.len as u64;
        st.kept_bytes -= bytes;
        true
    }

    /// Rewrites the fragments of `at` that failed their checksum in the
    /// last degraded read, re-encoded from verified bytes.
    fn repair(&self, far: &FarMemory, at: SpanAddr, good: &[u8]) -> Result<(), RuntimeError> {
        let bad = self.lock().corrupt.remove(&(at.region, at.page)).unwrap_or_default();
        if bad.is_empty() {
            return Ok(());
        }
        let loc = self.locate(at)?;
        let (k, f) = (self.c.k, loc.len);
        let mut data = vec![0u8; k * f];
        data[..good.len()].copy_from_slice(good);
        let frags: Vec<&[u8]> = data.chunks(f).collect();
        let parity = self.c.codec.encode_to_vec(&frags).map_err(RuntimeError::Codec)?;
        let g = self.c.place.group(loc.group);
        for &p in &bad {
            let bytes = if p < k { frags[p] } else { &parity[p - k] };
            if checksum(bytes) != loc.sums[p] {
                return Err(RuntimeError::lost_because(
                    at,
                    format!("{NAME}: re-encoded fragment {p} differs from what was written"),
                ));
            }
            let (r, c) = far.regions().client(g.regions[p])?;
            c.write(r.grant.cap, offset(loc.pages[p]) + loc.at as u64, bytes)?;
        }
        self.c.repairs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Rebuilds position `pos` of group `g` on a replacement region: the
    /// fragment of every held span there (kept ones too: they may go back
    /// without a write); returns the bytes rebuilt.
    fn recover(&self, far: &FarMemory, lost: &Lost) -> Result<u64, RuntimeError> {
        let (g, pos) = (lost.group, lost.pos);
        let done = recovery::rebuild(far, &self.c.place, lost, |cands| {
            let st = self.lock();
            let mut rows = Vec::new();
            for row in st.rows.values().filter(|r| r.group == g) {
                for f in row.spans.iter().filter(|f| f.live) {
                    let at = f.at as u64;
                    rows.push(recovery::Row {
                        offset: offset(row.pages[pos]) + at,
                        row_len: f.len as u32,
                        out_len: f.len as u32,
                        sum: Some(f.sums[pos]),
                        from: cands
                            .iter()
                            .map(|&p| (p, offset(row.pages[p]) + at, f.len as u32))
                            .collect(),
                        tag: 0,
                    });
                }
            }
            rows
        })?;
        // A fragment no k survivors rebuilt to its checksum: its span's
        // reads fail their checksums, decoded too, and report it lost.
        Ok(done.bytes)
    }
}

impl Scheme for EcSplit {
    fn name(&self) -> &'static str {
        NAME
    }

    fn swap_out(&self, far: &FarMemory, spans: &[&[u8]], _sums: &[u64]) -> Result<Vec<SpanAddr>, RuntimeError> {
        let sh = &*self.sh;
        let mut out = Vec::with_capacity(spans.len());
        let mut placed = Vec::new();
        let mut start = 0;
        while start < spans.len() {
            // A row: the next spans, up to ROW_BYTES per member (at least one).
            let (mut end, mut used) = (start, 0);
            while end < spans.len() && (end == start || used + spans[end].len().div_ceil(sh.c.k) <= ROW_BYTES) {
                used += spans[end].len().div_ceil(sh.c.k);
                end += 1;
            }
            match sh.write_row(far, &spans[start..end]) {
                Ok((id, names)) => {
                    placed.push(id);
                    out.extend(names);
                }
                Err(e) => {
                    // All or nothing: the caller keeps every span local.
                    for id in placed {
                        sh.unplace(far, id);
                    }
                    return Err(e);
                }
            }
            start = end;
        }
        Ok(out)
    }

    fn read_copy(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<CopyRead, RuntimeError> {
        // The fragments are read around failures as they are gathered.
        self.sh.read(far, at, dest, false)?;
        Ok(CopyRead::Read)
    }

    fn read_around(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<(), RuntimeError> {
        self.sh.read(far, at, dest, true)
    }

    fn repair(&self, far: &FarMemory, at: SpanAddr, good: &[u8]) -> Result<(), RuntimeError> {
        self.sh.repair(far, at, good)
    }

    fn release(&self, far: &FarMemory, at: SpanAddr, _pages: u32) {
        self.sh.release(far, at);
    }

    fn keep(&self, _far: &FarMemory, at: SpanAddr, _pages: u32) -> Option<u64> {
        self.sh.keep(at)
    }

    fn reuse(&self, _far: &FarMemory, at: SpanAddr, _pages: u32, token: u64) -> bool {
        self.sh.unkeep(at, token)
    }

    fn drop_kept(&self, far: &FarMemory, at: SpanAddr, _pages: u32, token: u64) {
        if self.sh.unkeep(at, token) {
            self.sh.release(far, at);
        }
    }

    fn node_left(&self, far: &Arc<FarMemory>, node: NodeId, why: Departure) -> bool {
        let sh = &self.sh;
        let (me, far) = (Arc::clone(sh), Arc::clone(far));
        sh.c.recovery
            .node_left(NAME, (sh.c.k, sh.c.m), &sh.c.place, (node, why), move |lost| {
                me.recover(&far, lost)
            })
    }

    fn stop(&self) {
        self.sh.c.stop();
        if let Some(w) = &self.sh.late {
            w.stop();
        }
    }

    fn give_back(&self, far: &FarMemory) -> u64 {
        self.sh.c.give_back(far)
    }

    fn stripe_groups(&self) -> Vec<Vec<u16>> {
        self.sh.c.place.regions_by_group()
    }

    fn report(&self) -> SchemeReport {
        // No holes: a span's fragments are freed with it.
        SchemeReport {
            kept_bytes: self.sh.lock().kept_bytes,
            ..self.sh.c.report()
        }
    }
}

impl Drop for EcSplit {
    fn drop(&mut self) {
        // No waiter thread outlives the scheme (each ends with its queue).
        if let Some(w) = &self.sh.late {
            w.stop();
        }
    }
}
