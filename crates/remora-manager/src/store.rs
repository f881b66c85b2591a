//! Durable manager state in an embedded redb database, `manager.redb`.
//!
//! Since schema version 3 the file holds a member's Raft log, its vote and
//! its latest snapshot (module `consensus`): the state itself is the
//! snapshot plus the log applied to it. The tables of versions 1 and 2 (one
//! table per record kind, keyed by id, values postcard-encoded) were a
//! single manager's state; they are read once, when such a store is taken
//! over by a group (see [`Store::legacy`]), and removed when the state they
//! hold has been applied through the log.
//!
//! **Schema version.** The `meta` table holds [`SCHEMA_VERSION`] under
//! `schema_version`, written when the store is created. A store with another
//! version, or with records but no version (written before versions
//! existed), is refused when opened instead of being misread: postcard
//! records carry no field names, so an older or newer layout would decode
//! into wrong values or not at all. Records embed `remora_proto` types
//! (states, tokens, ids), so a change to their encoding is a schema change
//! too; the tests below pin the bytes of each record.
//!
//! **Versions and migrations.**
//! - 1: the first versioned layout.
//! - 2: a region record ends with its epoch (`RegionRec::epoch`, a postcard
//!   varint). A version-1 store is migrated when opened, in one write
//!   transaction with the new version stamp: each region record gets epoch
//!   0 appended, which is what a region that never changed owner under
//!   epochs has. A crash during the migration leaves version 1 and the old
//!   records (redb commits atomically), so the next start migrates again.
//!   Only version 1 is migrated; any other version is refused as above.
//! - 3: the Raft tables (`raft_log`, `raft_meta`). A version-1 or -2 store
//!   with records is a single manager's: its records are loaded as
//!   [`Store::legacy`], proposed as one `Import` command by the member that
//!   initializes the group, and only after that command is applied are the
//!   old tables dropped and version 3 stamped ([`Store::finish_import`]),
//!   in one transaction. A crash in between imports again, and `Import`
//!   applies only to a state that has seen nothing else.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use remora_proto::msg::ComputeState;
use remora_proto::{AdminKey, ComputeId, NodeId, NodeState, RegionId, Token};
use serde::{Deserialize, Serialize};

const NODES: TableDefinition<u64, &[u8]> = TableDefinition::new("memory_nodes");
const REGIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("regions");
const COMPUTES: TableDefinition<u64, &[u8]> = TableDefinition::new("compute_nodes");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// A member's Raft log: entry index to postcard of the entry.
pub(crate) const RAFT_LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// A member's vote, last purged and committed log ids, and snapshot.
pub(crate) const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

/// The layout of the tables and of the records in them. Any change to
/// either needs a new number, and the manager then refuses stores written
/// with the old one.
pub const SCHEMA_VERSION: u64 = 3;
/// The last version of a single manager's records (see the module docs).
const LEGACY_VERSION: u64 = 2;
const SCHEMA_KEY: &str = "schema_version";

/// A store failure: the manager cannot promise durability, so it refuses the
/// request, or cannot read the store at all, so it does not start.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("manager store: {0}")]
    Db(String),
    /// The store was written with another schema version.
    #[error(
        "manager store {path}: schema version {found}, but this build reads schema version {expected}; \
         run the remora version that wrote it, or start from an empty data directory"
    )]
    SchemaMismatch {
        /// The database file.
        path: PathBuf,
        /// The version it holds.
        found: u64,
        /// [`SCHEMA_VERSION`].
        expected: u64,
    },
    /// The store holds records but no schema version: it predates versions.
    #[error(
        "manager store {path}: holds records but no schema version (written before schema versions existed), \
         and this build reads schema version {expected}; start from an empty data directory"
    )]
    NoSchemaVersion {
        /// The database file.
        path: PathBuf,
        /// [`SCHEMA_VERSION`].
        expected: u64,
    },
}

fn se(e: impl std::fmt::Display) -> StoreError {
    StoreError::Db(e.to_string())
}

/// A memory node as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeRec {
    pub(crate) addr: String,
    pub(crate) capacity: u64,
    pub(crate) region_size: u64,
    pub(crate) admin: AdminKey,
    pub(crate) state: NodeState,
    pub(crate) regions: Vec<RegionId>,
}

/// A region as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RegionRec {
    pub(crate) node: NodeId,
    pub(crate) size: u64,
    /// Owner and its capability token, if allocated.
    pub(crate) owner: Option<(ComputeId, Token)>,
    /// The epoch of the region's current assignment, bumped on every change
    /// of owner (see `remora_proto::cap`). Stored before a grant is sent, so
    /// no restart issues one epoch twice. Last, for the migration from 1.
    pub(crate) epoch: u64,
}

/// A region record of schema version 1 (no epoch), read only to migrate.
#[derive(Debug, Deserialize)]
struct RegionRecV1 {
    node: NodeId,
    size: u64,
    owner: Option<(ComputeId, Token)>,
}

/// Rewrites version-1 region records to version 2 inside `w` (see the module docs).
fn migrate_v1(w: &redb::WriteTransaction) -> Result<(), StoreError> {
    let mut t = w.open_table(REGIONS).map_err(se)?;
    let mut all = Vec::new();
    for e in t.iter().map_err(se)? {
        let (k, v) = e.map_err(se)?;
        let old: RegionRecV1 = postcard::from_bytes(v.value()).map_err(se)?;
        all.push((
            k.value(),
            RegionRec {
                node: old.node,
                size: old.size,
                owner: old.owner,
                epoch: 0,
            },
        ));
    }
    for (k, r) in &all {
        t.insert(*k, postcard::to_allocvec(r).map_err(se)?.as_slice())
            .map_err(se)?;
    }
    Ok(())
}

/// A compute node as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ComputeRec {
    pub(crate) name: String,
    pub(crate) secret: Token,
    pub(crate) state: ComputeState,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub(crate) next_node: u64,
    pub(crate) next_region: u64,
    pub(crate) next_compute: u64,
    pub(crate) incarnation: u64,
}

/// A single manager's records.
#[derive(Debug, Clone, Default)]
pub(crate) struct Loaded {
    pub(crate) nodes: Vec<(NodeId, NodeRec)>,
    pub(crate) regions: Vec<(RegionId, RegionRec)>,
    pub(crate) computes: Vec<(ComputeId, ComputeRec)>,
    pub(crate) meta: Meta,
}

/// The database.
pub(crate) struct Store {
    db: std::sync::Arc<Database>,
    /// A single manager's records, not yet taken over by the group.
    legacy: Option<Loaded>,
}

impl Store {
    /// Opens (or creates) `dir/manager.redb`, refusing one of another
    /// schema version (see the module docs), or one that users other than
    /// its owner can read: it holds every region's token and every
    /// session's secret. A new one is private from its first byte.
    pub(crate) fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| se(format!("cannot create {}: {e}", dir.display())))?;
        let path = dir.join("manager.redb");
        remora_proto::secret::check_private(&path).map_err(|e| se(format!("the store {e}")))?;
        remora_proto::secret::create_private(&path)
            .map_err(|e| se(format!("cannot create {}: {e}", path.display())))?;
        let db = Database::create(&path).map_err(|e| se(format!("{}: {e}", path.display())))?;
        let w = db.begin_write().map_err(se)?;
        let mut legacy = false;
        {
            let nodes = w.open_table(NODES).map_err(se)?;
            let regions = w.open_table(REGIONS).map_err(se)?;
            let computes = w.open_table(COMPUTES).map_err(se)?;
            let mut meta = w.open_table(META).map_err(se)?;
            w.open_table(RAFT_LOG).map_err(se)?;
            w.open_table(RAFT_META).map_err(se)?;
            let found = meta.get(SCHEMA_KEY).map_err(se)?.map(|v| v.value());
            let empty =
                nodes.is_empty().map_err(se)? && regions.is_empty().map_err(se)? && computes.is_empty().map_err(se)?;
            match found {
                Some(SCHEMA_VERSION) => {}
                Some(1) => {
                    drop(regions);
                    migrate_v1(&w)?;
                    meta.insert(SCHEMA_KEY, LEGACY_VERSION).map_err(se)?;
                    tracing::info!("manager store {}: migrated from schema version 1 to 2", path.display());
                    legacy = !empty;
                }
                Some(LEGACY_VERSION) => legacy = !empty,
                // Returning drops the transaction uncommitted: the store is left as it was.
                Some(found) => {
                    return Err(StoreError::SchemaMismatch {
                        path,
                        found,
                        expected: SCHEMA_VERSION,
                    });
                }
                None => {
                    // Empty (new, or created by a run that died before its
                    // first commit): it is ours to stamp.
                    if !(empty && meta.is_empty().map_err(se)?) {
                        return Err(StoreError::NoSchemaVersion {
                            path,
                            expected: SCHEMA_VERSION,
                        });
                    }
                }
            }
            if !legacy && found != Some(SCHEMA_VERSION) {
                meta.insert(SCHEMA_KEY, SCHEMA_VERSION).map_err(se)?;
            }
        }
        w.commit().map_err(se)?;
        let mut store = Self {
            db: std::sync::Arc::new(db),
            legacy: None,
        };
        if legacy {
            store.legacy = Some(store.load()?);
        }
        Ok(store)
    }

    /// The database, for the Raft log and state machine.
    pub(crate) fn db(&self) -> std::sync::Arc<Database> {
        std::sync::Arc::clone(&self.db)
    }

    /// A single manager's records awaiting their takeover by the group.
    pub(crate) fn legacy(&self) -> Option<&Loaded> {
        self.legacy.as_ref()
    }

    /// The legacy records were applied through the log: drops their
    /// tables and stamps the current schema version, in one transaction.
    pub(crate) fn finish_import(&mut self) -> Result<(), StoreError> {
        let w = self.db.begin_write().map_err(se)?;
        w.delete_table(NODES).map_err(se)?;
        w.delete_table(REGIONS).map_err(se)?;
        w.delete_table(COMPUTES).map_err(se)?;
        {
            let mut meta = w.open_table(META).map_err(se)?;
            for k in ["next_node", "next_region", "next_compute", "incarnation"] {
                meta.remove(k).map_err(se)?;
            }
            meta.insert(SCHEMA_KEY, SCHEMA_VERSION).map_err(se)?;
        }
        w.commit().map_err(se)?;
        self.legacy = None;
        Ok(())
    }

    /// Reads a single manager's records.
    fn load(&self) -> Result<Loaded, StoreError> {
        let r = self.db.begin_read().map_err(se)?;
        let mut out = Loaded::default();
        for e in r.open_table(NODES).map_err(se)?.iter().map_err(se)? {
            let (k, v) = e.map_err(se)?;
            out.nodes
                .push((NodeId(k.value()), postcard::from_bytes(v.value()).map_err(se)?));
        }
        for e in r.open_table(REGIONS).map_err(se)?.iter().map_err(se)? {
            let (k, v) = e.map_err(se)?;
            out.regions
                .push((RegionId(k.value()), postcard::from_bytes(v.value()).map_err(se)?));
        }
        for e in r.open_table(COMPUTES).map_err(se)?.iter().map_err(se)? {
            let (k, v) = e.map_err(se)?;
            out.computes
                .push((ComputeId(k.value()), postcard::from_bytes(v.value()).map_err(se)?));
        }
        let meta = r.open_table(META).map_err(se)?;
        let get = |k: &str| -> Result<u64, StoreError> { Ok(meta.get(k).map_err(se)?.map(|v| v.value()).unwrap_or(0)) };
        out.meta = Meta {
            next_node: get("next_node")?,
            next_region: get("next_region")?,
            next_compute: get("next_compute")?,
            incarnation: get("incarnation")?,
        };
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database file at `path`, made private first as `Store::open`
    /// makes it (an exposed store is refused).
    fn db(path: &Path) -> Database {
        remora_proto::secret::create_private(path).unwrap();
        Database::create(path).unwrap()
    }

    fn stored_version(dir: &Path) -> Option<u64> {
        let db = db(&dir.join("manager.redb"));
        let r = db.begin_read().unwrap();
        let meta = r.open_table(META).unwrap();
        meta.get(SCHEMA_KEY).unwrap().map(|v| v.value())
    }

    fn set_meta(dir: &Path, key: &str, value: u64) {
        let db = db(&dir.join("manager.redb"));
        let w = db.begin_write().unwrap();
        w.open_table(META).unwrap().insert(key, value).unwrap();
        w.commit().unwrap();
    }

    fn node() -> NodeRec {
        NodeRec {
            addr: "h:9".into(),
            capacity: 1 << 30,
            region_size: 1 << 26,
            admin: Token([7; 16]),
            state: NodeState::Draining,
            regions: vec![RegionId(1), RegionId(2)],
        }
    }

    /// Writes what a single manager (schema version 2) left behind.
    fn write_legacy(dir: &Path) {
        let db = db(&dir.join("manager.redb"));
        let w = db.begin_write().unwrap();
        {
            let mut t = w.open_table(NODES).unwrap();
            t.insert(4, postcard::to_allocvec(&node()).unwrap().as_slice()).unwrap();
            let mut m = w.open_table(META).unwrap();
            m.insert(SCHEMA_KEY, LEGACY_VERSION).unwrap();
            m.insert("next_node", 5).unwrap();
        }
        w.commit().unwrap();
    }

    #[test]
    fn fresh_store_is_stamped_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.legacy().is_none());
        drop(store);
        assert_eq!(stored_version(dir.path()), Some(SCHEMA_VERSION));
        assert!(Store::open(dir.path()).unwrap().legacy().is_none());
        // Reopening does not disturb the version.
        assert_eq!(stored_version(dir.path()), Some(SCHEMA_VERSION));
    }

    #[test]
    fn single_manager_store_is_kept_until_imported() {
        let dir = tempfile::tempdir().unwrap();
        write_legacy(dir.path());
        let store = Store::open(dir.path()).unwrap();
        let legacy = store.legacy().expect("legacy records loaded");
        assert_eq!(legacy.nodes.len(), 1);
        assert_eq!(legacy.nodes[0].0, NodeId(4));
        assert_eq!(legacy.nodes[0].1, node());
        assert_eq!(legacy.meta.next_node, 5);
        drop(store);
        // Not imported yet (a crash before the import was applied): still there.
        assert_eq!(stored_version(dir.path()), Some(LEGACY_VERSION));
        let mut store = Store::open(dir.path()).unwrap();
        assert!(store.legacy().is_some());
        store.finish_import().unwrap();
        assert!(store.legacy().is_none());
        drop(store);
        assert_eq!(stored_version(dir.path()), Some(SCHEMA_VERSION));
        assert!(Store::open(dir.path()).unwrap().legacy().is_none());
    }

    #[test]
    fn another_schema_version_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        set_meta(dir.path(), SCHEMA_KEY, SCHEMA_VERSION + 98);
        match Store::open(dir.path()) {
            Err(StoreError::SchemaMismatch { path, found, expected }) => {
                assert_eq!(found, SCHEMA_VERSION + 98);
                assert_eq!(expected, SCHEMA_VERSION);
                assert_eq!(path, dir.path().join("manager.redb"));
            }
            Err(e) => panic!("expected a schema mismatch, got {e}"),
            Ok(_) => panic!("a store of schema version {} opened", SCHEMA_VERSION + 98),
        }
        let msg = Store::open(dir.path()).err().unwrap().to_string();
        assert!(
            msg.contains(&format!("schema version {}", SCHEMA_VERSION + 98))
                && msg.contains(&format!("reads schema version {SCHEMA_VERSION}")),
            "{msg}"
        );
        assert_eq!(
            stored_version(dir.path()),
            Some(SCHEMA_VERSION + 98),
            "refusal rewrote the version"
        );
    }

    #[test]
    fn unversioned_store_with_records_is_refused() {
        // What a build before schema versions left behind.
        let dir = tempfile::tempdir().unwrap();
        set_meta(dir.path(), "next_node", 3);
        match Store::open(dir.path()) {
            Err(StoreError::NoSchemaVersion { expected, .. }) => assert_eq!(expected, SCHEMA_VERSION),
            Err(e) => panic!("expected a missing schema version, got {e}"),
            Ok(_) => panic!("an unversioned store with records opened"),
        }
        assert_eq!(stored_version(dir.path()), None);
    }

    #[test]
    fn unversioned_empty_store_is_stamped() {
        // A run that died between creating the file and its first commit.
        let dir = tempfile::tempdir().unwrap();
        let db = db(&dir.path().join("manager.redb"));
        let w = db.begin_write().unwrap();
        w.open_table(NODES).unwrap();
        w.open_table(META).unwrap();
        w.commit().unwrap();
        drop(db);
        drop(Store::open(dir.path()).unwrap());
        assert_eq!(stored_version(dir.path()), Some(SCHEMA_VERSION));
    }

    #[test]
    fn version_1_store_is_migrated_with_epoch_0() {
        let dir = tempfile::tempdir().unwrap();
        {
            // What a version-1 build wrote: region records without an epoch.
            let db = db(&dir.path().join("manager.redb"));
            let w = db.begin_write().unwrap();
            {
                let mut t = w.open_table(REGIONS).unwrap();
                let owned = format!("02 80808020 01 05 {}", "09".repeat(16)).replace(' ', "");
                t.insert(7, unhex(&owned).as_slice()).unwrap();
                t.insert(8, unhex("028080802000").as_slice()).unwrap();
                let mut m = w.open_table(META).unwrap();
                m.insert(SCHEMA_KEY, 1).unwrap();
                m.insert("next_region", 8).unwrap();
            }
            w.commit().unwrap();
        }
        let loaded = Store::open(dir.path()).unwrap().legacy().cloned().unwrap();
        assert_eq!(stored_version(dir.path()), Some(LEGACY_VERSION));
        assert_eq!(loaded.meta.next_region, 8);
        let r: std::collections::BTreeMap<RegionId, RegionRec> = loaded.regions.into_iter().collect();
        assert_eq!(r.len(), 2);
        assert_eq!(r[&RegionId(7)].owner, Some((ComputeId(5), Token([9; 16]))));
        assert_eq!((r[&RegionId(7)].node, r[&RegionId(7)].size), (NodeId(2), 1 << 26));
        assert_eq!(r[&RegionId(7)].epoch, 0);
        assert_eq!(r[&RegionId(8)].owner, None);
        assert_eq!(r[&RegionId(8)].epoch, 0);
        // Reopening a migrated store changes nothing.
        assert_eq!(Store::open(dir.path()).unwrap().legacy().unwrap().regions.len(), 2);
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// The records' bytes are the schema: a change here needs a new
    /// SCHEMA_VERSION (and a new golden).
    #[test]
    fn record_golden_bytes() {
        assert_eq!(LEGACY_VERSION, 2, "a new schema version needs new golden records");
        assert_eq!(
            hex(&postcard::to_allocvec(&node()).unwrap()),
            format!("03683a39 8080808004 80808020 {} 01 02 01 02", "07".repeat(16)).replace(' ', "")
        );
        let region = RegionRec {
            node: NodeId(2),
            size: 1 << 26,
            owner: Some((ComputeId(5), Token([9; 16]))),
            epoch: 300,
        };
        assert_eq!(
            hex(&postcard::to_allocvec(&region).unwrap()),
            format!("02 80808020 01 05 {} ac02", "09".repeat(16)).replace(' ', "")
        );
        let free = RegionRec {
            node: NodeId(2),
            size: 1 << 26,
            owner: None,
            epoch: 1,
        };
        assert_eq!(hex(&postcard::to_allocvec(&free).unwrap()), "02808080200001");
        let compute = ComputeRec {
            name: "app".into(),
            secret: Token([1; 16]),
            state: ComputeState::Dead,
        };
        assert_eq!(
            hex(&postcard::to_allocvec(&compute).unwrap()),
            format!("03617070 {} 01", "01".repeat(16)).replace(' ', "")
        );
    }
}
