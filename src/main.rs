//! `remora`: the one binary of a remora deployment — memory manager, memory
//! node daemon, operator commands, benchmarks and the demo.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use remora_proto::msg::ManagerRole;
use remora_proto::{ByteSize, ClusterKey, ConnOptions, ManagerConn, RemoteError, RpcError};

#[derive(Parser)]
#[command(
    name = "remora",
    version,
    about = "Fault-tolerant far memory: manager, memory nodes, tools, benchmarks"
)]
struct Cli {
    /// Log level or filter (RUST_LOG syntax), e.g. `info`, `debug`, `remora_manager=trace`.
    #[arg(long, global = true, env = "RUST_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the memory manager: region registry, allocation and liveness.
    Manager(remora_manager::daemon::ManagerArgs),
    /// Run a memory-node daemon that lends RAM to compute nodes.
    Memnode(remora_memnode::daemon::MemnodeArgs),
    /// Mark a memory node draining (planned departure).
    Drain {
        /// The manager's address, or every manager's in a group (comma-separated).
        #[arg(long)]
        manager: String,
        /// The memory node's data address, as shown by `remora status`.
        #[arg(long)]
        node: String,
        #[command(flatten)]
        key: KeyArg,
    },
    /// Show the manager's view of the cluster.
    Status {
        /// The manager's address, or every manager's in a group (comma-separated).
        #[arg(long)]
        manager: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        key: KeyArg,
    },
    /// Write a fresh random cluster key (64 hex digits, file mode 0600) for
    /// `--cluster-key-file` of every daemon and client of one cluster.
    Keygen {
        /// The file to create (an existing file is never overwritten).
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a fresh cluster CA (`ca.pem`) and a node certificate signed by it
    /// (`node.pem`, `node.key` with mode 0600) for `--tls-dir` of every daemon and
    /// client of one cluster.
    Certs {
        /// The directory to write to (made if missing).
        #[arg(long)]
        out: PathBuf,
        /// A host name or IP address nodes are reached at, besides localhost and
        /// 127.0.0.1 (repeat for more).
        #[arg(long = "name", value_name = "NAME")]
        names: Vec<String>,
        /// Replace certificates already in the directory.
        #[arg(long)]
        force: bool,
    },
    /// Benchmarks (`remora bench net`, ...).
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
    /// Start a local cluster, run a workload, kill a memory node, verify every object.
    Demo(remora_apps::demo::DemoArgs),
    /// A nemesis run: a workload with writes while a seeded schedule kills, pauses and
    /// partitions memory nodes; every object verified at the end.
    Chaos(remora_apps::chaos::ChaosArgs),
    /// Test support: a compute node running a write workload until killed.
    #[command(hide = true)]
    ComputeWorker(remora_apps::compute_worker::WorkerArgs),
}

/// The cluster key an admin command proves to the manager, and its TLS.
#[derive(clap::Args)]
struct KeyArg {
    /// File holding the cluster key (as given to the manager); without one, only a
    /// manager run with --insecure-no-auth answers.
    #[arg(long, env = "REMORA_CLUSTER_KEY_FILE", value_name = "FILE")]
    cluster_key_file: Option<PathBuf>,
    #[command(flatten)]
    tls: remora_daemon::TlsArgs,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Data path: READ latency vs raw TCP ping-pong, READ/WRITE throughput.
    Net(remora_bench::net::NetArgs),
    /// Swap-in READ latency on an idle memory node vs under eviction WRITEs, with and without lanes.
    Lanes(remora_bench::net::lanes::LanesArgs),
    /// Paper §5.1 microbenchmark: Zipf-skewed object accesses over a remotable array, per scheme.
    Micro(Box<remora_bench::micro::MicroArgs>),
    /// Runtime costs: local-hit deref vs a plain reference, span swap-in vs a raw READ.
    Runtime(remora_bench::runtime_bench::RuntimeArgs),
    /// Far collections (RemHashMap, RemBTreeMap, RemVec) vs std's and vs `bench micro`'s array.
    Collections(remora_bench::collections::CollectionsArgs),
    /// The paper's transactional KV store (TPC-A) on every scheme, vs local memory and Redis (Figures 8, 10a).
    Kv(remora_bench::kv::KvArgs),
    /// Eviction drain rate: fill local memory, lower the budget, time until eviction has drained it.
    Drain(remora_bench::drain::DrainArgs),
}

fn main() {
    let cli = Cli::parse();
    remora_daemon::init_logging(&cli.log);
    let res = match cli.cmd {
        Cmd::Manager(a) => remora_manager::daemon::run(a).map_err(Into::into),
        Cmd::Memnode(a) => remora_memnode::daemon::run(a).map_err(Into::into),
        Cmd::Drain { manager, node, key } => drain(&manager, &node, &key),
        Cmd::Status { manager, json, key } => status(&manager, json, &key),
        Cmd::Keygen { out } => keygen(&out),
        Cmd::Certs { out, names, force } => certs(&out, &names, force),
        Cmd::Bench { which } => match which {
            BenchCmd::Net(a) => remora_bench::net::run(&a),
            BenchCmd::Lanes(a) => remora_bench::net::lanes::run(&a),
            BenchCmd::Micro(a) => remora_bench::micro::run(&a),
            BenchCmd::Runtime(a) => remora_bench::runtime_bench::run(&a),
            BenchCmd::Drain(a) => remora_bench::drain::run(&a),
            BenchCmd::Collections(a) => remora_bench::collections::run(&a),
            BenchCmd::Kv(a) => remora_bench::kv::run(&a),
        },
        Cmd::Demo(a) => remora_apps::demo::run(&a),
        Cmd::Chaos(a) => remora_apps::chaos::run(&a),
        Cmd::ComputeWorker(a) => remora_apps::compute_worker::run(&a),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn manager_conn(addr: &str, key: &KeyArg) -> Result<ManagerConn> {
    let cluster_key = key.cluster_key_file.as_deref().map(ClusterKey::read_file).transpose()?;
    let opts = ConnOptions {
        cluster_key,
        tls: key.tls.config()?,
        ..ConnOptions::default()
    };
    ManagerConn::connect(addr, opts).with_context(|| format!("cannot reach the manager at {addr}"))
}

/// Names the likely cause when a manager that requires the cluster key
/// refused a command sent without one.
fn key_hint(e: RpcError, key: &KeyArg) -> anyhow::Error {
    let refused = matches!(e, RpcError::Remote(RemoteError::Unauthorized));
    let e = anyhow::Error::new(e);
    if refused && key.cluster_key_file.is_none() {
        return e.context(
            "the manager requires the cluster key: pass --cluster-key-file FILE (or REMORA_CLUSTER_KEY_FILE)",
        );
    }
    e
}

fn keygen(out: &Path) -> Result<()> {
    let key = ClusterKey::generate();
    key.write_new(out)?;
    println!(
        "wrote cluster key {} to {}; give every daemon and client of the cluster --cluster-key-file {}",
        key.id(),
        out.display(),
        out.display()
    );
    Ok(())
}

fn certs(out: &Path, names: &[String], force: bool) -> Result<()> {
    let f = remora_proto::tls::write_certs(out, names, force)?;
    println!(
        "wrote a cluster CA ({}) and a node certificate for {} ({}, key {}); give every daemon and \
         client of the cluster --tls control|data --tls-dir {}",
        f.ca.display(),
        f.names.join(", "),
        f.cert.display(),
        f.key.display(),
        out.display()
    );
    Ok(())
}

fn drain(manager: &str, node: &str, key: &KeyArg) -> Result<()> {
    manager_conn(manager, key)?
        .drain(node)
        .map_err(|e| key_hint(e, key))
        .with_context(|| format!("draining {node}"))?;
    println!("memory node {node} is draining; its owners have been told");
    Ok(())
}

fn status(manager: &str, json: bool, key: &KeyArg) -> Result<()> {
    let s = manager_conn(manager, key)?
        .status()
        .map_err(|e| key_hint(e, key))
        .context("asking for status")?;
    if json {
        let v = serde_json::json!({
            "managers": s.managers.iter().map(|m| serde_json::json!({
                "id": m.id, "addr": m.addr, "role": role_name(m.role), "term": m.term,
                "last_applied": m.last_applied, "leader": m.leader,
            })).collect::<Vec<_>>(),
            "memory_nodes": s.memory_nodes.iter().map(|m| serde_json::json!({
                "id": m.id.0, "addr": m.addr, "state": m.state.as_str(),
                "regions_total": m.regions_total, "regions_free": m.regions_free,
                "capacity_bytes": m.capacity_bytes,
                "peer": { "rebuild_reads": m.peer.rebuild_reads, "rebuild_bytes": m.peer.rebuild_bytes },
                "load": { "cpu_permille": m.load.cpu_permille, "cores": m.load.cores },
            })).collect::<Vec<_>>(),
            "compute_nodes": s.compute_nodes.iter().map(|c| serde_json::json!({
                "id": c.id.0, "name": c.name, "state": c.state.as_str(), "regions": c.regions,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("managers ({}):", s.managers.len());
    println!(
        "  {:<6} {:<22} {:<11} {:>8} {:>12}",
        "id", "addr", "role", "term", "applied"
    );
    for m in &s.managers {
        println!(
            "  {:<6} {:<22} {:<11} {:>8} {:>12}",
            m.id,
            m.addr,
            role_name(m.role),
            m.term,
            m.last_applied
        );
    }
    println!("memory nodes ({}):", s.memory_nodes.len());
    println!(
        "  {:<6} {:<22} {:<9} {:>8} {:>8} {:>12} {:>16} {:>9}",
        "id", "addr", "state", "regions", "free", "capacity", "sent for rebuild", "cpu %"
    );
    for m in &s.memory_nodes {
        println!(
            "  {:<6} {:<22} {:<9} {:>8} {:>8} {:>12} {:>16} {:>9.1}",
            m.id.to_string(),
            m.addr,
            m.state.as_str(),
            m.regions_total,
            m.regions_free,
            ByteSize(m.capacity_bytes).to_string(),
            ByteSize(m.peer.rebuild_bytes).to_string(),
            // Of one core, as the node measured itself at its last heartbeat.
            m.load.cpu_permille as f64 / 10.0
        );
    }
    println!("compute nodes ({}):", s.compute_nodes.len());
    println!("  {:<6} {:<22} {:<9} {:>8}", "id", "name", "state", "regions");
    for c in &s.compute_nodes {
        println!(
            "  {:<6} {:<22} {:<9} {:>8}",
            c.id.to_string(),
            c.name,
            c.state.as_str(),
            c.regions
        );
    }
    Ok(())
}

/// A manager's role as `remora status` shows it.
fn role_name(r: ManagerRole) -> &'static str {
    match r {
        ManagerRole::Leader => "leader",
        ManagerRole::Follower => "follower",
        ManagerRole::Candidate => "candidate",
        ManagerRole::Learner => "learner",
        ManagerRole::Shutdown => "shutdown",
        ManagerRole::Unreachable => "unreachable",
    }
}
