//! Quickstart: 1 GiB of objects behind remotable pointers with a 256 MiB
//! local budget, on a local cluster of memory nodes, every object checked.
//!
//! `cargo run --release --example quickstart`

use remora_cluster::{ClusterConfig, LocalCluster};
use remora_runtime::{Remotable, Runtime, RuntimeConfig};

/// 4 KiB with the runtime's 8-byte header: a whole size class.
#[derive(Clone, Copy)]
struct Chunk([u64; 511]);
// SAFETY: plain integers, no pointers.
unsafe impl Remotable for Chunk {}

fn chunk(i: u64) -> Chunk {
    Chunk(std::array::from_fn(|j| {
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ j as u64
    }))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    remora_cluster::serve_if_child(); // this program also runs the cluster's daemons
    let mut cfg = ClusterConfig::this_program()?;
    (cfg.memnodes, cfg.capacity, cfg.region_size) = (4, 512 << 20, 64 << 20);
    let cluster = LocalCluster::start(cfg)?;
    let mut rcfg = RuntimeConfig::new(cluster.manager_addr(), 256 << 20);
    rcfg.conn = cluster.conn_options(); // proves the cluster's key
    let rt = Runtime::connect(rcfg)?;

    let n = (1u64 << 30) / 4096;
    let objects = (0..n).map(|i| rt.alloc(chunk(i))).collect::<Result<Vec<_>, _>>()?;
    println!(
        "allocated {n} objects (1 GiB) with {} MiB local",
        rt.stats().local.bytes >> 20
    );

    for (i, obj) in objects.iter().enumerate() {
        let scope = rt.scope();
        if obj.deref(&scope)?.0 != chunk(i as u64).0 {
            return Err(format!("object {i} differs").into());
        }
    }
    let s = rt.stats();
    println!(
        "verified all {n} objects: {} swap-ins ({} remote reads), {} swap-outs",
        s.traffic.swap_ins, s.traffic.swap_in_reads, s.traffic.swap_outs
    );
    Ok(())
}
