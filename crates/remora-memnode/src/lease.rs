//! The memory node's lease: it serves data only while the manager has
//! recently acknowledged its heartbeat. A node that cannot renew (paused,
//! partitioned, or the manager gone) stops serving **before** the manager
//! may declare it dead, so once the manager hands its regions' data to a
//! replacement, the old node no longer answers with it, whether or not
//! anyone told it.
//!
//! The lease runs from when a heartbeat was *sent* (the manager's own clock
//! for this node starts no earlier) for [`LEASE_INTERVALS`] heartbeat
//! intervals. The manager sets the interval to a sixth of its heartbeat
//! timeout (`remora_manager`'s `heartbeat_interval`), so the lease is two
//! thirds of the timeout: it ends before the manager can give up on the node
//! even if the acknowledgment of the last heartbeat was delayed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Heartbeat intervals a renewal lasts (the manager counts on the same).
pub(crate) use remora_proto::LEASE_INTERVALS;

/// When the lease ends, as nanoseconds since `epoch` (0: expired).
#[derive(Debug)]
pub(crate) struct Lease {
    epoch: Instant,
    until_ns: AtomicU64,
}

impl Default for Lease {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            until_ns: AtomicU64::new(0),
        }
    }
}

impl Lease {
    /// The manager acknowledged a heartbeat (or registration) sent at `sent`,
    /// with heartbeats due every `interval`.
    pub(crate) fn renew(&self, sent: Instant, interval: Duration) {
        let until = sent.saturating_duration_since(self.epoch) + interval * LEASE_INTERVALS;
        // Renewals may be acknowledged out of order: keep the latest end.
        self.until_ns.fetch_max(until.as_nanos() as u64, Ordering::AcqRel);
    }

    /// The manager refused us (fenced): serve nothing until registered again.
    pub(crate) fn expire(&self) {
        self.until_ns.store(0, Ordering::Release);
    }

    /// Valid until [`Lease::expire`]: an in-process node's manager is the
    /// cluster in the same process, which cannot miss its heartbeats.
    pub(crate) fn hold(&self) {
        self.until_ns.store(u64::MAX, Ordering::Release);
    }

    /// Whether data may be served now.
    pub(crate) fn valid(&self) -> bool {
        (self.epoch.elapsed().as_nanos() as u64) < self.until_ns.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_until_four_intervals_after_the_send_and_expires_on_demand() {
        let l = Lease::default();
        assert!(!l.valid(), "no lease before registration");
        let i = Duration::from_millis(25);
        l.renew(Instant::now(), i);
        assert!(l.valid());
        // A late acknowledgment of an older heartbeat does not shorten it.
        l.renew(Instant::now() - Duration::from_secs(1), i);
        assert!(l.valid());
        std::thread::sleep(i * LEASE_INTERVALS + Duration::from_millis(20));
        assert!(!l.valid(), "not renewed within four intervals");
        l.renew(Instant::now(), i);
        assert!(l.valid());
        l.expire();
        assert!(!l.valid());
        // Sent long ago: already over when acknowledged.
        l.renew(Instant::now() - Duration::from_secs(1), i);
        assert!(!l.valid());
    }
}
