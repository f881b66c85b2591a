//! What a phase of a test did, read from the runtime's stats.
//!
//! Tests that count what a phase did (swap-ins, clean re-evictions, bytes
//! written) take a snapshot, run the phase and subtract: [`stats_delta`]
//! does that with [`Stats::since`], so no test subtracts field by field.

use std::time::Duration;

use remora_runtime::{Runtime, Stats};

use crate::verify::wait_stats;

/// Runs `phase` and returns the change in `rt`'s stats over it
/// ([`Stats::since`] of a snapshot taken just before): its counters are
/// what happened during `phase`, its levels (objects, far objects, kept
/// bytes, ...) are those after it.
pub fn stats_delta(rt: &Runtime, phase: impl FnOnce()) -> Stats {
    let before = rt.stats();
    phase();
    rt.stats().since(&before)
}

/// Bytes written to far memory (parity and copies included) per span byte
/// evicted, over whatever `st` counts (a whole run, or a [`stats_delta`]):
/// 1.5 for RS 4+2 spansets of equal spans, 3 for three copies.
pub fn write_amplification(st: &Stats) -> f64 {
    st.traffic.bytes_written_remote as f64 / st.traffic.bytes_evicted_data as f64
}

/// Waits (up to 10 s) until `rt` holds no far memory and no kept copies,
/// as once every object was dropped and eviction settled, and returns the
/// stats then (with no local object left either); fails the test if not.
#[track_caller]
pub fn wait_far_given_back(rt: &Runtime, what: &str) -> Stats {
    let st = wait_stats(
        rt,
        &format!("{what}: kept copies and far memory given back"),
        Duration::from_secs(10),
        |st| st.far.kept_bytes == 0 && st.far.bytes_used == 0,
    );
    assert_eq!(
        st.local.objects, 0,
        "{what}: local objects outlived their owners: {st:?}"
    );
    st
}
