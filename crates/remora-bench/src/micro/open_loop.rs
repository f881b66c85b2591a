//! The pieces of the open-loop mode of `remora bench micro`: each worker's
//! Poisson arrival schedule, the timer slack that lets it wake on time, and
//! a lag-1 autocorrelation that tells whether its latency samples are
//! independent (what the confidence intervals assume).

use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp};

/// Highest offered rate accepted, in operations per second (in total).
pub(crate) const MAX_RATE: f64 = 10_000_000.0;

/// Poisson arrivals: scheduled start times with exponential gaps, from a
/// seeded generator of their own (so the schedule does not depend on what
/// the operations draw).
pub(crate) struct Arrivals {
    start: Instant,
    at: f64,
    gaps: Exp<f64>,
    rng: SmallRng,
}

impl Arrivals {
    /// Arrivals at `rate` per second from `start` on.
    pub(crate) fn new(start: Instant, rate: f64, seed: u64) -> anyhow::Result<Self> {
        let gaps = Exp::new(rate).map_err(|e| anyhow::anyhow!("exponential gaps at rate {rate}: {e}"))?;
        Ok(Self {
            start,
            at: 0.0,
            gaps,
            rng: SmallRng::seed_from_u64(seed),
        })
    }
}

impl Iterator for Arrivals {
    type Item = Instant;

    /// The next scheduled start (the schedule never ends).
    fn next(&mut self) -> Option<Instant> {
        self.at += self.gaps.sample(&mut self.rng);
        Some(self.start + Duration::from_secs_f64(self.at))
    }
}

/// Lets the calling thread's sleeps end within a few µs of their deadline
/// instead of Linux's default 50 µs slack, which would otherwise be added to
/// every latency measured from an op's scheduled time. Best effort.
pub(crate) fn tight_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer (nanoseconds; 1 is the
    // smallest, 0 would restore the default), touches no memory of ours and
    // affects only the calling thread. A failure leaves the default slack.
    let r = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if r != 0 {
        tracing::debug!("PR_SET_TIMERSLACK failed: {}", std::io::Error::last_os_error());
    }
}

/// Online lag-1 autocorrelation (Pearson, on log latency so that a few huge
/// outliers do not decide it) of a sequence of latencies in issue order.
/// Pooled over threads by adding their sums (pairs never span two threads).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Lag1 {
    prev: Option<f64>,
    n: u64,
    sx: f64,
    sy: f64,
    sxx: f64,
    syy: f64,
    sxy: f64,
}

impl Lag1 {
    /// Adds the next latency of the sequence.
    pub(crate) fn push(&mut self, d: Duration) {
        let y = (d.as_nanos().max(1) as f64).ln();
        if let Some(x) = self.prev {
            self.n += 1;
            self.sx += x;
            self.sy += y;
            self.sxx += x * x;
            self.syy += y * y;
            self.sxy += x * y;
        }
        self.prev = Some(y);
    }

    /// Adds another thread's pairs.
    pub(crate) fn merge(&mut self, o: &Lag1) {
        self.n += o.n;
        self.sx += o.sx;
        self.sy += o.sy;
        self.sxx += o.sxx;
        self.syy += o.syy;
        self.sxy += o.sxy;
    }

    /// Number of pairs.
    pub(crate) fn pairs(&self) -> u64 {
        self.n
    }

    /// The correlation of each latency with the next, if defined.
    pub(crate) fn r(&self) -> Option<f64> {
        if self.n < 3 {
            return None;
        }
        let n = self.n as f64;
        let (mx, my) = (self.sx / n, self.sy / n);
        let vx = self.sxx / n - mx * mx;
        let vy = self.syy / n - my * my;
        if vx <= 0.0 || vy <= 0.0 {
            return None;
        }
        Some(((self.sxy / n - mx * my) / (vx * vy).sqrt()).clamp(-1.0, 1.0))
    }

    /// Whether `r` is significantly non-zero at 95 % (|r| > 1.96 / √n):
    /// neighbouring samples depend on each other (queueing), so confidence
    /// intervals computed as if they were independent are too narrow.
    pub(crate) fn dependent(&self) -> bool {
        self.r().is_some_and(|r| r.abs() > 1.96 / (self.n as f64).sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_average_the_rate() {
        let t0 = Instant::now();
        let last = Arrivals::new(t0, 1000.0, 3).unwrap().nth(9_999).unwrap();
        let secs = (last - t0).as_secs_f64();
        assert!((9.5..10.5).contains(&secs), "{secs}");
        let a: Vec<Instant> = Arrivals::new(t0, 1000.0, 3).unwrap().take(5).collect();
        let b: Vec<Instant> = Arrivals::new(t0, 1000.0, 3).unwrap().take(5).collect();
        assert_eq!(a, b);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn lag1_sees_dependence() {
        let mut flat = Lag1::default();
        let mut ramp = Lag1::default();
        let mut rng = SmallRng::seed_from_u64(1);
        let exp = Exp::new(1.0).unwrap();
        for i in 0..10_000u64 {
            let noise: f64 = exp.sample(&mut rng);
            flat.push(Duration::from_nanos(1000 + (noise * 500.0) as u64));
            // Slowly varying: each sample close to the one before.
            ramp.push(Duration::from_nanos(1000 + (i % 1000) * 50 + (noise * 10.0) as u64));
        }
        assert!(!flat.dependent(), "{:?}", flat.r());
        assert!(ramp.dependent() && ramp.r().unwrap() > 0.9, "{:?}", ramp.r());
        let mut both = flat;
        both.merge(&ramp);
        assert_eq!(both.pairs(), 2 * 9_999);
    }
}
