//! Eviction (§3.3, §3.6): when local memory crosses the high watermark,
//! eviction threads pick the coldest spans, write them to far memory through
//! the scheme, and release their local pages only once the write is
//! acknowledged. Which spans are cold is the policy's business, one file per
//! policy behind [`EvictionPolicy`] (CLOCK by default).

mod clock;

pub use clock::Clock;

/// Ranks spans by how recently their objects were used.
///
/// Access sets an object's hotness byte to [`EvictionPolicy::on_access`]; an
/// aging sweep replaces each byte `h` with [`EvictionPolicy::age`]`(h)` and
/// ranks the span by [`EvictionPolicy::span_score`] of the bytes it saw
/// before aging. Lower scores are evicted first.
pub trait EvictionPolicy: Send + Sync {
    /// The policy's name.
    fn name(&self) -> &'static str;
    /// Hotness written on access.
    fn on_access(&self) -> u8 {
        u8::MAX
    }
    /// Hotness after one aging sweep.
    fn age(&self, hotness: u8) -> u8;
    /// Score of a span from the hotness of its live objects and their size;
    /// spans of large objects should rank colder at equal hotness, since
    /// swapping them back in wastes less (swap-in amplification, §3.3).
    fn span_score(&self, hotness: &[u8], object_size: usize) -> f64;
}

/// Picks a policy by name.
pub fn policy_by_name(name: &str) -> Option<Box<dyn EvictionPolicy>> {
    match name {
        "clock" => Some(Box::new(Clock)),
        _ => None,
    }
}
