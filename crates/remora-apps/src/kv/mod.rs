//! The paper's transactional KV store (§5.2): a B-tree of keys to versioned
//! values, serializable transactions under many threads, and a background
//! trimmer that keeps the newest versions of each key — built on
//! [`remora_collections::RemBTreeMap`] and the runtime's public API, as an
//! application would build it.
//!
//! **Versions.** The table maps `(key, version)` to a value: every update
//! of a key installs a new version beside the old ones, and the newest
//! version of each key is kept in a local index ([`KvStore`] keeps it in
//! memory, 16 bytes a key, beside the table's own local index). Once a key
//! has more than `versions` versions the oldest are queued for the
//! trimmer, which removes them in the background ([`KvStore::trim`],
//! [`KvStore::run_trimmer`]); until it does, they hold memory, which is
//! why the store's peak working set is above its average (§5.2).
//!
//! **Transactions: conservative strict two-phase locking.** A transaction
//! names its keys up front ([`KvStore::transact`]); the store locks them
//! (by lock stripe, in stripe order, so two transactions never wait for
//! each other in a cycle) before the body runs, and holds them until the
//! commit is done. The body reads the newest versions and buffers its
//! writes. The commit installs each write as a new version, runs the
//! caller's commit hook (e.g. appending a history record), and only then
//! publishes the new versions in the local index, which cannot fail: a
//! commit that fails part-way removes what it installed, so a failed
//! transaction leaves nothing behind. Every transaction's reads and writes
//! happen while it holds every lock it will ever take, so the order in
//! which transactions acquire their first lock is a serial order:
//! serializable. Reads outside a transaction ([`KvStore::get_with`]) take
//! no lock: they see the newest committed version.
//!
//! The table is behind a trait ([`VersionTable`]) so that the same store
//! runs on far memory (`RemBTreeMap`) and, as the yardstick, on std's
//! `BTreeMap` in local memory ([`LocalTable`]).

mod bank;
mod table;
pub mod tpca;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::Duration;

pub use bank::{FarBank, HistoryLog, HistoryRecord, KvBank, LocalBank, ROW_BYTES, Row};
use remora_runtime::RuntimeError;
pub use table::{LocalTable, VersionTable};

/// A failed KV operation. A failed transaction changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The runtime failed (far memory unreachable, lost, or exhausted).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A transaction touched a key it did not name up front.
    #[error("key {0:#x} was not named by the transaction")]
    Undeclared(u64),
    /// The key has no value.
    #[error("key {0:#x} has no value")]
    NoSuchKey(u64),
    /// A value read back did not verify (its bytes are not what was written).
    #[error("key {key:#x}: version {version} read back wrong")]
    Corrupt {
        /// The key.
        key: u64,
        /// The version read.
        version: u64,
    },
    /// The index names a version the table does not hold (a bug).
    #[error("key {key:#x}: version {version} is in the index but not in the table")]
    Missing {
        /// The key.
        key: u64,
        /// Its newest version by the index.
        version: u64,
    },
}

/// Lock stripes: more than threads will ever hold, few enough to stay in
/// cache.
const STRIPES: usize = 4096;
/// Shards of the index of newest versions.
const SHARDS: usize = 64;

/// A shard of the index on a cache line of its own.
#[repr(align(128))]
struct Shard(RwLock<HashMap<u64, u64>>);

/// What a store has done, counted as it happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Transactions committed.
    pub commits: u64,
    /// Transactions that failed (and changed nothing).
    pub aborts: u64,
    /// Table operations (gets, inserts, removes): the denominator of a
    /// miss ratio.
    pub table_ops: u64,
    /// Old versions the trimmer removed.
    pub trimmed: u64,
    /// Old versions waiting for the trimmer now.
    pub trim_pending: u64,
}

/// A transactional store of versioned values over a [`VersionTable`].
pub struct KvStore<V, T> {
    table: T,
    index: Box<[Shard]>,
    stripes: Box<[Mutex<()>]>,
    versions: u64,
    trim_queue: Mutex<Vec<(u64, u64)>>,
    hasher: std::hash::RandomState,
    commits: AtomicU64,
    aborts: AtomicU64,
    table_ops: AtomicU64,
    trimmed: AtomicU64,
    trim_pending: AtomicU64,
    _values: std::marker::PhantomData<fn(V) -> V>,
}

/// A transaction in progress: reads see the newest committed versions (or
/// the transaction's own writes), writes are buffered until the commit.
pub struct Txn<'s, V, T> {
    store: &'s KvStore<V, T>,
    keys: &'s [u64],
    /// Newest versions looked up: under the transaction's locks they cannot
    /// change, so each key's is read from the index once.
    seen: Vec<(u64, Option<u64>)>,
    writes: Vec<(u64, V)>,
}

impl<V: Copy, T: VersionTable<V>> KvStore<V, T> {
    /// A store over `table` (empty) keeping the newest `versions` versions
    /// of each key (at least 1).
    pub fn new(table: T, versions: usize) -> Self {
        Self {
            table,
            index: (0..SHARDS).map(|_| Shard(RwLock::new(HashMap::new()))).collect(),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            versions: versions.max(1) as u64,
            trim_queue: Mutex::new(Vec::new()),
            hasher: std::hash::RandomState::new(),
            commits: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
            table_ops: AtomicU64::new(0),
            trimmed: AtomicU64::new(0),
            trim_pending: AtomicU64::new(0),
            _values: std::marker::PhantomData,
        }
    }

    /// The table underneath.
    pub fn table(&self) -> &T {
        &self.table
    }

    /// Versions kept per key.
    pub fn versions(&self) -> usize {
        self.versions as usize
    }

    fn hash(&self, key: u64) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, key: u64) -> &RwLock<HashMap<u64, u64>> {
        &self.index[(self.hash(key) >> 32) as usize % SHARDS].0
    }

    /// The newest committed version of `key`.
    pub fn newest(&self, key: u64) -> Option<u64> {
        self.shard(key)
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied()
    }

    /// Runs `body` as a transaction over `keys` (every key it will read or
    /// write); see the module's doc. Returns what `body` returned, once
    /// committed.
    pub fn transact<R>(
        &self,
        keys: &[u64],
        body: impl FnOnce(&mut Txn<'_, V, T>) -> Result<R, KvError>,
    ) -> Result<R, KvError> {
        self.transact_then(keys, body, || Ok(()))
    }

    /// [`Self::transact`], running `hook` in the commit once the writes are
    /// installed and before they are published (still under the locks): if
    /// it fails, the transaction fails and changes nothing, so `hook` must
    /// be the commit's only effect that cannot be undone.
    pub fn transact_then<R>(
        &self,
        keys: &[u64],
        body: impl FnOnce(&mut Txn<'_, V, T>) -> Result<R, KvError>,
        hook: impl FnOnce() -> Result<(), KvError>,
    ) -> Result<R, KvError> {
        let mut stripes: Vec<usize> = keys.iter().map(|&k| self.hash(k) as usize % STRIPES).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let _held: Vec<MutexGuard<'_, ()>> = stripes
            .iter()
            .map(|&s| self.stripes[s].lock().unwrap_or_else(|p| p.into_inner()))
            .collect();
        let mut txn = Txn {
            store: self,
            keys,
            seen: Vec::with_capacity(keys.len()),
            writes: Vec::with_capacity(keys.len()),
        };
        let out = body(&mut txn).and_then(|r| {
            let writes = std::mem::take(&mut txn.writes)
                .into_iter()
                .map(|(key, v)| (key, txn.newest(key), v))
                .collect();
            self.commit(writes, hook).map(|()| r)
        });
        let counter = if out.is_ok() { &self.commits } else { &self.aborts };
        counter.fetch_add(1, Ordering::Relaxed);
        out
    }

    /// Installs `writes` (key, its newest version now, value) as new
    /// versions, runs `hook`, and publishes them; on failure removes what it
    /// installed. The caller holds the keys' locks.
    fn commit(
        &self,
        writes: Vec<(u64, Option<u64>, V)>,
        hook: impl FnOnce() -> Result<(), KvError>,
    ) -> Result<(), KvError> {
        let mut installed: Vec<(u64, u64)> = Vec::with_capacity(writes.len());
        let mut result = Ok(());
        for (key, newest, v) in writes {
            let version = newest.map_or(0, |n| n + 1);
            self.table_ops.fetch_add(1, Ordering::Relaxed);
            match self.table.insert((key, version), v) {
                Ok(()) => installed.push((key, version)),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let result = result.and_then(|()| hook());
        if let Err(e) = result {
            for kv in installed {
                // What cannot be removed now is an unpublished version: the
                // index never names it, and the next commit of the key
                // replaces it in place.
                if let Err(r) = self.table.remove(kv) {
                    tracing::warn!("undoing a failed commit: key {:#x} version {}: {r}", kv.0, kv.1);
                }
            }
            return Err(e);
        }
        let mut trims = Vec::new();
        for (key, version) in installed {
            self.shard(key)
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, version);
            if version >= self.versions {
                trims.push((key, version - self.versions));
            }
        }
        if !trims.is_empty() {
            self.trim_pending.fetch_add(trims.len() as u64, Ordering::Relaxed);
            self.trim_queue.lock().unwrap_or_else(|p| p.into_inner()).extend(trims);
        }
        Ok(())
    }

    /// Sets `key` to `value` in a transaction of its own.
    pub fn put(&self, key: u64, value: V) -> Result<(), KvError> {
        self.transact(&[key], |t| t.write(key, value))
    }

    /// Runs `f` on the newest committed value of `key`, without a lock: a
    /// version trimmed under the reader is read again at the newer one.
    pub fn get_with<R>(&self, key: u64, mut f: impl FnMut(&V) -> R) -> Result<Option<R>, KvError> {
        loop {
            let Some(version) = self.newest(key) else {
                return Ok(None);
            };
            self.table_ops.fetch_add(1, Ordering::Relaxed);
            if let Some(r) = self.table.get_with((key, version), &mut f)? {
                return Ok(Some(r));
            }
            if self.newest(key) == Some(version) {
                return Err(KvError::Missing { key, version });
            }
        }
    }

    /// Runs `f` on `version` of `key`, if it is still kept.
    pub fn get_version_with<R>(&self, key: u64, version: u64, f: impl FnOnce(&V) -> R) -> Result<Option<R>, KvError> {
        self.table_ops.fetch_add(1, Ordering::Relaxed);
        self.table.get_with((key, version), f)
    }

    /// Removes the old versions queued so far; returns how many. One that
    /// fails to go (far memory unreachable) stays queued for the next call,
    /// and the error is returned.
    pub fn trim(&self) -> Result<usize, KvError> {
        let queued = std::mem::take(&mut *self.trim_queue.lock().unwrap_or_else(|p| p.into_inner()));
        let mut done = 0;
        for (i, &kv) in queued.iter().enumerate() {
            self.table_ops.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.table.remove(kv) {
                self.trim_queue
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(&queued[i..]);
                self.account_trimmed(done);
                return Err(e);
            }
            done += 1;
        }
        self.account_trimmed(done);
        Ok(done)
    }

    fn account_trimmed(&self, n: usize) {
        self.trimmed.fetch_add(n as u64, Ordering::Relaxed);
        self.trim_pending.fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// Trims until `stop` is set: the store's background trimmer, for a
    /// thread of its own. Errors are logged and retried after a pause.
    pub fn run_trimmer(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            match self.trim() {
                Ok(0) => std::thread::sleep(Duration::from_millis(2)),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("trimming old versions: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// What the store has done so far.
    pub fn stats(&self) -> KvStats {
        KvStats {
            commits: self.commits.load(Ordering::Relaxed),
            aborts: self.aborts.load(Ordering::Relaxed),
            table_ops: self.table_ops.load(Ordering::Relaxed),
            trimmed: self.trimmed.load(Ordering::Relaxed),
            trim_pending: self.trim_pending.load(Ordering::Relaxed),
        }
    }
}

impl<V: Copy, T: VersionTable<V>> Txn<'_, V, T> {
    fn check(&self, key: u64) -> Result<(), KvError> {
        if self.keys.contains(&key) {
            Ok(())
        } else {
            Err(KvError::Undeclared(key))
        }
    }

    /// `key`'s newest committed version, from the index the first time.
    fn newest(&mut self, key: u64) -> Option<u64> {
        if let Some(&(_, n)) = self.seen.iter().find(|(k, _)| *k == key) {
            return n;
        }
        let n = self.store.newest(key);
        self.seen.push((key, n));
        n
    }

    /// The newest committed version of `key` (the one a read sees, unless
    /// this transaction wrote the key).
    pub fn version(&mut self, key: u64) -> Result<Option<u64>, KvError> {
        self.check(key)?;
        Ok(self.newest(key))
    }

    /// Runs `f` on the value of `key` this transaction sees.
    pub fn read_with<R>(&mut self, key: u64, f: impl FnOnce(&V) -> R) -> Result<R, KvError> {
        self.check(key)?;
        if let Some((_, v)) = self.writes.iter().rev().find(|(k, _)| *k == key) {
            return Ok(f(v));
        }
        let version = self.newest(key).ok_or(KvError::NoSuchKey(key))?;
        self.store.table_ops.fetch_add(1, Ordering::Relaxed);
        // Locked: no commit can trim or replace it meanwhile.
        self.store
            .table
            .get_with((key, version), f)?
            .ok_or(KvError::Missing { key, version })
    }

    /// Sets `key` to `value` when the transaction commits.
    pub fn write(&mut self, key: u64, value: V) -> Result<(), KvError> {
        self.check(key)?;
        match self.writes.iter_mut().find(|(k, _)| *k == key) {
            Some(w) => w.1 = value,
            None => self.writes.push((key, value)),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
