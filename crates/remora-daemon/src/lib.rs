//! What every remora daemon process shares, so `remora manager` and `remora
//! memnode` (and a test binary re-executed as one of them by
//! `remora-cluster`) behave alike: logs go to stderr, SIGTERM/SIGINT start a
//! clean shutdown, a launcher can tie a daemon's life to its own through
//! stdin (`--exit-with-parent`), and the daemon prints one ready line on
//! stdout once it listens, from which launchers learn the bound address.
//! Every daemon also takes the cluster key the same way ([`AuthArgs`]) and
//! refuses to start without one unless told `--insecure-no-auth`, and TLS
//! the same way ([`TlsArgs`]), off unless asked for.
//!
//! The daemons' main loops live in their own crates (`remora_manager::daemon`,
//! `remora_memnode::daemon`); this crate only holds the process plumbing.

#![forbid(unsafe_code)]

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;

use remora_proto::auth::KeyFileError;
use remora_proto::server::Limits;
use remora_proto::tls::TlsError;
use remora_proto::{ClusterKey, TlsConfig, TlsMode};

/// Signal handlers could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("installing signal handlers: {0}")]
pub struct SignalsError(#[source] pub std::io::Error);

/// Sends tracing logs to stderr with the given filter (RUST_LOG syntax); a
/// bad filter is reported and replaced by `info` rather than refused, since
/// losing a daemon over its log level helps nobody.
///
/// The Raft library logs every step of every election at info and debug:
/// it logs warnings only, unless the filter names it (`openraft=debug`).
pub fn init_logging(filter: &str) {
    let filter = if filter.contains("openraft") {
        filter.to_string()
    } else {
        format!("{filter},openraft=warn")
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// SIGTERM or SIGINT arrived.
    Signal,
    /// The launcher's lifeline (stdin) closed: the launcher is gone.
    ParentGone,
}

/// Delivers SIGTERM/SIGINT and, with `exit_with_parent`, the closing of
/// stdin (a launcher holds the other end, so no daemon outlives it even
/// when the launcher is killed with SIGKILL).
pub fn wake_channel(exit_with_parent: bool) -> Result<mpsc::Receiver<Wake>, SignalsError> {
    let (tx, rx) = mpsc::channel();
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])
        .map_err(SignalsError)?;
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

/// Prints the ready line launchers wait for (`remora manager listening on
/// ADDR`, ...) and flushes it, since stdout is a pipe when launched.
pub fn announce(line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// The connection limits of every daemon ([`remora_proto::server::Limits`]).
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Authenticated connections served at once; more are refused with a
    /// `Busy` error (a compute node holds two per memory node).
    #[arg(long, default_value_t = Limits::default().connections)]
    pub max_connections: usize,
    /// Connections in their handshake at once; a new one beyond this drops the oldest.
    #[arg(long, default_value_t = Limits::default().handshakes)]
    pub max_handshakes: usize,
    /// Time a connection has for its whole handshake (TLS, hello, key proof).
    #[arg(long, default_value = "10s", value_parser = remora_proto::parse_duration)]
    pub handshake_deadline: std::time::Duration,
    /// Time a request has to arrive once its first byte has (and a reply to leave).
    #[arg(long, default_value = "30s", value_parser = remora_proto::parse_duration)]
    pub request_deadline: std::time::Duration,
}

impl LimitArgs {
    /// The limits these flags set.
    pub fn limits(&self) -> Limits {
        Limits {
            handshakes: self.max_handshakes,
            handshake_deadline: self.handshake_deadline,
            connections: self.max_connections,
            request_deadline: self.request_deadline,
        }
    }
}

/// The cluster-key flags of every daemon.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthArgs {
    /// File holding the cluster key (`remora keygen --out FILE` makes one); every
    /// connection to this daemon must prove it, and the daemon proves it to its peers.
    #[arg(long, env = "REMORA_CLUSTER_KEY_FILE", value_name = "FILE")]
    pub cluster_key_file: Option<PathBuf>,
    /// Run without a cluster key: anyone who can reach the port may join, drain
    /// nodes and read the cluster's status. Only for a trusted network.
    #[arg(long)]
    pub insecure_no_auth: bool,
}

/// Why a daemon has no usable cluster key.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// Neither a key nor `--insecure-no-auth` was given.
    #[error(
        "no cluster key: make one with `remora keygen --out FILE` and give every daemon and client \
         --cluster-key-file FILE (or REMORA_CLUSTER_KEY_FILE=FILE), or pass --insecure-no-auth \
         to let anyone who can reach this port join"
    )]
    NoKey,
    /// Both a key and `--insecure-no-auth` were given.
    #[error("both a cluster key file and --insecure-no-auth given: choose one")]
    Both,
    /// The key file is unreadable or holds no key.
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
}

impl AuthArgs {
    /// The key this daemon requires, `None` under `--insecure-no-auth`;
    /// says in the log which it is.
    pub fn key(&self) -> Result<Option<ClusterKey>, AuthConfigError> {
        match (&self.cluster_key_file, self.insecure_no_auth) {
            (Some(_), true) => Err(AuthConfigError::Both),
            (None, false) => Err(AuthConfigError::NoKey),
            (None, true) => {
                tracing::warn!(
                    "running without a cluster key (--insecure-no-auth): anyone who can reach this port may join"
                );
                Ok(None)
            }
            (Some(path), false) => {
                let key = ClusterKey::read_file(path)?;
                tracing::info!("cluster key {} from {}", key.id(), path.display());
                Ok(Some(key))
            }
        }
    }
}

/// The TLS flags of every daemon and client.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// Encrypt with mutually authenticated TLS: `off`; `control`, connections to
    /// the manager (and the manager's to memory nodes); `data`, also compute node to
    /// memory node and memory node to memory node. Every node of a cluster uses the same mode.
    #[arg(long = "tls", env = "REMORA_TLS", default_value = "off", value_name = "MODE")]
    pub mode: TlsMode,
    /// Directory with the cluster's certificates (`ca.pem`, `node.pem`, `node.key`),
    /// as written by `remora certs --out DIR`.
    #[arg(long, env = "REMORA_TLS_DIR", value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
}

impl TlsArgs {
    /// The loaded certificates, `None` with `--tls off`; says in the log which it is.
    pub fn config(&self) -> Result<Option<TlsConfig>, TlsError> {
        let cfg = TlsConfig::from_flags(self.mode, self.tls_dir.as_deref())?;
        if let Some(c) = &cfg {
            tracing::info!("TLS {} with certificates from {}", c.mode(), c.dir().display());
        }
        Ok(cfg)
    }
}
