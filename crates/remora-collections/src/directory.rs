//! An append-only table of cells that readers index without a lock.
//!
//! Segment `s` holds `2^s` cells and is allocated on first use, so cell `i`
//! never moves once it exists and growing never copies: a reader finds a
//! cell with one atomic load (the segment's `OnceLock`) and two shifts.

use std::sync::OnceLock;

/// Enough segments for `2^SEGMENTS - 1` cells.
const SEGMENTS: usize = 40;

pub(crate) struct Directory<C> {
    segments: [OnceLock<Box<[C]>>; SEGMENTS],
}

/// Segment and offset of cell `i`.
fn locate(i: usize) -> (usize, usize) {
    let n = i + 1;
    let s = (usize::BITS - 1 - n.leading_zeros()) as usize;
    (s, n - (1 << s))
}

impl<C: Default> Directory<C> {
    pub(crate) fn new() -> Self {
        Self {
            segments: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Cell `i` if its segment exists.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&C> {
        let (s, off) = locate(i);
        self.segments.get(s)?.get().map(|seg| &seg[off])
    }

    /// Cell `i`, creating its segment if needed; `None` past the table's end.
    pub(crate) fn get_or_create(&self, i: usize) -> Option<&C> {
        let (s, off) = locate(i);
        let seg = self
            .segments
            .get(s)?
            .get_or_init(|| (0..1usize << s).map(|_| C::default()).collect());
        Some(&seg[off])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_found_where_they_were_made() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(1), (1, 0));
        assert_eq!(locate(2), (1, 1));
        assert_eq!(locate(3), (2, 0));
        assert_eq!(locate(6), (2, 3));
        assert_eq!(locate(7), (3, 0));
        let d: Directory<std::sync::atomic::AtomicUsize> = Directory::new();
        assert!(d.get(5).is_none());
        for i in 0..100 {
            d.get_or_create(i)
                .unwrap()
                .store(i, std::sync::atomic::Ordering::Relaxed);
        }
        for i in 0..100 {
            assert_eq!(d.get(i).unwrap().load(std::sync::atomic::Ordering::Relaxed), i);
        }
    }
}
