//! How long an idempotent read is tried again: a node that says it is
//! unavailable (its lease lapsed) or whose connection broke may answer on
//! the next try, so the reader waits between tries (5 ms, doubling to
//! 100 ms) within a budget, then gives up: as long as one reply may take
//! for a shard's broken connection, the runtime's outage deadline for a
//! whole span's read.

use std::time::{Duration, Instant};

const FIRST_PAUSE: Duration = Duration::from_millis(5);
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// The retry budget of one read.
pub(crate) struct Retry {
    start: Instant,
    limit: Duration,
    pause: Duration,
}

impl Retry {
    /// A budget of `limit` (a connection's call timeout), counted from now.
    pub(crate) fn new(limit: Duration) -> Self {
        Self {
            start: Instant::now(),
            limit,
            pause: FIRST_PAUSE,
        }
    }

    /// Sleeps before the next try and says to make it; `false` (without
    /// sleeping) once the budget is spent.
    pub(crate) fn wait(&mut self) -> bool {
        if self.start.elapsed() >= self.limit {
            return false;
        }
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_with_doubling_pauses_until_the_budget_is_spent() {
        let mut r = Retry::new(Duration::from_millis(40));
        let start = Instant::now();
        let mut tries = 0;
        while r.wait() {
            tries += 1;
        }
        // 5 + 10 + 20 ms, then 40 ms have passed: at least 3 tries, and the
        // last pause ends no later than 40 + 40 ms after the start.
        assert!(tries >= 3, "{tries} tries");
        assert!(start.elapsed() >= Duration::from_millis(40));
        assert!(!Retry::new(Duration::ZERO).wait(), "a spent budget never sleeps");
    }
}
