//! Admission: how many connections a server holds, and how long one may
//! take to prove itself.
//!
//! A server's threads are bounded by two pools, as sshd's `MaxStartups` and
//! nginx's `worker_connections` bound theirs:
//!
//! - **handshakes**: connections still in their handshake (TLS, hello, key
//!   proof). Each has one deadline for the whole handshake, enforced by a
//!   reaper that shuts down the socket when it passes, whatever step the
//!   connection is in. When the pool is full, a new connection makes room
//!   by dropping the oldest one, so that a flood of idle connections
//!   cannot keep a real peer out for longer than it takes the flood to
//!   open [`Limits::handshakes`] more connections;
//! - **connections**: authenticated connections. Beyond the cap a new one is
//!   answered [`crate::RemoteError::Busy`] on its first request and closed.
//!
//! A connection runs on one thread from accept to close, so the server
//! never has more than `handshakes + connections` connection threads, plus
//! its accept thread and the reaper.

use std::collections::BTreeMap;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How much a server admits, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections in their handshake at once; a new one beyond this drops
    /// the oldest.
    pub handshakes: usize,
    /// Time for the whole handshake: TLS, protocol hello and key proof.
    pub handshake_deadline: Duration,
    /// Authenticated connections served at once; more are refused.
    pub connections: usize,
    /// Time for a request to arrive whole once its first byte has, and for
    /// a reply to leave; a connection that takes longer is closed. Between
    /// requests, an authenticated connection may stay idle for ever.
    pub request_deadline: Duration,
}

impl Default for Limits {
    /// Sized so that a daemon stays under 300 threads: 64 handshakes and
    /// 192 connections (a compute node holds two per memory node).
    fn default() -> Self {
        Self {
            handshakes: 64,
            handshake_deadline: Duration::from_secs(10),
            connections: 192,
            request_deadline: Duration::from_secs(30),
        }
    }
}

impl Limits {
    /// The most connection threads these limits allow at once.
    pub fn max_threads(&self) -> usize {
        self.handshakes + self.connections
    }
}

/// Connections a server has closed or refused to stay within its limits.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Refusals {
    /// Handshakes dropped to make room for a newer connection.
    pub evicted: u64,
    /// Handshakes closed at their deadline.
    pub expired: u64,
    /// Authenticated connections refused at the connection cap.
    pub over_cap: u64,
}

struct Pending {
    sock: TcpStream,
    since: Instant,
    /// Shut down already (evicted or expired); its thread is on its way out.
    closed: bool,
}

#[derive(Default)]
struct State {
    /// By arrival, oldest first.
    handshaking: BTreeMap<u64, Pending>,
    next: u64,
    serving: usize,
    stopped: bool,
}

/// The admission state of one server ([`super::Listener`]).
pub(crate) struct Gate {
    limits: Limits,
    name: String,
    st: Mutex<State>,
    /// Signalled when a handshake leaves the pool, and on stop.
    left: Condvar,
    /// Signalled on stop only: the reaper sleeps until the next deadline.
    stopping: Condvar,
    evicted: AtomicU64,
    expired: AtomicU64,
    over_cap: AtomicU64,
    /// Refusals logged at a bounded rate: under a flood, a line per
    /// connection would bury everything else.
    log: Mutex<LogBudget>,
}

/// A token bucket for log lines: [`LogBudget::BURST`] lines at once, then
/// one per [`LogBudget::EVERY`]; a line logged after some were suppressed
/// says how many.
#[derive(Debug)]
struct LogBudget {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

impl LogBudget {
    const BURST: f64 = 10.0;
    const EVERY: Duration = Duration::from_secs(1);

    fn new() -> Self {
        Self {
            tokens: Self::BURST,
            at: Instant::now(),
            suppressed: 0,
        }
    }

    /// `Some(suppressed since the last line)` if a line may be logged now.
    fn take(&mut self, now: Instant) -> Option<u64> {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() / Self::EVERY.as_secs_f64();
        self.tokens = (self.tokens + earned).min(Self::BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A connection's place in the handshake pool; leaves it when dropped.
pub(crate) struct Ticket {
    gate: Arc<Gate>,
    seq: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        lock(&self.gate.st).handshaking.remove(&self.seq);
        self.gate.left.notify_all();
    }
}

/// A connection's place among the authenticated ones; leaves it when dropped.
pub(crate) struct Slot {
    gate: Arc<Gate>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.gate.st).serving -= 1;
    }
}

impl Gate {
    pub(crate) fn new(name: &str, limits: Limits) -> Self {
        let limits = Limits {
            handshakes: limits.handshakes.max(1),
            connections: limits.connections.max(1),
            ..limits
        };
        Self {
            limits,
            name: name.to_string(),
            st: Mutex::new(State::default()),
            left: Condvar::new(),
            stopping: Condvar::new(),
            evicted: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            over_cap: AtomicU64::new(0),
            log: Mutex::new(LogBudget::new()),
        }
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Logs a refusal at a bounded rate.
    pub(crate) fn refused(&self, why: impl std::fmt::Display) {
        match lock(&self.log).take(Instant::now()) {
            Some(0) => tracing::warn!("{}: {why}", self.name),
            Some(n) => tracing::warn!("{}: {why} ({n} more refusals not logged)", self.name),
            None => {}
        }
    }

    pub(crate) fn refusals(&self) -> Refusals {
        Refusals {
            evicted: self.evicted.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
            over_cap: self.over_cap.load(Ordering::Relaxed),
        }
    }

    /// Connections in their handshake, and authenticated ones.
    pub(crate) fn occupancy(&self) -> (usize, usize) {
        let st = lock(&self.st);
        (st.handshaking.len(), st.serving)
    }

    /// Enters a new connection in the handshake pool. If the pool is full,
    /// the oldest handshake is shut down, and this waits until its thread
    /// has left, so the pool never holds more than its limit. `None` once
    /// the server stops.
    pub(crate) fn admit(self: &Arc<Self>, sock: &TcpStream) -> std::io::Result<Option<Ticket>> {
        let handle = sock.try_clone()?;
        let mut st = lock(&self.st);
        while st.handshaking.len() >= self.limits.handshakes && !st.stopped {
            if self.close_oldest(&mut st) {
                self.evicted.fetch_add(1, Ordering::Relaxed);
                self.refused(format_args!(
                    "{} connections in their handshake: dropped the oldest",
                    self.limits.handshakes
                ));
            }
            st = self
                .left
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if st.stopped {
            return Ok(None);
        }
        let seq = st.next;
        st.next += 1;
        st.handshaking.insert(
            seq,
            Pending {
                sock: handle,
                since: Instant::now(),
                closed: false,
            },
        );
        Ok(Some(Ticket {
            gate: Arc::clone(self),
            seq,
        }))
    }

    /// Shuts down the oldest handshake not already closed; false if none.
    fn close_oldest(&self, st: &mut State) -> bool {
        match st.handshaking.values_mut().find(|p| !p.closed) {
            Some(p) => {
                let _ = p.sock.shutdown(Shutdown::Both);
                p.closed = true;
                true
            }
            None => false,
        }
    }

    /// Frees a file descriptor when `accept` ran out of them: drops the
    /// oldest handshake.
    pub(crate) fn shed(&self) {
        let mut st = lock(&self.st);
        if self.close_oldest(&mut st) {
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A place among the authenticated connections, if there is room.
    pub(crate) fn slot(self: &Arc<Self>) -> Option<Slot> {
        let mut st = lock(&self.st);
        if st.serving >= self.limits.connections {
            drop(st);
            self.over_cap.fetch_add(1, Ordering::Relaxed);
            self.refused(format_args!(
                "{} authenticated connections: refusing another",
                self.limits.connections
            ));
            return None;
        }
        st.serving += 1;
        Some(Slot { gate: Arc::clone(self) })
    }

    /// Shuts down each handshake at its deadline, until [`Gate::stop`].
    pub(crate) fn reap(&self) {
        let deadline = self.limits.handshake_deadline;
        let mut st = lock(&self.st);
        while !st.stopped {
            let now = Instant::now();
            let mut next = now + deadline;
            let mut expired = 0;
            for p in st.handshaking.values_mut().filter(|p| !p.closed) {
                let due = p.since + deadline;
                if due <= now {
                    let _ = p.sock.shutdown(Shutdown::Both);
                    p.closed = true;
                    expired += 1;
                } else {
                    next = next.min(due);
                }
            }
            if expired > 0 {
                self.expired.fetch_add(expired, Ordering::Relaxed);
                self.refused(format_args!(
                    "closed {expired} connection(s) that did not finish their handshake within {deadline:?}"
                ));
            }
            // A handshake admitted meanwhile is due after `next`.
            let wait = next
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            st = self
                .stopping
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Ends [`Gate::reap`] and any [`Gate::admit`] waiting for room.
    pub(crate) fn stop(&self) {
        lock(&self.st).stopped = true;
        self.left.notify_all();
        self.stopping.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_budget_allows_a_burst_then_one_line_a_second() {
        let mut b = LogBudget::new();
        let t = b.at;
        for _ in 0..10 {
            assert_eq!(b.take(t), Some(0));
        }
        assert_eq!(b.take(t), None);
        assert_eq!(b.take(t + Duration::from_millis(500)), None);
        assert_eq!(b.take(t + Duration::from_millis(1100)), Some(2));
        assert_eq!(b.take(t + Duration::from_millis(1200)), None);
    }
}
