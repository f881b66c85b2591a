//! How a runtime is set up: what an application chooses ([`RuntimeConfig`])
//! and the knobs of the background work ([`Tuning`]), whose defaults suit
//! most workloads.

use std::time::Duration;

use remora_proto::ConnOptions;

use crate::eviction::{Clock, EvictionPolicy};
use crate::scheme::{NonFt, Scheme};

/// How a runtime is set up.
pub struct RuntimeConfig {
    /// The manager's address.
    pub manager: String,
    /// Name shown by `remora status`.
    pub name: String,
    /// Local memory budget in bytes (spans holding objects).
    pub local_budget: usize,
    /// Fault-tolerance scheme.
    pub scheme: Box<dyn Scheme>,
    /// Which spans are cold.
    pub policy: Box<dyn EvictionPolicy>,
    /// Connection options for the manager and memory nodes.
    pub conn: ConnOptions,
    /// How long an allocation outside a scope waits for eviction, and how
    /// long to wait for far memory when the manager has none.
    pub patience: Duration,
    /// How long an operation waits out far memory that is unreachable but
    /// not lost (the manager down and the memory nodes' leases lapsed, a
    /// memory node cut off but not declared dead) before failing with
    /// [`crate::RuntimeError::Unavailable`]. Far data is reported lost
    /// ([`crate::RuntimeError::DataLost`]) only when more members of a
    /// spanset than parity covers were declared dead by the manager or fail
    /// their checksums.
    pub outage_deadline: Duration,
    /// The background work's knobs.
    pub tuning: Tuning,
}

impl RuntimeConfig {
    /// Defaults for a manager at `manager` and a local budget in bytes:
    /// `non-ft`, CLOCK, [`Tuning::default`].
    pub fn new(manager: impl Into<String>, local_budget: usize) -> Self {
        Self {
            manager: manager.into(),
            name: format!("remora-runtime-{}", std::process::id()),
            local_budget,
            scheme: Box::new(NonFt::default()),
            policy: Box::new(Clock),
            conn: ConnOptions::default(),
            patience: Duration::from_secs(30),
            outage_deadline: Duration::from_secs(60),
            tuning: Tuning::default(),
        }
    }
}

/// The knobs of a runtime's background work: eviction, filtering and
/// swap-in granularity.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// Eviction starts above this fraction of the budget...
    pub high_watermark: f64,
    /// ...and stops below this one. Above it, spans the filtering threads
    /// found cold go as soon as a batch of them is queued.
    pub low_watermark: f64,
    /// Number of eviction threads.
    pub eviction_threads: usize,
    /// Spans evicted per batch (one grace period per batch).
    pub eviction_batch: usize,
    /// Number of filtering threads (paper §3.3: they move objects so spans
    /// hold only hot or only cold objects); 0 disables filtering.
    pub filtering_threads: usize,
    /// Pause between a filtering thread's rounds (each looks at the spans
    /// swapped in since the last, and every second round also sweeps a
    /// window of spans, ages their objects and moves those of mixed or
    /// sparse spans). Short, so a span swapped in for one object gives that
    /// object to a hot span and goes back soon.
    pub filter_interval: Duration,
    /// A swap-in from a span of small objects (at least 4 per span) brings
    /// back only the object asked for, while filtering runs: the remote
    /// read is still one read of the whole span, checked against its
    /// checksum, and the object is copied into a local span of its class as
    /// an allocation would place it. The far span keeps its other objects;
    /// a second miss on it within 10 ms (a scan) brings them all back.
    /// `false` swaps the whole span in (the paper's swap-in; filtering then
    /// moves the object out and the rest goes back, clean, without a write).
    pub object_swap_in: bool,
}

impl Default for Tuning {
    /// Two eviction threads, one filtering thread, watermarks 97 % / 94 %
    /// (with the filter's cold spans queued for eviction, the gap between
    /// them only needs to absorb a burst of swap-ins; every byte under the
    /// watermark is cache), batches of 32 spans, 5 ms between filtering
    /// rounds, object swap-in on.
    fn default() -> Self {
        Self {
            high_watermark: 0.97,
            low_watermark: 0.94,
            eviction_threads: 2,
            eviction_batch: 32,
            filtering_threads: 1,
            filter_interval: Duration::from_millis(5),
            object_swap_in: true,
        }
    }
}
