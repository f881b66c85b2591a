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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as StdOrdering};
use std::sync::{Arc, Mutex};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use super::Inner;
use crate::error::RuntimeError;

/// One parked application thread.
struct Waiter {
    /// It may go on once local usage is at most this.
    target: u64,
    thread: Thread,
    woken: AtomicBool,
}

/// The queue of threads waiting for local room.
#[derive(Default)]
pub(super) struct Room {
    queue: Mutex<VecDeque<Arc<Waiter>>>,
    /// Waiters queued; lets `wake` skip the lock when nobody waits.
    waiting: AtomicUsize,
}

/// How often a parked waiter looks at the stop flag and at eviction progress.
const CHECK_EVERY: Duration = Duration::from_millis(50);

impl Room {
    /// Unparks, once each, the waiters whose level is reached at `used` bytes.
    pub(super) fn wake(&self, used: u64) {
        if self.waiting.load(StdOrdering::Acquire) == 0 {
            return;
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.retain(|w| {
            if w.target >= used {
                w.woken.store(true, StdOrdering::Release);
                w.thread.unpark();
                false
            } else {
                true
            }
        });
        self.waiting.store(q.len(), StdOrdering::Release);
    }

    /// Unparks every waiter (shutdown, or a stalled evictor).
    pub(super) fn wake_all(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        for w in q.drain(..) {
            w.woken.store(true, StdOrdering::Release);
            w.thread.unpark();
        }
        self.waiting.store(0, StdOrdering::Release);
    }

    fn join(&self, target: u64) -> Arc<Waiter> {
        let w = Arc::new(Waiter {
            target,
            thread: thread::current(),
            woken: AtomicBool::new(false),
        });
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.push_back(Arc::clone(&w));
        self.waiting.store(q.len(), StdOrdering::Release);
        w
    }

    fn leave(&self, w: &Arc<Waiter>) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.retain(|x| !Arc::ptr_eq(x, w));
        self.waiting.store(q.len(), StdOrdering::Release);
    }
}

impl Inner {
    /// Blocks (outside scopes only) until local usage is at most `target`,
    /// helping eviction meanwhile; see the module docs.
    pub(super) fn wait_below(&self, target: u64, timeout: Duration) -> Result<(), RuntimeError> {
        if self.heap.bytes_in_use() as u64 <= target {
            return Ok(());
        }
        let start = Instant::now();
        let res = self.wait_below_slow(target, timeout, start);
        self.counters
            .room_wait_ns
            .fetch_add(start.elapsed().as_nanos() as u64, StdOrdering::Relaxed);
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
            let w = self.room.join(target);
            if self.heap.bytes_in_use() as u64 > target && !self.lifecycle.stopping() {
                while !w.woken.load(StdOrdering::Acquire) {
                    thread::park_timeout(CHECK_EVERY);
                    if self.lifecycle.stopping() || last_progress.1.elapsed() > CHECK_EVERY {
                        break;
                    }
                }
            }
            self.room.leave(&w);
            // Usage moved (or we timed out on progress): retry reclaim too.
            reclaim = !self.rcu.in_scope();
            if self.heap.bytes_in_use() < last_progress.0 {
                last_progress = (self.heap.bytes_in_use(), Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits on `room` for `target` in a thread; returns how it ended.
    fn waiter(room: &Arc<Room>, target: u64) -> thread::JoinHandle<bool> {
        let r = Arc::clone(room);
        let h = thread::spawn(move || {
            let w = r.join(target);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !w.woken.load(StdOrdering::Acquire) && Instant::now() < deadline {
                thread::park_timeout(Duration::from_millis(20));
            }
            r.leave(&w);
            w.woken.load(StdOrdering::Acquire)
        });
        // Let it join the queue.
        while room.waiting.load(StdOrdering::Acquire) == 0 {
            thread::yield_now();
        }
        h
    }

    #[test]
    fn wakes_exactly_the_waiters_whose_level_is_reached() {
        let room = Arc::new(Room::default());
        let low = waiter(&room, 100);
        while room.waiting.load(StdOrdering::Acquire) < 1 {
            thread::yield_now();
        }
        let high = waiter(&room, 200);
        while room.waiting.load(StdOrdering::Acquire) < 2 {
            thread::yield_now();
        }
        room.wake(250); // nobody's level
        assert_eq!(room.waiting.load(StdOrdering::Acquire), 2);
        room.wake(150); // only the waiter for 200
        assert!(high.join().unwrap(), "the waiter whose room exists was not woken");
        assert_eq!(room.waiting.load(StdOrdering::Acquire), 1);
        thread::sleep(Duration::from_millis(50));
        assert!(!low.is_finished(), "a waiter was woken before its room existed");
        room.wake(100);
        assert!(low.join().unwrap());
        assert_eq!(room.waiting.load(StdOrdering::Acquire), 0);
    }

    #[test]
    fn wake_all_releases_everyone() {
        let room = Arc::new(Room::default());
        let a = waiter(&room, 1);
        let b = waiter(&room, 2);
        while room.waiting.load(StdOrdering::Acquire) < 2 {
            thread::yield_now();
        }
        room.wake_all();
        assert!(a.join().unwrap() && b.join().unwrap());
        assert_eq!(room.waiting.load(StdOrdering::Acquire), 0);
    }
}
