//! What the runtime's in-process tests share: a 1 KiB test object whose
//! every word depends on (id, version), so a stale, misplaced or torn object
//! never compares equal.

#![allow(dead_code, unreachable_pub)]

use remora_runtime::Remotable;

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

/// A 1 KiB object.
#[derive(Clone, Copy)]
pub struct Obj {
    pub id: u64,
    pub version: u64,
    pub words: [u64; 126],
}
// SAFETY: integers only.
unsafe impl Remotable for Obj {}

/// Object `id` at `version`.
pub fn obj(id: u64, version: u64) -> Obj {
    Obj {
        id,
        version,
        words: std::array::from_fn(|i| (id << 20 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version),
    }
}

/// Whether `got` is object `id` at `version`, every word of it.
pub fn is(got: &Obj, id: u64, version: u64) -> bool {
    let want = obj(id, version);
    got.id == want.id && got.version == want.version && got.words == want.words
}

/// Runs the tests of a file one at a time: timing-dependent figures (clean
/// re-evictions, kept copies) need the cores the tests would otherwise
/// share among themselves on a 2-core machine.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}
