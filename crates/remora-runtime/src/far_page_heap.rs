//! The far page heap (§3.3): which pages of the held regions are free. A far
//! span is a run of 8 KiB pages inside one region. It also knows how full
//! each region is, so placement can let sparse regions empty and give
//! them back to the manager.

use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Default)]
struct RegionSpace {
    /// Pages of the region; 0 while its index holds no region.
    pages: u32,
    /// Pages handed out.
    used: u32,
    /// Free runs: first page → length in pages.
    free: BTreeMap<u32, u32>,
}

#[derive(Default)]
struct Inner {
    regions: Vec<RegionSpace>,
    used_pages: u64,
}

/// Free far pages of every region.
#[derive(Default)]
pub(crate) struct FarPageHeap {
    inner: Mutex<Inner>,
}

impl FarPageHeap {
    /// Makes region `idx` (of `pages` pages) available.
    pub(crate) fn add_region(&self, idx: u16, pages: u32) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        while g.regions.len() <= idx as usize {
            g.regions.push(RegionSpace::default());
        }
        let old = std::mem::replace(
            &mut g.regions[idx as usize],
            RegionSpace {
                pages,
                used: 0,
                free: BTreeMap::from([(0, pages)]),
            },
        );
        debug_assert_eq!(old.used, 0, "region index reused while in use");
    }

    /// Takes region `idx` out if none of its pages is in use; false (and
    /// nothing changed) otherwise. Allocation then never finds it again.
    pub(crate) fn remove_if_empty(&self, idx: u16) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(space) = g.regions.get_mut(idx as usize) else {
            return false;
        };
        if space.pages == 0 || space.used > 0 {
            return false;
        }
        *space = RegionSpace::default();
        true
    }

    /// Pages in use and pages in all of region `idx` (0, 0 if it holds none).
    pub(crate) fn usage(&self, idx: u16) -> (u32, u32) {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.regions.get(idx as usize).map_or((0, 0), |s| (s.used, s.pages))
    }

    /// Takes `pages` contiguous pages from region `idx` (first fit); `None`
    /// if it has no such run. Which region to use is placement's choice
    /// ([`crate::scheme`]'s stripe groups).
    pub(crate) fn alloc_in(&self, idx: u16, pages: u32) -> Option<u32> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let space = g.regions.get_mut(idx as usize)?;
        let (start, len) = space
            .free
            .iter()
            .find(|(_, len)| **len >= pages)
            .map(|(s, l)| (*s, *l))?;
        space.free.remove(&start);
        if len > pages {
            space.free.insert(start + pages, len - pages);
        }
        space.used += pages;
        g.used_pages += pages as u64;
        Some(start)
    }

    /// Returns a run, merging it with free neighbours.
    pub(crate) fn free(&self, region: u16, start: u32, pages: u32) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.used_pages -= pages as u64;
        let space = &mut g.regions[region as usize];
        space.used -= pages;
        let (mut s, mut len) = (start, pages);
        if let Some((&ps, &pl)) = space.free.range(..start).next_back() {
            if ps + pl == start {
                space.free.remove(&ps);
                s = ps;
                len += pl;
            }
        }
        if let Some(&nl) = space.free.get(&(start + pages)) {
            space.free.remove(&(start + pages));
            len += nl;
        }
        space.free.insert(s, len);
    }

    /// Pages handed out and not yet returned.
    pub(crate) fn used_pages(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).used_pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_coalesce() {
        let h = FarPageHeap::default();
        h.add_region(0, 10);
        h.add_region(1, 4);
        let a = h.alloc_in(0, 4).unwrap();
        let b = h.alloc_in(1, 4).unwrap();
        assert_eq!((a, b), (0, 0));
        assert!(h.alloc_in(1, 1).is_none(), "region 1 is full");
        let c = h.alloc_in(0, 6).unwrap();
        assert_eq!(c, 4);
        assert!(h.alloc_in(0, 1).is_none());
        assert!(h.alloc_in(2, 1).is_none(), "no such region");
        assert_eq!(h.used_pages(), 14);
        h.free(0, a, 4);
        h.free(0, c, 6);
        assert_eq!(h.alloc_in(0, 10), Some(0), "neighbours merged back");
    }

    #[test]
    fn only_empty_regions_leave_and_indices_come_back() {
        let h = FarPageHeap::default();
        h.add_region(0, 8);
        h.add_region(1, 8);
        let a = h.alloc_in(0, 3).unwrap();
        assert_eq!(h.usage(0), (3, 8));
        assert!(!h.remove_if_empty(0), "region 0 holds a run");
        assert!(h.remove_if_empty(1));
        assert!(!h.remove_if_empty(1), "already gone");
        assert_eq!(h.usage(1), (0, 0));
        assert!(h.alloc_in(1, 1).is_none(), "a removed region is never allocated from");
        h.free(0, a, 3);
        assert!(h.remove_if_empty(0));
        assert_eq!((h.used_pages(), h.usage(0)), (0, (0, 0)));
        h.add_region(1, 4);
        assert_eq!(h.alloc_in(1, 4), Some(0), "a reused index starts empty");
        assert_eq!(h.usage(1), (4, 4));
    }
}
