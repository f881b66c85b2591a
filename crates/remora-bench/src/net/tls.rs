//! `remora bench net --tls`: the data path over TLS against plain TCP.
//!
//! The cluster runs with `--tls control`, so its memory node serves TLS
//! and plain clients on one port; the benchmark connects to it both ways
//! (the TLS client as a `--tls data` compute node would) and measures the
//! two against each other with the same phases, offsets and checks as
//! remora against raw TCP: READ latency per size, then READ throughput.
//! The throughput goal is judged on the median of the window pairs' ratios
//! (each `--slices` window of TLS over the plain window beside it), printed
//! with their range and the whole phase's ratio: on this 2-core machine one
//! window pair ranged from 0.49× to 1.32× within a run, as the scheduler
//! placed the client and memory-node threads.

use anyhow::{Context, anyhow};
use remora_cluster::LocalCluster;
use remora_proto::{ConnOptions, MemNodeClient, RegionGrant, TlsConfig, TlsMode};
use serde_json::{Value, json};

use super::{LatencyRow, Names, Remora, TputRow, us};

/// READ p50 goal of TLS: at most this many times plain TCP.
const GOAL_P50_RATIO: f64 = 1.3;
/// Size at which the p50 goal is judged.
const GOAL_SIZE: u64 = 16 << 10;
/// Throughput goal of TLS: at least this fraction of plain TCP.
const GOAL_TPUT_RATIO: f64 = 0.7;

/// Plain remora against remora over TLS.
pub(super) const PLAIN_VS_TLS: Names = Names {
    base: "plain TCP",
    subject: "TLS",
};

/// A data-path connection over TLS, with the cluster's certificates.
pub(super) fn connect(cluster: &LocalCluster, grant: &RegionGrant) -> anyhow::Result<Remora> {
    let dir = cluster
        .tls()
        .ok_or_else(|| anyhow!("the cluster runs without TLS"))?
        .dir();
    let opts = ConnOptions {
        tls: Some(TlsConfig::load(TlsMode::Data, dir)?),
        ..cluster.conn_options()
    };
    Ok(Remora {
        client: MemNodeClient::connect(&grant.addr, opts)
            .with_context(|| format!("connecting over TLS to the memory node at {}", grant.addr))?,
        cap: grant.cap,
    })
}

/// The TLS comparison's results.
pub(super) struct TlsReport {
    pub(super) latency: Vec<LatencyRow>,
    pub(super) tput: Option<TputRow>,
}

impl TlsReport {
    pub(super) fn print(&self) {
        println!();
        println!(
            "TLS (`--tls data`: TLS 1.3, mutual certificates, rustls with ring) against plain TCP, \
             same memory node and run, sides alternating as above"
        );
        println!(
            "goals: READ p50 ≤ {GOAL_P50_RATIO:.1}× plain at {} KiB, READ throughput ≥ {GOAL_TPUT_RATIO:.1}× plain",
            GOAL_SIZE >> 10
        );
        println!(
            "{:<7} {:<10} {:>9} {:>9} {:>9} {:>8} {:>8}",
            "size", "side", "p50 µs", "p99 µs", "p999 µs", "p50 ×", "p99 ×"
        );
        for r in &self.latency {
            let goal = if r.size.0 == GOAL_SIZE {
                if r.ratio(0.5) <= GOAL_P50_RATIO {
                    "  met"
                } else {
                    "  MISSED"
                }
            } else {
                ""
            };
            for (i, (name, h)) in [(PLAIN_VS_TLS.base, &r.raw), (PLAIN_VS_TLS.subject, &r.remora)]
                .into_iter()
                .enumerate()
            {
                let size = if i == 0 { r.size.to_string() } else { String::new() };
                let tail = if i == 1 {
                    format!(
                        "{:>8} {:>8}{goal}",
                        format!("{:.2}×", r.ratio(0.5)),
                        format!("{:.2}×", r.ratio(0.99))
                    )
                } else {
                    String::new()
                };
                println!(
                    "{size:<7} {name:<10} {:>9} {:>9} {:>9} {tail}",
                    us(h.at(0.5)),
                    us(h.at(0.99)),
                    us(h.at(0.999))
                );
            }
        }
        if let Some(t) = &self.tput {
            let ratio = t.median_ratio();
            let (lo, hi) = t.window_range();
            println!(
                "throughput {}: plain TCP {:.2} GB/s, TLS {:.2} GB/s (whole {:.2}×); TLS ÷ plain over {} window pairs: \
                 median {ratio:.2}× [{lo:.2}, {hi:.2}] {}",
                t.op.name(),
                t.raw.gbps(),
                t.remora.gbps(),
                t.ratio(),
                t.windows.len(),
                if ratio >= GOAL_TPUT_RATIO { "met" } else { "MISSED" }
            );
            if let Some(b) = t.server_bound() {
                println!(
                    "  memory node CPU per GB read: plain {:.3} s, TLS {:.3} s ({:.2}×); busy {:.0} % and {:.0} % of one CPU; \
                     while it bounds both sides, TLS ÷ plain can reach at most {:.2}×",
                    b.plain_per_gb,
                    b.tls_per_gb,
                    b.tls_per_gb / b.plain_per_gb,
                    100.0 * b.plain_busy,
                    100.0 * b.tls_busy,
                    b.ceiling()
                );
            }
        }
    }

    pub(super) fn to_json(&self) -> Value {
        let latency: Vec<Value> = self
            .latency
            .iter()
            .map(|r| {
                json!({
                    "size_bytes": r.size.0,
                    "plain": r.raw.to_json(),
                    "tls": r.remora.to_json(),
                    "p50_ratio": r.ratio(0.5),
                    "p99_ratio": r.ratio(0.99),
                })
            })
            .collect();
        json!({
            "latency": latency,
            "throughput": self.tput.as_ref().map(|t| json!({
                "op": t.op.name(),
                "plain": t.raw.to_json(),
                "tls": t.remora.to_json(),
                "gbps_ratio": t.ratio(),
                "window_ratios": t.windows,
                "median_window_ratio": t.median_ratio(),
                "memnode_bound_ceiling": t.server_bound().map(|b| b.ceiling()),
            })),
            "goal_p50_ratio": GOAL_P50_RATIO,
            "goal_tput_ratio": GOAL_TPUT_RATIO,
        })
    }
}

/// The memory node's CPU cost per byte on each side of the comparison.
pub(super) struct ServerBound {
    plain_per_gb: f64,
    tls_per_gb: f64,
    plain_busy: f64,
    tls_busy: f64,
}

impl ServerBound {
    /// TLS ÷ plain throughput if the memory node ran flat out on both sides.
    fn ceiling(&self) -> f64 {
        self.plain_per_gb / self.tls_per_gb.max(1e-12)
    }
}

impl TputRow {
    /// The memory node's CPU per GB on both sides, where it was measured.
    fn server_bound(&self) -> Option<ServerBound> {
        Some(ServerBound {
            plain_per_gb: self.raw.server_cpu_per_gb()?,
            tls_per_gb: self.remora.server_cpu_per_gb()?,
            plain_busy: self.raw.server_busy()?,
            tls_busy: self.remora.server_busy()?,
        })
    }
}
