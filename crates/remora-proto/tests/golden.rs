//! Golden bytes of every wire message.
//!
//! Postcard writes an enum variant as its index and a struct's fields in
//! declaration order, so reordering variants or fields changes the bytes on
//! the wire without any compiler complaint, and two builds that differ only in
//! that order misread each other. These tests pin the encoding of one value of
//! every variant of every message enum, and of a whole frame, to hex written
//! out here. A failure means the wire format changed: if that is intended,
//! bump [`remora_proto::frame::VERSION`] and update the hex.
//!
//! Adding a variant cannot slip past: each enum has an `index_of` function
//! with an exhaustive `match` (no wildcard arm), so the new variant breaks the
//! build of this file, and `check_enum` proves that no variant exists past the
//! last golden case, so an arm without a case fails the test.
//!
//! In the hex strings, spaces and `|` only separate fields for the reader.

use std::fmt::Debug;

use remora_proto::cap::{AdminKey, Cap, ComputeId, NodeId, RegionId, Rights, Session, Token};
use remora_proto::frame::{
    FrameHeader, FrameKind, HEADER_LEN, HELLO_KIND, MAGIC, VERSION, check_hello, hello, parse_frames, write_frame,
};
use remora_proto::msg::{
    ClusterStatus, ComputeState, ComputeStatus, DeltaTarget, Event, EventKind, Fault, ManagerRole, ManagerStatus,
    MemNodeStats, MemNodeStatus, MemRequest, MemResponse, Member, MgrRequest, MgrResponse, NodeLoad, NodeState,
    PeerTraffic, RaftRpc, Range, RebuildRow, RebuildSource, RegionGrant, RemoteError, TxnId, TxnOp, decode, encode,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

fn unhex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace() && *b != b'|').collect();
    assert!(digits.len() % 2 == 0, "odd number of hex digits in {s:?}");
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap_or_else(|e| panic!("{s:?}: {e}")))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Sequential bytes, so that a token written in the wrong order shows.
const TOKEN: Token = Token([
    0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
]);
const TOKEN_HEX: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf";
const ADMIN: AdminKey = Token([
    0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf,
]);
const ADMIN_HEX: &str = "b0b1b2b3b4b5b6b7b8b9babbbcbdbebf";

/// Region 3, read-write, epoch 7: `03 | 00 | token | 07`.
fn cap() -> Cap {
    Cap {
        region: RegionId(3),
        rights: Rights::ReadWrite,
        token: TOKEN,
        epoch: 7,
    }
}

/// Compute node 5: `05 | token`.
fn session() -> Session {
    Session {
        id: ComputeId(5),
        secret: TOKEN,
    }
}

/// Expands `{T}` (the token), `{A}` (the admin key) and `{CAP}` (`cap()`).
fn golden(template: &str) -> Vec<u8> {
    let cap_hex = format!("03 00 {TOKEN_HEX} 07");
    unhex(
        &template
            .replace("{CAP}", &cap_hex)
            .replace("{T}", TOKEN_HEX)
            .replace("{A}", ADMIN_HEX),
    )
}

/// Encodes `value`, compares with the golden bytes and decodes them back.
fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(what: &str, value: &T, template: &str) {
    let want = golden(template);
    let got = encode(value);
    assert_eq!(
        hex(&got),
        hex(&want),
        "{what}: {value:?} no longer encodes to its golden bytes; the wire format changed \
         (bump frame::VERSION if that is intended)"
    );
    let back: T = decode(&want).unwrap_or_else(|e| panic!("{what}: golden bytes do not decode: {e}"));
    assert_eq!(&back, value, "{what}: golden bytes decode to another value");
}

/// Checks one golden case per variant, listed in variant order, and that the
/// enum has no variant past the last case.
fn check_enum<T: Serialize + DeserializeOwned + PartialEq + Debug>(
    name: &str,
    cases: &[(T, &str)],
    index_of: fn(&T) -> u32,
) {
    assert!(
        cases.len() < 128,
        "variant indices above 127 take two bytes; adjust this check"
    );
    for (i, (value, template)) in cases.iter().enumerate() {
        assert_eq!(
            index_of(value),
            i as u32,
            "{name}: cases must list one value per variant, in order"
        );
        let want = golden(template);
        assert_eq!(
            want.first().copied(),
            Some(i as u8),
            "{name}: golden bytes of {value:?} do not start with its variant index"
        );
        check(name, value, template);
    }
    // Zeros decode as a valid value of every field type used in messages, so
    // only a missing variant makes this fail to decode.
    let mut past = vec![cases.len() as u8];
    past.extend([0u8; 128]);
    if let Ok(v) = decode::<T>(&past) {
        panic!("{name} has a variant past its last golden case: {v:?}; add a case for it");
    }
    let mut last = vec![cases.len() as u8 - 1];
    last.extend([0u8; 128]);
    assert!(
        decode::<T>(&last).is_ok(),
        "{name}: zero fields must decode for the past-the-end check to mean anything"
    );
}

fn rights_index(r: &Rights) -> u32 {
    match r {
        Rights::ReadWrite => 0,
        Rights::ReadOnly => 1,
        Rights::ApplyDelta => 2,
    }
}

#[test]
fn rights() {
    check_enum(
        "Rights",
        &[
            (Rights::ReadWrite, "00"),
            (Rights::ReadOnly, "01"),
            (Rights::ApplyDelta, "02"),
        ],
        rights_index,
    );
}

#[test]
fn cap_and_session() {
    check(
        "Cap",
        &Cap {
            region: RegionId(300),
            rights: Rights::ReadOnly,
            token: TOKEN,
            epoch: 300,
        },
        "ac02 | 01 | {T} | ac02",
    );
    check("Session", &session(), "05 | {T}");
    check("NodeId", &NodeId(1), "01");
    check("ComputeId", &ComputeId(u64::MAX), "ffffffffffffffffff01");
}

fn mem_request_index(m: &MemRequest) -> u32 {
    match m {
        MemRequest::Read { .. } => 0,
        MemRequest::Write { .. } => 1,
        MemRequest::ReadV { .. } => 2,
        MemRequest::WriteV { .. } => 3,
        MemRequest::Ping => 4,
        MemRequest::Rebuild { .. } => 5,
        MemRequest::Grant { .. } => 6,
        MemRequest::Revoke { .. } => 7,
        MemRequest::Fault { .. } => 8,
        MemRequest::Prepare { .. } => 9,
        MemRequest::Commit { .. } => 10,
        MemRequest::Abort { .. } => 11,
        MemRequest::ReadMember { .. } => 12,
        MemRequest::Load => 13,
        MemRequest::Stats => 14,
        MemRequest::PrepareMany { .. } => 15,
    }
}

/// Region 3 at offset 300, 16 bytes, generation 2: `{CAP} | ac02 | 10 | 02`.
fn member() -> Member {
    Member {
        cap: cap(),
        offset: 300,
        len: 16,
        generation: 2,
    }
}

fn txn_op_index(t: &TxnOp) -> u32 {
    match t {
        TxnOp::Move { .. } => 0,
        TxnOp::Put { .. } => 1,
        TxnOp::Apply { .. } => 2,
    }
}

#[test]
fn txn_op() {
    let target = DeltaTarget {
        addr: "a:1".into(),
        member: member(),
        coef: 0x8e,
    };
    check_enum(
        "TxnOp",
        &[
            (
                TxnOp::Move {
                    to: member(),
                    from_cap: cap(),
                    from: 8,
                    return_delta: true,
                    targets: vec![target.clone()],
                },
                "00 | {CAP} ac02 10 02 | {CAP} | 08 | 01 | 01 03613a31 {CAP} ac02 10 02 8e",
            ),
            (
                TxnOp::Put {
                    to: member(),
                    return_delta: false,
                    targets: vec![],
                },
                "01 | {CAP} ac02 10 02 | 00 | 00",
            ),
            (TxnOp::Apply { to: member() }, "02 | {CAP} ac02 10 02"),
        ],
        txn_op_index,
    );
}

#[test]
fn mem_request() {
    let range = |offset, len| Range {
        cap: cap(),
        offset,
        len,
    };
    check_enum(
        "MemRequest",
        &[
            (
                MemRequest::Read {
                    cap: cap(),
                    offset: 300,
                    len: 4096,
                },
                "00 | {CAP} | ac02 | 8020",
            ),
            (MemRequest::Write { cap: cap(), offset: 1 }, "01 | {CAP} | 01"),
            (
                MemRequest::ReadV {
                    ranges: vec![range(0, 1), range(2, 3)],
                },
                "02 | 02 | {CAP} 00 01 | {CAP} 02 03",
            ),
            (
                MemRequest::WriteV {
                    ranges: vec![range(128, 127)],
                },
                "03 | 01 | {CAP} 8001 7f",
            ),
            (MemRequest::Ping, "04"),
            (
                MemRequest::Rebuild {
                    cap: cap(),
                    k: 4,
                    m: 2,
                    want: 1,
                    sources: vec![RebuildSource {
                        index: 0,
                        addr: "a:1".into(),
                        cap: cap(),
                    }],
                    rows: vec![RebuildRow {
                        offset: 8,
                        row_len: 16,
                        offsets: vec![0, 300],
                        lens: vec![16, 0],
                        out_len: 9,
                    }],
                },
                "05 | {CAP} | 04 02 01 | 01 00 03613a31 {CAP} | 01 08 10 02 00 ac02 02 10 00 09",
            ),
            (
                MemRequest::Grant {
                    admin: ADMIN,
                    region: RegionId(7),
                    owner: ComputeId(5),
                    token: TOKEN,
                    epoch: 9,
                },
                "06 | {A} | 07 | 05 | {T} | 09",
            ),
            (
                MemRequest::Revoke {
                    admin: ADMIN,
                    region: RegionId(7),
                    epoch: 10,
                },
                "07 | {A} | 07 | 0a",
            ),
            (
                MemRequest::Fault {
                    admin: ADMIN,
                    fault: Fault::DropReplies,
                },
                "08 | {A} | 03",
            ),
            (
                MemRequest::Prepare {
                    txn: TxnId(7),
                    op: TxnOp::Apply { to: member() },
                },
                "09 | 07 | 02 {CAP} ac02 10 02",
            ),
            (
                MemRequest::Commit {
                    cap: cap(),
                    txn: TxnId(300),
                },
                "0a | {CAP} | ac02",
            ),
            (
                MemRequest::Abort {
                    cap: cap(),
                    txn: TxnId(1),
                },
                "0b | {CAP} | 01",
            ),
            (
                MemRequest::ReadMember {
                    cap: cap(),
                    offset: 300,
                    len: 16,
                },
                "0c | {CAP} | ac02 | 10",
            ),
            (MemRequest::Load, "0d"),
            (MemRequest::Stats, "0e"),
            (
                MemRequest::PrepareMany {
                    txn: TxnId(7),
                    ops: vec![TxnOp::Apply { to: member() }, TxnOp::Apply { to: member() }],
                },
                "0f | 07 | 02 | 02 {CAP} ac02 10 02 | 02 {CAP} ac02 10 02",
            ),
        ],
        mem_request_index,
    );
}

fn fault_index(f: &Fault) -> u32 {
    match f {
        Fault::Pause => 0,
        Fault::Resume => 1,
        Fault::Delay { .. } => 2,
        Fault::DropReplies => 3,
        Fault::DropConnections => 4,
        Fault::Corrupt { .. } => 5,
        Fault::Busy { .. } => 6,
    }
}

#[test]
fn fault() {
    check_enum(
        "Fault",
        &[
            (Fault::Pause, "00"),
            (Fault::Resume, "01"),
            (Fault::Delay { micros: 1000 }, "02 | e807"),
            (Fault::DropReplies, "03"),
            (Fault::DropConnections, "04"),
            (
                Fault::Corrupt {
                    region: RegionId(2),
                    offset: 64,
                    len: 8,
                },
                "05 | 02 40 08",
            ),
            (
                Fault::Busy {
                    threads: 2,
                    millis: 300,
                },
                "06 | 02 | ac02",
            ),
        ],
        fault_index,
    );
}

fn mem_response_index(m: &MemResponse) -> u32 {
    match m {
        MemResponse::Data => 0,
        MemResponse::Written => 1,
        MemResponse::Pong => 2,
        MemResponse::Rebuilt { .. } => 3,
        MemResponse::Done => 4,
        MemResponse::Prepared => 5,
        MemResponse::Committed => 6,
        MemResponse::Aborted => 7,
        MemResponse::Member { .. } => 8,
        MemResponse::Load(_) => 9,
        MemResponse::Stats(_) => 10,
    }
}

#[test]
fn mem_response() {
    check_enum(
        "MemResponse",
        &[
            (MemResponse::Data, "00"),
            (MemResponse::Written, "01"),
            (MemResponse::Pong, "02"),
            (
                MemResponse::Rebuilt {
                    bytes: 65536,
                    checksums: vec![1, u64::MAX],
                },
                "03 | 808004 | 02 01 ffffffffffffffffff01",
            ),
            (MemResponse::Done, "04"),
            (MemResponse::Prepared, "05"),
            (MemResponse::Committed, "06"),
            (MemResponse::Aborted, "07"),
            (MemResponse::Member { generation: 300 }, "08 | ac02"),
            (
                MemResponse::Load(NodeLoad {
                    cpu_permille: 1500,
                    cores: 2,
                }),
                "09 | dc0b | 02",
            ),
            (
                MemResponse::Stats(MemNodeStats {
                    regions: 300,
                    granted: 2,
                    staged_txns: 1,
                    unanswered_writes: 4,
                    deltas_in_flight: 6,
                    stale_refused: 5,
                    stale_deltas_refused: 3,
                    peer: PeerTraffic {
                        rebuild_reads: 1,
                        rebuild_bytes: 200,
                        delta_applies: 2,
                        delta_bytes: 300,
                    },
                }),
                "0a | ac02 | 02 | 01 | 04 | 06 | 05 | 03 | 01 | c801 | 02 | ac02",
            ),
        ],
        mem_response_index,
    );
}

fn node_state_index(s: &NodeState) -> u32 {
    match s {
        NodeState::Alive => 0,
        NodeState::Draining => 1,
        NodeState::Dead => 2,
    }
}

fn compute_state_index(s: &ComputeState) -> u32 {
    match s {
        ComputeState::Alive => 0,
        ComputeState::Dead => 1,
    }
}

#[test]
fn states() {
    check_enum(
        "NodeState",
        &[
            (NodeState::Alive, "00"),
            (NodeState::Draining, "01"),
            (NodeState::Dead, "02"),
        ],
        node_state_index,
    );
    check_enum(
        "ComputeState",
        &[(ComputeState::Alive, "00"), (ComputeState::Dead, "01")],
        compute_state_index,
    );
}

fn event_kind_index(k: &EventKind) -> u32 {
    match k {
        EventKind::NodeDead { .. } => 0,
        EventKind::NodeDraining { .. } => 1,
    }
}

#[test]
fn event_kind() {
    check_enum(
        "EventKind",
        &[
            (
                EventKind::NodeDead {
                    node: NodeId(2),
                    addr: "h:9".into(),
                    regions: vec![RegionId(4), RegionId(5)],
                },
                "00 | 02 | 03683a39 | 02 04 05",
            ),
            (
                EventKind::NodeDraining {
                    node: NodeId(2),
                    addr: "h:9".into(),
                    regions: vec![],
                },
                "01 | 02 | 03683a39 | 00",
            ),
        ],
        event_kind_index,
    );
}

fn mgr_request_index(m: &MgrRequest) -> u32 {
    match m {
        MgrRequest::RegisterMemNode { .. } => 0,
        MgrRequest::MemNodeHeartbeat { .. } => 1,
        MgrRequest::Deregister { .. } => 2,
        MgrRequest::Drain { .. } => 3,
        MgrRequest::RegisterCompute { .. } => 4,
        MgrRequest::ComputeHeartbeat { .. } => 5,
        MgrRequest::Alloc { .. } => 6,
        MgrRequest::Free { .. } => 7,
        MgrRequest::MyRegions { .. } => 8,
        MgrRequest::WaitEvents { .. } => 9,
        MgrRequest::Status => 10,
        MgrRequest::Suspect { .. } => 11,
        MgrRequest::Raft { .. } => 12,
        MgrRequest::Member => 13,
        MgrRequest::Isolate { .. } => 14,
    }
}

#[test]
fn mgr_request() {
    check_enum(
        "MgrRequest",
        &[
            (
                MgrRequest::RegisterMemNode {
                    addr: "h:9".into(),
                    capacity: 1 << 30,
                    region_size: 1 << 26,
                    admin: ADMIN,
                    request: 300,
                },
                "00 | 03683a39 | 8080808004 | 80808020 | {A} | ac02",
            ),
            (
                MgrRequest::MemNodeHeartbeat {
                    node: NodeId(1),
                    admin: ADMIN,
                    peer: PeerTraffic {
                        rebuild_reads: 2,
                        rebuild_bytes: 300,
                        delta_applies: 3,
                        delta_bytes: 1,
                    },
                    load: NodeLoad {
                        cpu_permille: 300,
                        cores: 4,
                    },
                },
                "01 | 01 | {A} | 02 ac02 03 01 | ac02 04",
            ),
            (
                MgrRequest::Deregister {
                    node: NodeId(1),
                    admin: ADMIN,
                },
                "02 | 01 | {A}",
            ),
            (MgrRequest::Drain { addr: "h:9".into() }, "03 | 03683a39"),
            (
                MgrRequest::RegisterCompute {
                    name: "app".into(),
                    request: 5,
                },
                "04 | 03617070 | 05",
            ),
            (MgrRequest::ComputeHeartbeat { session: session() }, "05 | 05 {T}"),
            (
                MgrRequest::Alloc {
                    session: session(),
                    seq: 300,
                    count: 6,
                    distinct: true,
                    exclude: vec![NodeId(1), NodeId(2)],
                },
                "06 | 05 {T} | ac02 | 06 | 01 | 02 01 02",
            ),
            (
                MgrRequest::Free {
                    session: session(),
                    seq: 4,
                    region: RegionId(3),
                },
                "07 | 05 {T} | 04 | 03",
            ),
            (MgrRequest::MyRegions { session: session() }, "08 | 05 {T}"),
            (
                MgrRequest::WaitEvents {
                    session: session(),
                    after: 17,
                    timeout_ms: 250,
                },
                "09 | 05 {T} | 11 | fa01",
            ),
            (MgrRequest::Status, "0a"),
            (
                MgrRequest::Suspect {
                    session: session(),
                    node: NodeId(2),
                },
                "0b | 05 {T} | 02",
            ),
            (
                MgrRequest::Raft {
                    rpc: RaftRpc::Vote,
                    from: 3,
                },
                "0c | 01 | 03",
            ),
            (MgrRequest::Member, "0d"),
            (
                MgrRequest::Isolate {
                    peers: vec![1, 3],
                    for_ms: 300,
                },
                "0e | 02 01 03 | ac02",
            ),
        ],
        mgr_request_index,
    );
}

fn manager_member() -> ManagerStatus {
    ManagerStatus {
        id: 2,
        addr: "h:9".into(),
        role: ManagerRole::Leader,
        term: 7,
        last_applied: 300,
        leader: Some(2),
    }
}

fn mgr_response_index(m: &MgrResponse) -> u32 {
    match m {
        MgrResponse::MemNodeRegistered { .. } => 0,
        MgrResponse::HeartbeatAck { .. } => 1,
        MgrResponse::ComputeRegistered { .. } => 2,
        MgrResponse::Regions(_) => 3,
        MgrResponse::Events { .. } => 4,
        MgrResponse::Status(_) => 5,
        MgrResponse::Ok => 6,
        MgrResponse::Verdict { .. } => 7,
        MgrResponse::Raft => 8,
        MgrResponse::Member(_) => 9,
    }
}

#[test]
fn mgr_response() {
    check_enum(
        "MgrResponse",
        &[
            (
                MgrResponse::MemNodeRegistered {
                    node: NodeId(1),
                    regions: vec![RegionId(10), RegionId(11)],
                    heartbeat_interval_ms: 200,
                },
                "00 | 01 | 02 0a 0b | c801",
            ),
            (
                MgrResponse::HeartbeatAck {
                    state: NodeState::Draining,
                },
                "01 | 01",
            ),
            (
                MgrResponse::ComputeRegistered {
                    session: session(),
                    heartbeat_interval_ms: 200,
                    incarnation: 2,
                },
                "02 | 05 {T} | c801 | 02",
            ),
            (
                MgrResponse::Regions(vec![RegionGrant {
                    cap: cap(),
                    node: NodeId(1),
                    addr: "h:9".into(),
                    size: 1 << 26,
                    node_state: NodeState::Dead,
                }]),
                "03 | 01 | {CAP} 01 03683a39 80808020 02",
            ),
            (
                MgrResponse::Events {
                    incarnation: 2,
                    events: vec![Event {
                        seq: 9,
                        kind: EventKind::NodeDraining {
                            node: NodeId(2),
                            addr: "h:9".into(),
                            regions: vec![RegionId(4)],
                        },
                    }],
                },
                "04 | 02 | 01 | 09 | 01 02 03683a39 01 04",
            ),
            (
                MgrResponse::Status(ClusterStatus {
                    memory_nodes: vec![MemNodeStatus {
                        id: NodeId(1),
                        addr: "h:9".into(),
                        state: NodeState::Alive,
                        regions_total: 16,
                        regions_free: 15,
                        capacity_bytes: 1 << 30,
                        peer: PeerTraffic::default(),
                        load: NodeLoad {
                            cpu_permille: 1,
                            cores: 2,
                        },
                    }],
                    compute_nodes: vec![ComputeStatus {
                        id: ComputeId(5),
                        name: "app".into(),
                        state: ComputeState::Dead,
                        regions: 1,
                    }],
                    managers: vec![manager_member()],
                }),
                "05 | 01 | 01 03683a39 00 10 0f 8080808004 00 00 00 00 01 02 | 01 | 05 03617070 01 01 \
                 | 01 | 02 03683a39 00 07 ac02 01 02",
            ),
            (MgrResponse::Ok, "06"),
            (MgrResponse::Verdict { alive: true }, "07 | 01"),
            (MgrResponse::Raft, "08"),
            (
                MgrResponse::Member(manager_member()),
                "09 | 02 03683a39 00 07 ac02 01 02",
            ),
        ],
        mgr_response_index,
    );
}

fn remote_error_index(e: &RemoteError) -> u32 {
    match e {
        RemoteError::BadCapability { .. } => 0,
        RemoteError::NoSuchRegion { .. } => 1,
        RemoteError::OutOfBounds { .. } => 2,
        RemoteError::BadRequest(_) => 3,
        RemoteError::Unauthorized => 4,
        RemoteError::Fenced => 5,
        RemoteError::Unknown => 6,
        RemoteError::NoCapacity { .. } => 7,
        RemoteError::Unsupported(_) => 8,
        RemoteError::Unavailable => 9,
        RemoteError::Internal(_) => 10,
        RemoteError::StaleGeneration { .. } => 11,
        RemoteError::TxnConflict { .. } => 12,
        RemoteError::UnknownTxn(_) => 13,
        RemoteError::StaleEpoch { .. } => 14,
        RemoteError::NotLeader { .. } => 15,
        RemoteError::Busy(_) => 16,
    }
}

#[test]
fn remote_error() {
    check_enum(
        "RemoteError",
        &[
            (RemoteError::BadCapability { region: RegionId(3) }, "00 | 03"),
            (RemoteError::NoSuchRegion { region: RegionId(3) }, "01 | 03"),
            (
                RemoteError::OutOfBounds {
                    region: RegionId(3),
                    offset: 1,
                    len: 2,
                    size: 4,
                },
                "02 | 03 01 02 04",
            ),
            (RemoteError::BadRequest("no".into()), "03 | 026e6f"),
            (RemoteError::Unauthorized, "04"),
            (RemoteError::Fenced, "05"),
            (RemoteError::Unknown, "06"),
            (
                RemoteError::NoCapacity {
                    wanted: 6,
                    available: 5,
                },
                "07 | 06 05",
            ),
            (RemoteError::Unsupported("f".into()), "08 | 0166"),
            (RemoteError::Unavailable, "09"),
            (RemoteError::Internal("x".into()), "0a | 0178"),
            (
                RemoteError::StaleGeneration {
                    region: RegionId(3),
                    offset: 300,
                    expected: 1,
                    found: 2,
                },
                "0b | 03 | ac02 | 01 | 02",
            ),
            (
                RemoteError::TxnConflict {
                    region: RegionId(3),
                    offset: 8,
                },
                "0c | 03 | 08",
            ),
            (RemoteError::UnknownTxn(5), "0d | 05"),
            (
                RemoteError::StaleEpoch {
                    region: RegionId(3),
                    presented: 300,
                    current: 2,
                },
                "0e | 03 | ac02 | 02",
            ),
            (
                RemoteError::NotLeader {
                    leader: Some("h:9".into()),
                },
                "0f | 01 03683a39",
            ),
            (RemoteError::Busy("b".into()), "10 | 0162"),
        ],
        remote_error_index,
    );
}

fn frame_kind_byte(k: FrameKind) -> u8 {
    match k {
        FrameKind::Request => 1,
        FrameKind::Response => 2,
        FrameKind::Error => 3,
    }
}

#[test]
fn frame_header_constants() {
    assert_eq!(MAGIC.to_le_bytes(), *b"Rm");
    assert_eq!(HEADER_LEN, 24);
    for kind in [FrameKind::Request, FrameKind::Response, FrameKind::Error] {
        let b = FrameHeader {
            kind,
            id: 0,
            head_len: 0,
            payload_len: 0,
        }
        .encode();
        assert_eq!(b[3], frame_kind_byte(kind), "{kind:?}");
        assert_eq!(b[3], kind as u8, "{kind:?}");
    }
}

/// The hello: magic and version where every version keeps them, kind 4.
#[test]
fn hello_frame() {
    let want = unhex("526d 0b 04 0000 0000 | 0000000000000000 | 00000000 | 00000000");
    assert_eq!(hex(&hello()), hex(&want));
    assert_eq!(HELLO_KIND, 4);
    assert_eq!(check_hello(&hello()), Ok(()));
}

/// A whole request frame and its error reply: header, head and payload.
#[test]
fn whole_frames() {
    assert_eq!(VERSION, 11, "a new VERSION needs new golden frames");
    let head = encode(&MemRequest::Write { cap: cap(), offset: 1 });
    let mut out = Vec::new();
    write_frame(
        &mut out,
        FrameKind::Request,
        0x0102_0304_0506_0708,
        &head,
        &[b"pay", b"load"],
    )
    .unwrap();
    let want = golden(
        "526d 0b 01 0000 0000 | 0807060504030201 | 15000000 | 07000000 \
         | 01 {CAP} 01 | 7061796c6f6164",
    );
    assert_eq!(hex(&out), hex(&want), "request frame");
    let frames = parse_frames(&want).unwrap();
    assert_eq!(frames.len(), 1);
    assert_eq!(
        decode::<MemRequest>(&frames[0].1).unwrap(),
        MemRequest::Write { cap: cap(), offset: 1 }
    );
    assert_eq!(frames[0].2, b"payload");

    let head = encode(&RemoteError::NoSuchRegion { region: RegionId(3) });
    let mut out = Vec::new();
    write_frame(&mut out, FrameKind::Error, 0x0102_0304_0506_0708, &head, &[]).unwrap();
    let want = unhex("526d 0b 03 0000 0000 | 0807060504030201 | 02000000 | 00000000 | 01 03");
    assert_eq!(hex(&out), hex(&want), "error frame");
}
