//! Filling free slots of an existing spanset by two-phase commit.
//!
//! One transaction per spanset, however many of its slots it fills: each
//! data node gets a `Put` of its new span, computes the delta against the
//! slot's old bytes and stages `coef · delta` on every parity node itself
//! (with the apply-delta right delegated from our capability), so a span
//! crosses the network once from here and m times between memory nodes.
//! Several deltas for one parity member under one transaction add up on
//! the parity node. Then every participant commits.
//!
//! A failed prepare aborts everywhere and the spans go to a new spanset
//! instead. Once one participant has committed the transaction stands: a
//! participant whose commit is not confirmed (after retries) is marked in
//! doubt and read around, and the spanset is sealed (never filled again).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use remora_proto::msg::{DeltaTarget, MemRequest, Member};
use remora_proto::{NodeId, RemoteError, RpcError, TxnId, TxnOp};

use super::{Held, Shared, bytes, offset};
use crate::detector::SUSPECT_FOR;
use crate::error::RuntimeError;
use crate::far_memory::FarMemory;
use crate::scheme::{SpanAddr, shards};

/// Commit attempts per participant before its outcome is left in doubt.
const COMMIT_ATTEMPTS: usize = 3;

/// Why a prepare failed, and what it tells about the spanset.
struct Failure {
    err: RuntimeError,
    /// A node that failed in the transport (to suspect).
    node: Option<NodeId>,
    /// The node refused because of a generation or another transaction:
    /// our record of the spanset is off.
    stale: bool,
}

fn failure(e: RpcError, node: NodeId) -> Failure {
    Failure {
        node: e.is_node_down().then_some(node),
        stale: matches!(
            e,
            RpcError::Remote(RemoteError::StaleGeneration { .. } | RemoteError::TxnConflict { .. })
        ),
        err: e.into(),
    }
}

impl Shared {
    /// Picks a spanset of `pages`-page members with free slots (unwritten
    /// ones too if `unwritten`) for up to `want` spans, marks it busy;
    /// returns it and the slots (free ones first: unwritten ones need zeroing).
    pub(super) fn claim(&self, far: &FarMemory, pages: u32, want: usize, unwritten: bool) -> Option<(u64, Vec<usize>)> {
        let n = self.c.n();
        let mut st = self.lock();
        st.cooling.retain(|_, t| t.elapsed() < SUSPECT_FOR);
        let mut usable: HashMap<usize, bool> = HashMap::new();
        let mut best: Option<(u64, usize)> = None;
        for (&id, ss) in &st.sets {
            if ss.row_pages != pages || ss.busy || ss.readers > 0 || ss.sealed || st.cooling.contains_key(&ss.group) {
                continue;
            }
            let free = (0..self.c.k)
                .filter(|&p| ss.held(p) == Held::Hole || (unwritten && ss.held(p) == Held::Unwritten))
                .count();
            if free == 0 || best.is_some_and(|(_, f)| f >= free.min(want)) {
                continue;
            }
            let ok = *usable
                .entry(ss.group)
                .or_insert_with(|| (0..n).all(|p| !self.c.place.unusable(far, ss.group, p)));
            if ok {
                best = Some((id, free.min(want)));
            }
        }
        let (id, count) = best?;
        let ss = st.sets.get_mut(&id)?;
        let mut slots: Vec<usize> = (0..self.c.k).filter(|&p| ss.held(p) == Held::Hole).collect();
        slots.extend((0..self.c.k).filter(|&p| unwritten && ss.held(p) == Held::Unwritten));
        slots.truncate(count);
        ss.busy = true;
        Some((id, slots))
    }

    /// Writes span `spans[i]` into slot `pos` of spanset `id` for each
    /// `(pos, i)` of `picks` (claimed by [`Shared::claim`]) in one
    /// transaction; returns the slots' addresses.
    pub(super) fn fill(
        &self,
        far: &FarMemory,
        id: u64,
        picks: &[(usize, usize)],
        spans: &[&[u8]],
        sums: &[u64],
    ) -> Result<Vec<SpanAddr>, RuntimeError> {
        let (k, n) = (self.c.k, self.c.n());
        let (group, pages, page, mut generation, unwritten) = {
            let mut st = self.lock();
            let ss = st.sets.get_mut(&id).ok_or_else(|| {
                RuntimeError::lost_because(None::<SpanAddr>, format!("{}: no spanset {id}", self.c.name))
            })?;
            let unwritten: Vec<bool> = picks.iter().map(|&(p, _)| ss.held(p) == Held::Unwritten).collect();
            for &(p, _) in picks {
                ss.set_held(p, Held::Filling);
            }
            let page: Vec<u32> = ss.members.iter().map(|m| m.page).collect();
            let generation: Vec<u64> = ss.members.iter().map(|m| m.generation).collect();
            (ss.group, ss.row_pages, page, generation, unwritten)
        };
        let g = self.c.place.group(group);
        let len = bytes(pages);
        let txn = TxnId(self.next_txn.fetch_add(1, Ordering::Relaxed) + 1);
        let mut zeroed = Vec::new();
        let prepared = self.zero(far, &g.regions, &g.nodes, &page, picks, &unwritten, len, &mut zeroed);
        for &p in &zeroed {
            generation[p] = 0;
        }
        let prepared =
            prepared.and_then(|()| self.prepare(far, txn, &g.regions, &g.nodes, &page, &generation, picks, spans, len));
        let participants: Vec<usize> = picks.iter().map(|&(p, _)| p).chain(k..n).collect();
        let outcome = match prepared {
            Ok(()) => self.commit(far, txn, &g.regions, &g.nodes, &participants),
            Err(f) => Err(f),
        };
        let aborted = outcome.is_ok() || self.abort(far, txn, &g.regions, &participants);
        let mut st = self.lock();
        let ss = st.sets.get_mut(&id).ok_or_else(|| {
            RuntimeError::lost_because(
                None::<SpanAddr>,
                format!("{}: spanset {id} vanished mid-fill", self.c.name),
            )
        })?;
        ss.busy = false;
        for &p in &zeroed {
            ss.members[p].generation = 0;
            ss.members[p].sum = Some(remora_proto::checksum::checksum(&vec![0u8; len]));
        }
        let res = match outcome {
            Ok(doubt) => {
                for &(p, i) in picks {
                    ss.set_held(p, Held::Live);
                    ss.members[p].sum = Some(sums[i]);
                }
                for &p in &participants {
                    ss.members[p].generation += 1;
                    if p >= k {
                        ss.members[p].sum = None;
                    }
                }
                if !doubt.is_empty() {
                    ss.sealed = true;
                    for p in doubt {
                        ss.set_doubt(p, true);
                    }
                }
                Ok(picks
                    .iter()
                    .map(|&(p, _)| SpanAddr {
                        region: g.regions[p],
                        page: page[p],
                    })
                    .collect())
            }
            Err(f) => {
                for (&(p, _), &was) in picks.iter().zip(&unwritten) {
                    let h = if was && !zeroed.contains(&p) {
                        Held::Unwritten
                    } else {
                        Held::Hole
                    };
                    ss.set_held(p, h);
                }
                ss.sealed |= f.stale || !aborted;
                if let Some(node) = f.node {
                    far.suspect(node);
                }
                st.cooling.insert(group, Instant::now());
                Err(f.err)
            }
        };
        let dead = self.take_if_dead(&mut st, id);
        drop(st);
        self.idle.notify_all();
        if let Some(ss) = dead {
            self.free_far(far, &ss);
        }
        res
    }

    /// Zeroes the unwritten slots among `picks` (the parity counts them as
    /// zeros); `zeroed` gets those written.
    #[allow(clippy::too_many_arguments)]
    fn zero(
        &self,
        far: &FarMemory,
        regions: &[u16],
        nodes: &[NodeId],
        page: &[u32],
        picks: &[(usize, usize)],
        unwritten: &[bool],
        len: usize,
        zeroed: &mut Vec<usize>,
    ) -> Result<(), Failure> {
        if !unwritten.contains(&true) {
            return Ok(());
        }
        let zeros = vec![0u8; len];
        for (&(p, _), _) in picks.iter().zip(unwritten).filter(|(_, w)| **w) {
            let (r, c) = far.regions().client(regions[p]).map_err(|e| Failure {
                err: e,
                node: Some(nodes[p]),
                stale: false,
            })?;
            c.write(r.grant.cap, offset(page[p]), &zeros)
                .map_err(|e| failure(e, nodes[p]))?;
            zeroed.push(p);
        }
        Ok(())
    }

    /// Phase one: a `Put` to each picked slot's node, all in flight at once.
    #[allow(clippy::too_many_arguments)]
    fn prepare(
        &self,
        far: &FarMemory,
        txn: TxnId,
        regions: &[u16],
        nodes: &[NodeId],
        page: &[u32],
        generation: &[u64],
        picks: &[(usize, usize)],
        spans: &[&[u8]],
        len: usize,
    ) -> Result<(), Failure> {
        let (k, m) = (self.c.k, self.c.m);
        let parity: Vec<_> = (k..k + m).map(|p| far.regions().get(regions[p])).collect();
        let mut sent = Vec::with_capacity(picks.len());
        let mut first: Option<Failure> = None;
        for &(pos, i) in picks {
            let targets = (0..m)
                .map(|j| {
                    Ok(DeltaTarget {
                        addr: parity[j].grant.addr.clone(),
                        member: Member {
                            cap: parity[j].grant.cap.apply_delta(),
                            offset: offset(page[k + j]),
                            len: len as u32,
                            generation: generation[k + j],
                        },
                        coef: self.c.codec.coefficient(pos, j)?,
                    })
                })
                .collect::<Result<Vec<_>, remora_ec::EcError>>()
                .map_err(|e| Failure {
                    err: RuntimeError::Config(format!("{}: {e}", self.c.name)),
                    node: None,
                    stale: false,
                })?;
            let r = far.regions().client(regions[pos]).and_then(|(r, c)| {
                let op = TxnOp::Put {
                    to: Member {
                        cap: r.grant.cap,
                        offset: offset(page[pos]),
                        len: len as u32,
                        generation: generation[pos],
                    },
                    return_delta: false,
                    targets,
                };
                Ok((c.send_prepare(txn, op, spans[i])?, c))
            });
            match r {
                Ok((t, c)) => sent.push((pos, t, c)),
                Err(e) => {
                    first.get_or_insert(Failure {
                        err: e,
                        node: Some(nodes[pos]),
                        stale: false,
                    });
                }
            }
        }
        for (pos, t, c) in sent {
            if let Err(e) = shards::wait_prepared(far, &c, t, None) {
                first.get_or_insert(failure(e, nodes[pos]));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Phase two. Returns the participants whose commit was never
    /// confirmed; fails (nothing committed anywhere) only if the first
    /// participant refused outright.
    fn commit(
        &self,
        far: &FarMemory,
        txn: TxnId,
        regions: &[u16],
        nodes: &[NodeId],
        participants: &[usize],
    ) -> Result<Vec<usize>, Failure> {
        let mut doubt = Vec::new();
        for (n, &p) in participants.iter().enumerate() {
            let mut last = None;
            for _ in 0..COMMIT_ATTEMPTS {
                let r = far.regions().client(regions[p]).and_then(|(r, c)| {
                    shards::decide(far, &c, &MemRequest::Commit { cap: r.grant.cap, txn }).map_err(RuntimeError::from)
                });
                match r {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    // A refusal is final; a lost reply or connection is
                    // retried (a repeated commit is answered again).
                    // Overdue: the commit stays queued there; no second one.
                    Err(RuntimeError::Rpc(e)) if !e.is_node_down() || matches!(e, RpcError::Timeout { .. }) => {
                        last = Some(failure(e, nodes[p]));
                        break;
                    }
                    Err(e) => {
                        last = Some(Failure {
                            err: e,
                            node: Some(nodes[p]),
                            stale: false,
                        })
                    }
                }
            }
            match last {
                None => {}
                // Nothing committed yet and the first participant surely
                // did not: the transaction can still be aborted.
                Some(f) if n == 0 && f.node.is_none() => return Err(f),
                Some(f) => {
                    self.c.write_failures.fail(format_args!(
                        "{}: commit of txn {} on {}: {}",
                        self.c.name, txn.0, nodes[p], f.err
                    ));
                    if let Some(node) = f.node {
                        far.suspect(node);
                    }
                    doubt.push(p);
                }
            }
        }
        Ok(doubt)
    }

    /// Drops what `txn` staged on every participant; false if some
    /// participant could not be told.
    fn abort(&self, far: &FarMemory, txn: TxnId, regions: &[u16], participants: &[usize]) -> bool {
        let mut all = true;
        for &p in participants {
            let r = far.regions().client(regions[p]).and_then(|(r, c)| {
                shards::decide(far, &c, &MemRequest::Abort { cap: r.grant.cap, txn }).map_err(RuntimeError::from)
            });
            if let Err(e) = r {
                tracing::debug!("{}: abort of txn {}: {e}", self.c.name, txn.0);
                all = false;
            }
        }
        all
    }
}
