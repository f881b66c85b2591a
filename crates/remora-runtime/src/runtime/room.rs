//! Waiting for local room: where application threads block while eviction
//! brings local memory back under the budget.

use super::*;

impl Inner {
    /// Blocks (outside scopes only) until local usage is at most `target`.
    pub(super) fn wait_below(&self, target: u64, timeout: Duration) -> Result<(), RuntimeError> {
        let start = Instant::now();
        let mut last_progress = (self.heap.bytes_in_use(), Instant::now());
        loop {
            let used = self.heap.bytes_in_use();
            if used as u64 <= target {
                return Ok(());
            }
            if self.stop.load(StdOrdering::Acquire) {
                return Err(RuntimeError::Shutdown);
            }
            if used < last_progress.0 {
                last_progress = (used, Instant::now());
            }
            if start.elapsed() > timeout && last_progress.1.elapsed() > Duration::from_millis(500) {
                return Err(RuntimeError::EvictionStalled(timeout));
            }
            let k = self.kick.lock().unwrap_or_else(|p| p.into_inner());
            self.kicked.notify_all();
            let _ = self.kicked.wait_timeout(k, Duration::from_millis(5));
        }
    }
}
