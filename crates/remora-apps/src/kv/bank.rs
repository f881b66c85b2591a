//! TPC-A on the KV store: every branch, teller and account is a row of
//! [`ROW_BYTES`] (the paper's 4 KB values), every transfer a transaction of
//! three reads and three writes, and the history a log beside the store.

use std::sync::Mutex;

use remora_collections::RemVec;

use super::tpca::{Audit, Bank, BankError, INITIAL_BALANCE, Shape, Table, Transfer};
use super::{KvError, KvStore, VersionTable};

/// Bytes of a row: the paper's 4 KB values.
pub const ROW_BYTES: usize = 4096;

/// A row: word 0 its key, word 1 its version, word 2 its balance, and
/// filler derived from key and version, so that a row of another key, a
/// stale version or a torn copy fails verification.
pub type Row = [u64; ROW_BYTES / 8];

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn filler(key: u64, version: u64) -> u64 {
    splitmix(key ^ version.rotate_left(32))
}

/// The row of `key` at `version` holding `balance`.
fn row(key: u64, version: u64, balance: i64) -> Row {
    let mut r = [0u64; ROW_BYTES / 8];
    let s = filler(key, version);
    for (i, w) in r.iter_mut().enumerate() {
        *w = s.wrapping_add((i as u64).wrapping_mul(GOLDEN));
    }
    r[0] = key;
    r[1] = version;
    r[2] = balance as u64;
    r
}

/// The balance of `r` if it is the row of `key` at `version`.
fn verify(r: &Row, key: u64, version: u64) -> Option<i64> {
    let s = filler(key, version);
    let filler_ok = r[3..]
        .iter()
        .enumerate()
        .all(|(i, w)| *w == s.wrapping_add(((i + 3) as u64).wrapping_mul(GOLDEN)));
    (r[0] == key && r[1] == version && filler_ok).then_some(r[2] as i64)
}

/// A history record: account, teller and branch keys, and the delta.
pub type HistoryRecord = [u64; 4];

/// Where a bank appends its history: a [`RemVec`] on far memory, or a
/// `Vec` behind a `Mutex` in local memory.
pub trait HistoryLog: Sync {
    /// Appends `rec`.
    fn append(&self, rec: HistoryRecord) -> Result<(), KvError>;
    /// Calls `f` on every record.
    fn for_each(&self, f: &mut dyn FnMut(&HistoryRecord)) -> Result<(), KvError>;
}

impl HistoryLog for RemVec<'_, HistoryRecord> {
    fn append(&self, rec: HistoryRecord) -> Result<(), KvError> {
        self.push(rec)?;
        Ok(())
    }

    fn for_each(&self, f: &mut dyn FnMut(&HistoryRecord)) -> Result<(), KvError> {
        self.for_each_chunk(0, |_, recs| {
            recs.iter().for_each(&mut *f);
            true
        })?;
        Ok(())
    }
}

impl HistoryLog for Mutex<Vec<HistoryRecord>> {
    fn append(&self, rec: HistoryRecord) -> Result<(), KvError> {
        self.lock().unwrap_or_else(|p| p.into_inner()).push(rec);
        Ok(())
    }

    fn for_each(&self, f: &mut dyn FnMut(&HistoryRecord)) -> Result<(), KvError> {
        self.lock().unwrap_or_else(|p| p.into_inner()).iter().for_each(f);
        Ok(())
    }
}

/// The bank on far memory: a `RemBTreeMap` of rows and a `RemVec` history.
pub type FarBank<'rt> = KvBank<remora_collections::RemBTreeMap<'rt, (u64, u64), Row>, RemVec<'rt, HistoryRecord>>;

/// The bank on local memory (the yardstick): std collections.
pub type LocalBank = KvBank<super::LocalTable<Row>, Mutex<Vec<HistoryRecord>>>;

/// A TPC-A bank on a [`KvStore`] of [`Row`]s and a [`HistoryLog`].
pub struct KvBank<T, H> {
    store: KvStore<Row, T>,
    history: H,
    shape: Shape,
}

impl<T: VersionTable<Row>, H: HistoryLog> KvBank<T, H> {
    /// A bank of `shape` on an empty `table` and `history`, every row at
    /// [`INITIAL_BALANCE`], keeping `versions` versions of each row.
    pub fn load(table: T, history: H, shape: Shape, versions: usize) -> Result<Self, KvError> {
        let store = KvStore::new(table, versions);
        for key in shape.keys() {
            store.put(key, row(key, 0, INITIAL_BALANCE))?;
        }
        Ok(Self { store, history, shape })
    }

    /// The store underneath (its trimmer, its counters).
    pub fn store(&self) -> &KvStore<Row, T> {
        &self.store
    }

    /// The bank's size.
    pub fn shape(&self) -> Shape {
        self.shape
    }
}

impl<T: VersionTable<Row>, H: HistoryLog> Bank for KvBank<T, H> {
    fn transfer(&self, t: &Transfer) -> Result<(), BankError> {
        let keys = [
            Shape::key(Table::Account, t.account),
            Shape::key(Table::Teller, t.teller),
            Shape::key(Table::Branch, t.branch),
        ];
        let record = [keys[0], keys[1], keys[2], t.delta as u64];
        self.store.transact_then(
            &keys,
            |txn| {
                for &key in &keys {
                    let version = txn.version(key)?.ok_or(KvError::NoSuchKey(key))?;
                    let balance = txn
                        .read_with(key, |r| verify(r, key, version))?
                        .ok_or(KvError::Corrupt { key, version })?;
                    txn.write(key, row(key, version + 1, balance + t.delta))?;
                }
                Ok(())
            },
            || self.history.append(record),
        )?;
        Ok(())
    }

    fn audit(&self) -> Result<Audit, BankError> {
        let mut a = Audit::default();
        for key in self.shape.keys() {
            let Some(version) = self.store.newest(key) else {
                a.bad_values += 1;
                continue;
            };
            let balance = self.store.get_version_with(key, version, |r| verify(r, key, version))?;
            let Some(found) = balance else {
                a.bad_values += 1;
                continue;
            };
            a.values += 1;
            let Some(balance) = found else {
                a.bad_values += 1;
                continue;
            };
            let sum = match Shape::table(key) {
                Some(Table::Account) => &mut a.accounts,
                Some(Table::Teller) => &mut a.tellers,
                _ => &mut a.branches,
            };
            *sum += i128::from(balance);
        }
        self.history.for_each(&mut |r| {
            a.history += i128::from(r[3] as i64);
            a.history_records += 1;
        })?;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_verify_only_as_themselves() {
        let r = row(7, 3, -5);
        assert_eq!(verify(&r, 7, 3), Some(-5));
        assert_eq!(verify(&r, 7, 2), None);
        assert_eq!(verify(&r, 8, 3), None);
        let mut torn = r;
        torn[300] ^= 1;
        assert_eq!(verify(&torn, 7, 3), None);
    }
}
