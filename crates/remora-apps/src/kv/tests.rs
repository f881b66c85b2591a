//! The store's transactions, versions and trimmer on the local table; a
//! table that fails on demand for the rollback. (On far memory, with real
//! processes: `tests/kv.rs` at the workspace root.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use rand::SeedableRng;

use super::tpca::{Bank, Shape};
use super::*;

#[test]
fn transfers_from_many_threads_keep_the_money() {
    let shape = Shape {
        branches: 4,
        accounts_per_branch: 50,
    };
    let bank = KvBank::load(LocalTable::default(), Mutex::new(Vec::new()), shape, 2).unwrap();
    let committed = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| bank.store().run_trimmer(&stop));
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (bank, committed) = (&bank, &committed);
                s.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                    for _ in 0..2000 {
                        bank.transfer(&shape.draw(&mut rng)).unwrap();
                        committed.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    bank.store().trim().unwrap();
    let audit = bank.audit().unwrap();
    audit.check(&shape, committed.load(Ordering::Relaxed)).unwrap();
    assert!(audit.history != 0, "{audit:?}");
    let st = bank.store().stats();
    assert_eq!(st.commits, 8000 + shape.rows());
    assert_eq!(st.trim_pending, 0);
    // Every row keeps exactly its newest two versions.
    for key in shape.keys() {
        let n = bank.store().newest(key).unwrap();
        for v in 0..=n {
            let kept = bank.store().get_version_with(key, v, |_| ()).unwrap().is_some();
            assert_eq!(kept, v + 2 > n, "key {key:#x} version {v} of newest {n}");
        }
    }
}

#[test]
fn a_transaction_sees_its_own_writes_and_only_its_keys() {
    let store = KvStore::new(LocalTable::default(), 3);
    store.put(1, 10u64).unwrap();
    store.put(2, 20u64).unwrap();
    let got = store
        .transact(&[1, 2], |t| {
            let a = t.read_with(1, |v| *v)?;
            t.write(1, a + 1)?;
            t.write(2, a + 2)?;
            Ok((t.read_with(1, |v| *v)?, t.read_with(2, |v| *v)?))
        })
        .unwrap();
    assert_eq!(got, (11, 12));
    assert_eq!(store.get_with(1, |v| *v).unwrap(), Some(11));
    assert_eq!(store.newest(1), Some(1));
    // Old versions stay readable until trimmed.
    assert_eq!(store.get_version_with(1, 0, |v| *v).unwrap(), Some(10));
    assert!(matches!(
        store.transact(&[1], |t| t.read_with(2, |v| *v)),
        Err(KvError::Undeclared(2))
    ));
    assert!(matches!(
        store.transact(&[9], |t| t.read_with(9, |v| *v)),
        Err(KvError::NoSuchKey(9))
    ));
    assert_eq!(store.stats().aborts, 2);
}

/// A local table whose inserts fail once `fail_after` reaches zero.
struct Flaky {
    inner: LocalTable<u64>,
    fail_after: AtomicU64,
    held: RwLock<()>,
}

impl VersionTable<u64> for Flaky {
    fn get_with<R>(&self, kv: (u64, u64), f: impl FnOnce(&u64) -> R) -> Result<Option<R>, KvError> {
        self.inner.get_with(kv, f)
    }

    fn insert(&self, kv: (u64, u64), value: u64) -> Result<(), KvError> {
        let _g = self.held.read().unwrap();
        if self
            .fail_after
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err()
        {
            return Err(KvError::Runtime(RuntimeError::Shutdown));
        }
        self.inner.insert(kv, value)
    }

    fn remove(&self, kv: (u64, u64)) -> Result<bool, KvError> {
        self.inner.remove(kv)
    }
}

#[test]
fn a_commit_that_fails_part_way_changes_nothing() {
    let store = KvStore::new(
        Flaky {
            inner: LocalTable::default(),
            fail_after: AtomicU64::new(2),
            held: RwLock::new(()),
        },
        2,
    );
    store.put(1, 1).unwrap();
    store.put(2, 2).unwrap();
    // The first of the two writes is installed, the second fails.
    store.table().fail_after.store(1, Ordering::Relaxed);
    let r = store.transact(&[1, 2], |t| {
        t.write(1, 100)?;
        t.write(2, 200)
    });
    assert!(matches!(r, Err(KvError::Runtime(RuntimeError::Shutdown))), "{r:?}");
    assert_eq!((store.newest(1), store.newest(2)), (Some(0), Some(0)));
    assert_eq!(store.get_with(1, |v| *v).unwrap(), Some(1));
    assert_eq!(
        store.table().inner.get_with((1, 1), |v| *v).unwrap(),
        None,
        "the installed write was undone"
    );
    // A failing commit hook undoes every installed write too.
    store.table().fail_after.store(10, Ordering::Relaxed);
    let r = store.transact_then(
        &[1, 2],
        |t| {
            t.write(1, 100)?;
            t.write(2, 200)
        },
        || Err(KvError::NoSuchKey(0)),
    );
    assert!(r.is_err());
    assert_eq!(store.get_with(2, |v| *v).unwrap(), Some(2));
    assert_eq!(store.table().inner.get_with((2, 1), |v| *v).unwrap(), None);
    // And the next commit goes through.
    store.transact(&[1, 2], |t| t.write(2, 22)).unwrap();
    assert_eq!(store.get_with(2, |v| *v).unwrap(), Some(22));
}
