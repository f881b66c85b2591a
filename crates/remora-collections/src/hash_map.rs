//! `RemHashMap<K, V>`: a sharded hash map whose values are far objects.
//!
//! ```text
//!   local: shard[0..n], each RwLock<HashTable<(K, RemBox<V>)>>, padded to its own cache lines
//!                                                 \__ one remotable object per value
//! ```
//!
//! Keys and the 8-byte handles stay local (the index); each value is a
//! remotable object of its own, so a lookup is at most one swap-in of the
//! span holding it. A key is hashed once: the hash picks the shard (bits
//! 32 and up, which hashbrown's table leaves alone for tables under 2^32
//! buckets: it indexes with the low bits and tags with the top seven) and
//! is handed to the shard's table.
//!
//! Locking: a lookup takes its shard's read lock, so readers of different
//! shards share nothing and readers of one shard only its lock word; a
//! write takes its shard's write lock. A new value is allocated before the
//! lock is taken (allocation may wait for eviction), and a replaced or
//! removed value is freed after it is released.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::RwLock;

use hashbrown::DefaultHashBuilder;
use hashbrown::hash_table::{Entry, HashTable};
use remora_runtime::{RemBox, Remotable, Runtime, RuntimeError};

/// Shards by default: enough that two threads rarely meet on one lock.
const SHARDS: usize = 64;

type Table<K, V> = HashTable<(K, RemBox<V>)>;

/// A shard on cache lines of its own, so that its lock word is not shared
/// with a neighbour's.
#[repr(align(128))]
struct Shard<K, V: Remotable>(RwLock<Table<K, V>>);

/// A hash map whose values live in far memory (see the module docs).
///
/// ```no_run
/// # fn f(rt: &remora_runtime::Runtime) -> Result<(), remora_runtime::RuntimeError> {
/// use remora_collections::RemHashMap;
/// let m = RemHashMap::new(rt);
/// m.insert("k".to_string(), [7u8; 4096])?; // the key stays local, the value may go far
/// m.update("k", |v| v[0] = 8)?;
/// assert_eq!(m.get_with("k", |v| v[0])?, Some(8));
/// assert!(m.remove("k")); // freed where it lies
/// # Ok(()) }
/// ```
pub struct RemHashMap<'rt, K, V: Remotable + Copy> {
    rt: &'rt Runtime,
    hasher: DefaultHashBuilder,
    shards: Box<[Shard<K, V>]>,
    mask: u64,
}

impl<'rt, K: Hash + Eq, V: Remotable + Copy> RemHashMap<'rt, K, V> {
    /// An empty map on `rt`.
    pub fn new(rt: &'rt Runtime) -> Self {
        Self::with_shards(rt, SHARDS)
    }

    /// An empty map of `shards` shards (rounded up to a power of two).
    pub fn with_shards(rt: &'rt Runtime, shards: usize) -> Self {
        let n = shards.clamp(1, 1 << 16).next_power_of_two();
        Self {
            rt,
            hasher: DefaultHashBuilder::default(),
            shards: (0..n).map(|_| Shard(RwLock::new(HashTable::new()))).collect(),
            mask: n as u64 - 1,
        }
    }

    fn hash<Q: Hash + ?Sized>(&self, k: &Q) -> u64 {
        self.hasher.hash_one(k)
    }

    fn shard(&self, hash: u64) -> &RwLock<Table<K, V>> {
        &self.shards[((hash >> 32) & self.mask) as usize].0
    }

    fn read(&self, hash: u64) -> std::sync::RwLockReadGuard<'_, Table<K, V>> {
        self.shard(hash).read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, hash: u64) -> std::sync::RwLockWriteGuard<'_, Table<K, V>> {
        self.shard(hash).write().unwrap_or_else(|p| p.into_inner())
    }

    fn rehash(&self) -> impl Fn(&(K, RemBox<V>)) -> u64 + '_ {
        move |(k, _)| self.hash(k)
    }

    /// Number of entries (a sum over the shards, each read-locked in turn).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.0.read().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    /// Whether the map holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on the value of `key`, in place, if there is one.
    pub fn get_with<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Result<Option<R>, RuntimeError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let h = self.hash(key);
        let t = self.read(h);
        let Some((_, obj)) = t.find(h, |(k, _)| k.borrow() == key) else {
            return Ok(None);
        };
        let scope = self.rt.scope();
        Ok(Some(f(obj.deref(&scope)?)))
    }

    /// A copy of the value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Result<Option<V>, RuntimeError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get_with(key, |v| *v)
    }

    /// Whether `key` has a value (no swap-in: keys are local).
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let h = self.hash(key);
        self.read(h).find(h, |(k, _)| k.borrow() == key).is_some()
    }

    /// Sets the value of `key`; returns whether it replaced one. The old
    /// value is freed where it lies, unread (see [`RemHashMap::take`] to
    /// read and remove it).
    pub fn insert(&self, key: K, value: V) -> Result<bool, RuntimeError> {
        let obj = self.rt.alloc(value)?;
        let h = self.hash(&key);
        let old = {
            let mut t = self.write(h);
            match t.entry(h, |(k, _)| *k == key, self.rehash()) {
                Entry::Occupied(mut e) => Some(std::mem::replace(&mut e.get_mut().1, obj)),
                Entry::Vacant(e) => {
                    e.insert((key, obj));
                    None
                }
            }
        };
        Ok(old.is_some())
    }

    /// Changes the value of `key` in place with `f` (the object is marked
    /// dirty); returns whether `key` had a value.
    pub fn update<Q>(&self, key: &Q, f: impl FnOnce(&mut V)) -> Result<bool, RuntimeError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let h = self.hash(key);
        let mut t = self.write(h);
        let Some((_, obj)) = t.find_mut(h, |(k, _)| k.borrow() == key) else {
            return Ok(false);
        };
        let scope = self.rt.scope();
        f(obj.deref_mut(&scope)?);
        Ok(true)
    }

    /// Removes `key`; returns whether it had a value, which is freed where
    /// it lies, unread.
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let h = self.hash(key);
        let gone = {
            let mut t = self.write(h);
            t.find_entry(h, |(k, _)| k.borrow() == key).ok().map(|e| e.remove().0)
        };
        gone.is_some()
    }

    /// Removes `key` and returns its value (read back if it is far).
    pub fn take<Q>(&self, key: &Q) -> Result<Option<V>, RuntimeError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let h = self.hash(key);
        let mut t = self.write(h);
        let Ok(e) = t.find_entry(h, |(k, _)| k.borrow() == key) else {
            return Ok(None);
        };
        let value = {
            let scope = self.rt.scope();
            *e.get().1.deref(&scope)?
        };
        let gone = e.remove().0;
        drop(t);
        drop(gone);
        Ok(Some(value))
    }

    /// Removes every entry; far values are freed where they lie, unread.
    pub fn clear(&self) {
        for s in self.shards.iter() {
            let gone = std::mem::take(&mut *s.0.write().unwrap_or_else(|p| p.into_inner()));
            drop(gone);
        }
    }
}

impl<'rt, K: Hash + Eq + Clone, V: Remotable + Copy> RemHashMap<'rt, K, V> {
    /// A cursor over the entries, by value, shard by shard: it copies one
    /// shard's keys at a time and reads each value as it reaches it, so it
    /// holds at most one shard's keys and one value. Entries inserted or
    /// removed meanwhile may or may not be seen; none is seen twice.
    pub fn iter(&self) -> MapIter<'_, 'rt, K, V> {
        MapIter {
            map: self,
            shard: 0,
            keys: Vec::new(),
        }
    }
}

/// A cursor over a [`RemHashMap`] (see [`RemHashMap::iter`]).
pub struct MapIter<'m, 'rt, K, V: Remotable + Copy> {
    map: &'m RemHashMap<'rt, K, V>,
    shard: usize,
    /// The current shard's keys not yet visited, last first.
    keys: Vec<(u64, K)>,
}

impl<K: Hash + Eq + Clone, V: Remotable + Copy> Iterator for MapIter<'_, '_, K, V> {
    type Item = Result<(K, V), RuntimeError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((h, k)) = self.keys.pop() {
                let t = self.map.read(h);
                let Some((_, obj)) = t.find(h, |(key, _)| *key == k) else {
                    continue; // removed since the keys were copied
                };
                let scope = self.map.rt.scope();
                return Some(obj.deref(&scope).map(|v| (k, *v)));
            }
            let s = self.map.shards.get(self.shard)?;
            self.shard += 1;
            let t = s.0.read().unwrap_or_else(|p| p.into_inner());
            self.keys = t.iter().map(|(k, _)| (self.map.hash(k), k.clone())).collect();
        }
    }
}
