//! Reading shards: [`gather`] reads candidates, preferred ones first, until
//! enough have arrived and passed the caller's check (see the module docs
//! of `shards`).

use std::sync::{Arc, mpsc};
use std::time::Instant;

use remora_proto::msg::{MemRequest, MemResponse};
use remora_proto::rpc::Ticket;
use remora_proto::{NodeId, RpcError};

use super::Waiters;
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::region_table::Link;
use crate::scheme::retry::Retry;

/// One shard to read: its code position, where it is, its length (0: an
/// all-zero shard that was never written, read for free).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shard {
    pub(crate) pos: usize,
    pub(crate) node: NodeId,
    pub(crate) region: u16,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    /// The generation the member must hold (read with `ReadMember` and
    /// refused otherwise, so a decode uses members of one generation);
    /// `None`: a plain read.
    pub(crate) generation: Option<u64>,
}

/// What [`gather`] got.
pub(crate) struct Gathered {
    /// Indices (into the candidates) of the shards that arrived and passed.
    pub(crate) arrived: Vec<usize>,
    /// Reads that failed or were rejected by the check.
    pub(crate) failed: usize,
}

fn send(far: &FarMemory, s: &Shard) -> Result<(Ticket, Link), RuntimeError> {
    let (r, c) = far.regions().reader(s.region)?;
    let t = match s.generation {
        None => c.send_read(r.grant.cap, s.offset, s.len)?,
        Some(_) => {
            let len = u32::try_from(s.len).map_err(|_| RuntimeError::Config("member too large".into()))?;
            c.send(
                &MemRequest::ReadMember {
                    cap: r.grant.cap,
                    offset: s.offset,
                    len,
                },
                &[],
            )?
        }
    };
    Ok((t, c))
}

/// Whether a read's answer is the shard's bytes: data for a plain read, the
/// member at the wanted generation for a member read.
fn answered(s: &Shard, r: MemResponse) -> Result<(), RpcError> {
    match (s.generation, r) {
        (None, MemResponse::Data) => Ok(()),
        (Some(want), MemResponse::Member { generation }) if generation == want => Ok(()),
        (Some(want), MemResponse::Member { generation }) => Err(RpcError::Unexpected(format!(
            "member at generation {generation}, not {want}"
        ))),
        (_, other) => Err(RpcError::Unexpected(format!("{other:?}"))),
    }
}

/// Reads candidates (in order of preference) on the swap-in lane until
/// `need` have arrived and passed `check(index, bytes)`; shard `i` lands in
/// `dests[i][..len]` (the rest of `dests[i]` is left as it is: zero it for
/// padding). A node whose read fails in the transport becomes a suspect.
/// A read whose connection broke is tried again on a new connection, with
/// backoff for as long as a reply may take, once the other candidates ran
/// out: a broken connection to a live node is not a lost shard. Returns
/// fewer than `need` only when the candidates ran out.
pub(crate) fn gather(
    far: &FarMemory,
    cands: &[Shard],
    dests: &mut [&mut [u8]],
    need: usize,
    late: Option<&Waiters>,
    check: &mut dyn FnMut(usize, &[u8]) -> bool,
) -> Gathered {
    let mut got = Gathered {
        arrived: Vec::with_capacity(need),
        failed: 0,
    };
    // Candidates go in order (`next`); reads whose connection broke are
    // tried again (`again`) once the candidates ran out.
    let mut next = 0;
    let (mut broke, mut again): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut retry: Option<Retry> = None;
    let mut extra = usize::from(late.is_some());
    while got.arrived.len() < need {
        if next == cands.len() && again.is_empty() {
            if broke.is_empty() || !retry.as_mut().is_some_and(Retry::wait) {
                break;
            }
            again = std::mem::take(&mut broke);
        }
        let want = need - got.arrived.len() + std::mem::take(&mut extra);
        let wave: Vec<usize> = if next < cands.len() {
            let w: Vec<usize> = (next..cands.len()).take(want).collect();
            next += w.len();
            w
        } else {
            again.drain(..want.min(again.len())).collect()
        };
        let mut inflight = Vec::with_capacity(wave.len());
        for i in wave {
            let s = &cands[i];
            if s.len == 0 {
                got.arrived.push(i);
                continue;
            }
            match send(far, s) {
                Ok((t, c)) => {
                    retry.get_or_insert_with(|| Retry::new(c.call_timeout()));
                    inflight.push((i, t, c));
                }
                Err(e) => {
                    far.suspect(s.node);
                    got.failed += 1;
                    tracing::debug!("shard {} on {}: {e}", s.pos, s.node);
                }
            }
        }
        let mut arrive = |i: usize, r: Result<(), RpcError>, bytes: &[u8], got: &mut Gathered| match r {
            Ok(()) if check(i, bytes) => got.arrived.push(i),
            Ok(()) => got.failed += 1,
            Err(e) => {
                if e.is_node_down() {
                    far.suspect(cands[i].node);
                }
                if matches!(e, RpcError::Broken { .. }) {
                    broke.push(i);
                }
                tracing::debug!("shard {} on {}: {e}", cands[i].pos, cands[i].node);
                got.failed += 1;
            }
        };
        match late {
            None => {
                // With candidates to spare, a shard overdue is read around
                // rather than waited out.
                let spare = next < cands.len() || !again.is_empty();
                for (i, t, c) in inflight {
                    let d = &mut dests[i][..cands[i].len];
                    let wait = if spare {
                        far.detector().reads.bound(c.call_timeout())
                    } else {
                        c.call_timeout()
                    };
                    let r = c.wait(t, Some(d), wait).and_then(|r| answered(&cands[i], r));
                    if spare && matches!(r, Err(RpcError::Timeout { .. })) && wait < c.call_timeout() {
                        far.detector().reads.count_overdue();
                    }
                    arrive(i, r, d, &mut got);
                }
            }
            Some(pool) => {
                // The waits run in parallel; what arrives after `need` is dropped.
                let (tx, rx) = mpsc::channel();
                let sent = inflight.len();
                for (i, t, c) in inflight {
                    let (tx, len, link, shard) = (tx.clone(), cands[i].len, Arc::clone(&c), cands[i]);
                    let deadline = Instant::now() + c.call_timeout();
                    pool.submit(
                        &link,
                        Box::new(move || {
                            let mut b = vec![0u8; len];
                            let left = deadline.saturating_duration_since(Instant::now());
                            let r = c.wait(t, Some(&mut b), left).and_then(|r| answered(&shard, r));
                            let _ = tx.send((i, r, b));
                        }),
                    );
                }
                drop(tx);
                for (i, r, b) in rx.iter().take(sent) {
                    arrive(i, r, &b, &mut got);
                    if got.arrived.last() == Some(&i) {
                        dests[i][..b.len()].copy_from_slice(&b);
                    }
                    if got.arrived.len() >= need {
                        break;
                    }
                }
            }
        }
    }
    got
}
