//! How busy this memory node is: the CPU time its process used over a short
//! sliding window, as compute nodes see it in [`NodeLoad`].
//!
//! A compute node chooses where compaction computes parity deltas from it
//! (on the memory nodes while they have CPU to spare, on itself otherwise),
//! so the figure must follow a change within a poll or two and must not
//! swing with every scheduler tick: a sample every [`SAMPLE`], averaged over
//! the last [`WINDOW`].
//!
//! The source is `/proc/self/stat` (user plus system time of every thread
//! of the process), read without `unsafe`. Its unit is the kernel's
//! `USER_HZ`, which Linux fixes at 100 for user space on every architecture
//! it supports; reading it through `sysconf` would need `libc` and
//! `unsafe`. Where there is no `/proc`, the node reports 0.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use remora_proto::msg::NodeLoad;

/// Time between samples.
pub(crate) const SAMPLE: Duration = Duration::from_millis(100);
/// What the reported figure averages over.
pub(crate) const WINDOW: Duration = Duration::from_millis(500);
/// `/proc` clock ticks per second (`USER_HZ`; see the module docs).
const TICKS_PER_SEC: u64 = 100;

/// The node's CPU use, as last measured.
#[derive(Debug)]
pub(crate) struct CpuMeter {
    permille: AtomicU32,
    cores: u32,
}

impl Default for CpuMeter {
    fn default() -> Self {
        Self {
            permille: AtomicU32::new(0),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        }
    }
}

impl CpuMeter {
    /// The last measurement.
    pub(crate) fn load(&self) -> NodeLoad {
        NodeLoad {
            cpu_permille: self.permille.load(Ordering::Relaxed),
            cores: self.cores,
        }
    }

    /// Samples until `stop`; `sleep` waits one sample period (the caller's
    /// thread parks, so stopping can wake it).
    pub(crate) fn run(&self, stop: &AtomicBool, sleep: impl Fn(Duration)) {
        let mut w = Window::default();
        let mut warned = false;
        while !stop.load(Ordering::Acquire) {
            match process_cpu() {
                Some(cpu) => {
                    if let Some(p) = w.push(Instant::now(), cpu) {
                        self.permille.store(p, Ordering::Relaxed);
                    }
                }
                None if !warned => {
                    tracing::warn!("cannot read /proc/self/stat: this node reports its CPU use as 0");
                    warned = true;
                }
                None => {}
            }
            sleep(SAMPLE);
        }
    }
}

/// Samples of the process's CPU time over the last [`WINDOW`].
#[derive(Debug, Default)]
struct Window {
    samples: VecDeque<(Instant, Duration)>,
}

impl Window {
    /// Adds a sample; returns the CPU use since the oldest sample within the
    /// window, in thousandths of a core (`None` until two samples exist).
    fn push(&mut self, at: Instant, cpu: Duration) -> Option<u32> {
        self.samples.push_back((at, cpu));
        // Keep one sample at or before the window's start, so the average
        // covers the whole window.
        while self.samples.len() > 2 && at.duration_since(self.samples[1].0) >= WINDOW {
            self.samples.pop_front();
        }
        let &(t0, c0) = self.samples.front()?;
        let wall = at.duration_since(t0);
        if wall.is_zero() {
            return None;
        }
        let used = cpu.saturating_sub(c0);
        Some((used.as_nanos() * 1000 / wall.as_nanos()).min(u32::MAX as u128) as u32)
    }
}

/// CPU time (user plus system) the process used since it started.
fn process_cpu() -> Option<Duration> {
    cpu_time_of("self")
}

/// User plus system CPU time a process has used so far (every thread), from
/// `/proc/<pid>/stat`, at the kernel's 10 ms tick; `pid` is a process id or
/// `"self"`. `None` where there is no such process or no `/proc`. Benchmarks
/// use it to charge the memory nodes' (or Redis servers') CPU to the run.
pub fn cpu_time_of(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = parse_stat(&stat)?;
    Some(Duration::from_millis(ticks.checked_mul(1000)? / TICKS_PER_SEC))
}

/// utime + stime, in ticks, from a `/proc/<pid>/stat` line. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted
/// from the last `)`: after it come field 3 (state) onwards, and utime and
/// stime are fields 14 and 15.
fn parse_stat(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    utime.checked_add(stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_utime_and_stime_past_an_odd_command_name() {
        let line = "4242 (memnode (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 9 0 123 4096 10 0";
        assert_eq!(parse_stat(line), Some(287));
        assert_eq!(parse_stat("4242 (short) S 1 2"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn reads_this_process() {
        // Linux CI: the figure exists and moves forward.
        let Some(a) = process_cpu() else { return };
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(process_cpu().unwrap() >= a);
    }

    #[test]
    fn averages_over_the_window() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut w = Window::default();
        assert_eq!(w.push(t, ms(0)), None);
        // Half a core for 100 ms.
        assert_eq!(w.push(t + ms(100), ms(50)), Some(500));
        // Then a full core: the average covers both.
        assert_eq!(w.push(t + ms(200), ms(150)), Some(750));
        // Idle for a whole window: the busy past has left it.
        for i in 3..=8 {
            w.push(t + ms(100 * i), ms(150));
        }
        assert_eq!(w.push(t + ms(900), ms(150)), Some(0));
        assert!(w.samples.len() <= 7, "old samples are dropped: {}", w.samples.len());
        // Two cores busy.
        assert_eq!(w.push(t + ms(1000), ms(350)), Some(400));
    }
}
