//! The far page heap (§3.3): which pages of the held regions are free. A far
//! span is a run of 8 KiB pages inside one region.

use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Default)]
struct RegionSpace {
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
        g.regions[idx as usize].free.insert(0, pages);
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
        g.used_pages += pages as u64;
        Some(start)
    }

    /// Returns a run, merging it with free neighbours.
    pub(crate) fn free(&self, region: u16, start: u32, pages: u32) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.used_pages -= pages as u64;
        let space = &mut g.regions[region as usize];
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
}
