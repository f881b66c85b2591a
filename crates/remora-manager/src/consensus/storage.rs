//! The Raft log and the state machine on the member's redb store.
//!
//! **Log** (`raft_log`, `raft_meta`): entries are written in one
//! transaction per append and the append is acknowledged to the Raft core
//! only once that transaction is committed durably; the vote is committed
//! durably before it returns, so it is stored before it is answered. The
//! committed index is a hint (committed without waiting for the disk): a
//! member that lost it learns it again from the leader.
//!
//! **State machine**: the [`Machine`] lives in memory and is rebuilt at
//! start from the latest snapshot plus the log after it, which the Raft
//! core applies again. Snapshots are the whole machine, postcard-encoded,
//! stored under `raft_meta` before the log behind them is purged.

// `StorageError` is the Raft library's, fixed by its traits' signatures.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{Member, TypeConfig};
use crate::machine::{Answer, Machine, Outcome};
use crate::store::{RAFT_LOG, RAFT_META};
use crate::{Replica, lock};

type SError = StorageError<u64>;

fn rd(e: impl std::fmt::Display) -> SError {
    StorageIOError::read(openraft::AnyError::error(e.to_string())).into()
}

fn wr(e: impl std::fmt::Display) -> SError {
    StorageIOError::write(openraft::AnyError::error(e.to_string())).into()
}

fn get_meta<T: DeserializeOwned>(db: &Database, key: &str) -> Result<Option<T>, SError> {
    let r = db.begin_read().map_err(rd)?;
    let t = r.open_table(RAFT_META).map_err(rd)?;
    match t.get(key).map_err(rd)? {
        Some(v) => Ok(Some(postcard::from_bytes(v.value()).map_err(rd)?)),
        None => Ok(None),
    }
}

fn put_meta<T: Serialize>(db: &Database, key: &str, v: &T, durable: bool) -> Result<(), SError> {
    let mut w = db.begin_write().map_err(wr)?;
    if !durable {
        w.set_durability(Durability::None).map_err(wr)?;
    }
    {
        let mut t = w.open_table(RAFT_META).map_err(wr)?;
        t.insert(key, postcard::to_allocvec(v).map_err(wr)?.as_slice())
            .map_err(wr)?;
    }
    w.commit().map_err(wr)
}

/// The log of one member.
#[derive(Clone)]
pub(crate) struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    pub(crate) fn new(db: Arc<Database>) -> Self {
        Self { db }
    }

    /// True if this member ever voted or logged: it has joined a group before.
    pub(crate) fn has_state(&self) -> Result<bool, SError> {
        let r = self.db.begin_read().map_err(rd)?;
        let t = r.open_table(RAFT_META).map_err(rd)?;
        let log = r.open_table(RAFT_LOG).map_err(rd)?;
        Ok(t.get("vote").map_err(rd)?.is_some() || log.first().map_err(rd)?.is_some())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => Some(e),
            Bound::Excluded(&0) => return Ok(Vec::new()),
            Bound::Excluded(&e) => Some(e - 1),
            Bound::Unbounded => None,
        };
        let r = self.db.begin_read().map_err(rd)?;
        let t = r.open_table(RAFT_LOG).map_err(rd)?;
        let iter = match end {
            Some(e) if e < start => return Ok(Vec::new()),
            Some(e) => t.range(start..=e).map_err(rd)?,
            None => t.range(start..).map_err(rd)?,
        };
        let mut out = Vec::new();
        for item in iter {
            let (_, v) = item.map_err(rd)?;
            out.push(postcard::from_bytes(v.value()).map_err(rd)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SError> {
        let purged: Option<LogId<u64>> = get_meta(&self.db, "purged")?;
        let last = {
            let r = self.db.begin_read().map_err(rd)?;
            let t = r.open_table(RAFT_LOG).map_err(rd)?;
            match t.last().map_err(rd)? {
                Some((_, v)) => Some(postcard::from_bytes::<Entry<TypeConfig>>(v.value()).map_err(rd)?.log_id),
                None => None,
            }
        };
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last.or(purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), SError> {
        put_meta(&self.db, "vote", vote, true)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, SError> {
        get_meta(&self.db, "vote")
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), SError> {
        put_meta(&self.db, "committed", &committed, false)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, SError> {
        Ok(get_meta::<Option<LogId<u64>>>(&self.db, "committed")?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let w = self.db.begin_write().map_err(wr)?;
        {
            let mut t = w.open_table(RAFT_LOG).map_err(wr)?;
            for e in entries {
                t.insert(e.log_id.index, postcard::to_allocvec(&e).map_err(wr)?.as_slice())
                    .map_err(wr)?;
            }
        }
        // Durable before the core hears of it: only then may it be acknowledged.
        let done = w.commit().map_err(|e| std::io::Error::other(e.to_string()));
        let failed = done.as_ref().err().map(wr);
        callback.log_io_completed(done);
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), SError> {
        let w = self.db.begin_write().map_err(wr)?;
        {
            let mut t = w.open_table(RAFT_LOG).map_err(wr)?;
            t.retain_in(log_id.index.., |_, _| false).map_err(wr)?;
        }
        w.commit().map_err(wr)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), SError> {
        let w = self.db.begin_write().map_err(wr)?;
        {
            let mut m = w.open_table(RAFT_META).map_err(wr)?;
            m.insert("purged", postcard::to_allocvec(&log_id).map_err(wr)?.as_slice())
                .map_err(wr)?;
            let mut t = w.open_table(RAFT_LOG).map_err(wr)?;
            t.retain_in(..=log_id.index, |_, _| false).map_err(wr)?;
        }
        w.commit().map_err(wr)
    }
}

/// What a snapshot holds besides its metadata.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, Member>,
    data: Vec<u8>,
}

/// The state machine of one member: applies to the shared [`Replica`].
#[derive(Clone)]
pub(crate) struct StateMachine {
    db: Arc<Database>,
    replica: Arc<Replica>,
}

impl StateMachine {
    /// Loads the latest snapshot into `replica`.
    pub(crate) fn open(db: Arc<Database>, replica: Arc<Replica>) -> Result<Self, SError> {
        if let Some(s) = get_meta::<StoredSnapshot>(&db, "snapshot")? {
            let m: Machine = postcard::from_bytes(&s.data).map_err(rd)?;
            let mut st = lock(&replica.state);
            st.machine = m;
            st.applied = s.meta.last_log_id;
            st.membership = s.meta.last_membership;
        }
        Ok(Self { db, replica })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SError> {
        let (data, meta) = {
            let st = lock(&self.replica.state);
            let data = postcard::to_allocvec(&st.machine).map_err(wr)?;
            let id = st
                .applied
                .map(|l| format!("{}-{}-{}", l.leader_id.term, l.leader_id.node_id, l.index))
                .unwrap_or_else(|| "none".into());
            (
                data,
                SnapshotMeta {
                    last_log_id: st.applied,
                    last_membership: st.membership.clone(),
                    snapshot_id: id,
                },
            )
        };
        let stored = StoredSnapshot { meta, data };
        put_meta(&self.db, "snapshot", &stored, true)?;
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(stored.data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId<u64>>, StoredMembership<u64, Member>), SError> {
        let st = lock(&self.replica.state);
        Ok((st.applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Answer>, SError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        {
            let mut st = lock(&self.replica.state);
            for e in entries {
                st.applied = Some(e.log_id);
                out.push(match e.payload {
                    EntryPayload::Blank => Ok(Outcome::Done),
                    EntryPayload::Normal(p) => st.machine.apply(p),
                    EntryPayload::Membership(m) => {
                        st.membership = StoredMembership::new(Some(e.log_id), m);
                        Ok(Outcome::Done)
                    }
                });
            }
        }
        self.replica.changed.notify_all();
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Vec<u8>>, SError> {
        Ok(Box::default())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, Member>,
        snapshot: Box<Vec<u8>>,
    ) -> Result<(), SError> {
        let m: Machine = postcard::from_bytes(&snapshot).map_err(rd)?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: *snapshot,
        };
        put_meta(&self.db, "snapshot", &stored, true)?;
        {
            let mut st = lock(&self.replica.state);
            st.machine = m;
            st.applied = meta.last_log_id;
            st.membership = meta.last_membership.clone();
        }
        self.replica.changed.notify_all();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SError> {
        Ok(get_meta::<StoredSnapshot>(&self.db, "snapshot")?.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(s.data),
        }))
    }
}
