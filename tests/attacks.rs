//! Slow and hostile peers against real daemons: one connection that
//! misbehaves must not hold up anyone else's requests.

mod common;

use std::time::Duration;

use common::*;
use remora_proto::{ConnOptions, MemNodeClient, MemTransport, Range};

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
