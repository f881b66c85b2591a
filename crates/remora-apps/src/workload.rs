//! The objects the apps keep in far memory: 4 KiB each, every word derived
//! from the object's index and version, so a misplaced, stale or corrupt
//! byte never compares equal.

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use remora_runtime::{RemBox, Remotable, Runtime};

/// One 4 KiB object (with the runtime's 8-byte header): index, version, and
/// words derived from both, so any misplaced or stale byte is caught.
#[derive(Clone, Copy)]
pub(crate) struct Obj {
    pub(crate) index: u64,
    pub(crate) version: u64,
    pub(crate) words: [u64; 509],
}
// SAFETY: integers only.
unsafe impl Remotable for Obj {}

pub(crate) fn make(index: u64, version: u64) -> Obj {
    let seed = (index << 24 ^ version).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    Obj {
        index,
        version,
        words: std::array::from_fn(|j| (seed ^ j as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)),
    }
}

pub(crate) fn is(o: &Obj, index: u64, version: u64) -> bool {
    o.index == index && o.version == version && o.words == make(index, version).words
}

/// What reading every object back found.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Verified {
    /// Objects that read back as their last written version.
    pub(crate) ok: u64,
    /// Objects that read back as something else.
    pub(crate) wrong: u64,
    /// Objects that could not be read.
    pub(crate) lost: u64,
}

/// Reads every object of `objs` back against `versions`.
pub(crate) fn verify_all(rt: &Runtime, objs: &[RwLock<RemBox<Obj>>], versions: &[AtomicU64]) -> Verified {
    let mut v = Verified::default();
    for (i, o) in objs.iter().enumerate() {
        let scope = rt.scope();
        let g = o.read().unwrap_or_else(|p| p.into_inner());
        match g.deref(&scope) {
            Ok(x) if is(x, i as u64, versions[i].load(Ordering::Relaxed)) => v.ok += 1,
            Ok(_) => v.wrong += 1,
            Err(_) => v.lost += 1,
        }
    }
    v
}
