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

/// Other sets of sources tried for a row that failed its checksum.
const MAX_RETRIES_PER_ROW: usize = 16;

/// One member to rebuild.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// Where it goes in the target region.
    pub(crate) offset: u64,
    /// Bytes of its row (the longest member) and of the member itself.
    pub(crate) row_len: u32,
    pub(crate) out_len: u32,
    /// Its checksum as written (`None` when the compute node does not know
    /// it: a parity member changed in place by deltas).
    pub(crate) sum: Option<u64>,
    /// The members it may be decoded from, best first, at least k:
    /// position, offset there and bytes to read (0: a known zero member).
    /// Rows of one group may read different ones: a member in doubt is
    /// never a source of its spanset.
    pub(crate) from: Vec<(usize, u64, u32)>,
    /// The caller's name for it, returned if it cannot be rebuilt.
    pub(crate) tag: u64,
}

impl Row {
    /// The request decoding it from the members at indices `pick` of
    /// `from`, and their positions.
    fn request(&self, pick: &[usize]) -> (Vec<usize>, RebuildRow) {
        (
            pick.iter().map(|&i| self.from[i].0).collect(),
            RebuildRow {
                offset: self.offset,
                row_len: self.row_len,
                offsets: pick.iter().map(|&i| self.from[i].1).collect(),
                lens: pick.iter().map(|&i| self.from[i].2).collect(),
                out_len: self.out_len,
            },
        )
    }
}

/// What a rebuild did.
#[derive(Debug, Default)]
pub(crate) struct Rebuilt {
    pub(crate) bytes: u64,
    /// Tags of rows no set of k sources rebuilt to their checksum: more of
    /// their members are corrupt than parity covers. What is there now is
    /// not theirs.
    pub(crate) failed: Vec<u64>,
}

/// Rebuilds `lost` on a replacement region and rebinds its region index
/// there. `rows(survivors)` lists what to rebuild, each row decoded from k
/// of `survivors` (every surviving position, best first). A row that fails
/// its checksum is tried from other sets of survivors; one that no set
/// rebuilds is reported, not retried for ever.
pub(crate) fn rebuild(
    far: &FarMemory,
    place: &Placement,
    lost: &Lost,
    rows: impl FnOnce(&[usize]) -> Vec<Row>,
) -> Result<Rebuilt, RuntimeError> {
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
) -> Result<Rebuilt, RuntimeError> {
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
        "{scheme}: rebuilt group {g} position {pos} ({n} rows, {} bytes) on {node} in {:?}",
        rebuilt.bytes,
        start.elapsed()
    );
    if !rebuilt.failed.is_empty() {
        tracing::error!(
            "{scheme}: {} members at group {g} position {pos} match their checksums from no {} survivors: \
             more of their stripes are corrupt than parity covers",
            rebuilt.failed.len(),
            lost.k
        );
    }
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
) -> Result<Rebuilt, RuntimeError> {
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
/// at position `pos` of `grp`: first from each row's first k sources, one
/// request per set of sources and stretch of offsets, each given
/// `timeout`; then each row whose rebuilt shard failed its checksum alone,
/// from other sets of its sources, until one matches.
fn run(
    far: &FarMemory,
    (grp, g): (&Group, usize),
    (k, m, pos): (usize, usize, usize),
    (client, cap, timeout): (&Link, Cap, Duration),
    rows: Vec<Row>,
) -> Result<Rebuilt, RuntimeError> {
    let first: Vec<usize> = (0..k).collect();
    let mut reqs: Vec<(Vec<usize>, RebuildRow, usize)> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (at, req) = r.request(&first);
            (at, req, i)
        })
        .collect();
    reqs.sort_by(|a, b| (&a.0, a.1.offset).cmp(&(&b.0, b.1.offset)));
    let mut done = Rebuilt::default();
    let mut bad = Vec::new();
    let send = |at: &[usize], batch: Vec<RebuildRow>| -> Result<(u64, Vec<u64>), RuntimeError> {
        if far.is_stopping() {
            return Err(RuntimeError::Shutdown);
        }
        let sources = sources(far, (grp, g), at)?;
        let n = batch.len();
        let (bytes, sums) = client.rebuild(cap, k as u8, m as u8, pos as u8, sources, batch, timeout)?;
        if sums.len() != n {
            return Err(RuntimeError::Config(format!(
                "a rebuild of {n} rows answered {} checksums",
                sums.len()
            )));
        }
        Ok((bytes, sums))
    };
    for batch in reqs.chunk_by(|a, b| {
        // Keep requests near REBUILD_REQUEST_BYTES of rows each.
        a.0 == b.0 && a.1.offset / REBUILD_REQUEST_BYTES == b.1.offset / REBUILD_REQUEST_BYTES
    }) {
        let (bytes, sums) = send(&batch[0].0, batch.iter().map(|r| r.1.clone()).collect())?;
        done.bytes += bytes;
        for (r, sum) in batch.iter().zip(sums) {
            if rows[r.2].sum.is_some_and(|e| e != sum) {
                bad.push(r.2);
            }
        }
    }
    for i in bad {
        let row = &rows[i];
        let mut fixed = false;
        for pick in subsets(row.from.len(), k).skip(1).take(MAX_RETRIES_PER_ROW) {
            let (at, req) = row.request(&pick);
            let (bytes, sums) = send(&at, vec![req])?;
            if row.sum == sums.first().copied() {
                done.bytes += bytes;
                fixed = true;
                break;
            }
        }
        if !fixed {
            done.failed.push(row.tag);
        }
    }
    Ok(done)
}

/// The k-element subsets of `0..n`, in lexicographic order (`0..k` first).
fn subsets(n: usize, k: usize) -> impl Iterator<Item = Vec<usize>> {
    let mut next = (k <= n).then(|| (0..k).collect::<Vec<usize>>());
    std::iter::from_fn(move || {
        let cur = next.take()?;
        let mut c = cur.clone();
        // The rightmost index that can still move right.
        if let Some(i) = (0..k).rev().find(|&i| c[i] < n - k + i) {
            c[i] += 1;
            for j in i + 1..k {
                c[j] = c[j - 1] + 1;
            }
            next = Some(c);
        }
        Some(cur)
    })
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

/// The positions of `grp` other than `pos` that have not failed, best
/// sources of a decode first: empty positions of a short group (known
/// zeros), then data (the cheapest decode), suspects last.
pub(crate) fn ranked(far: &FarMemory, grp: &Group, k: usize, pos: usize) -> Vec<usize> {
    let mut cands: Vec<usize> = (0..grp.regions.len()).filter(|&p| p != pos && !grp.failed[p]).collect();
    cands.sort_by_key(|&p| (grp.present(p), far.is_suspect(grp.nodes[p]), p >= k));
    cands
}

/// Every survivor of `lost`'s group to rebuild from, best first (see
/// [`ranked`]). A retry (a survivor died or was corrupt
/// mid-rebuild) moves another one of them last each time, while spares
/// allow, so a bad survivor not yet declared dead is soon avoided.
fn survivors(far: &FarMemory, place: &Placement, lost: &Lost) -> Result<Vec<usize>, RuntimeError> {
    let &Lost {
        k,
        group: g,
        pos,
        attempt,
        ..
    } = lost;
    let grp = place.group(g);
    let mut cands = ranked(far, &grp, k, pos);
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
    let zeros = cands.iter().filter(|&&p| !grp.present(p)).count();
    if attempt > 0 && cands.len() > k && cands.len() > zeros {
        let out = cands.remove(zeros + (attempt - 1) % (cands.len() - zeros));
        cands.push(out);
    }
    Ok(cands)
}

#[cfg(test)]
mod tests {
    use super::subsets;

    #[test]
    fn subsets_come_in_order_first_the_first_k() {
        let all: Vec<Vec<usize>> = subsets(5, 4).collect();
        assert_eq!(
            all,
            vec![
                vec![0, 1, 2, 3],
                vec![0, 1, 2, 4],
                vec![0, 1, 3, 4],
                vec![0, 2, 3, 4],
                vec![1, 2, 3, 4]
            ]
        );
        assert_eq!(subsets(4, 4).count(), 1);
        assert_eq!(subsets(3, 4).count(), 0);
        assert_eq!(subsets(6, 1).count(), 6);
    }
}
