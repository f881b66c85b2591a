//! Durable manager state in an embedded redb database.
//!
//! One table per record kind, keyed by id, values postcard-encoded. Every
//! change is committed before the request that caused it is answered, so a
//! manager killed at any point restarts with every region assignment it ever
//! acknowledged. Liveness timestamps and event queues are not stored: after a
//! restart every node gets a fresh timeout to heartbeat again.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use remora_proto::msg::ComputeState;
use remora_proto::{AdminKey, ComputeId, NodeId, NodeState, RegionId, Token};
use serde::{Deserialize, Serialize};

const NODES: TableDefinition<u64, &[u8]> = TableDefinition::new("memory_nodes");
const REGIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("regions");
const COMPUTES: TableDefinition<u64, &[u8]> = TableDefinition::new("compute_nodes");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// A store failure: the manager cannot promise durability, so it refuses the request.
#[derive(Debug, thiserror::Error)]
#[error("manager store: {0}")]
pub struct StoreError(String);

fn se(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// A memory node as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
}

/// A compute node as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ComputeRec {
    pub(crate) name: String,
    pub(crate) secret: Token,
    pub(crate) state: ComputeState,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Meta {
    pub(crate) next_node: u64,
    pub(crate) next_region: u64,
    pub(crate) next_compute: u64,
    pub(crate) incarnation: u64,
}

/// Everything loaded at startup.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub(crate) nodes: Vec<(NodeId, NodeRec)>,
    pub(crate) regions: Vec<(RegionId, RegionRec)>,
    pub(crate) computes: Vec<(ComputeId, ComputeRec)>,
    pub(crate) meta: Meta,
}

/// A batch of changes committed together.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    nodes: Vec<(NodeId, NodeRec)>,
    regions: Vec<(RegionId, RegionRec)>,
    computes: Vec<(ComputeId, ComputeRec)>,
    meta: Option<Meta>,
}

impl Batch {
    pub(crate) fn node(&mut self, id: NodeId, r: &NodeRec) -> &mut Self {
        self.nodes.push((id, r.clone()));
        self
    }
    pub(crate) fn region(&mut self, id: RegionId, r: &RegionRec) -> &mut Self {
        self.regions.push((id, r.clone()));
        self
    }
    pub(crate) fn compute(&mut self, id: ComputeId, r: &ComputeRec) -> &mut Self {
        self.computes.push((id, r.clone()));
        self
    }
    pub(crate) fn meta(&mut self, m: Meta) -> &mut Self {
        self.meta = Some(m);
        self
    }
}

/// The database.
pub(crate) struct Store {
    db: Database,
}

impl Store {
    /// Opens (or creates) `dir/manager.redb`.
    pub(crate) fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| se(format!("cannot create {}: {e}", dir.display())))?;
        let path = dir.join("manager.redb");
        let db = Database::create(&path).map_err(|e| se(format!("{}: {e}", path.display())))?;
        let w = db.begin_write().map_err(se)?;
        {
            w.open_table(NODES).map_err(se)?;
            w.open_table(REGIONS).map_err(se)?;
            w.open_table(COMPUTES).map_err(se)?;
            w.open_table(META).map_err(se)?;
        }
        w.commit().map_err(se)?;
        Ok(Self { db })
    }

    /// Reads everything.
    pub(crate) fn load(&self) -> Result<Loaded, StoreError> {
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

    /// Commits a batch durably.
    pub(crate) fn commit(&self, b: &Batch) -> Result<(), StoreError> {
        let w = self.db.begin_write().map_err(se)?;
        {
            let mut t = w.open_table(NODES).map_err(se)?;
            for (id, r) in &b.nodes {
                t.insert(id.0, postcard::to_allocvec(r).map_err(se)?.as_slice())
                    .map_err(se)?;
            }
            let mut t = w.open_table(REGIONS).map_err(se)?;
            for (id, r) in &b.regions {
                t.insert(id.0, postcard::to_allocvec(r).map_err(se)?.as_slice())
                    .map_err(se)?;
            }
            let mut t = w.open_table(COMPUTES).map_err(se)?;
            for (id, r) in &b.computes {
                t.insert(id.0, postcard::to_allocvec(r).map_err(se)?.as_slice())
                    .map_err(se)?;
            }
            if let Some(m) = b.meta {
                let mut t = w.open_table(META).map_err(se)?;
                t.insert("next_node", m.next_node).map_err(se)?;
                t.insert("next_region", m.next_region).map_err(se)?;
                t.insert("next_compute", m.next_compute).map_err(se)?;
                t.insert("incarnation", m.incarnation).map_err(se)?;
            }
        }
        w.commit().map_err(se)
    }
}
