//! `remora bench net --tls`: the data path over TLS against plain TCP.
//!
//! The cluster runs with `--tls control`, so its memory node serves TLS
//! and plain clients on one port; the benchmark connects to it both ways
//! (the TLS client as a `--tls data` compute node would) and measures the
//! two against each other with the same phases, offsets and checks as
//! remora against raw TCP: READ latency per size, then READ throughput at
//! each `--tls-tput-sizes` size, a phase each.
//!
//! Where the memory node's one CPU bounds both sides, TLS ÷ plain is its
//! CPU per byte plain over TLS, so both are printed with the ceiling they
//! set; beside them, sealing alone is timed on the memory node's CPU, as
//! the least TLS can add per byte (AES-GCM runs at a fixed speed on a CPU,
//! while plain's cost per byte falls as requests grow). Likewise for
//! latency: with one request in flight a reply is sealed and then opened,
//! so the open is timed alone on the client's CPU too, and each size's row
//! shows the least p50 ratio the two allow.
//!
//! The throughput goal is judged on the median of the window pairs' ratios
//! (each `--slices` window of TLS over the plain window beside it), printed
//! with their range and the whole phase's ratio: on this 2-core machine one
//! window pair ranged from 0.49× to 1.32× within a run, as the scheduler
//! placed the client and memory-node threads.

use std::time::Duration;

use anyhow::{Context, anyhow};
use remora_cluster::LocalCluster;
use remora_proto::tls::CryptoCost;
use remora_proto::{ByteSize, ConnOptions, MemNodeClient, RegionGrant, TlsConfig, TlsMode};
use serde_json::{Value, json};

use super::pattern::Image;
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

/// One half of the record layer's work on a reply, timed alone.
#[derive(Debug, Clone, Copy)]
enum Crypto {
    /// The memory node's seal (with the copy into the record).
    Seal,
    /// The client's open (with the copy out of the read buffer).
    Open,
}

/// Times `what` alone on `cpu` (the memory node's for the seal, the
/// client's for the open, where pinned): the fastest of three bursts of
/// 50 ms, as the least TLS adds per byte on that side. The run times both
/// after the latency phase and beside every throughput phase and keeps the
/// fastest, since this shared machine's speed drifts within a run.
fn crypto_cost(what: Crypto, cpu: Option<usize>) -> anyhow::Result<CryptoCost> {
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(cpu) = cpu {
                super::pin::pin_current(cpu).context("pinning the TLS timing")?;
            }
            let plaintext = Image::new(64 << 10, 3);
            let mut best: Option<CryptoCost> = None;
            for _ in 0..3 {
                let min = Duration::from_millis(50);
                let c = match what {
                    Crypto::Seal => remora_proto::tls::seal_cost(plaintext.bytes(), min),
                    Crypto::Open => remora_proto::tls::open_cost(plaintext.bytes(), min),
                }
                .with_context(|| format!("timing the TLS {what:?}"))?;
                best = Some(faster(best, c));
            }
            best.ok_or_else(|| anyhow!("no {what:?} timed"))
        })
        .join()
        .map_err(|_| anyhow!("the TLS timing thread panicked"))?
    })
}

/// The faster of two timings.
fn faster(a: Option<CryptoCost>, b: CryptoCost) -> CryptoCost {
    match a {
        Some(a) if a.secs_per_gb() <= b.secs_per_gb() => a,
        _ => b,
    }
}

/// The TLS comparison's results.
pub(super) struct TlsReport {
    pub(super) latency: Vec<LatencyRow>,
    /// READ throughput, one phase per request size.
    pub(super) tput: Vec<(ByteSize, TputRow)>,
    /// Sealing alone, timed on the memory node's CPU.
    pub(super) seal: Option<CryptoCost>,
    /// Opening alone, timed on the client's CPU.
    pub(super) open: Option<CryptoCost>,
}

impl TlsReport {
    /// Times the seal on `cpus`' server CPU and the open on its client CPU
    /// (as pinned), keeping the fastest of this and earlier timings.
    pub(super) fn time_crypto(&mut self, cpus: Option<(usize, usize)>) -> anyhow::Result<()> {
        self.seal = Some(faster(self.seal, crypto_cost(Crypto::Seal, cpus.map(|(_, s)| s))?));
        self.open = Some(faster(self.open, crypto_cost(Crypto::Open, cpus.map(|(c, _)| c))?));
        Ok(())
    }

    /// The least TLS can add to a READ round trip of `size` bytes with one
    /// request in flight: the reply is sealed, then opened, one after the
    /// other; in µs.
    fn crypto_floor_us(&self, size: u64) -> Option<f64> {
        let (seal, open) = (self.seal?, self.open?);
        Some((seal.secs_per_gb() + open.secs_per_gb()) * size as f64 / 1e3)
    }

    /// The p50 ratio TLS could reach at best in `r`: plain's p50 plus the
    /// seal and open of the reply, over plain's p50.
    fn p50_floor(&self, r: &LatencyRow) -> Option<f64> {
        let plain = r.raw.at(0.5) as f64 / 1e3;
        Some((plain + self.crypto_floor_us(r.size.0)?) / plain.max(1e-9))
    }

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
            "{:<7} {:<10} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8}",
            "size", "side", "p50 µs", "p99 µs", "p999 µs", "p50 ×", "p99 ×", "floor ×"
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
                    let floor = self.p50_floor(r).map(|f| format!("{f:.2}×")).unwrap_or_default();
                    format!(
                        "{:>8} {:>8} {floor:>8}{goal}",
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
        if let (Some(seal), Some(open)) = (self.seal, self.open) {
            println!(
                "floor ×: the least p50 ratio TLS allows here, plain's p50 plus the reply's seal ({:.3} s/GB on the memory \
                 node's CPU) and then its open ({:.3} s/GB on the client's, the copy out included), each timed alone",
                seal.secs_per_gb(),
                open.secs_per_gb()
            );
        }
        if self.tput.is_empty() {
            return;
        }
        println!(
            "throughput READ, TLS ÷ plain: median and range over the window pairs, and the whole phase; goal ≥ {GOAL_TPUT_RATIO:.1}×"
        );
        println!(
            "{:<7} {:>10} {:>10} {:>7}  {:<14} {:>6}  goal",
            "size", "plain GB/s", "TLS GB/s", "median", "range", "whole"
        );
        for (size, t) in &self.tput {
            let ratio = t.median_ratio();
            let (lo, hi) = t.window_range();
            println!(
                "{:<7} {:>10.2} {:>10.2} {:>7}  {:<14} {:>6}  {}",
                size.to_string(),
                t.raw.gbps(),
                t.remora.gbps(),
                format!("{ratio:.2}×"),
                format!("[{lo:.2}, {hi:.2}]"),
                format!("{:.2}×", t.ratio()),
                if ratio >= GOAL_TPUT_RATIO { "met" } else { "MISSED" }
            );
        }
        let bounds: Vec<_> = self
            .tput
            .iter()
            .filter_map(|(size, t)| Some((size, t.server_bound()?)))
            .collect();
        if !bounds.is_empty() {
            println!(
                "memory node CPU per GB read (its one CPU bounds both sides while it is near 100 % busy), and the TLS ÷ plain it allows"
            );
            println!(
                "{:<7} {:>11} {:>9} {:>6} {:>11} {:>9} {:>8} {:>10}",
                "size", "plain s/GB", "TLS s/GB", "×", "plain busy", "TLS busy", "ceiling", "seal only"
            );
            for (size, b) in bounds {
                let seal_only = self
                    .seal
                    .map(|c| format!("{:.2}×", b.seal_only_ceiling(c.secs_per_gb())))
                    .unwrap_or_default();
                println!(
                    "{:<7} {:>11.3} {:>9.3} {:>6} {:>10.0}% {:>8.0}% {:>8} {:>10}",
                    size.to_string(),
                    b.plain_per_gb,
                    b.tls_per_gb,
                    format!("{:.2}×", b.tls_per_gb / b.plain_per_gb),
                    100.0 * b.plain_busy,
                    100.0 * b.tls_busy,
                    format!("{:.2}×", b.ceiling()),
                    seal_only
                );
            }
        }
        if let Some(c) = self.seal {
            println!(
                "seal only: sealing alone, as a TLS write does (copied into 16 KiB records, AES-128-GCM with ring), costs this CPU \
                 {:.3} s/GB ({:.1} GB/s); TLS adds at least that to plain's cost per GB, so with nothing else added the ratio \
                 could reach at most plain ÷ (plain + seal)",
                c.secs_per_gb(),
                1.0 / c.secs_per_gb()
            );
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
                    "p50_floor_ratio": self.p50_floor(r),
                })
            })
            .collect();
        let seal = self.seal.map(|c| c.secs_per_gb());
        let tput: Vec<Value> = self
            .tput
            .iter()
            .map(|(size, t)| {
                let bound = t.server_bound();
                json!({
                    "size_bytes": size.0,
                    "op": t.op.name(),
                    "plain": t.raw.to_json(),
                    "tls": t.remora.to_json(),
                    "gbps_ratio": t.ratio(),
                    "window_ratios": t.windows,
                    "median_window_ratio": t.median_ratio(),
                    "memnode_bound_ceiling": bound.as_ref().map(ServerBound::ceiling),
                    "seal_only_ceiling": bound.as_ref().zip(seal).map(|(b, c)| b.seal_only_ceiling(c)),
                })
            })
            .collect();
        json!({
            "latency": latency,
            "throughput": tput,
            "seal_s_per_gb": self.seal.map(|c| c.secs_per_gb()),
            "open_s_per_gb": self.open.map(|c| c.secs_per_gb()),
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

    /// TLS ÷ plain if TLS added nothing to plain's cost per GB but sealing,
    /// `seal_per_gb`, on a memory node that runs flat out.
    fn seal_only_ceiling(&self, seal_per_gb: f64) -> f64 {
        self.plain_per_gb / (self.plain_per_gb + seal_per_gb).max(1e-12)
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
