//! `remora memnode`: the memory-node daemon's flags and main loop. A first
//! SIGTERM/SIGINT drains the node (owners are told to move away) and the
//! daemon leaves once every region is released; a second one leaves at once.

use std::sync::mpsc;
use std::time::Duration;

use remora_daemon::{AuthArgs, AuthConfigError, LimitArgs, SignalsError, TlsArgs, Wake, announce, wake_channel};
use remora_proto::{ByteSize, Token};

use crate::{Config, MemNode, MemNodeError};

/// The environment variable that may give the key the manager proves on
/// its admin requests to this node (32 hex digits; random when unset).
/// Launchers that inject faults set it to know the key. A secret, so never
/// a flag: the command line shows in `ps` to every user.
pub const ADMIN_KEY_ENV: &str = "REMORA_ADMIN_KEY";

/// Why the memory-node daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Signal handlers could not be installed.
    #[error(transparent)]
    Signals(#[from] SignalsError),
    /// The admin key in the environment is not 32 hex digits.
    #[error("{ADMIN_KEY_ENV} must be 32 hex digits")]
    BadAdminKey,
    /// No usable cluster key.
    #[error(transparent)]
    Auth(#[from] AuthConfigError),
    /// The TLS certificates could not be loaded.
    #[error(transparent)]
    Tls(#[from] remora_proto::tls::TlsError),
    /// The memory node failed to start.
    #[error("starting the memory node: {0}")]
    MemNode(#[from] MemNodeError),
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
    /// The cluster key.
    #[command(flatten)]
    pub auth: AuthArgs,
    /// TLS.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Connection limits.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Exit when standard input closes (used by launchers).
    #[arg(long, hide = true)]
    pub exit_with_parent: bool,
}

/// Runs a memory node until it has drained after SIGTERM/SIGINT (a second
/// signal or the parent lifeline closing makes it leave at once).
pub fn run(a: MemnodeArgs) -> Result<(), DaemonError> {
    let admin_key = match std::env::var(ADMIN_KEY_ENV) {
        Ok(h) => Some(Token::from_hex(h.trim()).ok_or(DaemonError::BadAdminKey)?),
        Err(_) => None,
    };
    let cluster_key = a.auth.key()?;
    let tls = a.tls.config()?;
    let wake = wake_channel(a.exit_with_parent)?;
    let node = MemNode::start(Config {
        manager: a.manager.clone(),
        listen: a.listen.clone(),
        advertise: a.advertise.clone(),
        capacity: a.capacity.0,
        region_size: a.region_size.0,
        admin_key,
        manager_patience: Duration::from_secs(10),
        cluster_key,
        tls,
        limits: a.limits.limits(),
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
