//! Offloaded reconstruction (paper §3.5): the replacement memory node reads
//! the surviving shards of each row from its peers, with capabilities the
//! owner delegated, decodes the lost shard and writes it into its own region.
//! The compute node only orchestrates; the bulk bytes never cross it.

use std::sync::Arc;
use std::time::Duration;

use remora_ec::Codec;
use remora_proto::msg::{RebuildRow, RebuildSource};
use remora_proto::rpc::Ticket;
use remora_proto::{Cap, ConnOptions, MemNodeClient, MemTransport, Range, RemoteError, RpcError};

use crate::Shared;
use crate::region::RegionTable;

/// How a rebuilding node reaches a survivor: a connection per address.
pub(crate) type PeerFn<'a> = &'a dyn Fn(&str) -> Result<Arc<dyn MemTransport>, RemoteError>;

/// Bytes read from one source per round (rows are processed in rounds).
const ROUND_BYTES: u64 = 8 << 20;
/// The longest row a rebuild accepts: the largest spanset member. Each
/// short (zero-padded) member is padded to the row's length in memory, so
/// this bounds what one request can make the node allocate (k + 1 rows, on
/// top of a round's reads).
pub(crate) const MAX_ROW_LEN: u32 = 16 << 20;

fn bad(msg: impl Into<String>) -> RemoteError {
    RemoteError::BadRequest(msg.into())
}

/// The daemon's connection to a peer over TCP, reused across rebuilds.
pub(crate) fn tcp_peer(shared: &Shared, addr: &str) -> Result<Arc<dyn MemTransport>, RemoteError> {
    let mut p = shared.peers.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = p.get(addr) {
        if !c.is_broken() {
            return Ok(Arc::clone(c));
        }
    }
    let opts = ConnOptions {
        call_timeout: Duration::from_secs(30),
        cluster_key: shared.cluster_key,
        tls: shared.tls.clone(),
        ..ConnOptions::default()
    };
    let c: Arc<dyn MemTransport> =
        Arc::new(MemNodeClient::connect(addr, opts).map_err(|e| RemoteError::Internal(format!("peer {addr}: {e}")))?);
    p.insert(addr.to_string(), Arc::clone(&c));
    Ok(c)
}

fn remote(e: RpcError) -> RemoteError {
    match e {
        RpcError::Remote(r) => r,
        other => RemoteError::Internal(format!("reading a survivor: {other}")),
    }
}

/// Rebuilds shard `want` of every row into region `cap` (a replacement, or
/// the shard's own region to repair it); returns bytes written and each
/// row's checksum.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rebuild(
    regions: &RegionTable,
    peer: PeerFn<'_>,
    cap: Cap,
    k: u8,
    m: u8,
    want: u8,
    sources: &[RebuildSource],
    rows: &[RebuildRow],
) -> Result<(u64, Vec<u64>), RemoteError> {
    let (k, m, want) = (k as usize, m as usize, want as usize);
    let codec = Codec::new(k, m).map_err(|e| bad(format!("code: {e}")))?;
    if sources.len() != k
        || want >= k + m
        || sources
            .iter()
            .any(|s| s.index as usize >= k + m || s.index as usize == want)
    {
        return Err(bad("need exactly k survivors other than the shard to rebuild"));
    }
    let region = regions.get(cap.region)?;
    for r in rows {
        if r.lens.len() != k || r.offsets.len() != k || r.lens.iter().any(|&l| l > r.row_len) || r.out_len > r.row_len {
            return Err(bad("row lengths do not fit the row"));
        }
        if r.row_len > MAX_ROW_LEN {
            return Err(bad(format!("a row of {} bytes (at most {MAX_ROW_LEN})", r.row_len)));
        }
        // The caller must own the target range, before anything is read.
        region.read().check(&region, &cap, true, r.offset, r.out_len as u64)?;
    }
    let clients = sources.iter().map(|s| peer(&s.addr)).collect::<Result<Vec<_>, _>>()?;
    // Rounds: as many rows as keep every source's read under ROUND_BYTES.
    let mut rounds = Vec::new();
    let mut start = 0;
    while start < rows.len() {
        let mut end = start;
        let mut bytes = 0u64;
        while end < rows.len() && (end == start || bytes + rows[end].row_len as u64 <= ROUND_BYTES) {
            bytes += rows[end].row_len as u64;
            end += 1;
        }
        rounds.push(start..end);
        start = end;
    }
    // One vectored read per source and round, all in flight at once.
    let send = |round: &[RebuildRow]| -> Result<Vec<(Option<Ticket>, usize)>, RemoteError> {
        let mut tickets = Vec::with_capacity(k);
        for (si, s) in sources.iter().enumerate() {
            let ranges: Vec<Range> = round
                .iter()
                .filter(|r| r.lens[si] > 0)
                .map(|r| Range {
                    cap: s.cap,
                    offset: r.offsets[si],
                    len: r.lens[si],
                })
                .collect();
            let total: usize = ranges.iter().map(|r| r.len as usize).sum();
            let t = if ranges.is_empty() {
                None
            } else {
                Some(clients[si].send_read_v(&ranges).map_err(remote)?)
            };
            tickets.push((t, total));
        }
        Ok(tickets)
    };
    let mut written = 0u64;
    let mut sums = Vec::with_capacity(rows.len());
    let mut next = match rounds.first() {
        Some(r) => Some(send(&rows[r.clone()])?),
        None => None,
    };
    let mut padded: Vec<Vec<u8>> = vec![Vec::new(); k];
    let mut scratch = Vec::new();
    for (ri, rr) in rounds.iter().enumerate() {
        let tickets = next.take().expect("sent ahead");
        let mut bufs = Vec::with_capacity(k);
        for (si, (t, total)) in tickets.into_iter().enumerate() {
            let mut b = vec![0u8; total];
            if let Some(t) = t {
                clients[si].wait_read(t, &mut b).map_err(remote)?;
            }
            bufs.push(b);
        }
        // The next round travels while this one decodes.
        if let Some(nr) = rounds.get(ri + 1) {
            next = Some(send(&rows[nr.clone()])?);
        }
        let mut pos = vec![0usize; k];
        for r in &rows[rr.clone()] {
            let row_len = r.row_len as usize;
            // Full-length shards are decoded in place; only short ones
            // (zero-padded members) are copied.
            for si in 0..k {
                let len = r.lens[si] as usize;
                if len < row_len {
                    padded[si].clear();
                    padded[si].extend_from_slice(&bufs[si][pos[si]..pos[si] + len]);
                    padded[si].resize(row_len, 0);
                }
            }
            let present: Vec<(usize, &[u8])> = sources
                .iter()
                .enumerate()
                .map(|(si, s)| {
                    let len = r.lens[si] as usize;
                    let b: &[u8] = if len < row_len {
                        &padded[si]
                    } else {
                        &bufs[si][pos[si]..pos[si] + len]
                    };
                    (s.index as usize, b)
                })
                .collect();
            let mut g = region.write();
            let range = g.check(&region, &cap, true, r.offset, r.out_len as u64)?;
            if r.out_len as usize == row_len {
                codec
                    .decode_data(&present, want, &mut g.mem[range.clone()])
                    .map_err(|e| RemoteError::Internal(format!("decode: {e}")))?;
            } else {
                scratch.clear();
                scratch.resize(row_len, 0);
                codec
                    .decode_data(&present, want, &mut scratch)
                    .map_err(|e| RemoteError::Internal(format!("decode: {e}")))?;
                g.mem[range.clone()].copy_from_slice(&scratch[..r.out_len as usize]);
            }
            sums.push(remora_proto::checksum::checksum(&g.mem[range.clone()]));
            // A rebuilt member is written plainly, as by a WRITE: a fresh
            // member (generation 0) whose staged change, if any, is
            // superseded. Rebuilding in place repairs a member left a
            // commit behind.
            g.wrote(&range);
            drop(g);
            written += r.out_len as u64;
            for (p, len) in pos.iter_mut().zip(&r.lens) {
                *p += *len as usize;
            }
        }
    }
    Ok((written, sums))
}
