//! `--kill-at`: memory nodes holding the scheme's far data killed
//! (`kill -9`, `--kill-count` of them at once) during a measured run, and
//! what the run did after: the lowest throughput right after the kill, the
//! median throughput from 5 s after it to the end against the level before,
//! and when every spanset tolerated m losses again (rebuilt, or re-striped
//! as short spansets when too few nodes live to rebuild on).

use std::time::{Duration, Instant};

use remora_cluster::LocalCluster;
use remora_runtime::{Runtime, Stats};

use super::progress;

/// When the nodes were killed, counted from the call, and how many.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kill {
    pub(crate) at: Duration,
    pub(crate) nodes: usize,
}

/// After `after`, kill -9s up to `count` live memory nodes holding regions
/// of `rt` (those holding the most first), all at once, so the run goes on
/// through degraded reads and the recovery; then waits until the manager
/// declares them dead (the next scheme must not be handed regions there).
/// A failure to find or kill one is logged, not fatal.
pub(crate) fn kill_nodes(cluster: &LocalCluster, rt: &Runtime, scheme: &str, after: Duration, count: usize) -> Kill {
    let start = Instant::now();
    std::thread::sleep(after);
    let held: Vec<String> = rt.regions_with_data().iter().map(|(_, g)| g.addr.clone()).collect();
    let alive: Vec<String> = cluster
        .status()
        .map(|s| {
            s.memory_nodes
                .iter()
                .filter(|m| m.state == remora_proto::NodeState::Alive)
                .map(|m| m.addr.clone())
                .collect()
        })
        .unwrap_or_default();
    // Alive by the manager's word and as a process (an earlier scheme's
    // victim may not be declared dead yet).
    let running = |i: usize| cluster.wait_memnode_exit(i, Duration::ZERO).is_err();
    let mut victims: Vec<usize> = Vec::new();
    for addr in &held {
        let Some(i) = cluster.memnodes().iter().position(|m| &m.addr == addr) else {
            continue;
        };
        if victims.len() < count && !victims.contains(&i) && alive.contains(addr) && running(i) {
            victims.push(i);
        }
    }
    if victims.is_empty() {
        tracing::warn!("[{scheme}] no live memory node holds this runtime's regions: nothing killed");
    }
    let mut killed = Vec::new();
    let at = start.elapsed();
    for &i in &victims {
        match cluster.kill_memnode(i) {
            Ok(()) => killed.push(cluster.memnodes()[i].addr.clone()),
            Err(e) => tracing::warn!("[{scheme}] could not kill memory node {i}: {e}"),
        }
    }
    if !killed.is_empty() {
        progress(format_args!(
            "[{scheme}] killed {} memory node(s) ({}) with SIGKILL, {:.1} s into the run",
            killed.len(),
            killed.join(", "),
            after.as_secs_f64()
        ));
        let dead = cluster.wait_until(Duration::from_secs(60), "the killed nodes declared dead", |s| {
            killed.iter().all(|a| {
                s.memory_nodes
                    .iter()
                    .any(|m| &m.addr == a && m.state == remora_proto::NodeState::Dead)
            })
        });
        if let Err(e) = dead {
            tracing::warn!("[{scheme}] {e}");
        }
    }
    Kill {
        at,
        nodes: killed.len(),
    }
}

/// What the run did after the kill.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct AfterKill {
    /// Operations per second from the start to the kill.
    pub(super) before: f64,
    /// The lowest rate of a half-second window in the 5 s after the kill.
    pub(super) dip: f64,
    /// The median rate of half-second windows from 5 s after the kill to
    /// the end (`None`: the run ended sooner).
    pub(super) median_after: Option<f64>,
    /// From the kill to the first sample at which every failure was
    /// recovered and no spanset was below full tolerance (`None`: never).
    pub(super) tolerant_after: Option<f64>,
}

/// Half-second windows, as `--kill-manager-at` reads them.
const WINDOW: f64 = 0.5;

/// Reads the run off `at` (seconds into the measured phase and operations
/// completed by then) and `samples` (the stats at the same instants), for
/// `nodes` nodes killed `kill_s` into the measured phase.
pub(super) fn after_kill(at: &[(f64, u64)], samples: &[Stats], kill_s: f64, nodes: usize) -> AfterKill {
    let ops_at = |t: f64| -> Option<(f64, u64)> { at.iter().copied().find(|&(s, _)| s >= t) };
    let rate = |from: f64, to: f64| -> Option<f64> {
        let (a, oa) = ops_at(from)?;
        let (b, ob) = ops_at(to)?;
        (b > a).then(|| ob.saturating_sub(oa) as f64 / (b - a))
    };
    let end = at.last().map_or(0.0, |a| a.0);
    let windows = |from: f64, to: f64| -> Vec<f64> {
        let mut v = Vec::new();
        let mut t = from;
        while t + WINDOW <= to {
            if let Some(r) = rate(t, t + WINDOW) {
                v.push(r);
            }
            t += WINDOW;
        }
        v
    };
    let before = rate(0.0, kill_s).unwrap_or(0.0);
    let dip = windows(kill_s, (kill_s + 5.0).min(end))
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    let mut later = windows(kill_s + 5.0, end);
    later.sort_by(f64::total_cmp);
    let median_after = (!later.is_empty()).then(|| later[later.len() / 2]);
    let base = samples
        .iter()
        .zip(at)
        .take_while(|(_, (t, _))| *t < kill_s)
        .last()
        .map_or(0, |(s, _)| s.scheme.recoveries);
    let tolerant_after = samples
        .iter()
        .zip(at)
        .filter(|(_, (t, _))| *t >= kill_s)
        .find(|(s, _)| {
            s.scheme.recoveries >= base + nodes as u64
                && s.scheme.recovering == 0
                && s.scheme.spansets_below_tolerance == 0
        })
        .map(|(_, (t, _))| t - kill_s);
    AfterKill {
        before,
        dip: if dip.is_finite() { dip } else { 0.0 },
        median_after,
        tolerant_after,
    }
}

/// Prints what `scheme`'s run did after the kill.
pub(super) fn report(scheme: &str, k: Kill, warmup: Duration, at: &[(f64, u64)], samples: &[Stats]) {
    if k.nodes == 0 {
        return;
    }
    let kill_s = k.at.as_secs_f64() - warmup.as_secs_f64();
    let a = after_kill(at, samples, kill_s, k.nodes);
    let median = match a.median_after {
        Some(m) => format!("median from 5 s after it {:.2}x", m / a.before.max(1e-9)),
        None => "the run ended within 5 s of it".into(),
    };
    let tolerant = match a.tolerant_after {
        Some(s) => format!("every spanset tolerates m losses again {s:.1} s after the kill"),
        None => "spansets still below full tolerance at the end".into(),
    };
    let short = samples.last().map_or(0, |s| s.scheme.short_spansets);
    progress(format_args!(
        "[{scheme}] {} node(s) killed at {kill_s:.1} s: {:.0} ops/s before; lowest half-second after it {:.2}x; \
         {median}; {tolerant}; {short} short spansets at the end",
        k.nodes,
        a.before,
        a.dip / a.before.max(1e-9),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1000 ops/s for 5 s, 200 ops/s for 1 s, then 900 ops/s; recovered
    /// (and tolerant) from 3 s after the kill.
    #[test]
    fn the_run_after_a_kill_is_read_off_the_samples() {
        let (mut at, mut samples) = (Vec::new(), Vec::new());
        let mut ops = 0u64;
        for i in 0..=150 {
            let t = f64::from(i) * 0.1;
            at.push((t, ops));
            let mut s = Stats::default();
            if t >= 5.0 {
                s.scheme.recovering = u64::from(t < 8.0);
                s.scheme.recoveries = u64::from(t >= 8.0) * 2;
                s.scheme.spansets_below_tolerance = if t < 8.0 { 40 } else { 0 };
            }
            samples.push(s);
            ops += match t {
                t if t < 5.0 => 100,
                t if t < 6.0 => 20,
                _ => 90,
            };
        }
        let a = after_kill(&at, &samples, 5.0, 2);
        assert!((a.before - 1000.0).abs() < 1.0, "{a:?}");
        assert!((a.dip - 200.0).abs() < 1.0, "{a:?}");
        assert!((a.median_after.unwrap() - 900.0).abs() < 1.0, "{a:?}");
        assert!((a.tolerant_after.unwrap() - 3.0).abs() < 0.11, "{a:?}");
        // One failure only recovered: not both.
        assert_eq!(after_kill(&at, &samples, 5.0, 3).tolerant_after, None);
    }
}
