//! `remora`: the one binary of a remora deployment — memory manager, memory
//! node daemon, operator commands, benchmarks and the demo.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use remora_proto::{ByteSize, ConnOptions, ManagerConn, Token, parse_duration};

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
    Manager(ManagerArgs),
    /// Run a memory-node daemon that lends RAM to compute nodes.
    Memnode(MemnodeArgs),
    /// Mark a memory node draining (planned departure).
    Drain {
        /// The manager's address.
        #[arg(long)]
        manager: String,
        /// The memory node's data address, as shown by `remora status`.
        #[arg(long)]
        node: String,
    },
    /// Show the manager's view of the cluster.
    Status {
        /// The manager's address.
        #[arg(long)]
        manager: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks (`remora bench net`, ...).
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
    /// Start a local cluster, run a workload, kill a memory node, verify every object.
    Demo,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Data path: READ latency vs raw TCP ping-pong, READ/WRITE throughput.
    Net(remora_bench::net::NetArgs),
    /// Micro benchmark over remotable objects (comes with the runtime).
    Micro,
}

#[derive(clap::Args)]
struct ManagerArgs {
    /// Address to listen on, e.g. 127.0.0.1:7400.
    #[arg(long)]
    listen: String,
    /// Directory for the manager's persistent state.
    #[arg(long)]
    data_dir: PathBuf,
    /// Declare a node dead after this long without a heartbeat.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    heartbeat_timeout: Duration,
    /// Exit when standard input closes (used by launchers so that no daemon outlives them).
    #[arg(long, hide = true)]
    exit_with_parent: bool,
}

#[derive(clap::Args)]
struct MemnodeArgs {
    /// The manager's address.
    #[arg(long)]
    manager: String,
    /// Address to serve data requests on, e.g. 127.0.0.1:7500 (port 0 picks one).
    #[arg(long)]
    listen: String,
    /// Memory to lend, e.g. 4GiB.
    #[arg(long)]
    capacity: ByteSize,
    /// Size of each region.
    #[arg(long, default_value = "1GiB")]
    region_size: ByteSize,
    /// Address to register with the manager when listening on 0.0.0.0.
    #[arg(long)]
    advertise: Option<String>,
    /// Admin key shared with the manager (32 hex digits; random by default).
    #[arg(long, hide = true)]
    admin_key: Option<String>,
    /// Exit when standard input closes (used by launchers).
    #[arg(long, hide = true)]
    exit_with_parent: bool,
}

fn main() {
    let cli = Cli::parse();
    init_logging(&cli.log);
    let res = match cli.cmd {
        Cmd::Manager(a) => run_manager(a),
        Cmd::Memnode(a) => run_memnode(a),
        Cmd::Drain { manager, node } => drain(&manager, &node),
        Cmd::Status { manager, json } => status(&manager, json),
        Cmd::Bench { which } => match which {
            BenchCmd::Net(a) => remora_bench::net::run(&a),
            BenchCmd::Micro => {
                println!("remora bench micro: not yet — it arrives with the runtime core (remotable pointers).");
                Ok(())
            }
        },
        Cmd::Demo => {
            println!("remora demo: not yet — it arrives with erasure-coded eviction.");
            println!("Today you can run `remora bench net` for the data path.");
            Ok(())
        }
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("warning: bad log filter {filter:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal())
        .init();
}

/// What a daemon's main loop reacts to.
enum Wake {
    Signal,
    ParentGone,
}

/// Delivers SIGTERM/SIGINT and (optionally) the parent's lifeline closing.
fn wake_channel(exit_with_parent: bool) -> Result<mpsc::Receiver<Wake>> {
    let (tx, rx) = mpsc::channel();
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])
        .context("installing signal handlers")?;
    let t2 = tx.clone();
    thread::spawn(move || {
        for _ in signals.forever() {
            if t2.send(Wake::Signal).is_err() {
                break;
            }
        }
    });
    if exit_with_parent {
        thread::spawn(move || {
            let mut buf = [0u8; 64];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
            let _ = tx.send(Wake::ParentGone);
        });
    }
    Ok(rx)
}

fn announce(line: &str) {
    // Launchers read this line on stdout to learn the bound address.
    println!("{line}");
    let _ = std::io::stdout().flush();
}

fn run_manager(a: ManagerArgs) -> Result<()> {
    let wake = wake_channel(a.exit_with_parent)?;
    let mgr = remora_manager::Manager::start(remora_manager::Config {
        listen: a.listen.clone(),
        data_dir: a.data_dir.clone(),
        heartbeat_timeout: a.heartbeat_timeout,
    })
    .context("starting the manager")?;
    tracing::info!(
        "manager listening on {} (data in {}, heartbeat timeout {:?})",
        mgr.local_addr(),
        a.data_dir.display(),
        a.heartbeat_timeout
    );
    announce(&format!("remora manager listening on {}", mgr.local_addr()));
    match wake.recv() {
        Ok(Wake::Signal) => tracing::info!("signal received: shutting down"),
        Ok(Wake::ParentGone) | Err(_) => tracing::info!("parent gone: shutting down"),
    }
    mgr.shutdown();
    Ok(())
}

fn run_memnode(a: MemnodeArgs) -> Result<()> {
    let admin_key = match &a.admin_key {
        Some(h) => Some(Token::from_hex(h).context("--admin-key must be 32 hex digits")?),
        None => None,
    };
    let wake = wake_channel(a.exit_with_parent)?;
    let node = remora_memnode::MemNode::start(remora_memnode::Config {
        manager: a.manager.clone(),
        listen: a.listen.clone(),
        advertise: a.advertise.clone(),
        capacity: a.capacity.0,
        region_size: a.region_size.0,
        admin_key,
        manager_patience: Duration::from_secs(10),
    })
    .context("starting the memory node")?;
    announce(&format!(
        "remora memnode {} listening on {}",
        node.node_id(),
        node.addr()
    ));
    let mut draining = false;
    loop {
        match wake.recv_timeout(Duration::from_millis(200)) {
            Ok(Wake::Signal) if !draining => {
                let (_, granted) = node.regions();
                if granted == 0 {
                    tracing::info!("signal received: no regions in use, leaving");
                    node.shutdown();
                    return Ok(());
                }
                match node.drain() {
                    Ok(()) => tracing::info!(
                        "signal received: draining; waiting for {granted} allocated regions to be released \
                         (signal again to exit now and lose them)"
                    ),
                    Err(e) => tracing::error!("could not mark this node draining: {e}"),
                }
                draining = true;
            }
            Ok(Wake::Signal) => {
                tracing::warn!(
                    "second signal: exiting with {} regions still allocated",
                    node.regions().1
                );
                return Ok(());
            }
            Ok(Wake::ParentGone) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                tracing::info!("parent gone: exiting");
                return Ok(());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if draining && node.regions().1 == 0 {
                    tracing::info!("drained: every region released, leaving");
                    node.shutdown();
                    return Ok(());
                }
            }
        }
    }
}

fn manager_conn(addr: &str) -> Result<ManagerConn> {
    ManagerConn::connect(addr, ConnOptions::default()).with_context(|| format!("cannot reach the manager at {addr}"))
}

fn drain(manager: &str, node: &str) -> Result<()> {
    manager_conn(manager)?
        .drain(node)
        .with_context(|| format!("draining {node}"))?;
    println!("memory node {node} is draining; its owners have been told");
    Ok(())
}

fn status(manager: &str, json: bool) -> Result<()> {
    let s = manager_conn(manager)?.status().context("asking for status")?;
    if json {
        let v = serde_json::json!({
            "memory_nodes": s.memory_nodes.iter().map(|m| serde_json::json!({
                "id": m.id.0, "addr": m.addr, "state": m.state.as_str(),
                "regions_total": m.regions_total, "regions_free": m.regions_free,
                "capacity_bytes": m.capacity_bytes,
            })).collect::<Vec<_>>(),
            "compute_nodes": s.compute_nodes.iter().map(|c| serde_json::json!({
                "id": c.id.0, "name": c.name, "state": c.state.as_str(), "regions": c.regions,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("memory nodes ({}):", s.memory_nodes.len());
    println!(
        "  {:<6} {:<22} {:<9} {:>8} {:>8} {:>12}",
        "id", "addr", "state", "regions", "free", "capacity"
    );
    for m in &s.memory_nodes {
        println!(
            "  {:<6} {:<22} {:<9} {:>8} {:>8} {:>12}",
            m.id.to_string(),
            m.addr,
            m.state.as_str(),
            m.regions_total,
            m.regions_free,
            ByteSize(m.capacity_bytes).to_string()
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
