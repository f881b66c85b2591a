//! Fault injection: the switches a test flips to make this node misbehave.
//! The switches always exist (they cost one relaxed load on the data path);
//! only the `fault-injection` feature lets a request flip them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Current fault settings of the node.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    any: AtomicBool,
    paused: Mutex<bool>,
    resumed: Condvar,
    delay_us: AtomicU64,
    drop_replies: AtomicBool,
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

    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    pub(crate) fn clear(&self) {
        self.set_delay(0);
        self.set_drop_replies(false);
        self.set_paused(false);
    }
}
