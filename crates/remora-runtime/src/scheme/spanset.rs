//! The spanset (paper §3.4.1): k data spans plus m parity spans, one per
//! position of a stripe group ([`super::placement`]), so k+m regions on
//! k+m distinct memory nodes. Every scheme that keeps spansets (`ec-batch`,
//! `replication` as `ec-batch` with k = 1, and `ec-2pc`) uses this one type;
//! they differ in what happens to a data member whose span comes back
//! (`ec-batch` leaves a hole that compaction reclaims, `ec-2pc` refills it
//! by two-phase commit), not in what a spanset is.
//!
//! A spanset knows, per position: where its member is (page and length in
//! pages of that position's region), the generation the member holds on
//! its node (one up per change committed in place, 0 after a plain write),
//! the checksum of its bytes when known, and whether its bytes are in
//! doubt; per data position also what it holds ([`Held`]). It answers the
//! questions every reader and rebuilder asks of it: which members to read
//! to decode one ([`Spanset::decode_candidates`]), what to rebuild at a
//! lost position ([`Spanset::rebuild_row`]), and which far pages to give
//! back when it goes ([`Spanset::free_far`]).
//!
//! The `busy` and `readers` marks are the spanset lock; what they exclude
//! is each scheme's to say (see their module docs).

use remora_proto::NodeId;

use super::placement::{Group, Placement};
use super::recovery::Row;
use super::shards::Shard;
use crate::far_memory::FarMemory;
use crate::size_classes::PAGE_SIZE;

/// Bytes of `pages` far pages.
pub(crate) fn bytes(pages: u32) -> usize {
    pages as usize * PAGE_SIZE
}

/// Byte offset of far page `page` in its region.
pub(crate) fn offset(page: u32) -> u64 {
    page as u64 * PAGE_SIZE as u64
}

/// What a data member holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// Never written: zeros to the parity, whatever its far pages hold
    /// (`ec-batch` gives such a member no far pages at all).
    Unwritten,
    /// A span that came back (or was freed): its bytes stay, since the
    /// parity still covers them, until compaction or a fill replaces them.
    Hole,
    /// A transaction is writing a span here (`ec-2pc`).
    Filling,
    /// A far span.
    Live,
    /// A span that came back clean and may return without a write (see
    /// [`super::Scheme::keep`]); it keeps nothing else alive.
    Kept,
}

/// One member, data or parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    /// First page in its position's region.
    pub(crate) page: u32,
    /// Length in pages (0: no far pages, an unwritten `ec-batch` member).
    pub(crate) pages: u32,
    /// The name the runtime knows its span by (a data member of
    /// `ec-batch`, whose spans move when folded; otherwise its page).
    pub(crate) name: u32,
    /// Its generation on its memory node.
    pub(crate) generation: u64,
    /// Checksum of its bytes as written; `None` once changed in place by
    /// deltas the compute node never saw.
    pub(crate) sum: Option<u64>,
}

impl Member {
    /// A member just written plainly at `page`, `pages` long.
    pub(crate) fn written(page: u32, pages: u32, sum: Option<u64>) -> Self {
        Self {
            page,
            pages,
            name: page,
            generation: 0,
            sum,
        }
    }
}

/// A spanset: k data members, then m parity members.
pub(crate) struct Spanset {
    /// Its stripe group.
    pub(crate) group: usize,
    /// Length of every parity member (the longest data member).
    pub(crate) row_pages: u32,
    /// Position by position: k data members, then m parity members. A
    /// member's `pages` never changes (the `full` mask depends on it).
    pub(crate) members: Vec<Member>,
    held: Vec<Held>,
    /// Being changed (compacted, filled) or decoded: see the scheme.
    pub(crate) busy: bool,
    /// Reads of its members under way.
    pub(crate) readers: u32,
    /// Never changed in place again: a transaction went wrong in a way
    /// that may have left staged changes or generations we do not know.
    pub(crate) sealed: bool,
    /// Bit p: data member p is live. Picking folds reads the masks of every
    /// spanset; reading each member instead was a cache miss per spanset.
    live: u64,
    /// Bit p: data member p is as long as the row.
    full: u64,
    /// Bit p: data member p is a kept copy.
    kept: u64,
    /// Bit p: the bytes of member p (data or parity) may differ from what
    /// we recorded (a commit whose outcome we never learned): it is read
    /// around, never a source of a decode or rebuild, and the spanset is
    /// not folded until the member is repaired or rebuilt.
    doubt: u64,
}

fn set_bit(mask: &mut u64, pos: usize, on: bool) {
    if on {
        *mask |= 1 << pos;
    } else {
        *mask &= !(1 << pos);
    }
}

impl Spanset {
    /// A spanset of `members` (k data then m parity; `held` has one entry
    /// per data member) in stripe group `group`.
    pub(crate) fn new(group: usize, row_pages: u32, members: Vec<Member>, held: Vec<Held>) -> Self {
        debug_assert!(held.len() <= members.len() && held.len() <= 64);
        let mut ss = Self {
            group,
            row_pages,
            members,
            held: vec![Held::Unwritten; held.len()],
            busy: false,
            readers: 0,
            sealed: false,
            live: 0,
            full: 0,
            kept: 0,
            doubt: 0,
        };
        for (p, h) in held.into_iter().enumerate() {
            ss.set_held(p, h);
            set_bit(&mut ss.full, p, ss.members[p].pages == row_pages);
        }
        ss
    }

    /// Data members.
    pub(crate) fn k(&self) -> usize {
        self.held.len()
    }

    /// The data members.
    pub(crate) fn data(&self) -> &[Member] {
        &self.members[..self.k()]
    }

    /// The parity members.
    pub(crate) fn parity(&self) -> &[Member] {
        &self.members[self.k()..]
    }

    /// The parity members, to change in place.
    pub(crate) fn parity_mut(&mut self) -> &mut [Member] {
        let k = self.k();
        &mut self.members[k..]
    }

    /// What data member `pos` holds.
    pub(crate) fn held(&self, pos: usize) -> Held {
        self.held[pos]
    }

    /// Data member `pos` now holds `h`.
    pub(crate) fn set_held(&mut self, pos: usize, h: Held) {
        self.held[pos] = h;
        set_bit(&mut self.live, pos, h == Held::Live);
        set_bit(&mut self.kept, pos, h == Held::Kept);
    }

    /// Whether data member `pos` is live.
    pub(crate) fn is_live(&self, pos: usize) -> bool {
        self.live >> pos & 1 == 1
    }

    /// Whether data member `pos` is a kept copy.
    pub(crate) fn is_kept(&self, pos: usize) -> bool {
        self.kept >> pos & 1 == 1
    }

    /// Live data members, as a bit mask.
    pub(crate) fn live_mask(&self) -> u64 {
        self.live
    }

    /// Kept copies, as a bit mask.
    pub(crate) fn kept_mask(&self) -> u64 {
        self.kept
    }

    /// Whether member `pos` is in doubt.
    pub(crate) fn in_doubt(&self, pos: usize) -> bool {
        self.doubt >> pos & 1 == 1
    }

    /// Member `pos` is in doubt (`on`) or known again.
    pub(crate) fn set_doubt(&mut self, pos: usize, on: bool) {
        set_bit(&mut self.doubt, pos, on);
    }

    /// Members in doubt, as a bit mask.
    pub(crate) fn doubt_mask(&self) -> u64 {
        self.doubt
    }

    /// Whether a live (or arriving) span keeps the spanset.
    pub(crate) fn holds_live(&self) -> bool {
        self.live != 0 || self.held.contains(&Held::Filling)
    }

    /// Whether the masks say what the members do (checked in debug builds).
    pub(crate) fn masks_agree(&self) -> bool {
        self.held.iter().enumerate().all(|(p, &h)| {
            (self.live >> p & 1 == 1) == (h == Held::Live)
                && (self.full >> p & 1 == 1) == (self.members[p].pages == self.row_pages)
                && (self.kept >> p & 1 == 1) == (h == Held::Kept)
        })
    }

    /// Data members that are holes as long as the row, as a bit mask.
    pub(crate) fn hole_mask(&self) -> u64 {
        self.full & !self.live
    }

    /// The holes a fold may fill: not kept copies, whose spans would have
    /// to be written again at their next eviction if their far bytes were
    /// overwritten. Filling kept holes cost a quarter of `ec-batch`'s clean
    /// re-evictions in `bench micro` at 4 threads.
    pub(crate) fn fold_holes(&self) -> u64 {
        self.hole_mask() & !self.kept
    }

    /// Bytes a read of the member at `pos` takes: 0 for an unwritten data
    /// member (its bytes are zeros to the parity, for free).
    pub(crate) fn read_len(&self, pos: usize) -> usize {
        if self.held.get(pos) == Some(&Held::Unwritten) {
            0
        } else {
            bytes(self.members[pos].pages)
        }
    }

    /// Checksum of the member at `pos`, if known.
    pub(crate) fn sum(&self, pos: usize) -> Option<u64> {
        self.members[pos].sum
    }

    /// Pages of its data members that hold no span (holes, and members
    /// unwritten or being filled): far space parity keeps but no live data.
    pub(crate) fn hole_pages(&self) -> u64 {
        self.data()
            .iter()
            .zip(&self.held)
            .filter(|(_, h)| !matches!(h, Held::Live | Held::Kept))
            .map(|(m, _)| m.pages as u64)
            .sum()
    }

    /// Pages of its kept copies.
    pub(crate) fn kept_pages(&self) -> u64 {
        self.data()
            .iter()
            .zip(&self.held)
            .filter(|(_, h)| **h == Held::Kept)
            .map(|(m, _)| m.pages as u64)
            .sum()
    }

    /// Pages it holds in far memory, parity included.
    pub(crate) fn far_pages(&self) -> u64 {
        self.members.iter().map(|m| m.pages as u64).sum()
    }

    /// Gives back the far pages of every member (the spanset is already
    /// out of its scheme's table).
    pub(crate) fn free_far(&self, far: &FarMemory, place: &Placement) {
        for (p, m) in self.members.iter().enumerate() {
            place.free(far, self.group, p, m.page, m.pages);
        }
    }

    /// The members to read, best first, to decode the member at `want`:
    /// unwritten ones (free), then data, then parity; members on suspected
    /// nodes last (a paused node would make every wave wait for it). Dead
    /// positions and members in doubt are left out. With `checked`, each is
    /// read at the generation the spanset expects (refused otherwise), so a
    /// member changed in place concurrently is never mixed in.
    pub(crate) fn decode_candidates(
        &self,
        g: &Group,
        want: usize,
        is_suspect: impl Fn(NodeId) -> bool,
        checked: bool,
    ) -> Vec<Shard> {
        let k = self.k();
        let mut cands: Vec<usize> = (0..self.members.len())
            .filter(|&p| p != want && !g.failed[p] && !self.in_doubt(p))
            .collect();
        cands.sort_by_key(|&p| (self.read_len(p) > 0, is_suspect(g.nodes[p]), p >= k));
        cands
            .into_iter()
            .map(|p| Shard {
                pos: p,
                node: g.nodes[p],
                region: g.regions[p],
                offset: offset(self.members[p].page),
                len: self.read_len(p),
                generation: checked.then_some(self.members[p].generation),
            })
            .collect()
    }

    /// What a node rebuilds at position `pos` of spanset `tag`, decoded
    /// from k of `cands` (surviving positions, best first) not in doubt,
    /// and the checksum to verify it with. `None` when there is nothing to
    /// rebuild there (an unwritten member); `Some(None)` when fewer than k
    /// of its members can be trusted: then it cannot be rebuilt, and what
    /// the rebuild leaves there stays in doubt.
    pub(crate) fn rebuild_row(&self, pos: usize, cands: &[usize], tag: u64) -> Option<Option<Row>> {
        let out_len = self.read_len(pos);
        if out_len == 0 {
            return None;
        }
        let from: Vec<(usize, u64, u32)> = cands
            .iter()
            .filter(|&&p| !self.in_doubt(p))
            .map(|&p| (p, offset(self.members[p].page), self.read_len(p) as u32))
            .collect();
        if from.len() < self.k() {
            return Some(None);
        }
        Some(Some(Row {
            offset: offset(self.members[pos].page),
            row_len: bytes(self.row_pages) as u32,
            out_len: out_len as u32,
            sum: self.sum(pos),
            from,
            tag,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(pages: u32) -> Member {
        Member::written(0, pages, Some(0))
    }

    fn spanset(held: Vec<Held>, pages: &[u32]) -> Spanset {
        let mut members: Vec<Member> = pages.iter().map(|&p| member(p)).collect();
        members.extend([member(2), member(2)]);
        Spanset::new(0, 2, members, held)
    }

    #[test]
    fn folds_fill_holes_but_never_kept_copies() {
        // Positions: live, hole, kept copy, short hole.
        let mut ss = spanset(vec![Held::Live, Held::Hole, Held::Kept, Held::Hole], &[2, 2, 2, 1]);
        assert!(ss.masks_agree());
        assert_eq!(ss.hole_mask(), 0b0110);
        assert_eq!(
            ss.fold_holes(),
            0b0010,
            "the kept copy and the short hole are not fillable"
        );
        // The kept copy comes back (clean re-eviction), then leaves again as a plain hole.
        ss.set_held(2, Held::Live);
        assert!(ss.masks_agree());
        assert_eq!(ss.fold_holes(), 0b0010);
        ss.set_held(2, Held::Hole);
        assert_eq!(ss.fold_holes(), 0b0110);
        ss.set_held(1, Held::Kept);
        assert!(ss.masks_agree());
        assert_eq!(ss.fold_holes(), 0b0100);
    }

    #[test]
    fn pages_are_counted_by_what_members_hold() {
        let ss = spanset(vec![Held::Live, Held::Hole, Held::Kept, Held::Unwritten], &[2, 1, 2, 2]);
        assert_eq!(ss.hole_pages(), 1 + 2, "a hole and an unwritten member with pages");
        assert_eq!(ss.kept_pages(), 2);
        assert_eq!(ss.far_pages(), 2 + 1 + 2 + 2 + 2 + 2);
        assert!(ss.holds_live());
        assert_eq!(ss.read_len(3), 0, "an unwritten member reads as zeros, for free");
        assert_eq!(ss.read_len(1), PAGE_SIZE);
        assert_eq!(ss.read_len(4), 2 * PAGE_SIZE, "parity is as long as the row");
    }

    #[test]
    fn decode_candidates_skip_dead_and_doubtful_and_prefer_free_data() {
        let mut ss = spanset(vec![Held::Live, Held::Hole, Held::Live, Held::Unwritten], &[2, 2, 2, 2]);
        ss.set_doubt(1, true);
        ss.members[4].generation = 7;
        let g = Group {
            regions: (10..16).collect(),
            nodes: (0..6).map(NodeId).collect(),
            failed: vec![false, false, false, false, false, true],
            retired: false,
        };
        let suspect = |n: NodeId| n == NodeId(2);
        let c = ss.decode_candidates(&g, 0, suspect, true);
        let order: Vec<usize> = c.iter().map(|s| s.pos).collect();
        // Unwritten 3 first (free), then parity 4 before the suspect's data 2.
        assert_eq!(order, vec![3, 4, 2]);
        assert_eq!(c[0].len, 0);
        assert_eq!(c[1].generation, Some(7));
        assert_eq!(c[1].region, 14);
        assert!(
            ss.decode_candidates(&g, 0, suspect, false)
                .iter()
                .all(|s| s.generation.is_none())
        );
        // The member in doubt (1) is never a source.
        let row = ss
            .rebuild_row(5, &[0, 1, 2, 3, 4], 9)
            .flatten()
            .expect("parity is rebuilt");
        let from: Vec<(usize, u32)> = row.from.iter().map(|&(p, _, len)| (p, len)).collect();
        let full = 2 * PAGE_SIZE as u32;
        assert_eq!(from, vec![(0, full), (2, full), (3, 0), (4, full)]);
        assert_eq!((row.sum, row.tag), (Some(0), 9));
        assert!(
            ss.rebuild_row(5, &[0, 1, 2, 3], 9).is_some_and(|r| r.is_none()),
            "fewer than k members to trust"
        );
        assert!(
            ss.rebuild_row(3, &[0, 2, 4, 5], 9).is_none(),
            "nothing to rebuild where nothing was written"
        );
    }
}
