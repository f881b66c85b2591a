//! Reading around failures: decoding a span from survivors of one
//! generation, and rebuilding a dead node's position on a replacement.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Shared, bytes};
use crate::error::{LossCause, RuntimeError};
use crate::far_memory::FarMemory;
use crate::scheme::SpanAddr;
use crate::scheme::recovery::{self, Lost};

impl Shared {
    /// Reads the member at `want` of spanset `id` by decoding k survivors
    /// into `out` (the row length). Survivors are read with their
    /// generation and used only at the one the spanset expects, so a member
    /// a compaction changed (or failed to change) is never mixed in.
    pub(super) fn decode(&self, far: &FarMemory, id: u64, want: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        let (group, row_pages, cands) = {
            let st = self.lock();
            let ss = st.sets.get(&id).ok_or_else(|| {
                RuntimeError::lost_because(None::<SpanAddr>, format!("{}: no spanset {id}", self.c.name))
            })?;
            let g = self.c.place.group(ss.group);
            let cands = ss.decode_candidates(&g, want, |n| far.is_suspect(n), true);
            (ss.group, ss.row_pages, cands)
        };
        debug_assert_eq!(out.len(), bytes(row_pages));
        self.c.decode_from(far, group, id, &cands, want, out)
    }

    /// Spanset, data position and row pages of the span named `at`.
    pub(super) fn locate(&self, at: SpanAddr) -> Result<(u64, usize, u32), RuntimeError> {
        let st = self.lock();
        let &(id, pos) = st.by_span.get(&(at.region, at.page)).ok_or_else(|| self.no_span(at))?;
        Ok((id, pos, st.sets[&id].row_pages))
    }

    /// Decodes the span named `at` from survivors, holding its spanset's
    /// lock (a compaction of it waits, and it waits for one).
    pub(super) fn degraded(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<(), RuntimeError> {
        loop {
            let (id, pos, row_pages) = self.locate(at)?;
            if !self.take_busy(id) {
                continue; // folded into another spanset meanwhile: look again
            }
            if self.lock().by_span.get(&(at.region, at.page)) != Some(&(id, pos)) {
                self.release_busy(far, id);
                continue;
            }
            let mut out = vec![0u8; bytes(row_pages)];
            let res = self.decode(far, id, pos, &mut out);
            self.release_busy(far, id);
            res?;
            dest.copy_from_slice(&out[..dest.len()]);
            self.c.degraded.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
    }

    /// Rebuilds position `pos` of group `g` on a replacement region (every
    /// member there, holes included: other members' parity equations need
    /// them); returns the bytes rebuilt. No compaction runs in the group
    /// meanwhile, and the rebuilt members start at generation 0 (they were
    /// written plainly).
    ///
    /// A group with no live node outside it to rebuild on is re-striped
    /// instead (see `restripe`), and so is one being re-striped already.
    pub(super) fn recover(&self, far: &FarMemory, lost: &Lost) -> Result<u64, RuntimeError> {
        let (g, pos) = (lost.group, lost.pos);
        let grp = self.c.place.group(g);
        if grp.retired || !grp.failed[pos] {
            return Ok(0); // re-striped and given back, or rebuilt already
        }
        if self.lock().restriping.contains(&g) {
            // Re-striping reads the group's spans: it stops where reads
            // would, when more positions died than parity covers.
            let survivors = grp.failed.iter().filter(|&&f| !f).count();
            if survivors < self.c.k {
                self.lock().restriping.remove(&g);
                return Err(RuntimeError::lost(
                    None::<SpanAddr>,
                    LossCause::TooFewSurvivors {
                        group: g,
                        survivors,
                        needed: self.c.k,
                    },
                ));
            }
            return self.restripe(far, g);
        }
        self.lock().recovering.insert(g);
        let mut untrusted = Vec::new();
        let res = recovery::rebuild(far, &self.c.place, lost, |cands| {
            let mut st = self.lock();
            while st.sets.values().any(|ss| ss.group == g && ss.busy) {
                st = self
                    .idle
                    .wait_timeout(st, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            let mut rows = Vec::new();
            for (&id, ss) in st.sets.iter().filter(|(_, ss)| ss.group == g) {
                match ss.rebuild_row(pos, cands, id) {
                    Some(Some(row)) => rows.push(row),
                    Some(None) => untrusted.push(id),
                    None => {}
                }
            }
            rows
        });
        let mut st = self.lock();
        if let Ok(done) = &res {
            for (id, ss) in st.sets.iter_mut().filter(|(_, ss)| ss.group == g) {
                ss.members[pos].generation = 0;
                // Rebuilt from members that agree: no longer in doubt,
                // unless too few of its members could be trusted, or no k
                // of them rebuilt it to its checksum.
                ss.set_doubt(pos, untrusted.contains(id) || done.failed.contains(id));
            }
        }
        let res = res.map(|done| done.bytes);
        st.recovering.remove(&g);
        if let Err(RuntimeError::NoDistinctNode { .. }) = res {
            st.restriping.insert(g);
            drop(st);
            tracing::warn!(
                "{}: no live memory node outside stripe group {g} to rebuild position {pos} on: re-striping the group onto live nodes",
                self.c.name
            );
            return self.restripe(far, g);
        }
        res
    }
}
