//! `remora manager`: the manager daemon's flags and main loop.

use std::path::PathBuf;
use std::time::Duration;

use remora_daemon::{AuthArgs, AuthConfigError, SignalsError, TlsArgs, Wake, announce, wake_channel};
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
    /// The cluster key.
    #[command(flatten)]
    pub auth: AuthArgs,
    /// TLS.
    #[command(flatten)]
    pub tls: TlsArgs,
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
