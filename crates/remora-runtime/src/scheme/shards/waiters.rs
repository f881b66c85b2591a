//! [`Waiters`]: one thread per connection waiting for late-bound reads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use super::lock;
use crate::region_table::Link;

pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Threads that wait for late-bound reads: one per connection, waiting for
/// its replies in the order the reads were sent. A memory node answers a
/// connection in order, so no wait sits behind a reply that already came,
/// and each wait has its own deadline, so a stalled node's queue does not
/// add its timeouts up.
#[derive(Default)]
pub(crate) struct Waiters {
    lanes: Mutex<Vec<(Link, mpsc::Sender<Job>)>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    stopped: AtomicBool,
}

impl Waiters {
    /// Runs `job` (a wait on `link`) on that connection's waiter; inline
    /// once stopped or if no thread can be started.
    pub(super) fn submit(&self, link: &Link, job: Job) {
        let mut lanes = lock(&self.lanes);
        if self.stopped.load(Ordering::Acquire) {
            drop(lanes);
            return job();
        }
        // A broken connection's waiter ends once its queue is drained.
        lanes.retain(|(l, _)| !l.is_broken() || Arc::ptr_eq(l, link));
        let job = match lanes.iter().find(|(l, _)| Arc::ptr_eq(l, link)) {
            Some((_, tx)) => match tx.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("remora-waiter".into())
            .spawn(move || rx.into_iter().for_each(|j| j()));
        match spawned {
            Ok(h) => {
                let mut hs = lock(&self.handles);
                hs.retain(|h| !h.is_finished());
                hs.push(h);
                drop(hs);
                if let Err(mpsc::SendError(job)) = tx.send(job) {
                    drop(lanes);
                    return job();
                }
                lanes.push((Arc::clone(link), tx));
            }
            Err(e) => {
                drop(lanes);
                tracing::warn!("cannot start a waiter thread ({e}); waiting inline");
                job();
            }
        }
    }

    /// Lets every waiter drain its queue and joins them.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        lock(&self.lanes).clear();
        for h in std::mem::take(&mut *lock(&self.handles)) {
            let _ = h.join();
        }
    }
}
