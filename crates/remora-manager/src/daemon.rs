//! `remora manager`: the manager daemon's flags and main loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use remora_daemon::{AuthArgs, AuthConfigError, LimitArgs, SignalsError, TlsArgs, Wake, announce, wake_channel};
use remora_proto::parse_duration;

use crate::{Config, Manager, ManagerError};

/// Why the manager daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Signal handlers could not be installed.
    #[error(transparent)]
    Signals(#[from] SignalsError),
    /// No usable cluster key.
    #[error(transparent)]
    Auth(#[from] AuthConfigError),
    /// The TLS certificates could not be loaded.
    #[error(transparent)]
    Tls(#[from] remora_proto::tls::TlsError),
    /// The manager failed to start.
    #[error("starting the manager: {0}")]
    Manager(#[from] ManagerError),
}

/// The members named by `--peers`.
#[derive(Debug, Clone, Default)]
pub struct Peers(pub BTreeMap<u64, String>);

/// Parses `ID=ADDR,...`.
pub fn parse_peers(s: &str) -> Result<Peers, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}`: expected ID=ADDR, e.g. 1=127.0.0.1:7400"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("`{part}`: the member id `{id}` is not a number"))?;
        if id == 0 {
            return Err(format!("`{part}`: member ids start at 1"));
        }
        if addr.trim().is_empty() {
            return Err(format!("`{part}`: no address"));
        }
        if out.insert(id, addr.trim().to_string()).is_some() {
            return Err(format!("member {id} is named twice"));
        }
    }
    if out.len() == 2 || out.len() == 4 {
        tracing::warn!(
            "a manager group of {} tolerates no more failures than one of {}: use 3 or 5",
            out.len(),
            out.len() - 1
        );
    }
    Ok(Peers(out))
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
    /// This manager's member id in its group (with `--peers`).
    #[arg(long, default_value_t = 1)]
    pub id: u64,
    /// Every member of the manager group, this one included, as
    /// `ID=ADDR,...` (e.g. `1=10.0.0.1:7400,2=10.0.0.2:7400,3=10.0.0.3:7400`):
    /// a group of 3 or 5 keeps serving while a minority is down. Without
    /// it, this manager is a group of one.
    #[arg(long, value_parser = parse_peers, default_value = "")]
    pub peers: Peers,
    /// Take a snapshot of the group's state (and purge the log behind it)
    /// every this many log entries.
    #[arg(long, default_value_t = crate::DEFAULT_SNAPSHOT_EVERY, hide = true)]
    pub snapshot_every: u64,
    /// Declare a node dead after this long without a heartbeat.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub heartbeat_timeout: Duration,
    /// The cluster key.
    #[command(flatten)]
    pub auth: AuthArgs,
    /// TLS.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Connection limits.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Exit when standard input closes (used by launchers so that no daemon outlives them).
    #[arg(long, hide = true)]
    pub exit_with_parent: bool,
}

/// Runs the manager until SIGTERM/SIGINT (or the parent lifeline closes).
pub fn run(a: ManagerArgs) -> Result<(), DaemonError> {
    let cluster_key = a.auth.key()?;
    let tls = a.tls.config()?;
    let wake = wake_channel(a.exit_with_parent)?;
    let mgr = Manager::start(Config {
        listen: a.listen.clone(),
        data_dir: a.data_dir.clone(),
        heartbeat_timeout: a.heartbeat_timeout,
        cluster_key,
        tls,
        id: a.id,
        peers: a.peers.0.clone(),
        snapshot_every: a.snapshot_every,
        limits: a.limits.limits(),
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
