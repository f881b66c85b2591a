//! The recovery driver every redundant scheme uses: when a memory node dies,
//! each (group, position) it held is rebuilt on a replacement region, the
//! positions in parallel, each retried a few times. The scheme supplies the
//! rebuild of one position; the driver owns the threads, counts, and joins
//! them when the runtime stops (no recovery outlives its runtime).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::RuntimeError;

/// Attempts per position before it is left degraded.
const ATTEMPTS: usize = 5;

/// Counters of recoveries, for [`super::SchemeReport`].
#[derive(Debug, Default)]
pub(crate) struct RecoveryStats {
    pub(crate) rebuilt_bytes: AtomicU64,
    pub(crate) nanos: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) running: AtomicU64,
    pub(crate) retries: AtomicU64,
}

/// Runs and joins recoveries.
#[derive(Default)]
pub(crate) struct Recovery {
    pub(crate) stats: Arc<RecoveryStats>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Recovery {
    /// Rebuilds every `(group, position)` in `affected` with `rebuild(group,
    /// position, attempt)`, which returns the bytes it rebuilt.
    pub(crate) fn start<F>(&self, scheme: &'static str, affected: Vec<(usize, usize)>, rebuild: F)
    where
        F: Fn(usize, usize, usize) -> Result<u64, RuntimeError> + Send + Sync + 'static,
    {
        if affected.is_empty() {
            return;
        }
        let (stats, stop) = (Arc::clone(&self.stats), Arc::clone(&self.stop));
        stats.running.fetch_add(1, Ordering::Relaxed);
        let spawned = thread::Builder::new().name("remora-recovery".into()).spawn(move || {
            let started = Instant::now();
            thread::scope(|s| {
                for (g, pos) in affected {
                    let (stats, stop, rebuild) = (&stats, &stop, &rebuild);
                    s.spawn(move || {
                        for attempt in 0..ATTEMPTS {
                            if stop.load(Ordering::Acquire) {
                                return;
                            }
                            match rebuild(g, pos, attempt) {
                                Ok(bytes) => {
                                    stats.rebuilt_bytes.fetch_add(bytes, Ordering::Relaxed);
                                    return;
                                }
                                Err(e) => {
                                    stats.retries.fetch_add(1, Ordering::Relaxed);
                                    tracing::error!("{scheme}: rebuilding group {g} position {pos} failed: {e}");
                                    thread::sleep(Duration::from_millis(200));
                                }
                            }
                        }
                    });
                }
            });
            stats
                .nanos
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            stats.running.fetch_sub(1, Ordering::Relaxed);
            stats.finished.fetch_add(1, Ordering::Relaxed);
        });
        match spawned {
            Ok(h) => {
                let mut t = self.threads.lock().unwrap_or_else(|p| p.into_inner());
                t.retain(|h| !h.is_finished());
                t.push(h);
            }
            Err(e) => {
                tracing::error!("cannot start recovery: {e}");
                self.stats.running.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Stops retrying and waits for every recovery thread.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}
