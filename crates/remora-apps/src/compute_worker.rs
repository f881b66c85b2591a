//! `remora compute-worker` (hidden): a compute node to kill.
//!
//! Tests of compute-node death need a real process with a runtime in it
//! that they can `kill -9` in the middle of a swap-out, a compaction or a
//! two-phase commit. This one connects a runtime to a manager with the
//! scheme it is told, fills objects past its local budget and then reads
//! and rewrites random objects forever, so swap-outs, swap-ins, and (by
//! scheme) compactions and in-place fills never stop.
//!
//! It speaks to its test on stdout, one line per fact:
//! - `filled` once the objects are in;
//! - `cap REGION EPOCH TOKEN ADDR` for each region it holds, once per
//!   region (with `--print-caps`; the token in hex, so a test can replay a
//!   late request of the dead node; never use the flag outside tests);
//! - `stats swap_outs=N compactions=N txn_requests=N spansets_written=N`
//!   every 50 ms;
//! - `wrong INDEX` if an object ever reads back other than last written
//!   (the test fails on it), `error ...` for a typed error.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use remora_proto::ByteSize;
use remora_runtime::{RemBox, Runtime, RuntimeConfig, scheme};

use crate::workload::{Obj, is, make};

/// Arguments of `remora compute-worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The manager's address.
    #[arg(long)]
    pub manager: String,
    /// Fault-tolerance scheme (see `remora_runtime::scheme`).
    #[arg(long, default_value = "ec-2pc")]
    pub scheme: String,
    /// Data spans per spanset.
    #[arg(long, default_value_t = 2)]
    pub k: usize,
    /// Parity spans per spanset.
    #[arg(long, default_value_t = 1)]
    pub m: usize,
    /// Compaction threads (compacting schemes); 0 turns compaction off.
    #[arg(long, default_value_t = 1)]
    pub compaction_threads: usize,
    /// Objects of 4 KiB.
    #[arg(long, default_value_t = 2000)]
    pub objects: usize,
    /// Local memory budget.
    #[arg(long, default_value = "1MiB")]
    pub budget: ByteSize,
    /// Print the capabilities of the regions held (test support only).
    #[arg(long)]
    pub print_caps: bool,
    /// File holding the cluster key to prove to the manager and memory nodes.
    #[arg(long, env = "REMORA_CLUSTER_KEY_FILE", value_name = "FILE")]
    pub cluster_key_file: Option<std::path::PathBuf>,
    /// TLS to the manager and memory nodes.
    #[command(flatten)]
    pub tls: remora_daemon::TlsArgs,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // The test reading us may be gone; nothing to do about it then.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Runs until killed.
pub fn run(args: &WorkerArgs) -> Result<()> {
    let opts = scheme::SchemeOptions {
        k: args.k,
        m: args.m,
        compaction_threads: args.compaction_threads,
        // Fold whenever a fold exists: the tests want compactions often.
        compaction_trigger: 0.0,
        ..scheme::SchemeOptions::default()
    };
    let mut cfg = RuntimeConfig::new(args.manager.clone(), args.budget.0 as usize);
    cfg.name = "compute-worker".into();
    cfg.conn.cluster_key = args
        .cluster_key_file
        .as_deref()
        .map(remora_proto::ClusterKey::read_file)
        .transpose()
        .context("reading the cluster key")?;
    cfg.conn.tls = args.tls.config()?;
    cfg.scheme = scheme::make(&args.scheme, &opts).context("building the scheme")?;
    let rt = Runtime::connect(cfg).context("connecting the runtime")?;
    let mut objs: Vec<RemBox<Obj>> = Vec::with_capacity(args.objects);
    for i in 0..args.objects {
        objs.push(rt.alloc(make(i as u64, 0)).context("filling")?);
    }
    let mut versions = vec![0u64; args.objects];
    say("filled");
    let mut printed: BTreeSet<u64> = BTreeSet::new();
    let mut last = Instant::now() - Duration::from_secs(1);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    loop {
        if last.elapsed() >= Duration::from_millis(50) {
            last = Instant::now();
            if args.print_caps {
                for (_, g) in rt.regions() {
                    if printed.insert(g.cap.region.0) {
                        say(&format!(
                            "cap {} {} {} {}",
                            g.cap.region.0,
                            g.cap.epoch,
                            g.cap.token.to_hex(),
                            g.addr
                        ));
                    }
                }
            }
            let s = rt.stats();
            say(&format!(
                "stats swap_outs={} compactions={} txn_requests={} spansets_written={}",
                s.traffic.swap_outs, s.scheme.compactions, s.traffic.txn_requests, s.scheme.spansets_written
            ));
        }
        // xorshift: cheap, and the sequence does not matter.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % objs.len() as u64) as usize;
        let scope = rt.scope();
        if x & (1 << 40) != 0 {
            let v = versions[i] + 1;
            match objs[i].deref_mut(&scope) {
                Ok(o) => {
                    *o = make(i as u64, v);
                    versions[i] = v;
                }
                Err(e) => say(&format!("error write {i}: {e}")),
            }
        } else {
            match objs[i].deref(&scope) {
                Ok(o) if is(o, i as u64, versions[i]) => {}
                Ok(_) => say(&format!("wrong {i}")),
                Err(e) => say(&format!("error read {i}: {e}")),
            }
        }
    }
}
