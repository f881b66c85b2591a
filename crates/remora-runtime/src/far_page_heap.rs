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
    next: usize,
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

    /// Takes `pages` contiguous pages from some region (rotating over regions
    /// to spread load over memory nodes). `None` if no region has room.
    pub(crate) fn alloc(&self, pages: u32) -> Option<(u16, u32)> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let n = g.regions.len();
        for k in 0..n {
            let r = (g.next + k) % n;
            let found = g.regions[r]
                .free
                .iter()
                .find(|(_, len)| **len >= pages)
                .map(|(s, l)| (*s, *l));
            if let Some((start, len)) = found {
                let space = &mut g.regions[r];
                space.free.remove(&start);
                if len > pages {
                    space.free.insert(start + pages, len - pages);
                }
                g.next = (r + 1) % n;
                g.used_pages += pages as u64;
                return Some((r as u16, start));
            }
        }
        None
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
        let a = h.alloc(4).unwrap();
        let b = h.alloc(4).unwrap();
        assert_ne!(a.0, b.0, "rotates over regions");
        let c = h.alloc(6).unwrap();
        assert_eq!(c.0, 0);
        assert!(h.alloc(1).is_none());
        assert_eq!(h.used_pages(), 14);
        h.free(a.0, a.1, 4);
        h.free(c.0, c.1, 6);
        assert_eq!(h.alloc(10), Some((0, 0)), "neighbours merged back");
    }
}
