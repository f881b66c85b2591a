//! Memory-node primitives for in-place parity (remote compaction, ec-2pc):
//! transactions on spanset members, member generations and the delegated
//! apply-delta capability, on the in-process memory node and on real
//! memory-node processes.
//!
//! The scenario folds spanset B into spanset A of one RS(4,2) stripe group:
//! A's data members 1 and 3 are holes, B's live members are exactly 1 and 3,
//! so each moves into A's hole on its own node, and A's parity is updated
//! by deltas instead of being re-encoded. Every member is read back and
//! compared with what a full encode of the folded spanset gives.

mod common;

use std::sync::Arc;

use common::{assert_bytes_eq, pattern};
use remora_ec::Codec;
use remora_memnode::in_process::InProcessCluster;
use remora_proto::{
    Cap, DeltaTarget, FarBackend, MemNodeClient, MemTransport, Member, RegionGrant, RemoteError, RpcError, Token,
    TxnId, TxnOp,
};

const K: usize = 4;
const M: usize = 2;
/// A span: every member of both spansets has this length.
const SPAN: usize = 16 << 10;
/// Spanset A sits at offset 0 of every region, B at `SPAN`.
const A_AT: u64 = 0;
const B_AT: u64 = SPAN as u64;
/// B's live members, which are A's holes.
const MOVED: [usize; 2] = [1, 3];

/// One region on each of k+m memory nodes, and a connection to each.
struct Group {
    links: Vec<Arc<dyn MemTransport>>,
    grants: Vec<RegionGrant>,
    codec: Codec,
    /// The spansets' data members as written: a[i], b[i].
    a: Vec<Vec<u8>>,
    b: Vec<Vec<u8>>,
}

impl Group {
    /// Writes spansets A and B (data and parity) with plain writes.
    fn new(links: Vec<Arc<dyn MemTransport>>, grants: Vec<RegionGrant>) -> Self {
        assert_eq!(links.len(), K + M);
        let codec = Codec::new(K, M).unwrap();
        let a: Vec<Vec<u8>> = (0..K).map(|i| pattern(10 + i as u64, 0, SPAN)).collect();
        let b: Vec<Vec<u8>> = (0..K).map(|i| pattern(20 + i as u64, 0, SPAN)).collect();
        let g = Group {
            links,
            grants,
            codec,
            a,
            b,
        };
        for (set, at) in [(&g.a, A_AT), (&g.b, B_AT)] {
            let refs: Vec<&[u8]> = set.iter().map(Vec::as_slice).collect();
            let parity = g.codec.encode_to_vec(&refs).unwrap();
            for (i, bytes) in set.iter().chain(parity.iter()).enumerate() {
                g.links[i].write(g.cap(i), at, bytes).unwrap();
            }
        }
        g
    }

    fn cap(&self, i: usize) -> Cap {
        self.grants[i].cap
    }

    fn member(&self, i: usize, offset: u64, generation: u64) -> Member {
        Member {
            cap: self.cap(i),
            offset,
            len: SPAN as u32,
            generation,
        }
    }

    /// What A holds once B is folded into it.
    fn folded(&self) -> Vec<Vec<u8>> {
        let data: Vec<Vec<u8>> = (0..K)
            .map(|i| {
                if MOVED.contains(&i) {
                    self.b[i].clone()
                } else {
                    self.a[i].clone()
                }
            })
            .collect();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let parity = self.codec.encode_to_vec(&refs).unwrap();
        data.into_iter().chain(parity).collect()
    }

    /// Reads every member of A and checks bytes and generations.
    fn check_a(&self, want: &[Vec<u8>], generations: &[u64], what: &str) {
        for (i, w) in want.iter().enumerate() {
            let mut buf = vec![0u8; SPAN];
            let g = self.links[i].read_member(self.cap(i), A_AT, &mut buf).unwrap();
            assert_bytes_eq(&buf, w, &format!("{what}: member {i} of A"));
            assert_eq!(g, generations[i], "{what}: generation of member {i}");
        }
    }

    /// A before any fold: as written, every generation 0.
    fn original_a(&self) -> Vec<Vec<u8>> {
        let refs: Vec<&[u8]> = self.a.iter().map(Vec::as_slice).collect();
        let parity = self.codec.encode_to_vec(&refs).unwrap();
        self.a.iter().cloned().chain(parity).collect()
    }

    /// EC-Batch Local: data nodes return deltas, this side combines the
    /// parity deltas and stages them on the parity nodes.
    fn prepare_local(&self, txn: TxnId, generation: u64) -> Result<(), RpcError> {
        let mut parity_delta = vec![vec![0u8; SPAN]; M];
        for &i in &MOVED {
            let mut delta = vec![0u8; SPAN];
            let op = TxnOp::Move {
                to: self.member(i, A_AT, generation),
                from_cap: self.cap(i),
                from: B_AT,
                return_delta: true,
                targets: vec![],
            };
            self.links[i].prepare(txn, op, &[], Some(&mut delta))?;
            for (j, pd) in parity_delta.iter_mut().enumerate() {
                self.codec.apply_delta(i, j, &delta, pd).unwrap();
            }
        }
        for (j, pd) in parity_delta.iter().enumerate() {
            let op = TxnOp::Apply {
                to: self.member(K + j, A_AT, generation),
            };
            self.links[K + j].prepare(txn, op, pd, None)?;
        }
        Ok(())
    }

    /// EC-Batch Remote: data nodes send `A_ij · delta` to the parity nodes
    /// themselves, with delegated apply-delta capabilities.
    fn prepare_remote(&self, txn: TxnId, generation: u64) -> Result<(), RpcError> {
        let tickets: Vec<_> = MOVED
            .iter()
            .map(|&i| {
                let targets = (0..M)
                    .map(|j| DeltaTarget {
                        addr: self.grants[K + j].addr.clone(),
                        member: Member {
                            cap: self.cap(K + j).apply_delta(),
                            ..self.member(K + j, A_AT, generation)
                        },
                        coef: self.codec.coefficient(i, j).unwrap(),
                    })
                    .collect();
                let op = TxnOp::Move {
                    to: self.member(i, A_AT, generation),
                    from_cap: self.cap(i),
                    from: B_AT,
                    return_delta: false,
                    targets,
                };
                (i, self.links[i].send_prepare(txn, op, &[]).unwrap())
            })
            .collect();
        tickets
            .into_iter()
            .try_for_each(|(i, t)| self.links[i].wait_prepare(t, None))
    }

    /// The nodes a fold changes: the moved data members' and the parity's.
    fn participants(&self) -> Vec<usize> {
        MOVED.iter().copied().chain(K..K + M).collect()
    }

    fn commit(&self, txn: TxnId) {
        for i in self.participants() {
            self.links[i].commit(self.cap(i), txn).unwrap();
        }
    }

    fn abort(&self, txn: TxnId) {
        for i in self.participants() {
            self.links[i].abort(self.cap(i), txn).unwrap();
        }
    }
}

fn remote_err(r: Result<(), RpcError>, what: &str) -> RemoteError {
    match r {
        Err(RpcError::Remote(e)) => e,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// After a fold A holds B's live members in its holes, parity is what a
/// full encode gives, and every changed member is one generation up.
const FOLDED_GENERATIONS: [u64; K + M] = [0, 1, 0, 1, 1, 1];

/// An in-process cluster of k+m nodes, the compute node's backend on it, and
/// the group written.
fn in_process_group() -> (InProcessCluster, Arc<dyn FarBackend>, Group) {
    let cluster = InProcessCluster::new(K + M, 1, 1 << 20);
    let backend = cluster.backend();
    let grants = backend.alloc((K + M) as u32, true, &[]).unwrap();
    let links = grants.iter().map(|g| backend.connect(&g.addr).unwrap()).collect();
    (cluster, backend, Group::new(links, grants))
}

#[test]
fn local_fold_updates_parity_by_deltas() {
    let (_c, _b, g) = in_process_group();
    g.prepare_local(TxnId(1), 0).unwrap();
    // Nothing changes before the commit.
    g.check_a(&g.original_a(), &[0; K + M], "prepared");
    g.commit(TxnId(1));
    g.check_a(&g.folded(), &FOLDED_GENERATIONS, "committed");
}

#[test]
fn remote_fold_sends_deltas_between_memory_nodes() {
    let (c, _b, g) = in_process_group();
    g.prepare_remote(TxnId(1), 0).unwrap();
    g.check_a(&g.original_a(), &[0; K + M], "prepared");
    g.commit(TxnId(1));
    g.check_a(&g.folded(), &FOLDED_GENERATIONS, "committed");
    // Each parity node received one delta per moved member, counted there.
    for (i, grant) in g.grants.iter().enumerate() {
        let p = c.node(grant.node).unwrap().peer_traffic();
        let want = if i >= K { MOVED.len() as u64 } else { 0 };
        assert_eq!(p.delta_applies, want, "delta applies counted on node {i}");
        assert_eq!(p.delta_bytes, want * SPAN as u64, "delta bytes counted on node {i}");
    }
}

#[test]
fn late_and_retried_changes_never_apply_twice() {
    let (c, _b, g) = in_process_group();
    g.prepare_remote(TxnId(1), 0).unwrap();
    g.commit(TxnId(1));
    // A retried commit whose answer was lost is answered again, changing nothing.
    g.commit(TxnId(1));
    g.check_a(&g.folded(), &FOLDED_GENERATIONS, "after a retried commit");
    // A late delta naming the old generation is refused, in either mode.
    let late = TxnOp::Apply {
        to: g.member(K, A_AT, 0),
    };
    match remote_err(g.links[K].prepare(TxnId(2), late, &vec![1u8; SPAN], None), "late delta") {
        RemoteError::StaleGeneration {
            expected: 0, found: 1, ..
        } => {}
        e => panic!("late delta: {e:?}"),
    }
    match remote_err(g.prepare_local(TxnId(3), 0), "stale local fold") {
        RemoteError::StaleGeneration { .. } => {}
        e => panic!("stale fold: {e:?}"),
    }
    g.abort(TxnId(3));
    // A commit of something never prepared is a typed error.
    match remote_err(g.links[0].commit(g.cap(0), TxnId(99)), "unknown commit") {
        RemoteError::UnknownTxn(99) => {}
        e => panic!("unknown commit: {e:?}"),
    }
    g.check_a(&g.folded(), &FOLDED_GENERATIONS, "after refused changes");
    assert!(c.nodes().iter().all(|n| n.staged_transactions() == 0));
}

#[test]
fn abort_conflict_and_plain_writes() {
    let (c, _b, g) = in_process_group();
    // Aborted: nothing changed and nothing stays staged.
    g.prepare_remote(TxnId(1), 0).unwrap();
    g.abort(TxnId(1));
    g.check_a(&g.original_a(), &[0; K + M], "aborted");
    assert!(c.nodes().iter().all(|n| n.staged_transactions() == 0));
    // Two transactions never stage the same member.
    g.prepare_local(TxnId(2), 0).unwrap();
    match remote_err(g.prepare_local(TxnId(3), 0), "second transaction") {
        RemoteError::TxnConflict { .. } => {}
        e => panic!("conflict: {e:?}"),
    }
    g.abort(TxnId(3));
    // A plain write of a staged member supersedes the staged change.
    let fresh = pattern(77, 0, SPAN);
    g.links[1].write(g.cap(1), A_AT, &fresh).unwrap();
    assert!(
        g.links[1].commit(g.cap(1), TxnId(2)).is_err(),
        "a superseded change committed"
    );
    g.abort(TxnId(2));
    let mut buf = vec![0u8; SPAN];
    assert_eq!(g.links[1].read_member(g.cap(1), A_AT, &mut buf).unwrap(), 0);
    assert_bytes_eq(&buf, &fresh, "the plain write");
    // Staged state goes with a revoked region.
    let (c2, b2, g2) = in_process_group();
    g2.prepare_remote(TxnId(4), 0).unwrap();
    let parity_node = c2.node(g2.grants[K].node).unwrap();
    assert_eq!(parity_node.staged_transactions(), 1);
    b2.free(g2.grants[K].cap.region).unwrap();
    assert_eq!(parity_node.staged_transactions(), 0, "staged state survived a revoke");
}

#[test]
fn the_apply_delta_right_opens_nothing_else() {
    let (_c, _b, g) = in_process_group();
    let ad = g.cap(K).apply_delta();
    let mut buf = vec![0u8; SPAN];
    let refused = |r: Result<(), RpcError>, what: &str| match remote_err(r, what) {
        RemoteError::BadCapability { .. } => {}
        e => panic!("{what}: {e:?}"),
    };
    refused(g.links[K].read(ad, A_AT, &mut buf), "read with apply-delta");
    refused(g.links[K].write(ad, A_AT, &buf), "write with apply-delta");
    refused(
        g.links[K].read_member(ad, A_AT, &mut buf).map(|_| ()),
        "member read with apply-delta",
    );
    refused(g.links[K].commit(ad, TxnId(1)), "commit with apply-delta");
    let forged = Cap {
        token: Token::random(),
        ..ad
    };
    let op = |cap| TxnOp::Apply {
        to: Member {
            cap,
            ..g.member(K, A_AT, 0)
        },
    };
    refused(
        g.links[K].prepare(TxnId(1), op(forged), &buf, None),
        "forged apply-delta",
    );
    // Derived from a read-only capability, it opens nothing either.
    refused(
        g.links[K].prepare(TxnId(1), op(g.cap(K).read_only().apply_delta()), &buf, None),
        "apply-delta from read-only",
    );
    // A move must name an owner capability for its source.
    let mv = TxnOp::Move {
        to: g.member(1, A_AT, 0),
        from_cap: g.cap(1).read_only(),
        from: B_AT,
        return_delta: true,
        targets: vec![],
    };
    refused(
        g.links[1].prepare(TxnId(1), mv, &[], Some(&mut buf)),
        "move from a read-only source",
    );
    g.links[K].prepare(TxnId(1), op(ad), &buf, None).unwrap();
    g.links[K].abort(g.cap(K), TxnId(1)).unwrap();
    g.check_a(&g.original_a(), &[0; K + M], "after refused requests");
}

#[test]
fn real_memory_nodes_fold_remotely_and_refuse_stale_deltas() {
    let c = common::cluster(K + M, 16 << 20, 8 << 20);
    let s = common::session(&c, "fold");
    let grants = s.alloc((K + M) as u32, true, &[]).unwrap();
    let links: Vec<Arc<dyn MemTransport>> = grants
        .iter()
        .map(|g| Arc::new(MemNodeClient::connect(&g.addr, common::quick_opts(&c)).unwrap()) as Arc<dyn MemTransport>)
        .collect();
    let g = Group::new(links, grants);
    g.prepare_remote(TxnId(1), 0).unwrap();
    g.check_a(&g.original_a(), &[0; K + M], "prepared");
    g.commit(TxnId(1));
    g.check_a(&g.folded(), &FOLDED_GENERATIONS, "committed");
    // A second fold over the folded spanset, the local way: moves B's
    // members again (same bytes, so data is unchanged) at generation 1.
    g.prepare_local(TxnId(2), 1).unwrap();
    g.commit(TxnId(2));
    g.check_a(&g.folded(), &[0, 2, 0, 2, 2, 2], "second fold");
    let late = TxnOp::Apply {
        to: g.member(K + 1, A_AT, 1),
    };
    match remote_err(
        g.links[K + 1].prepare(TxnId(3), late, &vec![9u8; SPAN], None),
        "late delta",
    ) {
        RemoteError::StaleGeneration {
            expected: 1, found: 2, ..
        } => {}
        e => panic!("late delta: {e:?}"),
    }
    g.check_a(&g.folded(), &[0, 2, 0, 2, 2, 2], "after a late delta");
    // The deltas the data nodes sent crossed between memory nodes, and the
    // parity nodes report them in their heartbeats.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let p = c.peer_traffic().unwrap();
        if p.delta_bytes >= (MOVED.len() * M * SPAN) as u64 {
            assert_eq!(p.delta_bytes, (MOVED.len() * M * SPAN) as u64, "delta bytes");
            assert_eq!(p.delta_applies, (MOVED.len() * M) as u64);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "delta traffic never reported: {p:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `PrepareMany`: a parity node takes several deltas for one member in one
/// request (they add up, as separate prepares would), and a request one of
/// whose ops is refused leaves nothing of its own staged.
#[test]
fn prepare_many_adds_up_and_is_all_or_nothing() {
    let (c, _b, g) = in_process_group();
    let txn = TxnId(1);
    // Data nodes return their deltas (one op each, as a single prepare).
    let mut deltas = Vec::new();
    for &i in &MOVED {
        let mut delta = vec![0u8; SPAN];
        let op = TxnOp::Move {
            to: g.member(i, A_AT, 0),
            from_cap: g.cap(i),
            from: B_AT,
            return_delta: true,
            targets: vec![],
        };
        g.links[i].prepare(txn, op, &[], Some(&mut delta)).unwrap();
        deltas.push((i, delta));
    }
    // Each parity node: one request with one scaled delta per moved member.
    for j in 0..M {
        let shares: Vec<Vec<u8>> = deltas
            .iter()
            .map(|(i, d)| {
                let mut s = vec![0u8; SPAN];
                g.codec.scale(g.codec.coefficient(*i, j).unwrap(), d, &mut s).unwrap();
                s
            })
            .collect();
        let ops = shares
            .iter()
            .map(|_| TxnOp::Apply {
                to: g.member(K + j, A_AT, 0),
            })
            .collect();
        let payloads: Vec<&[u8]> = shares.iter().map(Vec::as_slice).collect();
        let t = g.links[K + j].send_prepare_many(txn, ops, &payloads).unwrap();
        g.links[K + j].wait_prepare(t, None).unwrap();
    }
    g.check_a(&g.original_a(), &[0; K + M], "prepared");
    g.commit(txn);
    g.check_a(&g.folded(), &FOLDED_GENERATIONS, "committed");

    // A request whose second op names a stale generation is refused whole:
    // its first op's staging is taken back, so another transaction may
    // stage that member at once.
    let i = MOVED[0];
    let (now, stale) = (g.member(i, A_AT, 1), g.member(i, A_AT + 2 * SPAN as u64, 5));
    let mv = |to: Member| TxnOp::Move {
        to,
        from_cap: g.cap(i),
        from: B_AT,
        return_delta: false,
        targets: vec![],
    };
    let t = g.links[i]
        .send_prepare_many(TxnId(2), vec![mv(now), mv(stale)], &[])
        .unwrap();
    match remote_err(g.links[i].wait_prepare(t, None), "a stale op in a PrepareMany") {
        RemoteError::StaleGeneration { expected: 5, .. } => {}
        e => panic!("stale op: {e:?}"),
    }
    g.links[i].prepare(TxnId(3), mv(now), &[], None).unwrap();
    g.links[i].abort(g.cap(i), TxnId(3)).unwrap();
    // A payload that does not match the ops' lengths is a typed refusal.
    let apply = TxnOp::Apply {
        to: g.member(K, A_AT, 1),
    };
    let t = g.links[K]
        .send_prepare_many(TxnId(4), vec![apply.clone(), apply], &[&[0u8; 7]])
        .unwrap();
    match remote_err(g.links[K].wait_prepare(t, None), "a short payload") {
        RemoteError::BadRequest(_) => {}
        e => panic!("short payload: {e:?}"),
    }
    g.check_a(&g.folded(), &FOLDED_GENERATIONS, "after refused requests");
    assert!(c.nodes().iter().all(|n| n.staged_transactions() == 0));
}
