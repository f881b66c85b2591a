//! Re-striping: a stripe group that lost a position with no live memory
//! node outside it to rebuild on (fewer than k+m live nodes) is written
//! again as short spansets on the live nodes, so that every spanset
//! tolerates m losses again instead of waiting for a node to come.
//!
//! A far span's name is its region index, and far pointer words hold it,
//! so a span cannot move to another group while it is far. Re-striping
//! therefore hands the group's live spans to the runtime
//! ([`FarMemory::restripe`]), which brings each back (a degraded read where
//! its member is lost) and evicts it again, into a group on live nodes.
//! Kept copies in the group are cancelled first: a clean re-eviction would
//! otherwise put a span back where it came from. Once the group holds no
//! span, its regions are given back and the lost positions are settled.

use super::{Held, Shared};
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::scheme::SpanAddr;

impl Shared {
    /// One step of re-striping group `g`: cancels its kept copies, queues
    /// its live spans for the runtime, and gives the group back once it
    /// holds nothing. Ok (0 bytes rebuilt) once done; until then the
    /// recovery driver calls again after its pause.
    pub(super) fn restripe(&self, far: &FarMemory, g: usize) -> Result<u64, RuntimeError> {
        let regions = self.c.place.group(g).regions;
        let mut live = Vec::new();
        let mut emptied = Vec::new();
        let mut busy = false;
        {
            let mut guard = self.lock();
            let st = &mut *guard;
            for (&id, ss) in st.sets.iter_mut().filter(|(_, ss)| ss.group == g) {
                if ss.busy {
                    busy = true;
                    continue;
                }
                for (p, &region) in regions.iter().enumerate().take(ss.k()) {
                    if ss.is_kept(p) {
                        let pages = ss.members[p].pages as u64;
                        ss.set_held(p, Held::Hole);
                        st.kept_pages -= self.kept_weight(pages);
                        st.hole_pages += pages;
                    } else if ss.is_live(p) {
                        live.push(SpanAddr {
                            region,
                            page: ss.members[p].name,
                        });
                    }
                }
                if !ss.holds_live() {
                    emptied.push(id);
                }
            }
            let mut freed = Vec::new();
            for id in emptied {
                if let Some(ss) = self.remove_set(st, id) {
                    freed.push(ss);
                }
            }
            drop(guard);
            for ss in &freed {
                self.free_far(far, ss);
            }
        }
        let left = live.len();
        // Looked at apart: the group goes back with no scheme lock held (a
        // guard in the condition would live through the call).
        let read_still = self.lock().retired.values().any(|ss| ss.group == g);
        if left > 0 {
            far.restripe(live);
        } else if !busy && !read_still && self.c.place.retire_emptied(far, g) {
            // The slot may be reused by a new group: it is not this one.
            self.lock().restriping.remove(&g);
            return Ok(0);
        }
        Err(RuntimeError::NoDistinctNode { group: g }).inspect_err(|_| {
            tracing::debug!("{}: re-striping group {g}: {left} live spans queued", self.c.name);
        })
    }
}
