//! Placement, shared by every scheme: **stripe groups** of `width` regions
//! on `width` distinct memory nodes, far space inside them (the far page
//! heap, one allocator for every scheme), the nodes we suspect, and the
//! replacement of a dead node's region.
//!
//! A scheme asks for one run of far pages per position of a group
//! ([`Placement::place`]), sized per position (0: nothing there). Each run
//! may sit at any page of its position's region: the members of a spanset
//! need not share a row (per-position spansets), so remote compaction can
//! recombine live spans position by position. `non-ft` uses groups of one.
//!
//! **Giving regions back.** Far memory held should follow the data, so a
//! group whose regions hold nothing goes back to the manager
//! ([`Placement::give_back_empty`]), keeping one empty group as a spare so a
//! workload that shrinks and grows again does not churn. For groups to
//! empty at all, placement steers new spans away from sparse groups: groups
//! below [`DRAINING`] of their pages in use take new spans only when the
//! fuller ones have no room, fullest first; swap-ins, frees and compaction
//! then empty them.
//!
//! **Short groups.** A scheme that allows it ([`Placement::shortening`],
//! `ec-batch` with k > 1) keeps writing while fewer than k+m memory nodes
//! live (but at least m+1): a group is then made of the live nodes only,
//! its last data positions *empty* (no region, no node: [`NO_REGION`]).
//! A spanset there is a shortened RS(k, m) codeword: its data members at
//! empty positions are known zeros, so the same codec encodes, decodes
//! and rebuilds it, and it still tolerates m losses, at a parity overhead
//! of (k'+m)/k' for k' data members instead of (k+m)/k.
//! [`Placement::data_width`] says how many data members new spansets take;
//! while it is short, placement asks the manager for a full group once a
//! second, and full spansets come back as soon as one is granted. Then
//! each short group is *widened* ([`Placement::widen`]): its empty
//! positions get regions on live nodes outside it, so it takes full
//! spansets again and compaction can fold its short ones into them.
//!
//! Positions are recorded under placement's lock, and a node's liveness is
//! checked under it too: a death declared before finds the region refused,
//! a death declared after finds the position recorded and fails it. Adding,
//! widening and giving back groups hold `growing` throughout, so a group
//! slot seen is still the same group when its position is recorded.
//!
//! Lock order: a scheme's own state lock may be held while calling
//! [`Placement::group`] or [`Placement::free`]
//! (placement's lock is taken after it, briefly, and never the other way);
//! [`Placement::place`], [`Placement::replacement`], [`Placement::rebind`],
//! [`Placement::data_width`] and [`Placement::retire_emptied`] talk to the
//! manager and must be called with no scheme lock held.

use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::{NodeId, RegionGrant, RemoteError, RpcError};

use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::size_classes::PAGE_SIZE;

/// Share of a group's pages in use below which it is left to empty.
const DRAINING: f64 = 0.25;

/// The region index of an empty position of a short group.
pub(crate) const NO_REGION: u16 = u16::MAX;

/// The node of an empty position of a short group (no real node's id).
pub(crate) const NO_NODE: NodeId = NodeId(u64::MAX);

/// How long a rebuild waits for a live node outside its group before the
/// group is re-striped instead (see [`Placement::replacement`]).
const SPARE_WAIT: Duration = Duration::from_secs(1);

/// While spansets are short, how often a full group is asked for.
const WIDEN_EVERY: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One stripe group: position `i` is region `regions[i]` on `nodes[i]`.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) regions: Vec<u16>,
    pub(crate) nodes: Vec<NodeId>,
    /// The node at this position died; its region awaits a rebuild.
    pub(crate) failed: Vec<bool>,
    /// Given back to the manager: nothing lives here, and the slot is
    /// reused by the next group added.
    pub(crate) retired: bool,
}

impl Group {
    /// Whether position `pos` has a region (not an empty position of a
    /// short group).
    pub(crate) fn present(&self, pos: usize) -> bool {
        self.regions[pos] != NO_REGION
    }

    /// Its regions (empty positions left out).
    pub(crate) fn present_regions(&self) -> impl Iterator<Item = u16> + '_ {
        self.regions.iter().copied().filter(|&r| r != NO_REGION)
    }

    /// Whether a position lost its node and awaits a rebuild.
    pub(crate) fn degraded(&self) -> bool {
        self.failed.iter().any(|&f| f)
    }
}

#[derive(Default)]
struct State {
    groups: Vec<Group>,
    /// Where the next search starts, to spread load over groups.
    next: usize,
    /// Groups added so far (a thread that saw an older count knows another
    /// one grew meanwhile).
    grown: usize,
}

/// Lets go of region `idx`, added but never recorded in a group: out of
/// the far page heap and the region table, and back to the manager unless
/// its node was declared dead (the manager took it back then).
fn let_go(far: &FarMemory, idx: u16) {
    far.pages().remove_if_empty(idx);
    if let Some(grant) = far.regions().vacate(idx)
        && !far.is_dead(grant.node)
    {
        far.give_back(grant.cap.region);
    }
}

/// Share of group `g`'s pages in use.
fn fill(far: &FarMemory, g: &Group) -> f64 {
    let (used, all) = g.present_regions().fold((0u64, 0u64), |(u, a), r| {
        let (ru, ra) = far.pages().usage(r);
        (u + ru as u64, a + ra as u64)
    });
    if all == 0 { 0.0 } else { used as f64 / all as f64 }
}

/// Stripe groups of one width, and the far space in them.
pub(crate) struct Placement {
    width: usize,
    scheme: &'static str,
    st: Mutex<State>,
    /// Held while a group is requested: threads that find every group full
    /// at once must not each take `width` regions.
    growing: Mutex<()>,
    /// (k, m) when groups may be short (see the module docs).
    short: Option<(usize, usize)>,
    /// Data members new spansets take (k unless short).
    data_width: std::sync::atomic::AtomicUsize,
    /// When a full group was last asked for while short.
    widen_tried: Mutex<Option<Instant>>,
}

impl Placement {
    pub(crate) fn new(width: usize, scheme: &'static str) -> Self {
        Self {
            width,
            scheme,
            st: Mutex::new(State::default()),
            growing: Mutex::new(()),
            short: None,
            data_width: std::sync::atomic::AtomicUsize::new(width),
            widen_tried: Mutex::new(None),
        }
    }

    /// Groups of RS(`k`, `m`) stripes that may be short (see the module
    /// docs): only for a scheme whose spansets may have data members that
    /// are never written (`ec-batch`).
    pub(crate) fn shortening(mut self, k: usize, m: usize) -> Self {
        debug_assert_eq!(k + m, self.width);
        if k > 1 {
            self.short = Some((k, m));
            self.data_width = std::sync::atomic::AtomicUsize::new(k);
        }
        self
    }

    /// Data members new spansets should take (at most the width, for a
    /// placement that does not shorten): k, or fewer while too few
    /// memory nodes live for a full group. While short, asks the manager
    /// for a full group at most once per [`WIDEN_EVERY`] (with no scheme
    /// lock held: it may talk to the manager).
    pub(crate) fn data_width(&self, far: &FarMemory) -> usize {
        let w = self.data_width.load(std::sync::atomic::Ordering::Acquire);
        let Some((k, _)) = self.short else { return w };
        if w < k {
            let due = {
                let mut t = lock(&self.widen_tried);
                let due = t.is_none_or(|t| t.elapsed() >= WIDEN_EVERY);
                if due {
                    *t = Some(Instant::now());
                }
                due
            };
            if due {
                let seen = lock(&self.st).grown;
                if let Err(e) = self.grow(far, &[], seen, true, false, &[]) {
                    tracing::debug!("{}: asking for a full stripe group: {e}", self.scheme);
                }
            }
        }
        self.data_width.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Gives the empty positions of short groups regions on live nodes the
    /// groups do not use, while the manager has them and every position is
    /// live: such a group is full width again, so it takes full spansets,
    /// and a fold can fill its short spansets' empty members on the new
    /// node. Returns the positions filled. Asks the manager at most once
    /// per [`WIDEN_EVERY`] while full groups are placed again; never call
    /// it with a scheme lock held.
    pub(crate) fn widen(&self, far: &FarMemory) -> usize {
        let Some((k, _)) = self.short else { return 0 };
        if self.data_width.load(std::sync::atomic::Ordering::Acquire) < k {
            return 0;
        }
        {
            let mut t = lock(&self.widen_tried);
            if t.is_some_and(|t| t.elapsed() < WIDEN_EVERY) {
                return 0;
            }
            *t = Some(Instant::now());
        }
        // No group is added, retired or given back meanwhile (a retired
        // slot is reused by the next group added).
        let _one = lock(&self.growing);
        let short: Vec<(usize, Vec<usize>)> = {
            let st = lock(&self.st);
            st.groups
                .iter()
                .enumerate()
                .filter(|(_, g)| !g.retired && !g.degraded())
                .map(|(gi, g)| (gi, (0..self.width).filter(|&p| !g.present(p)).collect::<Vec<usize>>()))
                .filter(|(_, empty)| !empty.is_empty())
                .collect()
        };
        let mut filled = 0;
        for (gi, empty) in short {
            let g = self.group(gi);
            let Some(&first) = g.present_regions().collect::<Vec<_>>().first() else {
                continue;
            };
            let pages = far.pages().usage(first).1;
            let mut exclude: Vec<NodeId> = g.nodes.iter().copied().filter(|&n| n != NO_NODE).collect();
            exclude.extend(far.detector().suspects.list());
            for pos in empty {
                let grant = match far.backend().alloc(1, false, &exclude) {
                    Ok(v) => match v.into_iter().next() {
                        Some(grant) => grant,
                        None => return filled,
                    },
                    Err(e) => {
                        tracing::debug!("{}: widening stripe group {gi}: {e}", self.scheme);
                        return filled;
                    }
                };
                if grant.size / (PAGE_SIZE as u64) < pages as u64 {
                    far.give_back(grant.cap.region);
                    return filled;
                }
                let node = grant.node;
                let idx = match far.regions().add(grant.clone()) {
                    Ok(idx) => idx,
                    Err(e) => {
                        far.give_back(grant.cap.region);
                        tracing::debug!("{}: widening stripe group {gi}: {e}", self.scheme);
                        return filled;
                    }
                };
                far.pages().add_region(idx, pages);
                let mut st = lock(&self.st);
                // Checked under the groups' lock: a death declared after
                // this finds the position recorded and fails it. A group
                // that lost a position meanwhile is rebuilt or re-striped
                // as it is.
                let grp = &st.groups[gi];
                if far.is_dead(node) || grp.retired || grp.degraded() || grp.present(pos) {
                    drop(st);
                    let_go(far, idx);
                    return filled;
                }
                st.groups[gi].regions[pos] = idx;
                st.groups[gi].nodes[pos] = node;
                drop(st);
                exclude.push(node);
                filled += 1;
            }
            tracing::debug!("{}: stripe group {gi} is full width again", self.scheme);
        }
        if filled > 0 {
            tracing::info!(
                "{}: {filled} empty positions of short stripe groups given regions on live nodes",
                self.scheme
            );
        }
        filled
    }

    /// Per group (by index): whether it is short (has empty positions),
    /// and whether it is degraded (a position lost, not yet rebuilt).
    pub(crate) fn flags(&self) -> Vec<(bool, bool)> {
        let st = lock(&self.st);
        st.groups
            .iter()
            .map(|g| (!g.retired && g.regions.contains(&NO_REGION), !g.retired && g.degraded()))
            .collect()
    }

    /// The regions of every group in use (empty positions left out).
    pub(crate) fn regions_by_group(&self) -> Vec<Vec<u16>> {
        lock(&self.st)
            .groups
            .iter()
            .filter(|g| !g.retired)
            .map(|g| g.present_regions().collect())
            .collect()
    }

    /// A copy of group `g`.
    pub(crate) fn group(&self, g: usize) -> Group {
        lock(&self.st).groups[g].clone()
    }

    /// Whether the node at (`g`, `pos`) should be read around.
    pub(crate) fn unusable(&self, far: &FarMemory, g: usize, pos: usize) -> bool {
        let (failed, node) = {
            let st = lock(&self.st);
            (st.groups[g].failed[pos], st.groups[g].nodes[pos])
        };
        failed || far.is_suspect(node)
    }

    /// Takes one run of `pages[i]` far pages at each position `i` of one
    /// group; returns the group and each run's first page (0 where
    /// `pages[i]` is 0). Levels, most careful first: groups clear of
    /// suspects and of `exclude` (nodes that failed this caller); then
    /// groups with a suspect; then any group, waiting up to `patience` for
    /// the manager. A transient failure thus never strands a caller while
    /// usable nodes exist.
    pub(crate) fn place(
        &self,
        far: &FarMemory,
        pages: &[u32],
        exclude: &[NodeId],
    ) -> Result<(usize, Vec<u32>), RuntimeError> {
        debug_assert_eq!(pages.len(), self.width);
        let levels: [(bool, &[NodeId]); 3] = [(false, exclude), (true, exclude), (true, &[])];
        for (i, (suspects_too, avoid)) in levels.into_iter().enumerate() {
            let last = i == levels.len() - 1;
            loop {
                let (found, seen) = self.try_alloc(far, pages, suspects_too, avoid);
                if let Some(f) = found {
                    return Ok(f);
                }
                if !self.grow(far, avoid, seen, !suspects_too, last, pages)? {
                    break;
                }
            }
        }
        unreachable!("the last level waits for a group or fails")
    }

    fn try_alloc(
        &self,
        far: &FarMemory,
        pages: &[u32],
        suspects_too: bool,
        avoid: &[NodeId],
    ) -> (Option<(usize, Vec<u32>)>, usize) {
        let mut st = lock(&self.st);
        let n = st.groups.len();
        // Groups that may take spans, in round-robin order; sparse ones
        // after the rest, fullest first, so that they can empty.
        let mut open = Vec::with_capacity(n);
        let mut sparse = Vec::new();
        for k in 0..n {
            let gi = (st.next + k) % n;
            let g = &st.groups[gi];
            if g.retired
                || g.failed.iter().any(|&f| f)
                || pages.iter().enumerate().any(|(p, &want)| want > 0 && !g.present(p))
                || g.nodes.iter().any(|n| avoid.contains(n))
                || (!suspects_too && g.nodes.iter().any(|n| far.is_suspect(*n)))
            {
                continue;
            }
            let fill = fill(far, g);
            if fill >= DRAINING {
                open.push(gi);
            } else {
                sparse.push((gi, fill));
            }
        }
        sparse.sort_by(|a, b| b.1.total_cmp(&a.1));
        for gi in open.into_iter().chain(sparse.into_iter().map(|(gi, _)| gi)) {
            let g = &st.groups[gi];
            let mut got = Vec::with_capacity(self.width);
            for (pos, &want) in pages.iter().enumerate() {
                if want == 0 {
                    got.push(0);
                    continue;
                }
                match far.pages().alloc_in(g.regions[pos], want) {
                    Some(p) => got.push(p),
                    None => break,
                }
            }
            if got.len() == self.width {
                st.next = (gi + 1) % n;
                return (Some((gi, got)), st.grown);
            }
            // Roll back the runs taken in this group (no one else allocates
            // here: every allocation holds this lock).
            for (pos, &p) in got.iter().enumerate() {
                if pages[pos] > 0 {
                    far.pages().free(g.regions[pos], p, pages[pos]);
                }
            }
        }
        (None, st.grown)
    }

    /// Gives every group that holds nothing back to the manager, but one
    /// (a spare); returns the bytes given back. Never call it with a scheme
    /// lock held: it talks to the manager.
    pub(crate) fn give_back_empty(&self, far: &FarMemory) -> u64 {
        // No group is added meanwhile (it could take a slot being emptied).
        let _one = lock(&self.growing);
        let regions: Vec<u16> = {
            let mut st = lock(&self.st);
            let mut spare = false;
            let mut out = Vec::new();
            for g in st.groups.iter_mut() {
                if g.retired || g.failed.iter().any(|&f| f) {
                    continue;
                }
                if g.present_regions().any(|r| far.pages().usage(r).0 > 0) {
                    continue;
                }
                if !spare {
                    spare = true;
                    continue;
                }
                // Every allocation holds `st`, and frees only empty a region
                // further, so each region of this group comes out.
                for r in g.present_regions() {
                    let removed = far.pages().remove_if_empty(r);
                    debug_assert!(removed, "an empty region stays empty under the placement lock");
                }
                g.retired = true;
                out.extend(g.present_regions());
            }
            out
        };
        let mut bytes = 0;
        for r in regions {
            if let Some(grant) = far.regions().vacate(r) {
                bytes += grant.size;
                far.give_back(grant.cap.region);
            }
        }
        if bytes > 0 {
            tracing::debug!(
                "{}: gave {} MiB of empty regions back ({} regions held)",
                self.scheme,
                bytes >> 20,
                far.regions().len()
            );
        }
        bytes
    }

    /// Returns a run taken by [`Placement::place`].
    pub(crate) fn free(&self, far: &FarMemory, g: usize, pos: usize, page: u32, pages: u32) {
        if pages > 0 {
            let region = lock(&self.st).groups[g].regions[pos];
            far.pages().free(region, page, pages);
        }
    }

    /// Adds a group (avoiding `avoid`, and suspects if `avoid_suspects`)
    /// unless another thread added one since the caller saw `seen` groups
    /// (then the caller just tries again). False when the manager has too
    /// few nodes and `wait` is not set. With `wait`, too few nodes for a
    /// full group but enough for a short one (if this placement shortens)
    /// make a short group; a request for `pages` that needs a position
    /// the short group lacks fails then, and is asked again narrower.
    fn grow(
        &self,
        far: &FarMemory,
        avoid: &[NodeId],
        seen: usize,
        avoid_suspects: bool,
        wait: bool,
        pages: &[u32],
    ) -> Result<bool, RuntimeError> {
        let need_pages = pages.iter().copied().max().unwrap_or(0);
        let _one = lock(&self.growing);
        if lock(&self.st).grown != seen {
            return Ok(true);
        }
        let mut avoid = avoid.to_vec();
        if avoid_suspects {
            avoid.extend(far.detector().suspects.list());
        }
        let n = self.width as u32;
        let start = Instant::now();
        let grants = loop {
            match far.backend().alloc(n, true, &avoid) {
                Ok(g) => break g,
                Err(RpcError::Remote(RemoteError::NoCapacity { .. })) if !wait => return Ok(false),
                Err(RpcError::Remote(RemoteError::NoCapacity { available, .. }))
                    if self
                        .short
                        .is_some_and(|(k, m)| (m + 1..k + m).contains(&(available as usize))) =>
                {
                    let (k, m) = self.short.expect("checked");
                    let narrow = available as usize - m;
                    self.set_data_width(narrow);
                    if pages[narrow.min(pages.len())..k.min(pages.len())]
                        .iter()
                        .any(|&p| p > 0)
                    {
                        return Err(RuntimeError::FarMemoryExhausted(format!(
                            "{}: {available} live memory nodes: spansets now take {narrow} data spans",
                            self.scheme
                        )));
                    }
                    match far.backend().alloc(available, true, &avoid) {
                        Ok(g) => break g,
                        // Fewer still: look again.
                        Err(RpcError::Remote(RemoteError::NoCapacity { .. })) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(RpcError::Remote(RemoteError::NoCapacity { available, .. })) => {
                    // A runtime shutting down stops waiting for capacity that
                    // may take minutes to come (a cluster short of k+m nodes).
                    if far.is_stopping() {
                        return Err(RuntimeError::Shutdown);
                    }
                    if start.elapsed() > far.patience() {
                        return Err(RuntimeError::FarMemoryExhausted(format!(
                            "{} needs {n} regions on distinct live memory nodes; {available} available",
                            self.scheme
                        )));
                    }
                    // Too few live nodes: wait for capacity, never drop data.
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
        if need_pages > pages {
            // Growing further would never help: fail, and keep nothing.
            for g in &grants {
                far.give_back(g.cap.region);
            }
            return Err(RuntimeError::TooLarge {
                size: need_pages as usize * PAGE_SIZE,
            });
        }
        let mut regions = Vec::with_capacity(self.width);
        let mut nodes = Vec::with_capacity(self.width);
        // A short group: its empty positions are the last data positions.
        let empty = self.width - grants.len();
        for (i, g) in grants.iter().enumerate() {
            if let Some((k, _)) = self.short
                && i + empty == k
            {
                regions.extend(std::iter::repeat_n(NO_REGION, empty));
                nodes.extend(std::iter::repeat_n(NO_NODE, empty));
            }
            match far.regions().add(g.clone()) {
                Ok(idx) => {
                    nodes.push(g.node);
                    regions.push(idx);
                }
                Err(e) => {
                    // Nothing references the group yet: give every region
                    // back (those already added stay as dead table entries).
                    for g in &grants {
                        far.give_back(g.cap.region);
                    }
                    return Err(e);
                }
            }
        }
        for &r in regions.iter().filter(|&&r| r != NO_REGION) {
            far.pages().add_region(r, pages);
        }
        let mut st = lock(&self.st);
        // Checked under the groups' lock: a death declared after this
        // finds the group recorded and fails its position.
        if nodes.iter().any(|&n| n != NO_NODE && far.is_dead(n)) {
            drop(st);
            for &r in regions.iter().filter(|&&r| r != NO_REGION) {
                let_go(far, r);
            }
            tracing::debug!(
                "{}: a node of a new stripe group died before it was placed",
                self.scheme
            );
            return Ok(true);
        }
        let group = Group {
            regions,
            nodes,
            failed: vec![false; self.width],
            retired: false,
        };
        st.grown += 1;
        // A retired slot is free: nothing names a group that held nothing.
        let gi = match st.groups.iter().position(|g| g.retired) {
            Some(gi) => {
                st.groups[gi] = group;
                gi
            }
            None => {
                st.groups.push(group);
                st.groups.len() - 1
            }
        };
        drop(st);
        tracing::debug!(
            "{}: stripe group {gi} of {} x {pages} pages ({empty} empty; {} regions held)",
            self.scheme,
            self.width,
            far.regions().len()
        );
        if empty == 0
            && let Some((k, _)) = self.short
        {
            self.set_data_width(k);
        }
        Ok(true)
    }

    /// New spansets take `w` data members; says so when it changes.
    fn set_data_width(&self, w: usize) {
        let Some((k, m)) = self.short else { return };
        let was = self.data_width.swap(w, std::sync::atomic::Ordering::AcqRel);
        if was == w {
            return;
        }
        if w < k {
            tracing::warn!(
                "{}: {} live memory nodes: writing {w}+{m} spansets ({:.2}x remote bytes, not {:.2}x) until {} are back",
                self.scheme,
                w + m,
                (w + m) as f64 / w as f64,
                (k + m) as f64 / k as f64,
                k + m
            );
        } else {
            tracing::info!(
                "{}: {} live memory nodes again: writing {k}+{m} spansets",
                self.scheme,
                k + m
            );
        }
    }

    /// Marks every position on `node` failed; returns them.
    pub(crate) fn fail_node(&self, node: NodeId) -> Vec<(usize, usize)> {
        self.fail_node_within(node, usize::MAX).0
    }

    /// Marks the positions on `node` failed in each group that has fewer
    /// than `tolerated` failed positions already (a draining node's data
    /// is read around and rebuilt elsewhere only while the group keeps
    /// enough to read); returns them, and how many positions on `node`
    /// were left alone.
    pub(crate) fn fail_node_within(&self, node: NodeId, tolerated: usize) -> (Vec<(usize, usize)>, usize) {
        let mut st = lock(&self.st);
        let (mut v, mut left) = (Vec::new(), 0);
        for (gi, g) in st.groups.iter_mut().enumerate().filter(|(_, g)| !g.retired) {
            for pos in 0..g.nodes.len() {
                if g.nodes[pos] == node && !g.failed[pos] {
                    if g.failed.iter().filter(|&&f| f).count() >= tolerated {
                        left += 1;
                        continue;
                    }
                    g.failed[pos] = true;
                    v.push((gi, pos));
                }
            }
        }
        (v, left)
    }

    /// A region to rebuild a position of group `g` on, on a node the group
    /// does not use (waiting up to `patience` for one). Where groups may be
    /// short, a group with no live node outside it gets
    /// [`RuntimeError::NoDistinctNode`] after [`SPARE_WAIT`] instead: its
    /// spans are better written again on the live nodes than left below m
    /// losses' tolerance until a node comes.
    pub(crate) fn replacement(&self, far: &FarMemory, g: usize) -> Result<RegionGrant, RuntimeError> {
        let start = Instant::now();
        let exclude = self.group(g).nodes;
        loop {
            match far.backend().alloc(1, false, &exclude) {
                Ok(v) => {
                    return v.into_iter().next().ok_or_else(|| {
                        RuntimeError::FarMemoryExhausted("the manager granted no region for a rebuild".into())
                    });
                }
                Err(RpcError::Remote(RemoteError::NoCapacity { available: 0, .. }))
                    if self.short.is_some() && start.elapsed() >= SPARE_WAIT.min(far.patience()) =>
                {
                    return Err(RuntimeError::NoDistinctNode { group: g });
                }
                Err(RpcError::Remote(RemoteError::NoCapacity { .. })) if start.elapsed() < far.patience() => {
                    // Waits for capacity, but never past a shutdown.
                    if far.is_stopping() {
                        return Err(RuntimeError::Shutdown);
                    }
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Gives back a degraded group `g` that holds nothing any more (its
    /// spans were written again elsewhere): the regions on live nodes go
    /// back to the manager, those on dead nodes leave the region table.
    /// False (and nothing done) while any of its pages is still in use.
    pub(crate) fn retire_emptied(&self, far: &FarMemory, g: usize) -> bool {
        let _one = lock(&self.growing);
        let gone: Vec<(u16, bool)> = {
            let mut st = lock(&self.st);
            let grp = &mut st.groups[g];
            if grp.retired {
                return true;
            }
            if grp.present_regions().any(|r| far.pages().usage(r).0 > 0) {
                return false;
            }
            for r in grp.present_regions() {
                far.pages().remove_if_empty(r);
            }
            grp.retired = true;
            grp.regions
                .iter()
                .zip(&grp.failed)
                .filter(|(r, _)| **r != NO_REGION)
                .map(|(&r, &f)| (r, f))
                .collect()
        };
        for (r, failed) in gone {
            // A failed position on a live node is one that was draining.
            if let Some(grant) = far.regions().vacate(r)
                && (!failed || !far.is_dead(grant.node))
            {
                far.give_back(grant.cap.region);
            }
        }
        tracing::info!(
            "{}: stripe group {g} re-striped onto live nodes and given back",
            self.scheme
        );
        true
    }

    /// Points position `pos` of group `g` at its rebuilt region. Far words
    /// keep naming the same region index, so none needs to change. The old
    /// region goes back to the manager if its node is still alive (it was
    /// draining: the node leaves once nothing of it is held).
    pub(crate) fn rebind(&self, far: &FarMemory, g: usize, pos: usize, grant: RegionGrant) -> Result<(), RuntimeError> {
        let idx = self.group(g).regions[pos];
        let node = grant.node;
        let old = far.regions().rebind(idx, grant)?;
        if !far.is_dead(old.node) {
            far.give_back(old.cap.region);
        }
        let mut st = lock(&self.st);
        st.groups[g].nodes[pos] = node;
        // Checked under the groups' lock: a death declared after this
        // finds the position recorded and fails it again.
        if far.is_dead(node) {
            return Err(RpcError::Broken {
                addr: far.regions().get(idx).grant.addr.clone(),
                reason: format!("{node} died while group {g} position {pos} was rebuilt on it"),
            }
            .into());
        }
        st.groups[g].failed[pos] = false;
        Ok(())
    }
}
