//! A fault's effect on throughput, read off windows of completed
//! operations: the mean from the fault to its end against the mean of the
//! 5 s before it, and how long until throughput was back. `remora chaos`
//! reads every fault this way, and `remora bench kv` a memory node killed
//! under the KV store (the paper's Figure 10a).

/// Baseline before a fault, seconds.
const BEFORE: f64 = 5.0;
/// Throughput counts as back once it stays at this share of the baseline…
pub const NORMAL: f64 = 0.9;
/// …for this long, seconds.
pub const STAY: f64 = 0.5;

/// A fault's effect on throughput.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dip {
    /// Mean throughput of the 5 s before the fault (fewer if the run
    /// started later).
    pub baseline: f64,
    /// Mean from the fault to its end (rebuilt for a kill, healed for a
    /// hold) ÷ the baseline.
    pub ratio: f64,
    /// Seconds from `back_from` until throughput stayed at [`NORMAL`] of
    /// the baseline for [`STAY`] seconds (0 when the first window after it
    /// already did: less than one window).
    pub back_after: Option<f64>,
}

/// Mean of the windows whose end lies in `(lo, hi]`.
fn mean(windows: &[(f64, f64)], lo: f64, hi: f64) -> Option<f64> {
    let v: Vec<f64> = windows.iter().filter(|w| w.0 > lo && w.0 <= hi).map(|w| w.1).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The dip of a fault at `at` that lasted until `end`, over windows
/// `(end of window, ops/s)` each `window` seconds long, with recovery
/// counted from `back_from`: the manager's outage hurts only once the
/// leases lapse, seconds in, so throughput "back" before it ended says
/// nothing. `None` when there is no baseline (no window before `at`, or
/// none with an operation).
pub fn dip(windows: &[(f64, f64)], window: f64, at: f64, end: f64, back_from: f64) -> Option<Dip> {
    let baseline = mean(windows, at - BEFORE, at)?;
    if baseline <= 0.0 {
        return None;
    }
    // A fault shorter than a window still covers the window it falls in.
    let during = mean(windows, at, end.max(at + window))?;
    let after: Vec<&(f64, f64)> = windows.iter().filter(|w| w.0 > back_from).collect();
    let stay = ((STAY / window).round() as usize).max(1);
    let back_after = (0..after.len().saturating_sub(stay - 1))
        .find(|&i| after[i..i + stay].iter().all(|w| w.1 >= NORMAL * baseline))
        .map(|i| (after[i].0 - window - back_from).max(0.0));
    Some(Dip {
        baseline,
        ratio: during / baseline,
        back_after,
    })
}

/// Windows of `window` seconds, `(end of window, ops/s)`, from samples
/// `(seconds, operations completed by then)` in time order: each window's
/// rate is the operations between the last samples at or before its ends.
pub fn windows(samples: &[(f64, u64)], window: f64) -> Vec<(f64, f64)> {
    let Some(&(t0, _)) = samples.first() else {
        return Vec::new();
    };
    let end = samples.last().map_or(t0, |s| s.0);
    // Sample times are measured, window ends computed: a sample within a
    // nanosecond of an end belongs to it.
    let at = |t: f64| {
        let i = samples.partition_point(|s| s.0 <= t + 1e-9);
        samples[i.saturating_sub(1)].1
    };
    let n = ((end - t0) / window + 1e-9).floor() as usize;
    (0..n)
        .map(|i| {
            let (a, b) = (t0 + i as f64 * window, t0 + (i + 1) as f64 * window);
            (b, at(b).saturating_sub(at(a)) as f64 / window)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_cut_from_samples() {
        // 1000 ops/s sampled every 10 ms for 1 s, then nothing for 0.3 s.
        let mut s: Vec<(f64, u64)> = (0..=100u32).map(|i| (f64::from(i) * 0.01, u64::from(i) * 10)).collect();
        s.extend((101..=130u32).map(|i| (f64::from(i) * 0.01, 1000)));
        let w = windows(&s, 0.1);
        assert_eq!(w.len(), 13);
        assert!(
            (w[0].1 - 1000.0).abs() < 1e-6 && (w[9].1 - 1000.0).abs() < 1e-6,
            "{w:?}"
        );
        assert!(w[10..].iter().all(|x| x.1 == 0.0), "{w:?}");
        // A dip at 1.0 that lasted to 1.3: nothing during it, never back.
        let d = dip(&w, 0.1, 1.0, 1.3, 1.0).unwrap();
        assert!(
            (d.baseline - 1000.0).abs() < 1e-6 && d.ratio == 0.0 && d.back_after.is_none(),
            "{d:?}"
        );
    }
}
