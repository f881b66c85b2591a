//! The rebuild of one stripe-group position that every erasure-coded
//! scheme shares: the replacement node itself reads k survivors (with
//! read-only capabilities delegated from ours) and decodes, and every shard
//! it rebuilt is checked against the checksum recorded when it was written.

use std::time::{Duration, Instant};

use remora_proto::{RebuildRow, RebuildSource, RegionGrant};

use super::Lost;
use crate::error::{LossCause, RuntimeError};
use crate::far_memory::FarMemory;
use crate::scheme::SpanAddr;
use crate::scheme::placement::Placement;

/// Row bytes per offloaded rebuild request.
const REBUILD_REQUEST_BYTES: u64 = 32 << 20;

/// Rebuilds `lost` on a replacement region and rebinds its region index
/// there; returns the bytes rebuilt. `rows(survivors)` lists what to
/// rebuild, with each shard's checksum as written (`None` when the compute
/// node does not know it: a parity member changed in place by deltas): a
/// row's `offsets` and `lens` follow `survivors`, the positions read.
pub(crate) fn rebuild(
    far: &FarMemory,
    place: &Placement,
    lost: &Lost,
    rows: impl FnOnce(&[usize]) -> Vec<(RebuildRow, Option<u64>)>,
) -> Result<u64, RuntimeError> {
    let start = Instant::now();
    // Survivors first: a position that cannot be rebuilt takes no region.
    let cands = survivors(far, place, lost)?;
    let grant = place.replacement(far, lost.group)?;
    let region = grant.cap.region;
    let res = rebuild_on(far, place, lost, &cands, grant, rows, start);
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
    cands: &[usize],
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
        ..
    } = lost;
    let client = far.regions().connect(&grant.addr)?;
    let grp = place.group(g);
    // An empty position of a short group is a known zero member: every
    // row's length there is 0, so the node never reads it, and it names
    // another source's region only because a source must name one.
    let real = cands
        .iter()
        .find(|&&p| grp.present(p))
        .map(|&p| far.regions().get(grp.regions[p]))
        .ok_or_else(|| RuntimeError::lost_because(None::<SpanAddr>, format!("group {g} has no member to read")))?;
    let sources: Vec<RebuildSource> = cands
        .iter()
        .map(|&p| {
            let r = if grp.present(p) {
                far.regions().get(grp.regions[p])
            } else {
                std::sync::Arc::clone(&real)
            };
            RebuildSource {
                index: p as u8,
                addr: r.grant.addr.clone(),
                cap: r.grant.cap.read_only(),
            }
        })
        .collect();
    let mut rows = rows(cands);
    rows.sort_by_key(|(r, _)| r.offset);
    let mut rebuilt = 0u64;
    for batch in rows.chunk_by(|a, b| {
        // Keep requests near REBUILD_REQUEST_BYTES of rows each.
        a.0.offset / REBUILD_REQUEST_BYTES == b.0.offset / REBUILD_REQUEST_BYTES
    }) {
        if far.is_stopping() {
            return Err(RuntimeError::Shutdown);
        }
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
        let wrong = |i: usize| sums.len() != expect.len() || expect[i].is_some_and(|e| sums[i] != e);
        if let Some(i) = (0..expect.len()).find(|&i| wrong(i)) {
            return Err(RuntimeError::lost_because(
                None::<SpanAddr>,
                format!(
                    "rebuilt shard {pos} of group {g} at offset {} failed its checksum",
                    offsets[i]
                ),
            ));
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

/// The k survivors of `lost`'s group to rebuild from: data first (the
/// cheapest decode), suspects last. A retry (a survivor died or was corrupt
/// mid-rebuild) leaves out another one of them each time, while spares
/// allow, so a bad survivor not yet declared dead is soon avoided.
fn survivors(far: &FarMemory, place: &Placement, lost: &Lost) -> Result<Vec<usize>, RuntimeError> {
    let &Lost {
        k,
        m,
        group: g,
        pos,
        attempt,
        ..
    } = lost;
    let grp = place.group(g);
    let mut cands: Vec<usize> = (0..k + m).filter(|&p| p != pos && !grp.failed[p]).collect();
    if cands.len() < k {
        return Err(RuntimeError::lost(
            None::<SpanAddr>,
            LossCause::TooFewSurvivors {
                group: g,
                survivors: cands.len(),
                needed: k,
            },
        ));
    }
    // Empty positions of a short group first: known zeros, read for free.
    cands.sort_by_key(|&p| (grp.present(p), far.is_suspect(grp.nodes[p]), p >= k));
    let zeros = cands.iter().filter(|&&p| !grp.present(p)).count();
    if attempt > 0 && cands.len() > k && cands.len() > zeros {
        cands.remove(zeros + (attempt - 1) % (cands.len() - zeros));
    }
    cands.truncate(k);
    Ok(cands)
}
