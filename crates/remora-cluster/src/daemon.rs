//! The daemons' main loops (`remora manager`, `remora memnode`), shared by
//! the `remora` binary and by programs that launch a [`crate::LocalCluster`]
//! of themselves ([`crate::serve_if_child`]).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use remora_proto::{ByteSize, Token, parse_duration};

/// Why a daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
    /// `--admin-key` is not 32 hex digits.
    #[error("--admin-key must be 32 hex digits")]
    BadAdminKey,
    /// The manager failed to start.
    #[error("starting the manager: {0}")]
    Manager(#[from] remora_manager::ManagerError),
    /// The memory node failed to start.
    #[error("starting the memory node: {0}")]
    MemNode(#[from] remora_memnode::MemNodeError),
}

/// Flags of `remora manager`.
#[derive(Debug, Clone, clap::Args)]
pub struct ManagerArgs {
    /// Address to listen on, e.g. 127.0.0.1:7400.
    #[arg(long)]
    pub listen: String,
    /// Directory for the manager's persistent state.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Declare a node dead after this long without a heartbeat.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub heartbeat_timeout: Duration,
    /// Exit when standard input closes (used by launchers so that no daemon outlives them).
    #[arg(long, hide = true)]
    pub exit_with_parent: bool,
}

/// Flags of `remora memnode`.
#[derive(Debug, Clone, clap::Args)]
pub struct MemnodeArgs {
    /// The manager's address.
    #[arg(long)]
    pub manager: String,
    /// Address to serve data requests on, e.g. 127.0.0.1:7500 (port 0 picks one).
    #[arg(long)]
    pub listen: String,
    /// Memory to lend, e.g. 4GiB.
    #[arg(long)]
    pub capacity: ByteSize,
    /// Size of each region.
    #[arg(long, default_value = "1GiB")]
    pub region_size: ByteSize,
    /// Address to register with the manager when listening on 0.0.0.0.
    #[arg(long)]
    pub advertise: Option<String>,
    /// Admin key shared with the manager (32 hex digits; random by default).
    #[arg(long, hide = true)]
    pub admin_key: Option<String>,
    /// Exit when standard input closes (used by launchers).
    #[arg(long, hide = true)]
    pub exit_with_parent: bool,
}

/// Sends tracing logs to stderr with the given filter (RUST_LOG syntax).
pub fn init_logging(filter: &str) {
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
fn wake_channel(exit_with_parent: bool) -> Result<mpsc::Receiver<Wake>, DaemonError> {
    let (tx, rx) = mpsc::channel();
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])
        .map_err(DaemonError::Signals)?;
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

/// Runs the manager until SIGTERM/SIGINT (or the parent lifeline closes).
pub fn run_manager(a: ManagerArgs) -> Result<(), DaemonError> {
    let wake = wake_channel(a.exit_with_parent)?;
    let mgr = remora_manager::Manager::start(remora_manager::Config {
        listen: a.listen.clone(),
        data_dir: a.data_dir.clone(),
        heartbeat_timeout: a.heartbeat_timeout,
    })?;
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

/// Runs a memory node until it has drained after SIGTERM/SIGINT (a second
/// signal or the parent lifeline closing makes it leave at once).
pub fn run_memnode(a: MemnodeArgs) -> Result<(), DaemonError> {
    let admin_key = match &a.admin_key {
        Some(h) => Some(Token::from_hex(h).ok_or(DaemonError::BadAdminKey)?),
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
    })?;
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
