//! The queue of application threads waiting for local room (see the
//! module docs of `room`): the room part of the runtime.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as StdOrdering};
use std::sync::{Arc, Mutex};
use std::thread::{self, Thread};
use std::time::Duration;

/// One parked application thread.
struct Waiter {
    /// It may go on once local usage is at most this.
    target: u64,
    thread: Thread,
    woken: AtomicBool,
}

/// The queue of threads waiting for local room.
#[derive(Default)]
pub(in crate::runtime) struct Room {
    queue: Mutex<VecDeque<Arc<Waiter>>>,
    /// Waiters queued; lets `wake` skip the lock when nobody waits.
    waiting: AtomicUsize,
}

/// How often a parked waiter looks at the stop flag and at eviction progress.
pub(super) const CHECK_EVERY: Duration = Duration::from_millis(50);

impl Room {
    /// Unparks, once each, the waiters whose level is reached at `used` bytes.
    pub(in crate::runtime) fn wake(&self, used: u64) {
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
    pub(in crate::runtime) fn wake_all(&self) {
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

    /// Parks the calling thread in the queue for `target` until its level
    /// is reached or `give_up` says so (looked at every [`CHECK_EVERY`]).
    /// Joins first, then asks `short` whether usage is still above the
    /// target: a wake between the caller's look and the join would
    /// otherwise be lost.
    pub(in crate::runtime) fn wait(&self, target: u64, short: impl FnOnce() -> bool, give_up: impl Fn() -> bool) {
        let w = self.join(target);
        if short() {
            while !w.woken.load(StdOrdering::Acquire) {
                thread::park_timeout(CHECK_EVERY);
                if give_up() {
                    break;
                }
            }
        }
        self.leave(&w);
    }

    fn leave(&self, w: &Arc<Waiter>) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.retain(|x| !Arc::ptr_eq(x, w));
        self.waiting.store(q.len(), StdOrdering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

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
