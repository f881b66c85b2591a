//! `--kill-manager-at`: the manager killed (`kill -9`) during a measured
//! run and started again on its port and data directory `--manager-down`
//! later, and what the run's throughput did around it: how soon after the
//! restart it is back to 0.9x its level before the kill, and how long it
//! stood at zero.

use std::time::{Duration, Instant};

use remora_cluster::LocalCluster;

use super::progress;

/// When the manager was killed and started again, counted from the call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outage {
    pub(super) killed: Duration,
    pub(super) restarted: Duration,
}

/// Sleeps `after`, kills the manager, sleeps `down` and starts it again.
pub(super) fn kill_and_restart(
    cluster: &LocalCluster,
    scheme: &str,
    after: Duration,
    down: Duration,
) -> Option<Outage> {
    let start = Instant::now();
    std::thread::sleep(after);
    cluster.kill_manager();
    let killed = start.elapsed();
    progress(format_args!("[{scheme}] killed the manager with SIGKILL"));
    std::thread::sleep(down);
    if let Err(e) = cluster.start_manager_again() {
        tracing::error!("[{scheme}] could not start the manager again: {e}");
        return None;
    }
    let restarted = start.elapsed();
    progress(format_args!(
        "[{scheme}] started the manager again after {:.1} s",
        (restarted - killed).as_secs_f64()
    ));
    Some(Outage { killed, restarted })
}

/// What the throughput did around an outage.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Recovery {
    /// Operations per second in the 3 s before the kill.
    pub(super) before: f64,
    /// From the restart to the end of the first half-second window whose
    /// rate is at least 0.9x `before` (`None`: never, in the run).
    pub(super) back_after: Option<f64>,
    /// Time in 100 ms samples with no operation completed.
    pub(super) at_zero: f64,
}

/// Half-second windows: short enough to see a recovery within 2 s.
const WINDOW: f64 = 0.5;

/// Reads the recovery off `at` (seconds into the measured phase and
/// operations completed by then, one pair per sample), for an outage whose
/// kill and restart fell `kill_s` and `restart_s` into the measured phase.
pub(super) fn recovery(at: &[(f64, u64)], kill_s: f64, restart_s: f64) -> Recovery {
    let ops_at = |t: f64| -> Option<(f64, u64)> { at.iter().copied().find(|&(s, _)| s >= t) };
    let rate = |from: f64, to: f64| -> Option<f64> {
        let (a, oa) = ops_at(from)?;
        let (b, ob) = ops_at(to)?;
        (b > a).then(|| (ob - oa) as f64 / (b - a))
    };
    let before = rate((kill_s - 3.0).max(0.0), kill_s).unwrap_or(0.0);
    let back_after = at
        .iter()
        .filter(|&&(t, _)| t >= restart_s)
        .find(|&&(t, _)| rate(t, t + WINDOW).is_some_and(|r| r >= 0.9 * before))
        .map(|&(t, _)| t + WINDOW - restart_s);
    let at_zero = at
        .windows(2)
        .filter(|w| w[1].1 == w[0].1)
        .map(|w| w[1].0 - w[0].0)
        .sum();
    Recovery {
        before,
        back_after,
        at_zero,
    }
}

/// Prints the recovery of `scheme`'s run.
pub(super) fn report(scheme: &str, o: Outage, warmup: Duration, at: &[(f64, u64)]) {
    let kill_s = o.killed.as_secs_f64() - warmup.as_secs_f64();
    let restart_s = o.restarted.as_secs_f64() - warmup.as_secs_f64();
    let r = recovery(at, kill_s, restart_s);
    let back = match r.back_after {
        Some(s) => format!("back to 0.9x {s:.2} s after the restart"),
        None => "never back to 0.9x in the run".into(),
    };
    progress(format_args!(
        "[{scheme}] manager down from {kill_s:.1} s to {restart_s:.1} s: {:.0} ops/s before; {back}; {:.1} s at 0 ops/s",
        r.before, r.at_zero
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1000 ops/s for 5 s, nothing for 3 s, then 500 ops/s for 1 s and
    /// 1000 ops/s after: back at the end of the first full window at 1000.
    #[test]
    fn recovery_is_read_off_the_samples() {
        let mut at = Vec::new();
        let mut ops = 0u64;
        for i in 0..=120 {
            let t = f64::from(i) * 0.1;
            at.push((t, ops));
            ops += match t {
                t if t < 5.0 => 100,
                t if t < 8.0 => 0,
                t if t < 9.0 => 50,
                _ => 100,
            };
        }
        let r = recovery(&at, 5.0, 8.0);
        assert!((r.before - 1000.0).abs() < 1.0, "{r:?}");
        let back = r.back_after.unwrap();
        assert!((back - 1.5).abs() < 0.11, "{r:?}");
        assert!((r.at_zero - 3.0).abs() < 0.11, "{r:?}");
        // Never back: the rate stays at half.
        let half: Vec<(f64, u64)> = (0..=50u32)
            .map(|i| {
                let ops = if i < 20 { i * 100 } else { 2000 + (i - 20) * 50 };
                (f64::from(i) * 0.1, u64::from(ops))
            })
            .collect();
        assert_eq!(recovery(&half, 2.0, 2.5).back_after, None);
    }
}
