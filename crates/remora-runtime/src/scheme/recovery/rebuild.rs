//! The rebuild of one stripe-group position that every erasure-coded
//! scheme shares: the replacement node itself reads k survivors (with
//! read-only capabilities delegated from ours) and decodes, and every shard
//! it rebuilt is checked against the checksum recorded when it was written.
//! The same request, aimed at a member's own region, repairs a member whose
//! bytes are in doubt ([`repair`]).

use std::time::{Duration, Instant};

use remora_proto::{Cap, RebuildRow, RebuildSource, RegionGrant};

use super::Lost;
use crate::error::{LossCause, RuntimeError};
use crate::far_memory::FarMemory;
use crate::region_table::Link;
use crate::scheme::SpanAddr;
use crate::scheme::placement::{Group, Placement};

/// Row bytes per offloaded rebuild request.
const REBUILD_REQUEST_BYTES: u64 = 32 << 20;

/// How long one rebuild request may take (a replacement reads up to
/// [`REBUILD_REQUEST_BYTES`] of rows from each survivor).
const REBUILD_TIMEOUT: Duration = Duration::from_secs(120);

/// How long one repair may take: a few members, while a spanset waits.
const REPAIR_TIMEOUT: Duration = Duration::from_secs(10);

/// One member to rebuild.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// Where it goes, and where its sources are read: `offsets` and `lens`
    /// follow `sources`.
    pub(crate) row: RebuildRow,
    /// Its checksum as written (`None` when the compute node does not know
    /// it: a parity member changed in place by deltas).
    pub(crate) sum: Option<u64>,
    /// The k positions it is decoded from. Rows of one group may read
    /// different ones: a member in doubt is never a source of its spanset.
    pub(crate) sources: Vec<usize>,
}

/// Rebuilds `lost` on a replacement region and rebinds its region index
/// there; returns the bytes rebuilt. `rows(survivors)` lists what to
/// rebuild, each row decoded from k of `survivors` (every surviving
/// position, best first).
pub(crate) fn rebuild(
    far: &FarMemory,
    place: &Placement,
    lost: &Lost,
    rows: impl FnOnce(&[usize]) -> Vec<Row>,
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
    rows: impl FnOnce(&[usize]) -> Vec<Row>,
    start: Instant,
) -> Result<u64, RuntimeError> {
    let &Lost {
        scheme, group: g, pos, ..
    } = lost;
    let client = far.regions().connect(&grant.addr)?;
    let rows = rows(cands);
    let n = rows.len();
    let to = (&client, grant.cap, REBUILD_TIMEOUT);
    let rebuilt = run(far, (&place.group(g), g), (lost.k, lost.m, pos), to, rows)?;
    let node = grant.node;
    place.rebind(far, g, pos, grant)?;
    tracing::info!(
        "{scheme}: rebuilt group {g} position {pos} ({n} rows, {rebuilt} bytes) on {node} in {:?}",
        start.elapsed()
    );
    Ok(rebuilt)
}

/// Writes `rows` of position `pos` of group `g` again, in place on the
/// position's own region, decoded from their sources: members whose bytes
/// are in doubt (a commit never acknowledged) become what the other
/// members say. The node makes each a fresh member (generation 0).
pub(crate) fn repair(
    far: &FarMemory,
    place: &Placement,
    (k, m): (usize, usize),
    g: usize,
    pos: usize,
    rows: Vec<Row>,
) -> Result<u64, RuntimeError> {
    let grp = place.group(g);
    let region = far.regions().get(grp.regions[pos]);
    let client = far.regions().connect(&region.grant.addr)?;
    run(
        far,
        (&grp, g),
        (k, m, pos),
        (&client, region.grant.cap, REPAIR_TIMEOUT),
        rows,
    )
}

/// Sends `rows` to the node behind `client`, to decode into region `cap`
/// at position `pos` of `grp`: one request per set of sources and stretch
/// of offsets, each given `timeout`. Returns the bytes written; a rebuilt shard whose checksum
/// differs from the row's is an error naming it.
fn run(
    far: &FarMemory,
    (grp, g): (&Group, usize),
    (k, m, pos): (usize, usize, usize),
    (client, cap, timeout): (&Link, Cap, Duration),
    mut rows: Vec<Row>,
) -> Result<u64, RuntimeError> {
    rows.sort_by(|a, b| (&a.sources, a.row.offset).cmp(&(&b.sources, b.row.offset)));
    let mut rebuilt = 0u64;
    for batch in rows.chunk_by(|a, b| {
        // Keep requests near REBUILD_REQUEST_BYTES of rows each.
        a.sources == b.sources && a.row.offset / REBUILD_REQUEST_BYTES == b.row.offset / REBUILD_REQUEST_BYTES
    }) {
        if far.is_stopping() {
            return Err(RuntimeError::Shutdown);
        }
        let sources = sources(far, (grp, g), &batch[0].sources)?;
        let reqs: Vec<RebuildRow> = batch.iter().map(|r| r.row.clone()).collect();
        let (n, sums) = client.rebuild(cap, k as u8, m as u8, pos as u8, sources, reqs, timeout)?;
        let wrong = |i: usize| sums.len() != batch.len() || batch[i].sum.is_some_and(|e| sums[i] != e);
        if let Some(i) = (0..batch.len()).find(|&i| wrong(i)) {
            return Err(RuntimeError::lost_because(
                None::<SpanAddr>,
                format!(
                    "rebuilt shard {pos} of group {g} at offset {} failed its checksum",
                    batch[i].row.offset
                ),
            ));
        }
        rebuilt += n;
    }
    Ok(rebuilt)
}

/// The survivors at `positions` as a rebuilding node reads them. An empty
/// position of a short group is a known zero member: every row's length
/// there is 0, so the node never reads it, and it names another source's
/// region only because a source must name one.
fn sources(
    far: &FarMemory,
    (grp, g): (&Group, usize),
    positions: &[usize],
) -> Result<Vec<RebuildSource>, RuntimeError> {
    let real = positions
        .iter()
        .find(|&&p| grp.present(p))
        .map(|&p| far.regions().get(grp.regions[p]))
        .ok_or_else(|| RuntimeError::lost_because(None::<SpanAddr>, format!("group {g} has no member to read")))?;
    Ok(positions
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
        .collect())
}

/// Every survivor of `lost`'s group to rebuild from, best first: empty
/// positions of a short group (known zeros), then data (the cheapest
/// decode), suspects last. A retry (a survivor died or was corrupt
/// mid-rebuild) moves another one of them last each time, while spares
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
    cands.sort_by_key(|&p| (grp.present(p), far.is_suspect(grp.nodes[p]), p >= k));
    let zeros = cands.iter().filter(|&&p| !grp.present(p)).count();
    if attempt > 0 && cands.len() > k && cands.len() > zeros {
        let out = cands.remove(zeros + (attempt - 1) % (cands.len() - zeros));
        cands.push(out);
    }
    Ok(cands)
}
