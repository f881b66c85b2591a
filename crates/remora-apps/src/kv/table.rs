//! Where a [`super::KvStore`] keeps its versions: a B-tree of
//! `(key, version)` to value, on far memory ([`RemBTreeMap`]) or, as the
//! yardstick, on std's `BTreeMap` in local memory ([`LocalTable`]).

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::RwLock;

use remora_collections::RemBTreeMap;
use remora_runtime::Remotable;

use super::KvError;

/// A table of `(key, version)` to value.
pub trait VersionTable<V>: Sync {
    /// Runs `f` on the value at `kv`, if there is one.
    fn get_with<R>(&self, kv: (u64, u64), f: impl FnOnce(&V) -> R) -> Result<Option<R>, KvError>;
    /// Sets the value at `kv` (replacing one if there is).
    fn insert(&self, kv: (u64, u64), value: V) -> Result<(), KvError>;
    /// Removes the value at `kv`; returns whether there was one.
    fn remove(&self, kv: (u64, u64)) -> Result<bool, KvError>;
}

impl<V: Remotable + Copy> VersionTable<V> for RemBTreeMap<'_, (u64, u64), V> {
    fn get_with<R>(&self, kv: (u64, u64), f: impl FnOnce(&V) -> R) -> Result<Option<R>, KvError> {
        Ok(RemBTreeMap::get_with(self, &kv, f)?)
    }

    fn insert(&self, kv: (u64, u64), value: V) -> Result<(), KvError> {
        RemBTreeMap::insert(self, kv, value)?;
        Ok(())
    }

    fn remove(&self, kv: (u64, u64)) -> Result<bool, KvError> {
        Ok(RemBTreeMap::remove(self, &kv)?)
    }
}

/// Shards of a [`LocalTable`]: a key's versions share one.
const SHARDS: usize = 64;

/// A shard on a cache line of its own.
#[repr(align(128))]
struct Shard<V>(RwLock<BTreeMap<(u64, u64), Box<V>>>);

/// std's `BTreeMap` in local memory, sharded by key behind `RwLock`s as a
/// user would share it between threads: the all-local yardstick.
pub struct LocalTable<V> {
    shards: Box<[Shard<V>]>,
    hasher: std::hash::RandomState,
}

impl<V> Default for LocalTable<V> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard(RwLock::new(BTreeMap::new()))).collect(),
            hasher: std::hash::RandomState::new(),
        }
    }
}

impl<V> LocalTable<V> {
    fn shard(&self, key: u64) -> &RwLock<BTreeMap<(u64, u64), Box<V>>> {
        &self.shards[(self.hasher.hash_one(key) >> 32) as usize % SHARDS].0
    }
}

impl<V: Send + Sync> VersionTable<V> for LocalTable<V> {
    fn get_with<R>(&self, kv: (u64, u64), f: impl FnOnce(&V) -> R) -> Result<Option<R>, KvError> {
        let g = self.shard(kv.0).read().unwrap_or_else(|p| p.into_inner());
        Ok(g.get(&kv).map(|v| f(v)))
    }

    fn insert(&self, kv: (u64, u64), value: V) -> Result<(), KvError> {
        // Boxed outside the lock: the copy of a large value is not the
        // shard's to wait for.
        let b = Box::new(value);
        self.shard(kv.0)
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(kv, b);
        Ok(())
    }

    fn remove(&self, kv: (u64, u64)) -> Result<bool, KvError> {
        let old = self.shard(kv.0).write().unwrap_or_else(|p| p.into_inner()).remove(&kv);
        Ok(old.is_some())
    }
}
