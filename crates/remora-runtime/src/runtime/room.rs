//! Waiting for local room: where application threads block while eviction
//! brings local memory back under the budget.
//!
//! A thread that must wait joins a queue with the level it waits for and
//! parks. Whoever lowers local usage (an eviction round's commit, a free that
//! releases a span, a raised budget) calls [`Room::wake`], which unparks
//! exactly the waiters whose level has been reached, once each: no herd and
//! no polling. A waiter parks with a timeout only to notice a stalled
//! evictor or a shutdown, never to look for room.
//!
//! Before it parks, an application thread outside any scope helps: it runs
//! an eviction round itself (direct reclaim, as a kernel does under memory
//! pressure). It is the only way an application thread can make room
//! appear sooner when the eviction threads are short of CPU, e.g. when
//! application threads outnumber cores; the time it spends so is still
//! counted as waiting for room.

use std::time::{Duration, Instant};

use super::Inner;
use crate::error::RuntimeError;

mod queue;

use queue::CHECK_EVERY;
pub(super) use queue::Room;

impl Inner {
    /// Blocks (outside scopes only) until local usage is at most `target`,
    /// helping eviction meanwhile; see the module docs.
    pub(super) fn wait_below(&self, target: u64, timeout: Duration) -> Result<(), RuntimeError> {
        if self.heap.bytes_in_use() as u64 <= target {
            return Ok(());
        }
        let start = Instant::now();
        let res = self.wait_below_slow(target, timeout, start);
        self.counters.room_waited(start.elapsed());
        res
    }

    fn wait_below_slow(&self, target: u64, timeout: Duration, start: Instant) -> Result<(), RuntimeError> {
        let mut last_progress = (self.heap.bytes_in_use(), Instant::now());
        let mut reclaim = !self.rcu.in_scope();
        loop {
            self.pressure.kick();
            if reclaim {
                // Direct reclaim: one round of our own while the eviction
                // threads run theirs. A round that finds nothing to evict
                // ends our help; we wait for theirs then.
                let n = self.evict_round();
                if n > 0 {
                    self.pressure.progressed();
                    self.room.wake(self.heap.bytes_in_use() as u64);
                } else {
                    reclaim = false;
                }
            }
            let used = self.heap.bytes_in_use();
            if used as u64 <= target {
                return Ok(());
            }
            if self.lifecycle.stopping() {
                return Err(RuntimeError::Shutdown);
            }
            if used < last_progress.0 {
                last_progress = (used, Instant::now());
            }
            if start.elapsed() > timeout && last_progress.1.elapsed() > Duration::from_millis(500) {
                return Err(RuntimeError::EvictionStalled(timeout));
            }
            if reclaim {
                continue;
            }
            // Join the queue, then look again: a wake between our look and
            // our join would otherwise be lost.
            self.room.wait(
                target,
                || self.heap.bytes_in_use() as u64 > target && !self.lifecycle.stopping(),
                || self.lifecycle.stopping() || last_progress.1.elapsed() > CHECK_EVERY,
            );
            // Usage moved (or we timed out on progress): retry reclaim too.
            reclaim = !self.rcu.in_scope();
            if self.heap.bytes_in_use() < last_progress.0 {
                last_progress = (self.heap.bytes_in_use(), Instant::now());
            }
        }
    }
}
