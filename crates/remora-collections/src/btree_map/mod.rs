//! `RemBTreeMap<K, V>`: an ordered map, a B+-tree whose nodes and values are
//! remotable objects.
//!
//! ```text
//!   local: node cells  [RwLock<Option<RemBox<Node<K>>>>; ...]   (node 0 is the root, always)
//!          value cells [RwLock<Option<RemBox<V>>>; ...]        + free value ids
//!   far:   Node { level, len, keys[32], ids[33] }   level 0: a leaf, ids are value ids
//!                                                   level > 0: ids are child node ids
//! ```
//!
//! Nodes name children and values by index into local tables of cells,
//! not by pointers inside the node: a node is plain data (no drop glue), so
//! dropping or clearing the map frees every far node and value where it
//! lies. What stays local is 16 bytes or so per node and per value (cell
//! and pointer slot); keys live in the nodes.
//!
//! Concurrency is latch coupling (lock crabbing) on the cells' locks:
//! - a lookup read-locks the root, then each child before releasing its
//!   parent, then the value's cell before releasing the leaf;
//! - an insert or removal goes down the same way and write-locks only the
//!   leaf; when the leaf is full, it starts again from the root with write
//!   locks, releasing the ancestors above any node with room, so a split
//!   holds exactly the nodes it changes;
//! - the root never moves (a full root is split by moving its entries into
//!   two new children), so every descent starts from node 0.
//!
//! A thread in a deref scope never waits for a lock, so the evictor's grace
//! periods never wait for a lock holder that waits for them: a lookup goes
//! down in one scope taking each lock only if it is free (`try_read`), and
//! when one is not, leaves the scope and goes down again the slow way, where
//! each scope is closed before the next lock is taken.
//! Removal does not merge nodes (a leaf may become empty); the tree never
//! shrinks until it is cleared.

use std::borrow::Borrow;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use remora_runtime::{DerefScope, RemBox, Remotable, Runtime, RuntimeError};

use crate::directory::Directory;

mod iter;
mod node;

pub use iter::BTreeIter;
use node::{CAP, Node, Open, ROOT};

type NodeCell<K> = RwLock<Option<RemBox<Node<K>>>>;
/// A node's cell, read-locked.
type ReadNode<'a, K> = RwLockReadGuard<'a, Option<RemBox<Node<K>>>>;
/// A node's cell, write-locked.
type WriteNode<'a, K> = RwLockWriteGuard<'a, Option<RemBox<Node<K>>>>;
/// One leaf's entries in range, last first, and the bound above its keys.
type LeafBatch<K, V> = (Vec<(K, V)>, Option<K>);
type ValueCell<V> = RwLock<Option<RemBox<V>>>;

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// The read lock if it is free now (a poisoned lock is taken as the
/// blocking calls take it); `None` if a writer holds it.
fn try_read<T>(l: &RwLock<T>) -> Option<RwLockReadGuard<'_, T>> {
    match l.try_read() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// What a fast-path lookup found.
enum Fast<G> {
    Found(G),
    Absent,
    /// A lock was held by a writer.
    Busy,
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// An ordered map whose nodes and values live in far memory (see the
/// module docs for its layout and locking).
///
/// ```no_run
/// # fn f(rt: &remora_runtime::Runtime) -> Result<(), remora_runtime::RuntimeError> {
/// use remora_collections::RemBTreeMap;
/// let t = RemBTreeMap::new(rt);
/// for k in 0..100u64 {
///     t.insert(k, [k; 16])?;
/// }
/// let keys: Vec<u64> = t.range(10..13).map(|e| e.map(|(k, _)| k)).collect::<Result<_, _>>()?;
/// assert_eq!(keys, [10, 11, 12]);
/// # Ok(()) }
/// ```
pub struct RemBTreeMap<'rt, K: Remotable + Copy + Ord, V: Remotable + Copy> {
    rt: &'rt Runtime,
    nodes: Directory<NodeCell<K>>,
    next_node: AtomicU32,
    values: Directory<ValueCell<V>>,
    next_value: AtomicU32,
    free_values: Mutex<Vec<u32>>,
    len: AtomicUsize,
}

/// What the optimistic pass of a write found.
enum Leaf<R> {
    Done(R),
    /// The leaf is full: go again with write locks from the root.
    Full,
}

impl<'rt, K: Remotable + Copy + Ord, V: Remotable + Copy> RemBTreeMap<'rt, K, V> {
    /// An empty map on `rt`.
    pub fn new(rt: &'rt Runtime) -> Self {
        let nodes = Directory::new();
        // The root's cell exists from the start; its node, with the first key.
        nodes.get_or_create(ROOT as usize);
        Self {
            rt,
            nodes,
            next_node: AtomicU32::new(ROOT + 1),
            values: Directory::new(),
            next_value: AtomicU32::new(0),
            free_values: Mutex::new(Vec::new()),
            len: AtomicUsize::new(0),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether the map holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn node_cell(&self, id: u32) -> &NodeCell<K> {
        self.nodes.get(id as usize).expect("a node id names a cell")
    }

    fn value_cell(&self, id: u32) -> &ValueCell<V> {
        self.values.get(id as usize).expect("a value id names a cell")
    }

    /// Runs `f` on the node in `cell` inside a scope of its own.
    fn with_node<R>(
        &self,
        cell: &Option<RemBox<Node<K>>>,
        f: impl FnOnce(&Node<K>) -> R,
    ) -> Result<Option<R>, RuntimeError> {
        let Some(b) = cell else { return Ok(None) };
        let scope = self.rt.scope();
        Ok(Some(f(b.deref(&scope)?)))
    }

    fn store(&self, cell: &mut Option<RemBox<Node<K>>>, node: Node<K>) -> Result<(), RuntimeError> {
        match cell {
            Some(b) => {
                let scope = self.rt.scope();
                *b.deref_mut(&scope)? = node;
            }
            None => *cell = Some(self.rt.alloc(node)?),
        }
        Ok(())
    }

    /// A new node holding `open`; returns its id.
    fn new_node(&self, open: &Open<K>, fill: K) -> Result<u32, RuntimeError> {
        let id = self.next_node.fetch_add(1, Ordering::Relaxed);
        let cell = self
            .nodes
            .get_or_create(id as usize)
            .ok_or(RuntimeError::TooLarge { size: id as usize })?;
        let b = self.rt.alloc(open.close(fill))?;
        *write(cell) = Some(b);
        Ok(id)
    }

    fn new_value(&self, v: RemBox<V>) -> Result<u32, RuntimeError> {
        let id = match self.free_values.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            Some(id) => id,
            None => self.next_value.fetch_add(1, Ordering::Relaxed),
        };
        let cell = self
            .values
            .get_or_create(id as usize)
            .ok_or(RuntimeError::TooLarge { size: id as usize })?;
        *write(cell) = Some(v);
        Ok(id)
    }

    /// Descends with read locks to the leaf for `key`, and returns it
    /// read-locked with the bound above its keys.
    fn leaf_for<Q: Ord + ?Sized>(&self, key: &Q) -> Result<(ReadNode<'_, K>, Option<K>), RuntimeError>
    where
        K: Borrow<Q>,
    {
        self.descend(|n| n.child(key))
    }

    /// Descends with read locks, taking child `pick(node)` of each inner
    /// node, and returns the leaf read-locked with the bound above its keys.
    fn descend(&self, pick: impl Fn(&Node<K>) -> usize) -> Result<(ReadNode<'_, K>, Option<K>), RuntimeError> {
        let mut g = read(self.node_cell(ROOT));
        let mut high = None;
        loop {
            let step = self.with_node(&g, |n| {
                (n.level > 0).then(|| {
                    let i = pick(n);
                    (n.ids[i], n.high(i))
                })
            })?;
            match step {
                Some(Some((child, h))) => {
                    let cg = read(self.node_cell(child));
                    g = cg;
                    high = h.or(high);
                }
                _ => return Ok((g, high)),
            }
        }
    }

    /// Runs `f` on the value of `key`, in place, if there is one.
    pub fn get_with<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Result<Option<R>, RuntimeError>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        {
            // The fast path: one scope for the whole descent, every lock
            // taken without waiting (see `try_read`).
            let scope = self.rt.scope();
            match self.value_fast(key, &scope)? {
                Fast::Found(vg) => {
                    let Some(b) = vg.as_ref() else { return Ok(None) };
                    return Ok(Some(f(b.deref(&scope)?)));
                }
                Fast::Absent => return Ok(None),
                Fast::Busy => {}
            }
        }
        let (leaf, _) = self.leaf_for(key)?;
        let vid = self.with_node(&leaf, |n| {
            n.keys()
                .binary_search_by(|k| k.borrow().cmp(key))
                .ok()
                .map(|i| n.ids[i])
        })?;
        let Some(Some(vid)) = vid else { return Ok(None) };
        let vg = read(self.value_cell(vid));
        drop(leaf);
        let Some(b) = vg.as_ref() else { return Ok(None) };
        let scope = self.rt.scope();
        Ok(Some(f(b.deref(&scope)?)))
    }

    /// The value cell of `key`, read-locked, found inside `scope` with
    /// locks taken only when free: `Busy` when one was not, and the caller
    /// goes the slow way, out of the scope (a thread in a scope never
    /// waits for a lock).
    fn value_fast<'s, Q>(
        &'s self,
        key: &Q,
        scope: &'s DerefScope<'_>,
    ) -> Result<Fast<RwLockReadGuard<'s, Option<RemBox<V>>>>, RuntimeError>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let Some(mut g) = try_read(self.node_cell(ROOT)) else {
            return Ok(Fast::Busy);
        };
        loop {
            let Some(b) = g.as_ref() else { return Ok(Fast::Absent) };
            let n = b.deref(scope)?;
            if n.level == 0 {
                let Ok(i) = n.keys().binary_search_by(|k| k.borrow().cmp(key)) else {
                    return Ok(Fast::Absent);
                };
                return Ok(match try_read(self.value_cell(n.ids[i])) {
                    Some(vg) => Fast::Found(vg),
                    None => Fast::Busy,
                });
            }
            let child = n.ids[n.child(key)];
            let Some(cg) = try_read(self.node_cell(child)) else {
                return Ok(Fast::Busy);
            };
            g = cg;
        }
    }

    /// A copy of the value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Result<Option<V>, RuntimeError>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get_with(key, |v| *v)
    }

    /// Whether `key` has a value (reads the nodes on its path, not the value).
    pub fn contains_key<Q>(&self, key: &Q) -> Result<bool, RuntimeError>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let (leaf, _) = self.leaf_for(key)?;
        Ok(self.with_node(&leaf, |n| n.keys().binary_search_by(|k| k.borrow().cmp(key)).is_ok())? == Some(true))
    }

    /// The leaf for `key`, write-locked, found with read locks above it.
    /// The root, when it is the leaf, is write-locked after a check of its
    /// level, checked again under the write lock.
    fn leaf_for_write(&self, key: &K) -> Result<WriteNode<'_, K>, RuntimeError> {
        loop {
            let mut g = read(self.node_cell(ROOT));
            if self.with_node(&g, |n| n.level)?.unwrap_or(0) == 0 {
                drop(g);
                let w = write(self.node_cell(ROOT));
                if self.with_node(&w, |n| n.level)?.unwrap_or(0) == 0 {
                    return Ok(w);
                }
                continue; // the root split meanwhile
            }
            loop {
                let step = self.with_node(&g, |n| {
                    let i = n.child(key);
                    (n.ids[i], n.level)
                })?;
                let Some((child, level)) = step else {
                    unreachable!("an inner node is allocated")
                };
                if level == 1 {
                    let leaf = write(self.node_cell(child));
                    return Ok(leaf);
                }
                let cg = read(self.node_cell(child));
                g = cg;
            }
        }
    }

    /// Sets the value of `key`; returns whether it replaced one. The old
    /// value is freed where it lies, unread.
    pub fn insert(&self, key: K, value: V) -> Result<bool, RuntimeError> {
        let obj = self.rt.alloc(value)?;
        let mut obj = Some(obj);
        // Optimistic: only the leaf write-locked.
        let first = {
            let mut leaf = self.leaf_for_write(&key)?;
            self.put_in_leaf(&mut leaf, key, &mut obj)?
        };
        let replaced = match first {
            Leaf::Done(r) => r,
            Leaf::Full => self.insert_splitting(key, &mut obj)?,
        };
        if !replaced {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        Ok(replaced)
    }

    /// Puts `obj` in the write-locked `leaf` if its key is there (replacing
    /// the value) or the leaf has room; `Full` otherwise (obj untouched).
    fn put_in_leaf(
        &self,
        leaf: &mut Option<RemBox<Node<K>>>,
        key: K,
        obj: &mut Option<RemBox<V>>,
    ) -> Result<Leaf<bool>, RuntimeError> {
        let found = self.with_node(leaf, |n| (n.keys().binary_search(&key), n.len as usize, n.ids))?;
        match found {
            Some((Ok(i), _, ids)) => {
                let old = write(self.value_cell(ids[i])).replace(obj.take().expect("the new value"));
                drop(old);
                Ok(Leaf::Done(true))
            }
            Some((Err(_), len, _)) if len >= CAP => Ok(Leaf::Full),
            found => {
                let vid = self.new_value(obj.take().expect("the new value"))?;
                let mut open = match leaf {
                    Some(_) => self.with_node(leaf, Open::of)?.expect("checked"),
                    None => Open {
                        level: 0,
                        keys: Vec::new(),
                        ids: Vec::new(),
                    },
                };
                let i = match found {
                    Some((Err(i), ..)) => i,
                    _ => 0,
                };
                open.keys.insert(i, key);
                open.ids.insert(i, vid);
                self.store(leaf, open.close(key))?;
                Ok(Leaf::Done(false))
            }
        }
    }

    /// The pessimistic insert: write locks from the root, ancestors released
    /// below any node with room; full nodes on the way split bottom-up.
    fn insert_splitting(&self, key: K, obj: &mut Option<RemBox<V>>) -> Result<bool, RuntimeError> {
        let mut held: Vec<(u32, WriteNode<'_, K>)> = vec![(ROOT, write(self.node_cell(ROOT)))];
        loop {
            let (_, g) = held.last().expect("the path is never empty");
            let step = self
                .with_node(g, |n| (n.level > 0).then(|| n.ids[n.child(&key)]))?
                .flatten();
            let Some(child) = step else { break };
            let cg = write(self.node_cell(child));
            if self.with_node(&cg, |n| (n.len as usize) < CAP)? == Some(true) {
                held.clear();
            }
            held.push((child, cg));
        }
        let (_, leaf) = held.last_mut().expect("the path is never empty");
        if let Leaf::Done(r) = self.put_in_leaf(leaf, key, obj)? {
            return Ok(r); // another writer made room, or the key appeared
        }
        // The leaf is full and so is every node held above it but the first.
        let vid = self.new_value(obj.take().expect("the new value"))?;
        let mut carry: Option<(K, u32)> = None;
        for depth in (0..held.len()).rev() {
            let (id, g) = &mut held[depth];
            let mut open = self.with_node(g, Open::of)?.expect("a held node is allocated");
            match carry.take() {
                None => {
                    let i = open.keys.binary_search(&key).expect_err("the key is new");
                    open.keys.insert(i, key);
                    open.ids.insert(i, vid);
                }
                Some((sep, right)) => {
                    let i = open.keys.partition_point(|k| *k <= sep);
                    open.keys.insert(i, sep);
                    open.ids.insert(i + 1, right);
                }
            }
            if open.keys.len() <= CAP {
                self.store(g, open.close(key))?;
                return Ok(false);
            }
            let (right, sep) = open.split();
            if *id == ROOT {
                // The root stays node 0: both halves move to new nodes.
                let left = self.new_node(&open, key)?;
                let right = self.new_node(&right, key)?;
                let root = Open {
                    level: open.level + 1,
                    keys: vec![sep],
                    ids: vec![left, right],
                };
                self.store(g, root.close(key))?;
                return Ok(false);
            }
            let right = self.new_node(&right, key)?;
            self.store(g, open.close(key))?;
            carry = Some((sep, right));
        }
        unreachable!("the first node held has room or is the root")
    }

    /// Removes `key`; returns whether it had a value, which is freed where
    /// it lies, unread.
    pub fn remove(&self, key: &K) -> Result<bool, RuntimeError> {
        let gone = {
            let mut leaf = self.leaf_for_write(key)?;
            let Some(mut open) = self.with_node(&leaf, Open::of)? else {
                return Ok(false);
            };
            let Ok(i) = open.keys.binary_search(key) else {
                return Ok(false);
            };
            open.keys.remove(i);
            let vid = open.ids.remove(i);
            self.store(&mut leaf, open.close(*key))?;
            let gone = write(self.value_cell(vid)).take();
            self.free_values.lock().unwrap_or_else(|p| p.into_inner()).push(vid);
            gone
        };
        drop(gone);
        self.len.fetch_sub(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Removes every entry; far nodes and values are freed where they lie.
    pub fn clear(&self) {
        // Write-locking the root first keeps every descent out meanwhile.
        let mut root = write(self.node_cell(ROOT));
        let n = self.next_node.load(Ordering::Relaxed);
        for id in ROOT + 1..n {
            if let Some(c) = self.nodes.get(id as usize) {
                drop(write(c).take());
            }
        }
        self.next_node.store(ROOT + 1, Ordering::Relaxed);
        let mut free = self.free_values.lock().unwrap_or_else(|p| p.into_inner());
        free.clear();
        for id in 0..self.next_value.load(Ordering::Relaxed) {
            if let Some(c) = self.values.get(id as usize) {
                drop(write(c).take());
            }
        }
        self.next_value.store(0, Ordering::Relaxed);
        drop(root.take());
        self.len.store(0, Ordering::Relaxed);
    }
}
