//! Fault-tolerance schemes: how evicted spans are laid out in far memory and
//! read back. One file per scheme behind [`Scheme`]; `non-ft` is the baseline
//! (one copy, no redundancy). The erasure-coded schemes implement the same
//! trait with spansets.

mod non_ft;

pub use non_ft::NonFt;

use crate::error::RuntimeError;
pub use crate::far_memory::FarMemory;

/// Where a far span lives: region index and first page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanAddr {
    /// Region-table index.
    pub region: u16,
    /// First 8 KiB page inside the region.
    pub page: u32,
}

/// A way of keeping evicted spans in far memory.
pub trait Scheme: Send + Sync {
    /// The scheme's name as given on the command line (`non-ft`, ...).
    fn name(&self) -> &'static str;

    /// Places and writes whole spans (each a multiple of 8 KiB); returns where
    /// each landed once every byte (and any redundancy) is acknowledged.
    fn swap_out(&self, far: &FarMemory, spans: &[&[u8]]) -> Result<Vec<SpanAddr>, RuntimeError>;

    /// Reads the span at `at` into `dest` (its full length). Returns the
    /// number of remote reads it took (1 outside failures).
    fn swap_in(&self, far: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<u32, RuntimeError>;

    /// The far copy at `at` (of `pages` pages) is no longer needed.
    fn release(&self, far: &FarMemory, at: SpanAddr, pages: u32);
}

/// Picks a scheme by name.
pub fn by_name(name: &str) -> Option<Box<dyn Scheme>> {
    match name {
        "non-ft" => Some(Box::new(NonFt)),
        _ => None,
    }
}
