//! The recovery driver every redundant scheme uses: when a memory node dies,
//! each (group, position) it held is rebuilt on a replacement region, the
//! positions in parallel, each retried a few times. The scheme supplies the
//! rebuild of one position; the driver owns the threads, counts, and joins
//! them when the runtime stops (no recovery outlives its runtime).
//!
//! [`rebuild`] is the rebuild of one position that every erasure-coded
//! scheme shares: the replacement node itself reads k survivors (with
//! read-only capabilities delegated from ours) and decodes, and every shard
//! it rebuilt is checked against the checksum recorded when it was written.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use remora_proto::{NodeId, RebuildRow, RebuildSource, RegionGrant};

use super::SchemeReport;
use super::placement::Placement;
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;

/// Attempts per position before it is left degraded.
const ATTEMPTS: usize = 5;

/// Row bytes per offloaded rebuild request.
const REBUILD_REQUEST_BYTES: u64 = 32 << 20;

/// Counters of recoveries, for [`super::SchemeReport`].
#[derive(Debug, Default)]
pub(crate) struct RecoveryStats {
    pub(crate) rebuilt_bytes: AtomicU64,
    pub(crate) nanos: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) running: AtomicU64,
    pub(crate) retries: AtomicU64,
}

/// Runs and joins recoveries.
#[derive(Default)]
pub(crate) struct Recovery {
    pub(crate) stats: Arc<RecoveryStats>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl RecoveryStats {
    /// The recovery half of a [`SchemeReport`] (the rest left default).
    pub(crate) fn report(&self) -> SchemeReport {
        SchemeReport {
            reconstructed_bytes: self.rebuilt_bytes.load(Ordering::Relaxed),
            reconstruct_time: Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
            recoveries: self.finished.load(Ordering::Relaxed),
            recovering: self.running.load(Ordering::Relaxed),
            rebuild_retries: self.retries.load(Ordering::Relaxed),
            ..SchemeReport::default()
        }
    }
}

impl Recovery {
    /// Memory node `node` died: marks its positions in `place` failed and
    /// rebuilds each with `rebuild(lost)` (RS(k, m) stripes), which returns
    /// the bytes it rebuilt.
    pub(crate) fn node_failed<F>(
        &self,
        scheme: &'static str,
        (k, m): (usize, usize),
        place: &Placement,
        node: NodeId,
        rebuild: F,
    ) where
        F: Fn(&Lost) -> Result<u64, RuntimeError> + Send + Sync + 'static,
    {
        let affected = place.fail_node(node);
        if affected.is_empty() {
            return;
        }
        tracing::warn!(
            "{scheme}: {node} died; rebuilding {} stripe-group positions",
            affected.len()
        );
        let (stats, stop) = (Arc::clone(&self.stats), Arc::clone(&self.stop));
        stats.running.fetch_add(1, Ordering::Relaxed);
        let spawned = thread::Builder::new().name("remora-recovery".into()).spawn(move || {
            let started = Instant::now();
            thread::scope(|s| {
                for (g, pos) in affected {
                    let (stats, stop, rebuild) = (&stats, &stop, &rebuild);
                    s.spawn(move || {
                        for attempt in 0..ATTEMPTS {
                            if stop.load(Ordering::Acquire) {
                                return;
                            }
                            let lost = Lost {
                                scheme,
                                k,
                                m,
                                group: g,
                                pos,
                                attempt,
                            };
                            match rebuild(&lost) {
                                Ok(bytes) => {
                                    stats.rebuilt_bytes.fetch_add(bytes, Ordering::Relaxed);
                                    return;
                                }
                                Err(e) => {
                                    stats.retries.fetch_add(1, Ordering::Relaxed);
                                    tracing::error!("{scheme}: rebuilding group {g} position {pos} failed: {e}");
                                    thread::sleep(Duration::from_millis(200));
                                }
                            }
                        }
                    });
                }
            });
            stats
                .nanos
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            stats.running.fetch_sub(1, Ordering::Relaxed);
            stats.finished.fetch_add(1, Ordering::Relaxed);
        });
        match spawned {
            Ok(h) => {
                let mut t = self.threads.lock().unwrap_or_else(|p| p.into_inner());
                t.retain(|h| !h.is_finished());
                t.push(h);
            }
            Err(e) => {
                tracing::error!("cannot start recovery: {e}");
                self.stats.running.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Stops retrying and waits for every recovery thread.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// A position to rebuild, and the code its stripes use.
pub(crate) struct Lost {
    pub(crate) scheme: &'static str,
    pub(crate) k: usize,
    pub(crate) m: usize,
    pub(crate) group: usize,
    pub(crate) pos: usize,
    /// Which attempt this is: a retry reads another set of survivors.
    pub(crate) attempt: usize,
}

/// Rebuilds `lost` on a replacement region and rebinds its region index
/// there; returns the bytes rebuilt. `rows(survivors)` lists what to
/// rebuild, with each shard's checksum as written (`None` where the scheme
/// does not know it: parity updated in place): a row's `offsets` and
/// `lens` follow `survivors`, the positions read.
pub(crate) fn rebuild(
    far: &FarMemory,
    place: &Placement,
    lost: &Lost,
    rows: impl FnOnce(&[usize]) -> Vec<(RebuildRow, Option<u64>)>,
) -> Result<u64, RuntimeError> {
    let start = Instant::now();
    let grant = place.replacement(far, lost.group)?;
    let region = grant.cap.region;
    let res = rebuild_on(far, place, lost, grant, rows, start);
    if res.is_err() {
        // Give the unused replacement back; a retry asks for another.
        far.give_back(region);
    }
    res
}

fn rebuild_on(
    far: &FarMemory,
    place: &Placement,
    lost: &Lost,
    grant: RegionGrant,
    rows: impl FnOnce(&[usize]) -> Vec<(RebuildRow, Option<u64>)>,
    start: Instant,
) -> Result<u64, RuntimeError> {
    let &Lost {
        scheme,
        k,
        m,
        group: g,
        pos,
        attempt,
    } = lost;
    let client = far.regions.connect(&grant.addr)?;
    let grp = place.group(g);
    // Data survivors first: the cheapest decode.
    let mut cands: Vec<usize> = (0..k + m).filter(|&p| p != pos && !grp.failed[p]).collect();
    cands.sort_by_key(|&p| p >= k);
    if cands.len() < k {
        return Err(RuntimeError::DataLost(format!(
            "{scheme} stripe group {g}: {} survivors, {k} needed (more failures than parity covers)",
            cands.len()
        )));
    }
    // A retry (after a rebuilt shard failed its checksum) tries another
    // set of survivors: one of them was corrupt.
    let spare = cands.len() - k;
    cands.rotate_left(attempt % (spare + 1));
    cands.truncate(k);
    let sources: Vec<RebuildSource> = cands
        .iter()
        .map(|&p| {
            let r = far.regions.get(grp.regions[p]);
            RebuildSource {
                index: p as u8,
                addr: r.grant.addr.clone(),
                cap: r.grant.cap.read_only(),
            }
        })
        .collect();
    let mut rows = rows(&cands);
    rows.sort_by_key(|(r, _)| r.offset);
    let mut rebuilt = 0u64;
    for batch in rows.chunk_by(|a, b| {
        // Keep requests near REBUILD_REQUEST_BYTES of rows each.
        a.0.offset / REBUILD_REQUEST_BYTES == b.0.offset / REBUILD_REQUEST_BYTES
    }) {
        let (rows, expect): (Vec<RebuildRow>, Vec<Option<u64>>) = batch.iter().cloned().unzip();
        let offsets: Vec<u64> = rows.iter().map(|r| r.offset).collect();
        let (n, sums) = client.rebuild(
            grant.cap,
            k as u8,
            m as u8,
            pos as u8,
            sources.clone(),
            rows,
            Duration::from_secs(120),
        )?;
        if let Some(i) = (0..expect.len()).find(|&i| expect[i].is_some_and(|e| sums.get(i) != Some(&e))) {
            return Err(RuntimeError::DataLost(format!(
                "rebuilt shard {pos} of group {g} at offset {} failed its checksum",
                offsets[i]
            )));
        }
        rebuilt += n;
    }
    let node = grant.node;
    place.rebind(far, g, pos, grant)?;
    tracing::info!(
        "{scheme}: rebuilt group {g} position {pos} ({} rows, {rebuilt} bytes) on {node} in {:?}",
        rows.len(),
        start.elapsed()
    );
    Ok(rebuilt)
}
