//! Slow and hostile peers against real daemons: one connection that
//! misbehaves must not hold up, exhaust or expose anyone else. Each test
//! says what the daemon did before it was fixed.

mod common;

use std::time::Duration;

use common::*;
use remora_proto::msg::{Member, RebuildRow, RebuildSource};
use remora_proto::{
    Cap, ConnOptions, MemNodeClient, MemTransport, Range, RegionGrant, RemoteError, RpcError, Token, TxnId, TxnOp,
};

/// A peer asks for far more than a socket buffer holds and never reads the
/// reply (as a rebuild that gave up on its other sources leaves it). The
/// node's reply to it stalls, but no region lock is held meanwhile: the
/// region's owner writes and reads it at once, byte for byte. (Before,
/// the reply was sent from region memory under the region's read lock: the
/// owner's write waited for the lock until the stalled connection timed
/// out, and every read of the region queued behind that write.)
#[test]
fn a_reader_that_stops_reading_holds_no_region_lock() {
    let c = cluster(1, 8 << 20, 4 << 20);
    let s = session(&c, "owner");
    let g = s.alloc(1, false, &[]).expect("a region").remove(0);
    let opts = ConnOptions {
        call_timeout: Duration::from_secs(5),
        ..c.conn_options()
    };
    let stalled = MemNodeClient::connect(&g.addr, opts.clone()).unwrap();
    // 32 times the whole region: 128 MiB of reply nobody reads.
    let whole = Range {
        cap: g.cap,
        offset: 0,
        len: g.size as u32,
    };
    let _never_read = stalled.send_read_v(&vec![whole; 32]).unwrap();
    // Let the node fill the socket's buffers and block on the rest.
    std::thread::sleep(Duration::from_millis(500));

    let owner = MemNodeClient::connect(&g.addr, opts).unwrap();
    let data = pattern(7, 0, 64 << 10);
    // Each call gives up after 5 s (the stalled reply would hold a lock
    // for the node's 30 s stall limit).
    owner.write(g.cap, 4096, &data).expect("the owner's write is served");
    let mut back = vec![0u8; data.len()];
    owner.read(g.cap, 4096, &mut back).expect("the owner's read is served");
    assert_bytes_eq(
        &back,
        &data,
        "the region, written while a reply to another connection stalled",
    );
    drop(stalled);
}

/// The memory node's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the memory node's status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib << 10
}

/// The node still serves its owner: a write read back byte for byte.
fn still_serves(owner: &MemNodeClient, g: &RegionGrant, seed: u64) {
    let data = pattern(seed, 0, 4096);
    owner
        .write(g.cap, 0, &data)
        .expect("the owner's write after the attack");
    let mut back = vec![0u8; data.len()];
    owner
        .read(g.cap, 0, &mut back)
        .expect("the owner's read after the attack");
    assert_bytes_eq(&back, &data, "the region after the attack");
}

/// A rebuild whose rows claim 256 MiB each, every source member empty:
/// refused with a typed error before anything is allocated. (Before, each
/// empty member was zero-padded to the row in memory: k × 256 MiB and more
/// for this request, and a 4 GiB row took the node down.)
#[test]
fn an_oversize_rebuild_is_refused_before_anything_is_allocated() {
    let c = cluster(1, 8 << 20, 4 << 20);
    let s = session(&c, "owner");
    let g = s.alloc(1, false, &[]).expect("a region").remove(0);
    let owner = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
    let pid = c.memnodes()[0].pid;
    let before = peak_rss(pid);
    let sources = (0..4)
        .map(|index| RebuildSource {
            index,
            addr: g.addr.clone(),
            cap: g.cap,
        })
        .collect();
    let rows = vec![RebuildRow {
        offset: 0,
        row_len: 256 << 20,
        offsets: vec![0; 4],
        lens: vec![0; 4],
        out_len: 16,
    }];
    let r = owner.rebuild(g.cap, 4, 2, 4, sources, rows, Duration::from_secs(10));
    assert!(
        matches!(r, Err(RpcError::Remote(RemoteError::BadRequest(_)))),
        "an oversize rebuild answered {r:?}"
    );
    let grew = peak_rss(pid).saturating_sub(before);
    assert!(grew < 64 << 20, "the memory node's peak memory grew by {grew} bytes");
    still_serves(&owner, &g, 11);
}

/// A 200 MiB `Prepare` that no capability opens: refused before its payload
/// is held in memory (it is read off the socket and dropped as it comes).
/// (Before, the whole payload was read into memory and then refused.)
#[test]
fn a_prepare_no_capability_opens_is_refused_before_its_payload_is_held() {
    let c = cluster(1, 8 << 20, 4 << 20);
    let s = session(&c, "owner");
    let g = s.alloc(1, false, &[]).expect("a region").remove(0);
    let owner = MemNodeClient::connect(&g.addr, c.conn_options()).unwrap();
    let pid = c.memnodes()[0].pid;
    let before = peak_rss(pid);
    let forged = Cap {
        token: Token([0xAB; 16]),
        ..g.cap
    };
    let len = 200u32 << 20;
    let op = TxnOp::Put {
        to: Member {
            cap: forged,
            offset: 0,
            len,
            generation: 0,
        },
        return_delta: false,
        targets: vec![],
    };
    let attacker = MemNodeClient::connect(
        &g.addr,
        ConnOptions {
            call_timeout: Duration::from_secs(20),
            ..c.conn_options()
        },
    )
    .unwrap();
    let r = attacker.prepare(TxnId(1), op, &vec![0x5A; len as usize], None);
    assert!(
        matches!(r, Err(RpcError::Remote(RemoteError::BadCapability { .. }))),
        "a forged prepare answered {r:?}"
    );
    let grew = peak_rss(pid).saturating_sub(before);
    assert!(grew < 64 << 20, "the memory node's peak memory grew by {grew} bytes");
    still_serves(&owner, &g, 12);
}

/// The permission bits of `path`.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The manager's store (every region's token, every session's secret) and
/// the cluster key are private to their owner from the start, and a daemon
/// refuses a store others can read. (Before, the store took the umask's
/// mode, 644 here, and a key others could read only drew a warning.)
#[test]
fn the_store_and_the_key_are_private_and_an_exposed_store_is_refused() {
    let c = cluster(1, 8 << 20, 4 << 20);
    let store = c.dir().join("manager-data").join("manager.redb");
    assert_eq!(mode(&store), 0o600, "{}", store.display());
    assert_eq!(mode(c.key_file()), 0o600);

    let data = tempfile::tempdir().unwrap();
    let exposed = data.path().join("manager.redb");
    std::fs::write(&exposed, b"").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let out = run_remora(
        &[
            "manager",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.path().to_str().unwrap(),
            "--insecure-no-auth",
        ],
        &[],
    );
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "a manager started on a store others can read: {err}"
    );
    assert!(err.contains("chmod 600"), "{err}");
}

/// A secret is never taken from the command line, which every user of the
/// machine sees in `ps`: the memory node's admin key comes from the
/// environment only. (Before, `--admin-key` took it.)
#[test]
fn a_secret_on_the_command_line_is_refused() {
    let out = run_remora(
        &[
            "memnode",
            "--manager",
            "127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "8MiB",
            "--admin-key",
            "00112233445566778899aabbccddeeff",
            "--insecure-no-auth",
        ],
        &[],
    );
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "a memory node took its admin key from a flag: {err}"
    );
    assert!(err.contains("--admin-key"), "{err}");
}
