//! What `remora bench net` prints and writes as JSON.

use std::time::Duration;

use serde_json::{Value, json};

use super::latency::LatencyRow;
use super::throughput::TputRow;
use super::{GOAL_P50_RATIO, NetArgs, Side};

/// Everything the run produced, for printing and JSON.
pub(super) struct Report<'a> {
    pub(super) args: &'a NetArgs,
    pub(super) cpus: Option<(usize, usize)>,
    pub(super) machine_cpus: usize,
    pub(super) grant_addr: &'a str,
    pub(super) latency: &'a [LatencyRow],
    pub(super) tput: &'a [TputRow],
    pub(super) verified: u64,
    pub(super) elapsed: Duration,
}

pub(super) fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

impl Report<'_> {
    pub(super) fn print(&self) {
        let a = self.args;
        let cpus = self.machine_cpus;
        println!();
        println!(
            "remora bench net — 1 memory node at {} (loopback, {}), {cpus} CPUs",
            self.grant_addr,
            a.memnode.name()
        );
        println!(
            "region {}, every reply checked against a known pattern ({} checked); total run {:.1} s",
            a.region_size,
            self.verified,
            self.elapsed.as_secs_f64()
        );
        println!("{}", self.pinning());
        println!();
        println!(
            "READ latency, one request outstanding: {} samples per size and side, after {} warm-up, \
             sides alternating in blocks of {}",
            a.samples, a.warmup, a.block
        );
        println!(
            "raw TCP = blocking ping-pong to a server ({}), 32 B request, reply of the size",
            a.raw_server.name()
        );
        println!("µs; [95 % CI]");
        println!(
            "{:<7} {:<8} {:>8} {:>20} {:>20} {:>8} {:>8} {:>8}   goal: p50 ≤ {GOAL_P50_RATIO:.2}× raw",
            "size", "side", "samples", "p50", "p99", "p999", "p50 ×", "p99 ×"
        );
        for r in self.latency {
            for (side, h) in [(Side::Raw, &r.raw), (Side::Remora, &r.remora)] {
                let (l50, h50) = h.ci95(0.5);
                let (l99, h99) = h.ci95(0.99);
                let p50 = format!("{} [{}–{}]", us(h.at(0.5)), us(l50), us(h50));
                let p99 = format!("{} [{}–{}]", us(h.at(0.99)), us(l99), us(h99));
                let size = if side == Side::Raw {
                    r.size.to_string()
                } else {
                    String::new()
                };
                let tail = if side == Side::Remora {
                    let ratio = r.ratio(0.5);
                    format!(
                        "{:>8} {:>8}   {}",
                        format!("{ratio:.2}×"),
                        format!("{:.2}×", r.ratio(0.99)),
                        if ratio <= GOAL_P50_RATIO { "met" } else { "MISSED" }
                    )
                } else {
                    String::new()
                };
                println!(
                    "{size:<7} {:<8} {:>8} {p50:>20} {p99:>20} {:>8} {tail}",
                    side.name(),
                    h.samples(),
                    us(h.at(0.999))
                );
            }
        }
        if !self.tput.is_empty() {
            println!();
            println!(
                "throughput: {} requests, {} in flight over {} connection(s) (one client thread each), \
                 {:.1} s per side in {} alternating windows; 1 in {} read replies checked, written data read back",
                a.tput_size,
                a.depth,
                a.conns,
                a.duration.as_secs_f64(),
                a.slices,
                a.verify_every
            );
            println!(
                "{:<6} {:<8} {:>10} {:>10} {:>12} {:>12}",
                "op", "side", "ops", "GB/s", "ops/s", "remora/raw"
            );
            for r in self.tput {
                for (side, t) in [(Side::Raw, &r.raw), (Side::Remora, &r.remora)] {
                    let op = if side == Side::Raw { r.op.name() } else { "" };
                    let ratio = if side == Side::Remora {
                        format!("{:.2}×", r.ratio())
                    } else {
                        String::new()
                    };
                    println!(
                        "{op:<6} {:<8} {:>10} {:>10.2} {:>12.0} {ratio:>12}",
                        side.name(),
                        t.ops,
                        t.gbps(),
                        t.ops_per_sec()
                    );
                }
            }
        }
    }

    fn pinning(&self) -> String {
        match self.cpus {
            None => "CPU pinning: none (--pin none): placement left to the scheduler".into(),
            Some((c, s)) => format!(
                "CPU pinning (--pin {}): client threads on CPU {c}, server threads (memory node, raw baseline) on CPU {s}",
                if c == s { "same" } else { "split" }
            ),
        }
    }

    pub(super) fn to_json(&self) -> Value {
        let a = self.args;
        let latency: Vec<Value> = self
            .latency
            .iter()
            .map(|r| {
                json!({
                    "size_bytes": r.size.0,
                    "size": r.size.to_string(),
                    "raw_tcp": r.raw.to_json(),
                    "remora": r.remora.to_json(),
                    "p50_ratio": r.ratio(0.5),
                    "p99_ratio": r.ratio(0.99),
                    "p999_ratio": r.ratio(0.999),
                    "goal_p50_ratio": GOAL_P50_RATIO,
                    "goal_met": r.ratio(0.5) <= GOAL_P50_RATIO,
                })
            })
            .collect();
        let tput: Vec<Value> = self
            .tput
            .iter()
            .map(|r| {
                json!({
                    "op": r.op.name(),
                    "size_bytes": a.tput_size.0,
                    "depth": a.depth,
                    "conns": a.conns,
                    "raw_tcp": r.raw.to_json(),
                    "remora": r.remora.to_json(),
                    "gbps_ratio": r.ratio(),
                })
            })
            .collect();
        json!({
            "benchmark": "remora bench net",
            "params": {
                "sizes_bytes": a.sizes.iter().map(|s| s.0).collect::<Vec<_>>(),
                "samples": a.samples,
                "warmup": a.warmup,
                "block": a.block,
                "depth": a.depth,
                "conns": a.conns,
                "tput_size_bytes": a.tput_size.0,
                "duration_s": a.duration.as_secs_f64(),
                "slices": a.slices,
                "verify_every": a.verify_every,
                "region_size_bytes": a.region_size.0,
                "memory_nodes": 1,
                "memnode_placement": format!("{:?}", a.memnode),
                "pin": format!("{:?}", a.pin),
                "client_cpu": self.cpus.map(|c| c.0),
                "server_cpu": self.cpus.map(|c| c.1),
                "raw_server_placement": format!("{:?}", a.raw_server),
                "cpus": self.machine_cpus,
            },
            "memnode_addr": self.grant_addr,
            "latency": latency,
            "throughput": tput,
            "replies_checked": self.verified,
            "elapsed_s": self.elapsed.as_secs_f64(),
        })
    }
}
