//! The READ and WRITE throughput phase: requests pipelined over several
//! connections, the two sides alternating in windows, and the read-back of
//! everything written.

use super::cpu;
use std::collections::VecDeque;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use remora_proto::ByteSize;

use super::pattern::Image;
use super::stats::{self, Tally};
use super::{Checked, Endpoint, Names, NetArgs, Remora, Side, progress, to_usize};

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Read,
    Write,
}

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Read => "READ",
            Self::Write => "WRITE",
        }
    }
}

/// The part of the region one connection's requests cycle through: blocks
/// `first`, `first + step`, ... in order, wrapping around.
#[derive(Debug, Clone, Copy)]
struct Stripe {
    first: u64,
    step: u64,
    len: u64,
    size: u64,
    sent: u64,
}

impl Stripe {
    fn all(slots: u64, conns: u64, size: u64) -> Vec<Stripe> {
        (0..conns)
            .map(|first| Stripe {
                first,
                step: conns,
                len: (slots - first).div_ceil(conns),
                size,
                sent: 0,
            })
            .collect()
    }

    fn next_offset(&mut self) -> u64 {
        let k = self.sent % self.len;
        self.sent += 1;
        (self.first + k * self.step) * self.size
    }

    /// True once the stripe's `i`-th block has been the target of a request.
    fn touched(&self, i: u64) -> bool {
        self.sent > i
    }
}

/// Parameters shared by the throughput phases.
pub(super) struct TputParams {
    pub(super) size: usize,
    pub(super) depth: u32,
    pub(super) conns: u32,
    pub(super) slices: u32,
    pub(super) slice: Duration,
    pub(super) warmup: Duration,
    pub(super) verify_every: u64,
    pub(super) slots: u64,
}

impl TputParams {
    /// The phase's parameters from the flags, with requests of `size`.
    pub(super) fn new(args: &NetArgs, size: ByteSize) -> anyhow::Result<Self> {
        Ok(Self {
            size: to_usize(size.0)?,
            depth: args.depth,
            conns: args.conns,
            slices: args.slices,
            slice: args.duration / args.slices,
            warmup: (args.duration / 10).clamp(Duration::from_millis(50), Duration::from_millis(300)),
            verify_every: args.verify_every,
            slots: args.region_size.0 / size.0,
        })
    }

    /// Requests in flight on connection `j`.
    fn depth_of(&self, j: usize) -> usize {
        let (d, c) = (self.depth as usize, self.conns as usize);
        d / c + usize::from(j < d % c)
    }
}

/// The results of one throughput phase.
pub(super) struct TputRow {
    pub(super) op: Op,
    pub(super) raw: Tally,
    pub(super) remora: Tally,
    /// Each window pair's ratio (subject ÷ base), in the order they ran.
    pub(super) windows: Vec<f64>,
}

impl TputRow {
    /// The whole phase's ratio: all bytes over all time, per side.
    pub(super) fn ratio(&self) -> f64 {
        self.remora.gbps() / self.raw.gbps().max(1e-12)
    }

    /// The median of the window pairs' ratios (the whole ratio without
    /// windows): a window the machine disturbs moves it little.
    pub(super) fn median_ratio(&self) -> f64 {
        stats::median(&self.windows).unwrap_or_else(|| self.ratio())
    }

    /// The smallest and largest window pair ratio.
    pub(super) fn window_range(&self) -> (f64, f64) {
        stats::range(&self.windows).unwrap_or((self.ratio(), self.ratio()))
    }
}

/// Runs one throughput phase on both sides. Reads are checked against
/// `old`; writes store `new`, and afterwards each side's region is read
/// back and checked against `new` where it was written and `old` elsewhere.
/// With `server`, the process both sides talk to, each window's tally also
/// has that process's CPU time.
#[allow(clippy::too_many_arguments)]
pub(super) fn throughput_phase<B: Endpoint>(
    tp: &TputParams,
    op: Op,
    raw: &mut [B],
    rem: &mut [Remora],
    names: Names,
    old: &Image,
    new: &Image,
    verified: &mut Checked,
    server: Option<u32>,
) -> anyhow::Result<TputRow> {
    let conns = u64::from(tp.conns);
    let mut raw_stripes = Stripe::all(tp.slots, conns, tp.size as u64);
    let mut rem_stripes = raw_stripes.clone();
    let src = if op == Op::Read { old } else { new };
    progress(format_args!(
        "throughput {}: warming up {:.1?} per side, then {} windows of {:.1?} per side",
        op.name(),
        tp.warmup,
        tp.slices,
        tp.slice
    ));
    let mut row = TputRow {
        op,
        raw: Tally::default(),
        remora: Tally::default(),
        windows: Vec::new(),
    };
    for (s, dur) in std::iter::once((None, tp.warmup)).chain((0..tp.slices).map(|s| (Some(s), tp.slice))) {
        let mut pair = [0.0f64; 2];
        for side in Side::order(s.unwrap_or(0) % 2 == 0) {
            let cpu_before = server.map(cpu::process_cpu).transpose()?;
            let (mut t, checked) = match side {
                Side::Raw => run_side(tp, op, raw, &mut raw_stripes, dur, src)?,
                Side::Remora => run_side(tp, op, rem, &mut rem_stripes, dur, src)?,
            };
            if let (Some(pid), Some(before)) = (server, cpu_before) {
                t.server_cpu = Some(cpu::process_cpu(pid)?.saturating_sub(before));
            }
            verified.replies += checked;
            if s.is_some() {
                match side {
                    Side::Raw => {
                        pair[0] = t.gbps();
                        row.raw.add(t);
                    }
                    Side::Remora => {
                        pair[1] = t.gbps();
                        row.remora.add(t);
                    }
                }
            }
        }
        if s.is_some() && pair[0] > 0.0 {
            row.windows.push(pair[1] / pair[0]);
        }
    }
    progress(format_args!(
        "throughput {}: {} {:.2} GB/s, {} {:.2} GB/s",
        op.name(),
        names.subject,
        row.remora.gbps(),
        names.base,
        row.raw.gbps()
    ));
    if op == Op::Write {
        progress(format_args!(
            "throughput WRITE: reading both regions back to check what was written"
        ));
        verified.replies += read_back(tp, names.base, &mut raw[0], &raw_stripes, old, new)?;
        verified.replies += read_back(tp, names.subject, &mut rem[0], &rem_stripes, old, new)?;
    }
    Ok(row)
}

/// One window of one side: a pipeline per connection, each on its own thread.
/// Returns the tally and how many replies were checked.
fn run_side<E: Endpoint>(
    tp: &TputParams,
    op: Op,
    ends: &mut [E],
    stripes: &mut [Stripe],
    dur: Duration,
    src: &Image,
) -> anyhow::Result<(Tally, u64)> {
    thread::scope(|s| {
        let handles: Vec<_> = ends
            .iter_mut()
            .zip(stripes.iter_mut())
            .enumerate()
            .map(|(j, (e, st))| {
                let depth = tp.depth_of(j);
                thread::Builder::new()
                    .name(format!("bench-conn{j}"))
                    .spawn_scoped(s, move || pipeline(e, op, tp, depth, st, dur, src))
            })
            .collect::<Result<_, _>>()?;
        let mut total = Tally::default();
        let mut checked = 0;
        for h in handles {
            let (t, c) = h.join().map_err(|_| anyhow!("a benchmark thread panicked"))??;
            total.ops += t.ops;
            total.bytes += t.bytes;
            total.time = total.time.max(t.time);
            checked += c;
        }
        Ok((total, checked))
    })
}

/// Keeps `depth` requests in flight on one connection for `dur`. Only
/// replies that arrive before the window closes count; the rest are drained.
fn pipeline<E: Endpoint>(
    e: &mut E,
    op: Op,
    tp: &TputParams,
    depth: usize,
    stripe: &mut Stripe,
    dur: Duration,
    src: &Image,
) -> anyhow::Result<(Tally, u64)> {
    let size = tp.size;
    let mut buf = vec![0u8; size];
    let send = |e: &mut E, stripe: &mut Stripe| -> anyhow::Result<(E::Ticket, u64)> {
        let off = stripe.next_offset();
        let t = match op {
            Op::Read => e.send_read(off, size)?,
            Op::Write => e.send_write(off, src.at(off, size))?,
        };
        Ok((t, off))
    };
    let mut queue = VecDeque::with_capacity(depth);
    let start = Instant::now();
    let end = start + dur;
    for _ in 0..depth {
        queue.push_back(send(e, stripe)?);
    }
    let mut ops = 0u64;
    let mut checked = 0u64;
    let time = loop {
        let Some((t, off)) = queue.pop_front() else {
            bail!("pipeline emptied");
        };
        match op {
            Op::Read => {
                e.wait_read(t, &mut buf)?;
                if ops % tp.verify_every == 0 {
                    src.check("throughput read", off, &buf)?;
                    checked += 1;
                }
            }
            Op::Write => e.wait_write(t)?,
        }
        ops += 1;
        let now = Instant::now();
        if now >= end {
            break now - start;
        }
        queue.push_back(send(e, stripe)?);
    };
    for (t, _) in queue {
        match op {
            Op::Read => e.wait_read(t, &mut buf)?,
            Op::Write => e.wait_write(t)?,
        }
    }
    Ok((
        Tally {
            ops,
            bytes: ops * size as u64,
            time,
            server_cpu: None,
        },
        checked,
    ))
}

/// Reads every block of the throughput working set back and checks it
/// against `new` where a write was sent, `old` elsewhere.
fn read_back<E: Endpoint>(
    tp: &TputParams,
    side: &str,
    e: &mut E,
    stripes: &[Stripe],
    old: &Image,
    new: &Image,
) -> anyhow::Result<u64> {
    let conns = u64::from(tp.conns);
    let mut buf = vec![0u8; tp.size];
    for slot in 0..tp.slots {
        let written = stripes[(slot % conns) as usize].touched(slot / conns);
        let off = slot * tp.size as u64;
        e.read(off, &mut buf)?;
        let want = if written { new } else { old };
        want.check(&format!("{side} read-back after writes"), off, &buf)?;
    }
    Ok(tp.slots)
}

#[cfg(test)]
mod tput_tests {
    use super::*;

    #[test]
    fn median_and_range_of_window_ratios() {
        let tally = |bytes| Tally {
            ops: 1,
            bytes,
            time: Duration::from_secs(1),
            server_cpu: None,
        };
        let mut row = TputRow {
            op: Op::Read,
            raw: tally(4),
            remora: tally(3),
            windows: Vec::new(),
        };
        assert_eq!(row.median_ratio(), 0.75, "no windows: the whole ratio");
        row.windows = vec![0.9, 0.5, 0.7, 1.3];
        assert!((row.median_ratio() - 0.8).abs() < 1e-12);
        assert_eq!(row.window_range(), (0.5, 1.3));
    }
}
