//! The in-process node refuses what the daemon refuses: the same requests
//! go to a daemon's TCP data path and to an in-process node, and must get
//! the same answers, byte for byte. If the two ever grow separate checks
//! again, one of these answers differs.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use remora_proto::msg::{Fault, MemRequest, MemResponse, RebuildSource};
use remora_proto::server::Listener;
use remora_proto::{
    Cap, ComputeId, ConnOptions, MemNodeClient, MemTransport, Range, RegionId, RemoteError, Rights, RpcError, Token,
    TxnId,
};

use super::InProcessCluster;
use crate::region::RegionTable;

const REGION_SIZE: u64 = 1 << 20;

/// What a request got, in terms both transports share.
#[derive(PartialEq)]
enum Outcome {
    Reply(MemResponse, Vec<u8>),
    Refused(RemoteError),
    /// The node ended the connection (a malformed request).
    ConnectionEnded,
}

/// Payloads shortened, so that a mismatch stays readable (equality still
/// compares every byte).
impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Reply(r, p) => write!(f, "Reply({r:?}, {} bytes {:?}..)", p.len(), &p[..p.len().min(8)]),
            Self::Refused(e) => write!(f, "Refused({e:?})"),
            Self::ConnectionEnded => write!(f, "ConnectionEnded"),
        }
    }
}

/// One memory node under test, reached through the transport trait.
struct Side {
    name: &'static str,
    connect: Box<dyn Fn() -> Arc<dyn MemTransport>>,
    /// The owner's capability of its one granted region.
    cap: Cap,
    lapse: Box<dyn Fn()>,
    renew: Box<dyn Fn()>,
    /// Keeps a daemon serving.
    _keep: Option<Listener>,
}

fn call(link: &dyn MemTransport, req: &MemRequest, payload: &[&[u8]], reply_len: usize) -> Outcome {
    let t = match link.send(req, payload) {
        Ok(t) => t,
        Err(e) => panic!("send {req:?}: {e}"),
    };
    let mut buf = vec![0u8; reply_len];
    let dest = (reply_len > 0).then_some(&mut buf[..]);
    match link.wait(t, dest, Duration::from_secs(10)) {
        Ok(resp) => Outcome::Reply(resp, buf),
        Err(RpcError::Remote(e)) => Outcome::Refused(e),
        Err(RpcError::Timeout { .. }) => panic!("{req:?} timed out"),
        Err(_) => Outcome::ConnectionEnded,
    }
}

/// An in-process node with one region granted through the cluster.
fn in_process() -> Side {
    let cluster = InProcessCluster::new(1, 1, REGION_SIZE);
    let backend = cluster.backend();
    let grant = backend.alloc(1, false, &[]).expect("alloc").remove(0);
    let node = cluster.nodes().remove(0);
    let (n1, n2) = (node.clone(), node);
    let addr = grant.addr.clone();
    Side {
        name: "in-process",
        connect: Box::new(move || backend.connect(&addr).expect("connect")),
        cap: grant.cap,
        lapse: Box::new(move || n1.lapse_lease()),
        renew: Box::new(move || n2.renew_lease()),
        _keep: None,
    }
}

/// A daemon's TCP data path (no manager: the lease is set by hand), with
/// the same region, token and epoch as `like`'s.
fn daemon(like: Cap) -> Side {
    let shared = Arc::new(crate::Shared {
        admin: Token::random(),
        regions: RegionTable::default(),
        faults: Default::default(),
        lease: Default::default(),
        cpu: Default::default(),
        peer: Default::default(),
        node_id: AtomicU64::new(0),
        draining: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        conns: Mutex::new(None),
        cluster_key: None,
        tls: None,
        peers: Mutex::new(HashMap::new()),
    });
    shared.regions.replace(&[like.region], REGION_SIZE);
    shared
        .regions
        .grant(like.region, ComputeId(1), like.token, like.epoch)
        .expect("grant");
    shared.lease.hold();
    let sock = TcpListener::bind("127.0.0.1:0").expect("bind");
    let s2 = Arc::clone(&shared);
    let listener = Listener::start(sock, "memnode-test", None, move |stream, guard| {
        crate::serve::handle(&s2, stream, guard)
    })
    .expect("listen");
    *shared.conns.lock().unwrap() = Some(Arc::clone(listener.conns()));
    let addr = listener.local_addr().to_string();
    let (s3, s4) = (Arc::clone(&shared), shared);
    Side {
        name: "daemon",
        connect: Box::new(move || Arc::new(MemNodeClient::connect(&addr, ConnOptions::default()).expect("connect"))),
        cap: like,
        lapse: Box::new(move || s3.lease.expire()),
        renew: Box::new(move || s4.lease.hold()),
        _keep: Some(listener),
    }
}

/// Runs the same script on both nodes; returns the owner's capability
/// (the same on both) and the outcomes (the same on both).
fn both(script: impl Fn(&Side) -> Vec<Outcome>) -> (Cap, Vec<Outcome>) {
    let ip = in_process();
    let d = daemon(ip.cap);
    let (a, b) = (script(&ip), script(&d));
    assert_eq!(a, b, "{} and {} answered differently", ip.name, d.name);
    (ip.cap, a)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

#[test]
fn a_lapsed_lease_refuses_data_on_both_and_keeps_it() {
    let data = pattern(4096);
    let (_, out) = both(|s| {
        let link = (s.connect)();
        let cap = s.cap;
        let read = MemRequest::Read {
            cap,
            offset: 64,
            len: 4096,
        };
        let mut o = vec![call(&*link, &MemRequest::Write { cap, offset: 64 }, &[&data], 0)];
        (s.lapse)();
        o.push(call(&*link, &read, &[], 4096));
        o.push(call(&*link, &MemRequest::Write { cap, offset: 0 }, &[&data], 0));
        o.push(call(
            &*link,
            &MemRequest::ReadV {
                ranges: vec![Range { cap, offset: 0, len: 8 }],
            },
            &[],
            8,
        ));
        o.push(call(&*link, &MemRequest::ReadMember { cap, offset: 0, len: 8 }, &[], 8));
        o.push(call(&*link, &MemRequest::Commit { cap, txn: TxnId(1) }, &[], 0));
        o.push(call(&*link, &MemRequest::Load, &[], 0));
        let rebuild = MemRequest::Rebuild {
            cap,
            k: 1,
            m: 1,
            want: 1,
            sources: vec![RebuildSource {
                index: 0,
                addr: "nowhere:1".into(),
                cap,
            }],
            rows: Vec::new(),
        };
        o.push(call(&*link, &rebuild, &[], 0));
        // Not data: answered while lapsed.
        o.push(call(&*link, &MemRequest::Ping, &[], 0));
        (s.renew)();
        o.push(call(&*link, &read, &[], 4096));
        o
    });
    assert_eq!(out[0], Outcome::Reply(MemResponse::Written, vec![0; 0]));
    for refused in &out[1..8] {
        assert_eq!(*refused, Outcome::Refused(RemoteError::Unavailable));
    }
    assert_eq!(out[8], Outcome::Reply(MemResponse::Pong, Vec::new()));
    // The refused write changed nothing: the data written before is intact.
    assert_eq!(out[9], Outcome::Reply(MemResponse::Data, data.clone()));
}

#[test]
fn bad_capabilities_bounds_and_admin_keys_are_refused_alike() {
    let (cap, out) = both(|s| {
        let link = (s.connect)();
        let cap = s.cap;
        let forged = Cap {
            token: Token::random(),
            ..cap
        };
        let stale = Cap {
            epoch: cap.epoch + 1,
            ..cap
        };
        let read_only = Cap {
            rights: Rights::ReadOnly,
            token: cap.token.derive_read_only(cap.region, cap.epoch),
            ..cap
        };
        let huge = u32::MAX / 2;
        vec![
            call(
                &*link,
                &MemRequest::Read {
                    cap: forged,
                    offset: 0,
                    len: 8,
                },
                &[],
                8,
            ),
            call(
                &*link,
                &MemRequest::Read {
                    cap: stale,
                    offset: 0,
                    len: 8,
                },
                &[],
                8,
            ),
            call(
                &*link,
                &MemRequest::Write {
                    cap: read_only,
                    offset: 0,
                },
                &[b"x"],
                0,
            ),
            call(
                &*link,
                &MemRequest::Read {
                    cap,
                    offset: REGION_SIZE - 4,
                    len: 8,
                },
                &[],
                8,
            ),
            call(
                &*link,
                &MemRequest::Read {
                    cap: Cap {
                        region: RegionId(999),
                        ..cap
                    },
                    offset: 0,
                    len: 8,
                },
                &[],
                8,
            ),
            // Over the frame limit: refused before any bounds check.
            call(
                &*link,
                &MemRequest::ReadV {
                    ranges: vec![
                        Range {
                            cap,
                            offset: 0,
                            len: huge,
                        },
                        Range {
                            cap,
                            offset: 0,
                            len: huge,
                        },
                    ],
                },
                &[],
                0,
            ),
            call(
                &*link,
                &MemRequest::WriteV {
                    ranges: vec![Range { cap, offset: 0, len: 4 }],
                },
                &[b"12345678"],
                0,
            ),
            call(
                &*link,
                &MemRequest::Grant {
                    admin: Token::random(),
                    region: cap.region,
                    owner: ComputeId(2),
                    token: Token::random(),
                    epoch: cap.epoch + 1,
                },
                &[],
                0,
            ),
            call(
                &*link,
                &MemRequest::Revoke {
                    admin: Token::random(),
                    region: cap.region,
                    epoch: cap.epoch + 1,
                },
                &[],
                0,
            ),
            call(
                &*link,
                &MemRequest::Fault {
                    admin: Token::random(),
                    fault: Fault::Pause,
                },
                &[],
                0,
            ),
            // The owner still reads what it had (zeroes): nothing above got in.
            call(&*link, &MemRequest::Read { cap, offset: 0, len: 8 }, &[], 8),
            call(&*link, &MemRequest::Stats, &[], 0),
        ]
    });
    let region = cap.region;
    assert_eq!(out[0], Outcome::Refused(RemoteError::BadCapability { region }));
    assert_eq!(
        out[1],
        Outcome::Refused(RemoteError::StaleEpoch {
            region,
            presented: cap.epoch + 1,
            current: cap.epoch,
        })
    );
    assert_eq!(out[2], Outcome::Refused(RemoteError::BadCapability { region }));
    assert_eq!(
        out[3],
        Outcome::Refused(RemoteError::OutOfBounds {
            region,
            offset: REGION_SIZE - 4,
            len: 8,
            size: REGION_SIZE,
        })
    );
    assert_eq!(
        out[4],
        Outcome::Refused(RemoteError::NoSuchRegion { region: RegionId(999) })
    );
    assert!(matches!(&out[5], Outcome::Refused(RemoteError::BadRequest(m)) if m.contains("frame limit")));
    assert!(matches!(&out[6], Outcome::Refused(RemoteError::BadRequest(m)) if m.contains("payload has 8")));
    for admin in &out[7..10] {
        assert_eq!(*admin, Outcome::Refused(RemoteError::Unauthorized));
    }
    assert_eq!(out[10], Outcome::Reply(MemResponse::Data, vec![0; 8]));
    match &out[11] {
        Outcome::Reply(MemResponse::Stats(st), p) => {
            assert!(p.is_empty());
            assert_eq!((st.regions, st.granted, st.stale_refused), (1, 1, 1));
        }
        other => panic!("stats: {other:?}"),
    }
}

#[test]
fn a_payload_where_none_belongs_ends_the_connection_on_both() {
    both(|s| {
        let cap = s.cap;
        let mut o = Vec::new();
        for req in [MemRequest::Ping, MemRequest::Read { cap, offset: 0, len: 4 }] {
            let link = (s.connect)();
            o.push(call(&*link, &req, &[b"junk"], 4));
            assert_eq!(o.last(), Some(&Outcome::ConnectionEnded), "{}: {req:?}", s.name);
            // Only that connection: a new one is served.
            o.push(call(&*(s.connect)(), &MemRequest::Ping, &[], 0));
            assert_eq!(o.last(), Some(&Outcome::Reply(MemResponse::Pong, Vec::new())));
        }
        o
    });
}
