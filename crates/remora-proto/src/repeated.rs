//! Logging a failure that repeats without flooding the log.
//!
//! A retry loop that fails the same way hundreds of times a second (the
//! manager down, too few live memory nodes) would otherwise write a line
//! per attempt and bury everything else. [`Repeated`] logs the first
//! failure of a streak at WARN, then WARN summaries with a count, the first
//! one interval later and each further one twice as long after the last (up
//! to [`MAX_GAP`] intervals), and one INFO line when an attempt succeeds
//! again, saying how long the streak lasted and how many attempts it cost.
//! The gaps grow so that a long outage, seen by several such streaks at
//! once, still leaves a log a person reads through.

use std::fmt::Display;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The summary interval unless a caller asks for another.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// The longest gap between two summaries, in intervals.
pub const MAX_GAP: u32 = 6;

/// What a call to [`Repeated::fail`] or [`Repeated::ok`] logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logged {
    /// Nothing: a failure counted for the next summary, or a success that
    /// ended no streak.
    Nothing,
    /// The first failure of a streak, at WARN.
    First,
    /// A WARN summary: this failure and `more` others since the last line.
    Summary {
        /// Failures since the last line logged, this one excluded.
        more: u64,
        /// Time since that line.
        over: Duration,
    },
    /// The streak ended, at INFO.
    Cleared {
        /// How long it lasted, from its first failure.
        after: Duration,
        /// Failures in it.
        failures: u64,
    },
}

#[derive(Debug, Default)]
struct Streak {
    /// When the streak's first failure happened; `None` outside a streak.
    since: Option<Instant>,
    /// When its last line was logged.
    logged: Option<Instant>,
    /// Failures since that line.
    unlogged: u64,
    /// Failures in the streak.
    failures: u64,
    /// The wait before the next summary.
    gap: Duration,
}

/// One kind of repeating failure, logged as a streak. Shared by every
/// thread that retries the same thing (`&self` throughout).
#[derive(Debug)]
pub struct Repeated {
    /// What holds again when the streak ends, e.g. "manager reachable".
    recovered: String,
    /// What each failure cost, plural, e.g. "swap-outs deferred".
    cost: String,
    interval: Duration,
    st: Mutex<Streak>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A duration as a person reads it in a log line: whole seconds from 10 s
/// on, tenths below, milliseconds below one second.
fn human(d: Duration) -> String {
    if d >= Duration::from_secs(10) {
        format!("{} s", d.as_secs_f64().round() as u64)
    } else if d >= Duration::from_secs(1) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

impl Repeated {
    /// A streak whose end reads "{recovered} again after 42 s; 61 {cost}",
    /// first summarised [`DEFAULT_INTERVAL`] after its start.
    pub fn new(recovered: impl Into<String>, cost: impl Into<String>) -> Self {
        Self::with_interval(recovered, cost, DEFAULT_INTERVAL)
    }

    /// As [`Repeated::new`], first summarised `interval` after its start
    /// (tests use a short one).
    pub fn with_interval(recovered: impl Into<String>, cost: impl Into<String>, interval: Duration) -> Self {
        Self {
            recovered: recovered.into(),
            cost: cost.into(),
            interval,
            st: Mutex::new(Streak::default()),
        }
    }

    /// An attempt failed with `what` (the whole message, cause included).
    pub fn fail(&self, what: impl Display) -> Logged {
        let logged = self.fail_at(Instant::now());
        match logged {
            Logged::First => tracing::warn!("{what}"),
            Logged::Summary { more, over } => tracing::warn!("{what} ({more} more in the last {})", human(over)),
            Logged::Nothing | Logged::Cleared { .. } => {}
        }
        logged
    }

    /// An attempt succeeded: ends the streak, if there was one.
    pub fn ok(&self) -> Logged {
        let logged = self.ok_at(Instant::now());
        if let Logged::Cleared { after, failures } = logged {
            tracing::info!(
                "{} again after {}; {failures} {}",
                self.recovered,
                human(after),
                self.cost
            );
        }
        logged
    }

    /// Whether a streak is under way (the last attempt failed).
    pub fn failing(&self) -> bool {
        lock(&self.st).since.is_some()
    }

    /// The decision of [`Repeated::fail`] at `now`, without logging.
    fn fail_at(&self, now: Instant) -> Logged {
        let mut st = lock(&self.st);
        st.failures += 1;
        let Some(logged) = st.logged.filter(|_| st.since.is_some()) else {
            st.since = Some(now);
            st.logged = Some(now);
            st.unlogged = 0;
            st.gap = self.interval;
            return Logged::First;
        };
        let over = now.saturating_duration_since(logged);
        if over >= st.gap {
            let more = st.unlogged;
            st.logged = Some(now);
            st.unlogged = 0;
            st.gap = (st.gap * 2).min(self.interval * MAX_GAP);
            Logged::Summary { more, over }
        } else {
            st.unlogged += 1;
            Logged::Nothing
        }
    }

    /// The decision of [`Repeated::ok`] at `now`, without logging.
    fn ok_at(&self, now: Instant) -> Logged {
        let mut st = lock(&self.st);
        let Some(since) = st.since.take() else {
            return Logged::Nothing;
        };
        let failures = std::mem::take(&mut st.failures);
        st.unlogged = 0;
        st.logged = None;
        Logged::Cleared {
            after: now.saturating_duration_since(since),
            failures,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const TICK: Duration = Duration::from_millis(50);

    fn r() -> Repeated {
        Repeated::with_interval("manager reachable", "swap-outs deferred", TICK)
    }

    #[test]
    fn a_streak_logs_its_first_failure_then_summaries_further_and_further_apart() {
        let r = r();
        let t0 = Instant::now();
        assert_eq!(r.fail_at(t0), Logged::First);
        for i in 1..1000 {
            assert_eq!(r.fail_at(t0 + TICK * i / 1000), Logged::Nothing, "failure {i}");
        }
        assert_eq!(r.fail_at(t0 + TICK), Logged::Summary { more: 999, over: TICK });
        // The next summary comes two intervals later, then four, ...
        assert_eq!(r.fail_at(t0 + TICK * 2), Logged::Nothing);
        assert_eq!(
            r.fail_at(t0 + TICK * 3),
            Logged::Summary {
                more: 1,
                over: TICK * 2
            }
        );
        assert_eq!(r.fail_at(t0 + TICK * 6), Logged::Nothing);
        assert_eq!(
            r.fail_at(t0 + TICK * 7),
            Logged::Summary {
                more: 1,
                over: TICK * 4
            }
        );
        // ... up to MAX_GAP intervals.
        assert_eq!(
            r.fail_at(t0 + TICK * 13),
            Logged::Summary {
                more: 0,
                over: TICK * 6
            }
        );
        assert_eq!(r.fail_at(t0 + TICK * 18), Logged::Nothing);
        assert_eq!(
            r.fail_at(t0 + TICK * 19),
            Logged::Summary {
                more: 1,
                over: TICK * 6
            }
        );
        assert_eq!(
            r.ok_at(t0 + TICK * 20),
            Logged::Cleared {
                after: TICK * 20,
                failures: 1008
            }
        );
        assert_eq!(r.ok_at(t0 + TICK * 21), Logged::Nothing, "one line per streak end");
        assert_eq!(
            r.fail_at(t0 + TICK * 21),
            Logged::First,
            "a new streak is logged at once"
        );
        assert_eq!(
            r.fail_at(t0 + TICK * 22),
            Logged::Summary { more: 0, over: TICK },
            "and summarised one interval later"
        );
    }

    #[test]
    fn lines_per_minute_of_failures_are_bounded_by_the_interval() {
        let r = Repeated::new("manager reachable", "swap-outs deferred");
        let t0 = Instant::now();
        // One failure every millisecond for a minute.
        let lines = (0..60_000u32)
            .map(|ms| r.fail_at(t0 + Duration::from_millis(ms.into())))
            .filter(|l| *l != Logged::Nothing)
            .count();
        // At 0 s, then 5, 15 and 35 s (the next would be at 65 s).
        assert_eq!(lines, 4);
    }

    #[test]
    fn threads_sharing_one_streak_log_its_first_failure_once() {
        let r = Arc::new(Repeated::with_interval("x", "y", Duration::from_secs(3600)));
        let firsts: usize = (0..4)
            .map(|_| {
                let r = Arc::clone(&r);
                std::thread::spawn(move || (0..1000).filter(|_| r.fail("failed") != Logged::Nothing).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap_or(usize::MAX))
            .sum();
        assert_eq!(firsts, 1);
        assert!(r.failing());
        assert!(matches!(r.ok(), Logged::Cleared { failures: 4000, .. }));
        assert!(!r.failing());
    }

    #[test]
    fn durations_read_as_a_person_would_write_them() {
        assert_eq!(human(Duration::from_millis(250)), "250 ms");
        assert_eq!(human(Duration::from_millis(4200)), "4.2 s");
        assert_eq!(human(Duration::from_millis(42_400)), "42 s");
    }
}
