//! Fault injection: the switches a test flips to make this node misbehave.
//! The switches always exist (they cost one relaxed load on the data path);
//! only the `fault-injection` feature lets a request flip them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use remora_proto::RemoteError;

/// Current fault settings of the node.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    any: AtomicBool,
    paused: Mutex<bool>,
    resumed: Condvar,
    delay_us: AtomicU64,
    drop_replies: AtomicBool,
    /// Bumped to stop every spinning `Busy` thread.
    busy_epoch: Arc<AtomicU64>,
    /// Writes served with their reply dropped (for `Stats`).
    unanswered_writes: AtomicU64,
}

impl Faults {
    /// Called before serving each data request: blocks while paused, sleeps
    /// the configured delay. Returns whether the reply should be sent.
    pub(crate) fn before_data(&self) -> bool {
        if !self.any.load(Ordering::Relaxed) {
            return true;
        }
        self.wait_while_paused();
        let d = self.delay_us.load(Ordering::Relaxed);
        if d > 0 {
            std::thread::sleep(Duration::from_micros(d));
        }
        !self.drop_replies.load(Ordering::Relaxed)
    }

    /// Notes a write whose reply [`Faults::before_data`] said to drop.
    pub(crate) fn unanswered_write(&self) {
        self.unanswered_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes whose reply was dropped so far.
    pub(crate) fn unanswered_writes(&self) -> u64 {
        self.unanswered_writes.load(Ordering::Relaxed)
    }

    pub(crate) fn wait_while_paused(&self) {
        let mut p = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        while *p {
            p = self.resumed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(crate) fn is_paused(&self) -> bool {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) fn set_paused(&self, on: bool) {
        self.any.store(true, Ordering::Relaxed);
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = on;
        self.resumed.notify_all();
    }

    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) fn set_delay(&self, micros: u64) {
        self.any.store(true, Ordering::Relaxed);
        self.delay_us.store(micros, Ordering::Relaxed);
    }

    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) fn set_drop_replies(&self, on: bool) {
        self.any.store(true, Ordering::Relaxed);
        self.drop_replies.store(on, Ordering::Relaxed);
    }

    /// Spins `threads` threads for `millis` ms, or until [`Faults::clear`]
    /// or [`Faults::stop_busy`]. They burn CPU only: the data path does not
    /// wait for them, so what changes is the node's measured CPU use (and
    /// whatever the scheduler takes from its other threads).
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) fn busy(&self, threads: u32, millis: u64) -> Result<(), RemoteError> {
        if threads > remora_proto::Fault::MAX_BUSY_THREADS {
            return Err(RemoteError::BadRequest(format!(
                "busy: {threads} threads, at most {}",
                remora_proto::Fault::MAX_BUSY_THREADS
            )));
        }
        let epoch = self.busy_epoch.load(Ordering::Acquire);
        let until = Instant::now() + Duration::from_millis(millis);
        for i in 0..threads {
            let current = Arc::clone(&self.busy_epoch);
            std::thread::Builder::new()
                .name(format!("memnode-busy-{i}"))
                .spawn(move || {
                    while current.load(Ordering::Relaxed) == epoch && Instant::now() < until {
                        // A few microseconds of work between looks at the clock.
                        let mut x = 1u64;
                        for _ in 0..2000 {
                            x = std::hint::black_box(x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(7));
                        }
                    }
                })
                .map_err(|e| RemoteError::Internal(format!("busy: spawning a thread: {e}")))?;
        }
        Ok(())
    }

    /// Stops every `Busy` thread (at `Resume` and when the node stops).
    pub(crate) fn stop_busy(&self) {
        self.busy_epoch.fetch_add(1, Ordering::AcqRel);
    }

    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) fn clear(&self) {
        self.set_delay(0);
        self.set_drop_replies(false);
        self.set_paused(false);
        self.stop_busy();
    }
}
