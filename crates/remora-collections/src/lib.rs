//! Far-memory collections shaped like std's, for applications of remora.
//!
//! [`RemVec`], [`RemHashMap`] and [`RemBTreeMap`] keep their values in remotable objects of a
//! [`remora_runtime::Runtime`]: hot values stay in its local heap, cold ones
//! are evicted to memory nodes under the runtime's fault-tolerance scheme and
//! swapped back in on use. What stays local is the collection's index (the
//! vector's table of chunks, the hash map's keys and 8-byte handles, the
//! B-tree's tables of node and value cells), so a hash-map lookup costs at
//! most one remote read and a B-tree lookup one per level not local.
//!
//! Every operation takes `&self`: share a collection between threads with
//! `&` or `Arc`. Reads never take a collection-wide lock (see each type for
//! its locking), and iteration is by cursors that hold one chunk or one
//! shard's keys at a time, never the whole collection.
//!
//! Values are plain data without drop glue (`Copy`), so dropping or clearing
//! a collection frees its far objects where they lie, without reading them
//! back.
//!
//! ```no_run
//! # fn f(rt: &remora_runtime::Runtime) -> Result<(), remora_runtime::RuntimeError> {
//! use remora_collections::{RemHashMap, RemVec};
//! let v = RemVec::new(rt);
//! for i in 0..1000u64 {
//!     v.push(i)?;
//! }
//! assert_eq!(v.get(7)?, Some(7));
//! let m = RemHashMap::new(rt);
//! m.insert("answer".to_string(), [42u8; 1024])?;
//! assert_eq!(m.get("answer")?.map(|v| v[0]), Some(42));
//! let t = remora_collections::RemBTreeMap::new(rt);
//! t.insert(3u64, 30u64)?;
//! assert_eq!(t.iter().next().transpose()?, Some((3, 30)));
//! # Ok(()) }
//! ```

mod btree_map;
mod directory;
mod hash_map;
mod vec;

pub use btree_map::{BTreeIter, RemBTreeMap};
pub use hash_map::{MapIter, RemHashMap};
pub use remora_runtime::RuntimeError;
pub use vec::{RemVec, VecIter};
