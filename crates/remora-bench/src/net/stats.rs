//! Latency histograms with order-statistic confidence intervals, and
//! throughput tallies.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// The median of `xs` (the mean of the middle two for an even count).
pub(crate) fn median(xs: &[f64]) -> Option<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The smallest and largest of `xs`.
pub(crate) fn range(xs: &[f64]) -> Option<(f64, f64)> {
    let lo = xs.iter().copied().reduce(f64::min)?;
    let hi = xs.iter().copied().reduce(f64::max)?;
    Some((lo, hi))
}

/// Latencies of one side at one size, in nanoseconds.
pub(crate) struct Latency {
    pub(crate) hist: Histogram<u64>,
}

impl Latency {
    /// An empty histogram: 1 ns to 60 s at 3 significant digits.
    pub(crate) fn new() -> anyhow::Result<Self> {
        Ok(Self {
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3)?,
        })
    }

    /// Records one round trip.
    pub(crate) fn record(&mut self, d: Duration) {
        self.hist
            .saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1));
    }

    /// Adds the samples of `other` (another thread's, or a later window's).
    pub(crate) fn merge(&mut self, other: &Latency) -> anyhow::Result<()> {
        self.hist
            .add(&other.hist)
            .map_err(|e| anyhow::anyhow!("merging histograms: {e:?}"))
    }

    /// Number of samples.
    pub(crate) fn samples(&self) -> u64 {
        self.hist.len()
    }

    /// The value at quantile `q`, in ns.
    pub(crate) fn at(&self, q: f64) -> u64 {
        self.hist.value_at_quantile(q)
    }

    /// A 95 % confidence interval for quantile `q`, in ns, from the order
    /// statistics `j ≈ ⌊np − 1.96√(np(1−p))⌋` and `k ≈ ⌈np + 1.96√(np(1−p))⌉ + 1`
    /// (Lancet, eqs. 4.1–4.2; valid for independent samples).
    pub(crate) fn ci95(&self, q: f64) -> (u64, u64) {
        let n = self.hist.len() as f64;
        if n == 0.0 {
            return (0, 0);
        }
        let half = 1.96 * (n * q * (1.0 - q)).sqrt();
        let j = (n * q - half).floor().max(1.0);
        let k = ((n * q + half).ceil() + 1.0).min(n);
        (self.hist.value_at_quantile(j / n), self.hist.value_at_quantile(k / n))
    }

    /// Everything about it as JSON (ns).
    pub(crate) fn to_json(&self) -> Value {
        let h = &self.hist;
        let (p50_lo, p50_hi) = self.ci95(0.5);
        let (p99_lo, p99_hi) = self.ci95(0.99);
        json!({
            "samples": h.len(),
            "min_ns": h.min(),
            "mean_ns": h.mean(),
            "p50_ns": self.at(0.5),
            "p90_ns": self.at(0.9),
            "p99_ns": self.at(0.99),
            "p999_ns": self.at(0.999),
            "max_ns": h.max(),
            "p50_ci95_ns": [p50_lo, p50_hi],
            "p99_ci95_ns": [p99_lo, p99_hi],
        })
    }
}

/// Completed operations of one side of a throughput phase.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Tally {
    /// Requests completed inside the measured windows.
    pub(super) ops: u64,
    /// Payload bytes they moved.
    pub(super) bytes: u64,
    /// Length of the measured windows.
    pub(super) time: Duration,
    /// CPU time the server process ran in them, where it was measured
    /// (replies still in flight when a window closes are drained inside
    /// it: 64 × 64 KiB against ~1 GB per window).
    pub(super) server_cpu: Option<Duration>,
}

impl Tally {
    /// Adds another window.
    pub(super) fn add(&mut self, other: Tally) {
        // The first window's CPU, then the sum while every window has one.
        self.server_cpu = if self.time.is_zero() {
            other.server_cpu
        } else {
            self.server_cpu.zip(other.server_cpu).map(|(a, b)| a + b)
        };
        self.ops += other.ops;
        self.bytes += other.bytes;
        self.time += other.time;
    }

    /// Server CPU seconds per GB moved.
    pub(super) fn server_cpu_per_gb(&self) -> Option<f64> {
        let cpu = self.server_cpu?;
        (self.bytes > 0).then(|| cpu.as_secs_f64() / (self.bytes as f64 / 1e9))
    }

    /// The share of the windows' time the server ran (1.0: one CPU, always busy).
    pub(super) fn server_busy(&self) -> Option<f64> {
        Some(self.server_cpu?.as_secs_f64() / self.time.as_secs_f64().max(1e-9))
    }

    /// Payload throughput in GB/s (10^9 bytes per second).
    pub(super) fn gbps(&self) -> f64 {
        self.bytes as f64 / self.time.as_secs_f64().max(1e-9) / 1e9
    }

    /// Operations per second.
    pub(super) fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.time.as_secs_f64().max(1e-9)
    }

    /// As JSON.
    pub(super) fn to_json(self) -> Value {
        json!({
            "ops": self.ops,
            "bytes": self.bytes,
            "seconds": self.time.as_secs_f64(),
            "gb_per_s": self.gbps(),
            "ops_per_s": self.ops_per_sec(),
            "server_cpu_s": self.server_cpu.map(|c| c.as_secs_f64()),
            "server_cpu_s_per_gb": self.server_cpu_per_gb(),
            "server_busy": self.server_busy(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(range(&[]), None);
        assert_eq!(range(&[0.9, 0.5, 1.3]), Some((0.5, 1.3)));
    }

    #[test]
    fn server_cpu_adds_up_only_while_every_window_has_it() {
        let w = |cpu: Option<u64>| Tally {
            ops: 10,
            bytes: 500_000_000,
            time: Duration::from_secs(1),
            server_cpu: cpu.map(Duration::from_millis),
        };
        let mut t = Tally::default();
        t.add(w(Some(900)));
        t.add(w(Some(700)));
        assert_eq!(t.server_cpu, Some(Duration::from_millis(1600)));
        assert!((t.server_cpu_per_gb().unwrap() - 1.6).abs() < 1e-9);
        assert!((t.server_busy().unwrap() - 0.8).abs() < 1e-9);
        t.add(w(None));
        assert_eq!(t.server_cpu, None, "a window without it leaves the sum unknown");
        t.add(w(Some(500)));
        assert_eq!(t.server_cpu, None);
    }

    #[test]
    fn ci_brackets_the_quantile() {
        let mut l = Latency::new().unwrap();
        for i in 1..=10_000u64 {
            l.record(Duration::from_nanos(i * 10));
        }
        let (lo, hi) = l.ci95(0.99);
        let p99 = l.at(0.99);
        assert!(lo <= p99 && p99 <= hi, "{lo} {p99} {hi}");
        // Lancet's example: indices 9880 and 9921 for n = 10 000.
        assert!((98_700..=98_900).contains(&lo), "{lo}");
        assert!((99_150..=99_300).contains(&hi), "{hi}");
    }
}
