//! Repairing members in doubt. A fold whose commit a node never
//! acknowledged leaves that node's members of the fold holding the old
//! bytes or the new; the spanset reads around them, so it tolerates one
//! loss fewer. Once the node answers again and nothing else in the group is
//! suspect, each such member is rebuilt in place from the members that
//! agree (the node itself decodes, as for a rebuild), and the spanset is
//! whole again. Until then it is never folded (see `compaction`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Shared;
use crate::far_memory::FarMemory;
use crate::scheme::recovery;

/// How long repairs wait after one failed.
const REPAIR_BACKOFF: Duration = Duration::from_millis(250);

impl Shared {
    /// Repairs what members in doubt it can now; the rest wait for a later
    /// call (their node unreachable, or their group being rebuilt).
    pub(super) fn repair_doubtful(&self, far: &FarMemory) {
        let ids: Vec<u64> = {
            let st = self.lock();
            if st.doubtful.is_empty() {
                return;
            }
            let after = self.compaction.repair_after.lock().unwrap_or_else(|p| p.into_inner());
            if after.is_some_and(|t| Instant::now() < t) {
                return;
            }
            st.doubtful.iter().copied().collect()
        };
        let (k, m) = (self.c.k, self.c.m);
        let mut repaired = 0;
        for id in ids {
            if far.is_stopping() {
                break;
            }
            let Some(group) = self.lock().sets.get(&id).map(|ss| ss.group) else {
                self.lock().doubtful.remove(&id);
                continue;
            };
            // A suspect in the group could hold the repair (its sources)
            // up to its timeout while the spanset stays busy.
            if (0..k + m).any(|p| self.c.place.unusable(far, group, p)) {
                continue;
            }
            if !self.take_busy(id) {
                self.lock().doubtful.remove(&id);
                continue;
            }
            let work = {
                let mut st = self.lock();
                let busy = st.recovering.contains(&group) || st.restriping.contains(&group);
                let g = self.c.place.group(group);
                let mut cands: Vec<usize> = (0..k + m).filter(|&p| !g.failed[p]).collect();
                cands.sort_by_key(|&p| (g.present(p), p >= k));
                let ss = st.sets.get_mut(&id).expect("a busy spanset stays in the table");
                let mut work = Vec::new();
                let doubt = ss.doubt_mask();
                for pos in (0..k + m).filter(|&p| doubt >> p & 1 == 1) {
                    let others: Vec<usize> = cands.iter().copied().filter(|&p| p != pos).collect();
                    match ss.rebuild_row(pos, &others, id) {
                        // An unwritten member holds nothing a decode reads.
                        None => ss.set_doubt(pos, false),
                        Some(Some(row)) if !busy => work.push((pos, row)),
                        Some(_) => {}
                    }
                }
                work
            };
            for (pos, row) in work {
                match recovery::repair(far, &self.c.place, (k, m), group, pos, vec![row]) {
                    // No k members rebuilt it to its checksum: it stays in
                    // doubt (and its span fails its reads as lost).
                    Ok(done) if !done.failed.is_empty() => {}
                    Ok(_) => {
                        let mut st = self.lock();
                        if let Some(ss) = st.sets.get_mut(&id) {
                            // Written plainly: a fresh member on its node.
                            ss.members[pos].generation = 0;
                            ss.set_doubt(pos, false);
                        }
                        drop(st);
                        self.compaction.doubt_repairs.fetch_add(1, Ordering::Relaxed);
                        repaired += 1;
                    }
                    Err(e) => {
                        tracing::debug!("{}: repairing member {pos} of group {group}: {e}", self.c.name);
                        *self.compaction.repair_after.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(Instant::now() + REPAIR_BACKOFF);
                    }
                }
            }
            {
                let mut st = self.lock();
                if st.sets.get(&id).is_none_or(|ss| ss.doubt_mask() == 0) {
                    st.doubtful.remove(&id);
                }
            }
            self.release_busy(far, id);
        }
        if repaired > 0 {
            tracing::info!(
                "{}: repaired {repaired} members left in doubt by folds' unacknowledged commits",
                self.c.name
            );
        }
    }
}
