//! Several stores measured in alternating rounds (`--rounds`), closed loop
//! or open loop at one offered rate.
//!
//! On this shared 2-core machine one store's throughput moves by 10–20 %
//! from one 10 s run to the next, so the ratio of two runs taken one after
//! the other cannot tell a 10 % difference from the machine's drift. Here
//! every store (remora schemes, compaction-thread counts, the Redis
//! baseline) is filled first and paused; then each round gives each store a
//! window of `--duration` ÷ rounds in turn, the order reversed every other
//! round, while the others stay paused: a remora runtime's filtering and
//! compaction are stopped (`Runtime::pause_background`) and a Redis group
//! has no client. Each store's windows are joined into one record (counts
//! and histograms add up, the counters of the gaps between windows are
//! left out) and each window's throughput is kept, so each round yields
//! one throughput ratio per pair of stores measured seconds apart
//! (`rounds.rs` prints their medians).

use std::time::Duration;

use anyhow::{Context, anyhow};
use rand_distr::Zipf;

use super::cache_sim::SimMisses;
use super::record::Record;
use super::worker::{self, Run, Snaps, Store};
use super::{MicroArgs, Plan, progress};

/// Warm-up of every window after a store's first (capped by `--warmup`).
const SETTLE: Duration = Duration::from_millis(300);

/// A snapshot whose counters can be subtracted, so windows measured apart
/// join into one run.
pub(crate) trait Counters: Sized {
    /// The counters of `self` minus those of `earlier`; the levels of `self`.
    fn since(&self, earlier: &Self) -> Self;
}

/// A filled store that can be measured in windows and recorded.
pub(crate) trait Recorded: Store<Snap: Counters> {
    /// Stops (`true`) or resumes the store's background work while another
    /// store's window runs.
    fn pause(&self, _on: bool) {}
    /// The record of a measured run of the store (its windows joined),
    /// with the caches simulated over its access stream.
    fn record(
        &self,
        scheme: &str,
        fill_time: Duration,
        run: Run,
        sim: SimMisses,
        snaps: &Snaps<Self::Snap>,
    ) -> anyhow::Result<Record>;
}

/// One filled store and its windows so far.
pub(crate) struct Entry<S: Recorded> {
    scheme: String,
    store: S,
    fill_time: Duration,
    windows: Vec<(Run, Snaps<S::Snap>)>,
}

impl<S: Recorded> Entry<S> {
    /// A filled store, paused at once: its background work (a remora
    /// runtime's filtering and compaction) must not run while the other
    /// stores fill, nor between its windows.
    pub(crate) fn new(scheme: &str, store: S, fill_time: Duration) -> Self {
        store.pause(true);
        Self {
            scheme: scheme.to_string(),
            store,
            fill_time,
            windows: Vec::new(),
        }
    }
}

/// What the rounds need of a store, whatever its type.
pub(crate) trait Contestant {
    fn scheme(&self) -> &str;
    fn pause(&self, on: bool);
    /// Measures one window with `args`' warm-up and duration, closed loop or
    /// open loop at `offered` ops/s.
    fn window(
        &mut self,
        args: &MicroArgs,
        plan: &Plan,
        zipf: Option<&Zipf<f64>>,
        offered: Option<f64>,
    ) -> anyhow::Result<()>;
    /// One record of every window, each window's throughput in `rounds`.
    fn finish(self: Box<Self>, args: &MicroArgs, plan: &Plan, zipf: Option<&Zipf<f64>>) -> anyhow::Result<Record>;
}

impl<S: Recorded> Contestant for Entry<S> {
    fn scheme(&self) -> &str {
        &self.scheme
    }

    fn pause(&self, on: bool) {
        self.store.pause(on);
    }

    fn window(
        &mut self,
        args: &MicroArgs,
        plan: &Plan,
        zipf: Option<&Zipf<f64>>,
        offered: Option<f64>,
    ) -> anyhow::Result<()> {
        let w = worker::measure(args, &self.store, &plan.perm, zipf, offered)?;
        self.windows.push(w);
        Ok(())
    }

    fn finish(self: Box<Self>, args: &MicroArgs, plan: &Plan, zipf: Option<&Zipf<f64>>) -> anyhow::Result<Record> {
        let rates: Vec<f64> = self.windows.iter().map(|(run, _)| run.throughput()).collect();
        let (mut run, snaps) = join_windows(self.windows)?;
        let sim = super::simulate(args, plan, &self.scheme, &mut run, zipf);
        let mut rec = self.store.record(&self.scheme, self.fill_time, run, sim, &snaps)?;
        rec.rounds = rates;
        Ok(rec)
    }
}

/// Measures `stores` (each filled and paused by [`Entry::new`]) in `args.rounds` alternating
/// rounds, closed loop or open loop at `offered` ops/s; one record per
/// store, in order.
pub(crate) fn run(
    args: &MicroArgs,
    plan: &Plan,
    mut stores: Vec<Box<dyn Contestant + '_>>,
    offered: Option<f64>,
) -> anyhow::Result<Vec<Record>> {
    let zipf = worker::zipf(args, plan.n)?;
    let rounds = args.rounds.max(1);
    let window = args.duration / rounds;
    let names: Vec<&str> = stores.iter().map(|s| s.scheme()).collect();
    progress(format_args!(
        "[{}] {rounds} alternating rounds of {:.1} s each",
        names.join(", "),
        window.as_secs_f64()
    ));
    for r in 0..rounds {
        let mut order: Vec<usize> = (0..stores.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for i in order {
            // The first window warms the store up for at least a window
            // (after a 1 s warm-up, a first 6 s window ran 18 % below the
            // later ones with no fold in any window; after 5 s, it did not);
            // later ones resume a store frozen in its steady state after a
            // short settle. Neither is counted.
            let a = MicroArgs {
                duration: window,
                warmup: if r == 0 {
                    args.warmup.max(window)
                } else {
                    args.warmup.min(SETTLE)
                },
                seed: args.seed.wrapping_add(u64::from(r)),
                ..args.clone()
            };
            let s = &mut stores[i];
            s.pause(false);
            let measured = s.window(&a, plan, zipf.as_ref(), offered);
            s.pause(true);
            measured.with_context(|| format!("{}: round {}", s.scheme(), r + 1))?;
        }
    }
    stores
        .into_iter()
        .map(|s| {
            s.pause(false);
            s.finish(args, plan, zipf.as_ref())
        })
        .collect()
}

/// One store's windows as one run: counts add up, the counters' deltas
/// leave out what happened between windows, samples join end to end (their
/// times shifted by the windows before).
fn join_windows<T: Counters>(ws: Vec<(Run, Snaps<T>)>) -> anyhow::Result<(Run, Snaps<T>)> {
    let mut it = ws.into_iter();
    let (mut run, mut snaps) = it.next().ok_or_else(|| anyhow!("no window measured"))?;
    // Counters between windows (the settles, and anything a paused store
    // did), taken out of the whole span's at the end.
    let mut gaps = Vec::new();
    for (r, s) in it {
        let shift = run.elapsed.as_secs_f64();
        let ops_shift = snaps.at.last().map_or(snaps.ops0, |&(_, o)| o);
        gaps.push(s.first.since(&snaps.last));
        snaps.at.extend(
            s.at.iter()
                .map(|&(t, o)| (t + shift, ops_shift + o.saturating_sub(s.ops0))),
        );
        snaps.samples.extend(s.samples);
        snaps.last = s.last;
        run.append(r)?;
    }
    let mut counted = snaps.last.since(&snaps.first);
    for g in &gaps {
        counted = counted.since(g);
    }
    // Records take deltas from first to last: hand them a zero base.
    snaps.first = counted.since(&counted);
    snaps.last = counted;
    Ok((run, snaps))
}
