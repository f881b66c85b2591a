//! Repairing members in doubt. A fold whose commit a node never
//! acknowledged leaves that node's members of the fold holding the old
//! bytes or the new; the spanset reads around them, so it tolerates one
//! loss fewer. Once the node answers again and nothing else in the group is
//! suspect, each such member is rebuilt in place from the members that
//! agree (the node itself decodes, as for a rebuild: one request per
//! position of a group), and the spanset is whole again. Until then it is
//! never folded (see `compaction`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Shared;
use crate::far_memory::FarMemory;
use crate::scheme::recovery::{self, Row};

/// How long repairs wait after one failed.
const REPAIR_BACKOFF: Duration = Duration::from_millis(250);

impl Shared {
    /// Repairs what members in doubt it can now; the rest wait for a later
    /// call (their node unreachable, or their group being rebuilt).
    pub(super) fn repair_doubtful(&self, far: &FarMemory) {
        let after = *self.compaction.repair_after.lock().unwrap_or_else(|p| p.into_inner());
        if after.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let ids: Vec<u64> = {
            let st = self.lock();
            if st.doubtful.is_empty() {
                return;
            }
            st.doubtful.iter().copied().collect()
        };
        let (k, m) = (self.c.k, self.c.m);
        // Rows to rebuild, per (group, position), tagged with their
        // spanset: each goes to its node as one request.
        let mut work: BTreeMap<(usize, usize), Vec<Row>> = BTreeMap::new();
        let mut taken = Vec::new();
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
            taken.push(id);
            let g = self.c.place.group(group);
            let mut st = self.lock();
            let busy = st.recovering.contains(&group) || st.restriping.contains(&group);
            let ss = st.sets.get_mut(&id).expect("a busy spanset stays in the table");
            let doubt = ss.doubt_mask();
            for pos in (0..k + m).filter(|&p| doubt >> p & 1 == 1) {
                match ss.rebuild_row(pos, &recovery::ranked(far, &g, k, pos), id) {
                    // An unwritten member holds nothing a decode reads.
                    None => ss.set_doubt(pos, false),
                    Some(Some(row)) if !busy => work.entry((group, pos)).or_default().push(row),
                    Some(_) => {}
                }
            }
        }
        let mut repaired = 0;
        for ((group, pos), rows) in work {
            if far.is_stopping() {
                break;
            }
            let tags: Vec<u64> = rows.iter().map(|r| r.tag).collect();
            match recovery::repair(far, &self.c.place, (k, m), group, pos, rows) {
                Ok(done) => {
                    // A row no k members rebuilt to its checksum stays in
                    // doubt (and its span fails its reads as lost).
                    let mut st = self.lock();
                    for id in tags.into_iter().filter(|t| !done.failed.contains(t)) {
                        if let Some(ss) = st.sets.get_mut(&id) {
                            // Written plainly: a fresh member on its node.
                            ss.members[pos].generation = 0;
                            ss.set_doubt(pos, false);
                            repaired += 1;
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!("{}: repairing position {pos} of group {group}: {e}", self.c.name);
                    *self.compaction.repair_after.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(Instant::now() + REPAIR_BACKOFF);
                }
            }
        }
        self.compaction.doubt_repairs.fetch_add(repaired, Ordering::Relaxed);
        for id in taken {
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
