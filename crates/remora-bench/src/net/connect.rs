//! What the cluster-key proof costs: connection setup to a server with a key
//! and to one without, and one request on each new connection, measured in
//! the same run.
//!
//! Two servers run in this process on the real accept path
//! ([`remora_proto::server::Listener`]), one requiring a key and one not,
//! each answering `Ping`. The client alternates between them in blocks, so
//! that machine noise hits both equally. A connection's setup is
//! [`RpcConn::connect`] (hello, and with a key the one-round-trip proof).
//! Two `Ping`s follow on each connection: the first also waits for the
//! server to finish setting up (with a key, the client sends its proof and
//! its first request back to back, so the server's check of the proof lands
//! there); the second shows that nothing is added per request.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use anyhow::Context;
use remora_proto::msg::{MemRequest, MemResponse, decode};
use remora_proto::server::{ConnGuard, Listener, serve_requests};
use remora_proto::{ClusterKey, ConnOptions, RpcConn, Stream};
use serde_json::{Value, json};

use super::stats::Latency;

/// Connects alternate between the two servers in blocks of this many.
const BLOCK: u64 = 20;

/// Answers `Ping` with `Pong` until the peer hangs up.
fn serve_pings(sock: Stream, _guard: ConnGuard) {
    serve_requests(sock, Duration::from_secs(5), |out, req| {
        decode::<MemRequest>(&req.head).ok() == Some(MemRequest::Ping)
            && out.ok(req.header.id, &MemResponse::Pong, &[]).is_ok()
    });
}

/// One side of the comparison.
pub(crate) struct Side {
    /// Connection setup, hello (and proof) included.
    pub(crate) setup: Latency,
    /// The first request on each new connection.
    pub(crate) first_request: Latency,
    /// The second one.
    pub(crate) second_request: Latency,
}

/// Both sides' figures.
pub(crate) struct ConnectCost {
    /// Without a key on either end.
    pub(crate) plain: Side,
    /// With the cluster key proved both ways.
    pub(crate) keyed: Side,
}

fn side() -> anyhow::Result<Side> {
    Ok(Side {
        setup: Latency::new()?,
        first_request: Latency::new()?,
        second_request: Latency::new()?,
    })
}

fn one(addr: &str, opts: &ConnOptions, into: &mut Side) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let conn = RpcConn::connect(addr, opts.clone()).with_context(|| format!("connecting to {addr}"))?;
    let t1 = Instant::now();
    let (r, _) = conn.call::<_, MemResponse>(&MemRequest::Ping, &[], None)?;
    let t2 = Instant::now();
    anyhow::ensure!(r == MemResponse::Pong, "unexpected reply {r:?}");
    let (r, _) = conn.call::<_, MemResponse>(&MemRequest::Ping, &[], None)?;
    let t3 = Instant::now();
    anyhow::ensure!(r == MemResponse::Pong, "unexpected reply {r:?}");
    into.setup.record(t1 - t0);
    into.first_request.record(t2 - t1);
    into.second_request.record(t3 - t2);
    Ok(())
}

/// Makes `n` connections to each server, alternating in blocks.
pub(crate) fn measure(n: u64) -> anyhow::Result<ConnectCost> {
    let key = ClusterKey::generate();
    let start = |k: Option<ClusterKey>| -> anyhow::Result<Listener> {
        let sock = TcpListener::bind("127.0.0.1:0")?;
        Ok(Listener::start(sock, "bench-connect", k, serve_pings)?)
    };
    let (plain_srv, keyed_srv) = (start(None)?, start(Some(key))?);
    let (plain_addr, keyed_addr) = (plain_srv.local_addr().to_string(), keyed_srv.local_addr().to_string());
    let plain_opts = ConnOptions::default();
    let keyed_opts = ConnOptions {
        cluster_key: Some(key),
        ..ConnOptions::default()
    };
    let mut cost = ConnectCost {
        plain: side()?,
        keyed: side()?,
    };
    // Warm-up: thread stacks, page faults, the HMAC code.
    for _ in 0..BLOCK {
        one(&plain_addr, &plain_opts, &mut side()?)?;
        one(&keyed_addr, &keyed_opts, &mut side()?)?;
    }
    let mut done = 0;
    let mut keyed_first = false;
    while done < n {
        let b = BLOCK.min(n - done);
        for pass in [keyed_first, !keyed_first] {
            for _ in 0..b {
                if pass {
                    one(&keyed_addr, &keyed_opts, &mut cost.keyed)?;
                } else {
                    one(&plain_addr, &plain_opts, &mut cost.plain)?;
                }
            }
        }
        keyed_first = !keyed_first;
        done += b;
    }
    anyhow::ensure!(
        plain_srv.auth_refused() == 0 && keyed_srv.auth_refused() == 0,
        "a connection was refused"
    );
    Ok(cost)
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl ConnectCost {
    /// Prints the comparison.
    pub(crate) fn print(&self) {
        println!(
            "connection setup (in-process servers on the real accept path, {} connects each, alternating):",
            self.plain.setup.samples()
        );
        println!(
            "  {:<20} {:>10} {:>10} {:>14} {:>14} {:>14}",
            "µs", "setup p50", "setup p99", "+1st req p50", "+1st req p99", "2nd req p50"
        );
        for (name, s) in [("no key", &self.plain), ("cluster key proved", &self.keyed)] {
            println!(
                "  {:<20} {:>10.1} {:>10.1} {:>14.1} {:>14.1} {:>14.1}",
                name,
                us(s.setup.at(0.5)),
                us(s.setup.at(0.99)),
                us(s.setup.at(0.5) + s.first_request.at(0.5)),
                us(s.setup.at(0.99) + s.first_request.at(0.99)),
                us(s.second_request.at(0.5))
            );
        }
        let total = |s: &Side, q| us(s.setup.at(q) + s.first_request.at(q));
        let added = total(&self.keyed, 0.5) - total(&self.plain, 0.5);
        let added99 = total(&self.keyed, 0.99) - total(&self.plain, 0.99);
        let per_req = us(self.keyed.second_request.at(0.5)) - us(self.plain.second_request.at(0.5));
        println!(
            "  the key proof adds {added:.1} µs at p50 ({added99:.1} µs at p99) to setup + first request \
             (goal ≤ 1000 µs), {per_req:.1} µs to a later request's p50 (goal 0)"
        );
    }

    /// The figures as JSON (ns).
    pub(crate) fn to_json(&self) -> Value {
        let side = |s: &Side| {
            json!({
                "setup": s.setup.to_json(),
                "first_request": s.first_request.to_json(),
                "second_request": s.second_request.to_json(),
            })
        };
        json!({
            "plain": side(&self.plain),
            "keyed": side(&self.keyed),
            "added_setup_and_first_request_p50_ns": (self.keyed.setup.at(0.5) + self.keyed.first_request.at(0.5)) as i64
                - (self.plain.setup.at(0.5) + self.plain.first_request.at(0.5)) as i64,
        })
    }
}
