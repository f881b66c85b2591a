//! A B-tree node as it is stored in far memory, and taken apart for changes.

use std::borrow::Borrow;

use remora_runtime::Remotable;

/// Keys per node.
pub(super) const CAP: usize = 32;
pub(super) const ROOT: u32 = 0;

/// A node as stored: `len` keys; a leaf's `ids[i]` is the value of
/// `keys[i]`, an inner node's `ids[i]` the child holding keys below
/// `keys[i]` (and `ids[len]` those from `keys[len - 1]` up).
#[derive(Clone, Copy)]
pub(super) struct Node<K> {
    pub(super) level: u8,
    pub(super) len: u16,
    pub(super) keys: [K; CAP],
    pub(super) ids: [u32; CAP + 1],
}

// SAFETY: integers and keys that are themselves remotable.
unsafe impl<K: Remotable + Copy> Remotable for Node<K> {}

impl<K: Ord + Copy> Node<K> {
    pub(super) fn keys(&self) -> &[K] {
        &self.keys[..self.len as usize]
    }

    /// Which child of an inner node holds `key`.
    pub(super) fn child<Q: Ord + ?Sized>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
    {
        self.keys().partition_point(|k| k.borrow() <= key)
    }

    /// The bound above every key of child `i`, if there is one.
    pub(super) fn high(&self, i: usize) -> Option<K> {
        self.keys().get(i).copied()
    }
}

/// A node taken apart, for changes.
pub(super) struct Open<K> {
    pub(super) level: u8,
    pub(super) keys: Vec<K>,
    pub(super) ids: Vec<u32>,
}

impl<K: Copy> Open<K> {
    pub(super) fn of(n: &Node<K>) -> Self {
        let len = n.len as usize;
        let ids = if n.level == 0 { len } else { len + 1 };
        Self {
            level: n.level,
            keys: n.keys[..len].to_vec(),
            ids: n.ids[..ids].to_vec(),
        }
    }

    /// Back to a node; `fill` stands for the unused key places.
    pub(super) fn close(&self, fill: K) -> Node<K> {
        debug_assert!(self.keys.len() <= CAP);
        let mut n = Node {
            level: self.level,
            len: self.keys.len() as u16,
            keys: [fill; CAP],
            ids: [u32::MAX; CAP + 1],
        };
        n.keys[..self.keys.len()].copy_from_slice(&self.keys);
        n.ids[..self.ids.len()].copy_from_slice(&self.ids);
        n
    }

    /// Splits off the upper half; returns it and the key that separates it.
    pub(super) fn split(&mut self) -> (Open<K>, K) {
        let mid = self.keys.len() / 2;
        if self.level == 0 {
            let right = Open {
                level: 0,
                keys: self.keys.split_off(mid),
                ids: self.ids.split_off(mid),
            };
            let sep = right.keys[0];
            (right, sep)
        } else {
            let right_keys = self.keys.split_off(mid + 1);
            let sep = self.keys.pop().expect("an inner node to split has keys");
            let right = Open {
                level: self.level,
                keys: right_keys,
                ids: self.ids.split_off(mid + 1),
            };
            (right, sep)
        }
    }
}
