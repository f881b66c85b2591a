//! The spanset table's bookkeeping: names, holes and kept copies, the
//! spanset lock (busy), swap-ins counted as readers, and giving far space
//! back.

use std::sync::MutexGuard;
use std::time::Duration;

use super::{Held, Shared, Spanset, State};
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::scheme::SpanAddr;

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Far pages a kept copy of `pages` holds. With one data span per
    /// spanset (replication) the copy is the whole spanset, its replicas
    /// included; with k > 1 it is the member alone (parity stays alive for
    /// the live members, never for the copy).
    pub(super) fn kept_weight(&self, pages: u64) -> u64 {
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
    /// spanset, so keeping it keeps nothing else alive. A busy spanset
    /// (being compacted) keeps no copy and is not freed here: the
    /// compaction decides its fate when it ends.
    pub(super) fn unlive(&self, far: &FarMemory, at: SpanAddr, keep: bool) -> Option<u64> {
        let mut st = self.lock();
        let &(id, pos) = st.by_span.get(&(at.region, at.page))?;
        let ss = st.sets.get_mut(&id)?;
        if !ss.is_live(pos) {
            return None;
        }
        let pages = ss.members[pos].pages as u64;
        ss.set_held(pos, Held::Hole);
        let keep = keep && !ss.busy;
        if ss.busy || ss.live_mask() != 0 || (keep && self.c.k == 1) {
            if keep {
                ss.set_held(pos, Held::Kept);
                st.kept_pages += self.kept_weight(pages);
                return Some(id);
            }
            st.hole_pages += pages;
            st.made += 1;
            return None;
        }
        // Every data span is gone: free the whole spanset.
        st.hole_pages += pages;
        let ss = self.remove_set(&mut st, id);
        drop(st);
        if let Some(ss) = ss {
            self.free_far(far, &ss);
        }
        None
    }

    /// Takes spanset `id` out of the table (its names, holes and kept
    /// copies with it); returns it unless swap-ins still read it (then it
    /// is retired, and its last reader frees it).
    pub(super) fn remove_set(&self, st: &mut State, id: u64) -> Option<Spanset> {
        let ss = st.sets.remove(&id)?;
        let regions = self.c.place.group(ss.group).regions;
        for (i, m) in ss.data().iter().enumerate() {
            if m.pages == 0 {
                continue;
            }
            st.by_span.remove(&(regions[i], m.name));
            if ss.is_kept(i) {
                st.kept_pages -= self.kept_weight(m.pages as u64);
            } else if !ss.is_live(i) {
                st.hole_pages -= m.pages as u64;
            }
        }
        if ss.readers > 0 {
            st.retired.insert(id, ss);
            return None;
        }
        Some(ss)
    }

    /// A free name for a span first written at `page` of region `region`:
    /// the page itself unless a moved span still holds that name.
    pub(super) fn name_for(&self, st: &mut State, region: u16, page: u32) -> u32 {
        if !st.by_span.contains_key(&(region, page)) {
            return page;
        }
        let cursor = st.name_cursor.entry(region).or_insert(0);
        loop {
            *cursor = (*cursor + 1) % (crate::pointer::MAX_FAR_PAGE + 1);
            if !st.by_span.contains_key(&(region, *cursor)) {
                return *cursor;
            }
        }
    }

    /// Waits until spanset `id` is not busy, then marks it busy; false if
    /// it is gone.
    pub(super) fn take_busy(&self, id: u64) -> bool {
        let mut st = self.lock();
        loop {
            match st.sets.get_mut(&id) {
                None => return false,
                Some(ss) if !ss.busy => {
                    ss.busy = true;
                    return true;
                }
                Some(_) => {
                    st = self
                        .idle
                        .wait_timeout(st, Duration::from_millis(100))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    /// Clears spanset `id`'s busy mark (taken by `take_busy`) and frees it
    /// if nothing in it is live any more.
    pub(super) fn release_busy(&self, far: &FarMemory, id: u64) {
        let mut st = self.lock();
        let empty = match st.sets.get_mut(&id) {
            Some(ss) => {
                ss.busy = false;
                ss.live_mask() == 0
            }
            None => false,
        };
        let freed = if empty { self.remove_set(&mut st, id) } else { None };
        drop(st);
        self.idle.notify_all();
        if let Some(ss) = freed {
            self.free_far(far, &ss);
        }
    }

    /// Counts a swap-in reading the span named `at` among its spanset's
    /// readers until the returned guard is dropped.
    pub(super) fn begin_read<'a>(&'a self, far: &'a FarMemory, at: SpanAddr) -> Result<Reading<'a>, RuntimeError> {
        let (id, pos, group, page, doubt) = {
            let mut st = self.lock();
            let &(id, pos) = st.by_span.get(&(at.region, at.page)).ok_or_else(|| self.no_span(at))?;
            let ss = st.sets.get_mut(&id).ok_or_else(|| self.no_span(at))?;
            ss.readers += 1;
            (id, pos, ss.group, ss.members[pos].page, ss.in_doubt(pos))
        };
        Ok(Reading {
            sh: self,
            far,
            id,
            page,
            around: doubt || self.c.place.unusable(far, group, pos),
        })
    }

    /// The read a [`Reading`] counted is over.
    fn end_read(&self, far: &FarMemory, id: u64) {
        let mut st = self.lock();
        if let Some(ss) = st.sets.get_mut(&id) {
            ss.readers -= 1;
            return;
        }
        let done = match st.retired.get_mut(&id) {
            Some(ss) => {
                ss.readers -= 1;
                ss.readers == 0
            }
            None => false,
        };
        let ss = if done { st.retired.remove(&id) } else { None };
        drop(st);
        if let Some(ss) = ss {
            self.free_far(far, &ss);
        }
    }

    pub(super) fn no_span(&self, at: SpanAddr) -> RuntimeError {
        RuntimeError::lost_because(at, format!("{}: no spanset holds it", self.c.name))
    }

    /// Gives back the far space of a spanset already out of the table.
    pub(super) fn free_far(&self, far: &FarMemory, ss: &Spanset) {
        ss.free_far(far, &self.c.place);
    }
}

/// A swap-in's read of one member: while it lives the member's spanset
/// counts it as a reader, so a fold that moves the spanset's spans away
/// leaves its pages to the last reader to free.
pub(super) struct Reading<'a> {
    sh: &'a Shared,
    far: &'a FarMemory,
    id: u64,
    /// The member's first page in its region.
    pub(super) page: u32,
    /// Its node is dead or suspected: read around it.
    pub(super) around: bool,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.sh.end_read(self.far, self.id);
    }
}
