//! The B-tree's cursor: one leaf's entries at a time.

use std::ops::{Bound, RangeBounds};

use remora_runtime::{Remotable, RuntimeError};

use super::{LeafBatch, RemBTreeMap, read, try_read};

impl<'rt, K: Remotable + Copy + Ord, V: Remotable + Copy> RemBTreeMap<'rt, K, V> {
    /// A cursor over the entries whose keys are in `range`, in key order,
    /// by value. It holds one leaf's entries at a time: each refill goes
    /// down from the root to the leaf after the last key it returned, so it
    /// is weakly consistent (it sees each leaf as it is when it gets there)
    /// and never returns a key twice or out of order.
    pub fn range(&self, range: impl RangeBounds<K>) -> BTreeIter<'_, 'rt, K, V> {
        BTreeIter {
            map: self,
            from: range.start_bound().cloned(),
            to: range.end_bound().cloned(),
            buf: Vec::new(),
            done: false,
        }
    }

    /// A cursor over every entry (see [`RemBTreeMap::range`]).
    pub fn iter(&self) -> BTreeIter<'_, 'rt, K, V> {
        self.range(..)
    }

    /// The entries of the leaf holding keys from `from` on, those in range,
    /// last first, and the bound above the leaf's keys.
    fn leaf_entries(&self, from: Bound<K>, to: Bound<K>) -> Result<LeafBatch<K, V>, RuntimeError> {
        let (leaf, high) = match from {
            Bound::Included(k) | Bound::Excluded(k) => self.leaf_for(&k)?,
            Bound::Unbounded => self.descend(|_| 0)?,
        };
        let entries = self.with_node(&leaf, |n| {
            n.keys()
                .iter()
                .zip(&n.ids)
                .filter(|(k, _)| (from.as_ref(), to.as_ref()).contains(*k))
                .map(|(k, id)| (*k, *id))
                .collect::<Vec<_>>()
        })?;
        let mut out = Vec::new();
        let mut scope = Some(self.rt.scope());
        for (k, vid) in entries.unwrap_or_default() {
            // One scope for the leaf's values while their locks are free;
            // a busy one is waited for outside any scope.
            let vg = match try_read(self.value_cell(vid)) {
                Some(vg) => vg,
                None => {
                    scope = None;
                    read(self.value_cell(vid))
                }
            };
            if let Some(b) = vg.as_ref() {
                let sc = scope.get_or_insert_with(|| self.rt.scope());
                out.push((k, *b.deref(sc)?));
            }
        }
        drop(scope);
        drop(leaf);
        out.reverse();
        Ok((out, high))
    }
}

/// A cursor over a [`RemBTreeMap`] (see [`RemBTreeMap::range`]).
pub struct BTreeIter<'m, 'rt, K: Remotable + Copy + Ord, V: Remotable + Copy> {
    map: &'m RemBTreeMap<'rt, K, V>,
    from: Bound<K>,
    to: Bound<K>,
    /// The current leaf's entries not yet returned, last first.
    buf: Vec<(K, V)>,
    done: bool,
}

impl<K: Remotable + Copy + Ord, V: Remotable + Copy> Iterator for BTreeIter<'_, '_, K, V> {
    type Item = Result<(K, V), RuntimeError>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.buf.is_empty() {
            if self.done {
                return None;
            }
            match self.map.leaf_entries(self.from, self.to) {
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Ok((entries, high)) => {
                    self.buf = entries;
                    // The next leaf starts at `high`; keys added to this one
                    // from now on are not seen (weak consistency).
                    match high {
                        Some(h) if (Bound::Unbounded, self.to).contains(&h) => self.from = Bound::Included(h),
                        _ => self.done = true,
                    }
                }
            }
        }
        self.buf.pop().map(Ok)
    }
}
