//! Region epochs fence what was issued for an earlier owner of a region: a
//! compute node's capability after its region was reassigned, and a parity
//! delta a peer memory node still pushes for it. Both are refused with
//! `StaleEpoch`, on real processes and on the in-process node, and the new
//! owner sees only its own bytes. The manager's epochs survive its restart.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_bytes_eq, pattern};
use remora_memnode::in_process::InProcessCluster;
use remora_proto::msg::ComputeState;
use remora_proto::{
    Cap, DeltaTarget, Epoch, FarBackend, MemNodeClient, MemTransport, Member, RegionGrant, RegionId, RemoteError,
    RpcError, TxnId, TxnOp,
};

const MIB: u64 = 1 << 20;

#[track_caller]
fn stale(r: Result<(), RpcError>, region: RegionId, presented: Epoch, what: &str) -> Epoch {
    match r {
        Err(RpcError::Remote(RemoteError::StaleEpoch {
            region: r,
            presented: p,
            current,
        })) => {
            assert_eq!(r, region, "{what}: region");
            assert_eq!(p, presented, "{what}: presented epoch");
            assert!(
                current > presented,
                "{what}: current epoch {current} not past {presented}"
            );
            current
        }
        other => panic!("{what}: expected StaleEpoch, got {other:?}"),
    }
}

/// Compute node A writes its region and goes silent; the manager revokes the
/// region and grants it to B. Every capability A held (owner, read-only and
/// apply-delta delegates) is refused as stale, B's works, and B reads zeros
/// where A wrote, then its own bytes.
#[test]
fn capability_from_before_a_reassignment_is_refused() {
    // One memory node of one region: B can only get A's region back.
    let c = common::quick_cluster(1, 8 * MIB, 8 * MIB);
    let a = common::session(&c, "a");
    let ga = a.alloc(1, false, &[]).unwrap().remove(0);
    let cl = MemNodeClient::connect(&ga.addr, common::quick_opts(&c)).unwrap();
    let len = ga.size as usize;
    let a_bytes = pattern(0xA, 0, len);
    cl.write(ga.cap, 0, &a_bytes).unwrap();
    let mut buf = vec![0u8; len];
    cl.read(ga.cap.read_only(), 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &a_bytes, "A's delegated read before the reassignment");

    a.suspend_heartbeats();
    c.wait_until(Duration::from_secs(20), "A declared dead and its region freed", |st| {
        st.compute_nodes
            .iter()
            .any(|n| n.state == ComputeState::Dead && n.regions == 0)
            && st.memory_nodes.iter().all(|m| m.regions_free == m.regions_total)
    })
    .unwrap();
    let region = ga.cap.region;
    let revoked = stale(
        cl.read(ga.cap, 0, &mut buf),
        region,
        ga.cap.epoch,
        "A's read after the revoke",
    );

    let b = common::session(&c, "b");
    let gb = b.alloc(1, false, &[]).unwrap().remove(0);
    assert_eq!(gb.cap.region, region, "B got A's region");
    assert!(
        gb.cap.epoch > revoked,
        "B's epoch {} is not past the revoke's {revoked}",
        gb.cap.epoch
    );
    // B's region starts zeroed: nothing of A's survives the reassignment.
    cl.read(gb.cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &vec![0u8; len], "B's first read of the reassigned region");
    let b_bytes = pattern(0xB, 0, len);
    cl.write(gb.cap, 0, &b_bytes).unwrap();

    let e = ga.cap.epoch;
    let mut small = vec![0u8; 4096];
    stale(cl.read(ga.cap, 0, &mut small), region, e, "A's owner read");
    stale(cl.write(ga.cap, 0, &a_bytes[..4096]), region, e, "A's owner write");
    stale(
        cl.read(ga.cap.read_only(), 0, &mut small),
        region,
        e,
        "A's read-only delegate",
    );
    let apply = TxnOp::Apply {
        to: Member {
            cap: ga.cap.apply_delta(),
            offset: 0,
            len: 4096,
            generation: 0,
        },
    };
    stale(
        cl.prepare(TxnId(1), apply, &[0xFF; 4096], None),
        region,
        e,
        "A's apply-delta delegate",
    );
    // Even A's token dressed in B's epoch does not open the region.
    let dressed = Cap {
        epoch: gb.cap.epoch,
        ..ga.cap
    };
    match cl.read(dressed, 0, &mut small) {
        Err(RpcError::Remote(RemoteError::BadCapability { region: r })) => assert_eq!(r, region),
        other => panic!("A's token in B's epoch: {other:?}"),
    }
    assert_eq!(cl.stats().unwrap().staged_txns, 0, "a refused delta staged nothing");
    cl.read(gb.cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &b_bytes, "B reads back its own bytes after A's refused requests");
}

/// k=2, m=1: data members on links 0 and 1, parity on link 2. Member bytes
/// are written at offset 0 of each region.
const SPAN: usize = 4096;

struct Stripe {
    links: Vec<Arc<dyn MemTransport>>,
    grants: Vec<RegionGrant>,
    data: Vec<Vec<u8>>,
}

impl Stripe {
    fn new(links: Vec<Arc<dyn MemTransport>>, grants: Vec<RegionGrant>) -> Self {
        let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(40 + i, 0, SPAN)).collect();
        for (i, d) in data.iter().enumerate() {
            links[i].write(grants[i].cap, 0, d).unwrap();
        }
        Self { links, grants, data }
    }

    fn member(&self, i: usize) -> Member {
        Member {
            cap: self.grants[i].cap,
            offset: 0,
            len: SPAN as u32,
            generation: 0,
        }
    }

    /// Data node 0 is asked to replace its member and push `coef · delta`
    /// to the parity member with A's (old) apply-delta capability.
    fn put_with_late_delta(&self) -> Result<(), RpcError> {
        let op = TxnOp::Put {
            to: self.member(0),
            return_delta: false,
            targets: vec![DeltaTarget {
                addr: self.grants[2].addr.clone(),
                member: Member {
                    cap: self.grants[2].cap.apply_delta(),
                    ..self.member(2)
                },
                coef: 1,
            }],
        };
        self.links[0].prepare(TxnId(7), op, &pattern(99, 0, SPAN), None)
    }
}

/// The scenario on any backend: A holds a stripe; the parity region is
/// reassigned to B (`reassign`, which returns B's grant) between A building
/// a change and the data node pushing its delta. The push carries A's old
/// epoch and is refused; nothing stays staged; B's bytes and A's data
/// member are untouched.
fn late_delta_is_refused(
    stripe: &Stripe,
    reassign: impl FnOnce(RegionId) -> (RegionGrant, Arc<dyn MemTransport>),
    staged: impl Fn(usize) -> u64,
) {
    let parity = stripe.grants[2].cap;
    let (gb, link_b) = reassign(parity.region);
    assert_eq!(gb.cap.region, parity.region, "B got the parity region");
    let b_bytes = pattern(0xB, 0, SPAN);
    link_b.write(gb.cap, 0, &b_bytes).unwrap();

    // Pushed by data node 0 on A's behalf: the parity node refuses it, and
    // the data node takes back its own staging and passes the refusal on.
    stale(
        stripe.put_with_late_delta(),
        parity.region,
        parity.epoch,
        "peer delta push",
    );
    // Sent straight to the parity node, as a data node that raced the
    // reassignment would have.
    let late = TxnOp::Apply {
        to: Member {
            cap: parity.apply_delta(),
            ..stripe.member(2)
        },
    };
    stale(
        stripe.links[2].prepare(TxnId(8), late, &[0xFF; SPAN], None),
        parity.region,
        parity.epoch,
        "late Apply",
    );
    for i in 0..3 {
        assert_eq!(staged(i), 0, "node {i} keeps nothing staged");
    }
    let mut buf = vec![0u8; SPAN];
    link_b.read(gb.cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &b_bytes, "B's bytes after the late deltas");
    let generation = stripe.links[0].read_member(stripe.grants[0].cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &stripe.data[0], "A's data member after the refused change");
    assert_eq!(generation, 0, "A's data member was not changed");
    // A can still change its own member with no parity target.
    let op = TxnOp::Put {
        to: stripe.member(0),
        return_delta: false,
        targets: vec![],
    };
    stripe.links[0]
        .prepare(TxnId(9), op, &pattern(5, 0, SPAN), None)
        .unwrap();
    stripe.links[0].commit(stripe.grants[0].cap, TxnId(9)).unwrap();
    stripe.links[0].read_member(stripe.grants[0].cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &pattern(5, 0, SPAN), "A's own change still commits");
}

#[test]
fn in_process_late_peer_delta_with_the_old_epoch_is_refused() {
    let cluster = InProcessCluster::new(3, 1, MIB);
    let a = cluster.backend();
    let grants = a.alloc(3, true, &[]).unwrap();
    let links = grants.iter().map(|g| a.connect(&g.addr).unwrap()).collect();
    let stripe = Stripe::new(links, grants);
    let nodes = cluster.nodes();
    late_delta_is_refused(
        &stripe,
        |region| {
            a.free(region).unwrap();
            let b: Arc<dyn FarBackend> = cluster.backend();
            let gb = b.alloc(1, false, &[]).unwrap().remove(0);
            let link = b.connect(&gb.addr).unwrap();
            (gb, link)
        },
        |i| {
            let addr = &stripe.grants[i].addr;
            nodes.iter().find(|n| n.addr() == addr).unwrap().staged_transactions() as u64
        },
    );
}

#[test]
fn real_late_peer_delta_with_the_old_epoch_is_refused() {
    // Three nodes of one region each: once A frees the parity region, it
    // is the only free one.
    let c = common::cluster(3, 8 * MIB, 8 * MIB);
    let a = common::session(&c, "a");
    let grants = a.alloc(3, true, &[]).unwrap();
    let links: Vec<Arc<dyn MemTransport>> = grants
        .iter()
        .map(|g| Arc::new(MemNodeClient::connect(&g.addr, common::quick_opts(&c)).unwrap()) as Arc<dyn MemTransport>)
        .collect();
    let stripe = Stripe::new(links, grants);
    let b = common::session(&c, "b");
    let stats: Vec<MemNodeClient> = stripe
        .grants
        .iter()
        .map(|g| MemNodeClient::connect(&g.addr, common::quick_opts(&c)).unwrap())
        .collect();
    late_delta_is_refused(
        &stripe,
        |region| {
            a.free(region).unwrap();
            let gb = b.alloc(1, false, &[]).unwrap().remove(0);
            let link = Arc::new(MemNodeClient::connect(&gb.addr, common::quick_opts(&c)).unwrap());
            (gb, link)
        },
        |i| stats[i].stats().unwrap().staged_txns,
    );
    // The parity node counted both late deltas as stale deltas.
    let parity = stats[2].stats().unwrap();
    assert_eq!(parity.stale_deltas_refused, 2, "{parity:?}");
    assert_eq!(parity.stale_refused, 2, "{parity:?}");
}

/// Epochs are stored: after a manager restart the next grant of a region
/// still moves past every epoch issued before (its grant and its revoke),
/// and the memory node accepts it.
#[test]
fn epochs_survive_a_manager_restart() {
    let c = common::cluster(1, 8 * MIB, 8 * MIB);
    let a = common::session(&c, "a");
    let ga = a.alloc(1, false, &[]).unwrap().remove(0);
    a.free(ga.cap.region).unwrap();
    c.restart_manager().unwrap();
    let b = common::session(&c, "b");
    let gb = b.alloc(1, false, &[]).unwrap().remove(0);
    assert_eq!(gb.cap.region, ga.cap.region);
    // Granted (e), revoked (e+1), granted again: past both.
    assert!(
        gb.cap.epoch >= ga.cap.epoch + 2,
        "epoch {} after {} and its revoke",
        gb.cap.epoch,
        ga.cap.epoch
    );
    let cl = MemNodeClient::connect(&gb.addr, common::quick_opts(&c)).unwrap();
    let mine = pattern(0xB, 0, 4096);
    cl.write(gb.cap, 0, &mine).unwrap();
    let mut buf = vec![0u8; 4096];
    cl.read(gb.cap, 0, &mut buf).unwrap();
    assert_bytes_eq(&buf, &mine, "B after the restart");
    stale(
        cl.read(ga.cap, 0, &mut buf),
        ga.cap.region,
        ga.cap.epoch,
        "A after the restart",
    );
}
