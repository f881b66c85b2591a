//! TLS for remora connections: which connections use it ([`TlsMode`]), the
//! cluster's certificates ([`TlsConfig`], made by [`certs`]) and the byte
//! stream every connection runs on ([`Stream`]), plain TCP or TLS.
//!
//! Every node of a cluster presents a certificate signed by the cluster's CA
//! and accepts only peers that present one too (mutual TLS 1.3, rustls with
//! the `ring` provider). TLS sits below everything else: the protocol hello
//! and the cluster-key proof run inside it, unchanged.
//!
//! A server tells a TLS client from a plain one by the first byte it sends
//! (`0x16` starts a TLS ClientHello, `R` a remora hello), so one port can
//! serve both where that is allowed, and a client of the wrong kind is
//! answered with a TLS alert that it reports as [`crate::RpcError::Tls`]
//! instead of hanging.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

pub mod certs;
mod handshake;
mod record;
mod stream;
#[cfg(test)]
mod tests;

pub use certs::{CertsError, write_certs};
pub use stream::{Stream, TlsStream};
pub(crate) use stream::{TLS_HANDSHAKE, client_handshake, is_tls_alert, refuse_plain, refuse_tls, server_handshake};

/// The cluster CA's certificate in a TLS directory.
pub const CA_FILE: &str = "ca.pem";
/// The node certificate in a TLS directory.
pub const CERT_FILE: &str = "node.pem";
/// The node certificate's private key in a TLS directory.
pub const KEY_FILE: &str = "node.key";

/// Which connections are encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum TlsMode {
    /// None: plain TCP (with the cluster key) everywhere.
    #[default]
    Off,
    /// Connections to the manager, and the manager's own connections to
    /// memory nodes (grants and revocations carry region tokens).
    Control,
    /// Also the data path: compute node to memory node and memory node to
    /// memory node.
    Data,
}

impl TlsMode {
    /// The flag value (`off`, `control`, `data`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Control => "control",
            Self::Data => "data",
        }
    }
}

impl fmt::Display for TlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--tls` value that is none of `off`, `control`, `data`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown TLS mode {0:?}: expected off, control or data")]
pub struct BadTlsMode(String);

impl FromStr for TlsMode {
    type Err = BadTlsMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "no" | "none" => Ok(Self::Off),
            "control" => Ok(Self::Control),
            "data" | "all" => Ok(Self::Data),
            _ => Err(BadTlsMode(s.to_string())),
        }
    }
}

/// Which kind of connection a client opens, to choose whether the
/// [`TlsMode`] encrypts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// To the manager, or the manager's own to a memory node.
    Control,
    /// Compute node or memory node to a memory node.
    Data,
}

/// Why the cluster's certificates could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// `--tls` other than `off` without `--tls-dir`.
    #[error(
        "--tls {mode} needs --tls-dir DIR (or REMORA_TLS_DIR): make the cluster's certificates with \
         `remora certs --out DIR`"
    )]
    NoDir {
        /// The mode asked for.
        mode: TlsMode,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}; make the cluster's certificates with `remora certs --out {dir}`")]
    Read {
        /// The file.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Users other than its owner can read the private key.
    #[error(transparent)]
    Exposed(#[from] crate::secret::Exposed),
    /// A file holds no usable certificate or key.
    #[error("{path}: {reason}; make the cluster's certificates with `remora certs --out {dir}`")]
    Bad {
        /// The file.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// What a server does with TLS and plain clients.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate and the CA its clients must be signed by.
    pub config: Arc<ServerConfig>,
    /// Refuse plain clients; otherwise both kinds are served on one port.
    pub required: bool,
}

/// A node's TLS settings: the mode and the loaded certificates. Cheap to
/// clone (the rustls configurations are shared).
#[derive(Clone)]
pub struct TlsConfig {
    mode: TlsMode,
    dir: PathBuf,
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TlsConfig({}, {})", self.mode, self.dir.display())
    }
}

/// ring's TLS 1.3 suites, AES-128-GCM first: both ends are remora nodes,
/// so the choice is ours, and AES-128 seals a data-path payload in fewer
/// rounds than AES-256 at a security margin nobody here needs more of.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite;
    Arc::new(rustls::crypto::CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::ring::default_provider()
    })
}

impl TlsConfig {
    /// The settings for `--tls mode --tls-dir dir`: `None` for
    /// [`TlsMode::Off`], otherwise the certificates `remora certs` wrote to
    /// `dir` (`ca.pem`, `node.pem`, `node.key`).
    pub fn from_flags(mode: TlsMode, dir: Option<&Path>) -> Result<Option<Self>, TlsError> {
        if mode == TlsMode::Off {
            return Ok(None);
        }
        let dir = dir.ok_or(TlsError::NoDir { mode })?;
        Self::load(mode, dir).map(Some)
    }

    /// Loads the certificates in `dir` for a `mode` other than
    /// [`TlsMode::Off`].
    pub fn load(mode: TlsMode, dir: &Path) -> Result<Self, TlsError> {
        let file = |name: &str| -> Result<(PathBuf, Vec<u8>), TlsError> {
            let path = dir.join(name);
            match std::fs::read(&path) {
                Ok(b) => Ok((path, b)),
                Err(source) => Err(TlsError::Read {
                    path,
                    dir: dir.to_path_buf(),
                    source,
                }),
            }
        };
        let bad = |path: &Path, reason: String| TlsError::Bad {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            reason,
        };
        let certs_in = |path: &Path, bytes: &[u8]| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            let certs = CertificateDer::pem_slice_iter(bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(path, format!("not a PEM certificate file: {e}")))?;
            if certs.is_empty() {
                return Err(bad(path, "holds no certificate".into()));
            }
            Ok(certs)
        };
        let (ca_path, ca_pem) = file(CA_FILE)?;
        let (cert_path, cert_pem) = file(CERT_FILE)?;
        crate::secret::check_private(&dir.join(KEY_FILE))?;
        let (key_path, key_pem) = file(KEY_FILE)?;
        let mut roots = RootCertStore::empty();
        for c in certs_in(&ca_path, &ca_pem)? {
            roots
                .add(c)
                .map_err(|e| bad(&ca_path, format!("not a usable CA certificate: {e}")))?;
        }
        let roots = Arc::new(roots);
        let chain = certs_in(&cert_path, &cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| bad(&key_path, format!("holds no private key: {e}")))?;

        let tls13 = &[&rustls::version::TLS13];
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
            .build()
            .map_err(|e| bad(&ca_path, format!("cannot verify clients with it: {e}")))?;
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(tls13)
            .map_err(|e| bad(&ca_path, e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| bad(&key_path, format!("does not fit {}: {e}", cert_path.display())))?;
        // Connections are long-lived and never resumed: tickets would only
        // be bytes a client has to read after the handshake.
        server.send_tls13_tickets = 0;
        // The record layer after the handshake is ours (tls/record.rs).
        server.enable_secret_extraction = true;
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(tls13)
            .map_err(|e| bad(&ca_path, e.to_string()))?
            .with_root_certificates(Arc::clone(&roots))
            .with_client_auth_cert(chain, key)
            .map_err(|e| bad(&key_path, format!("does not fit {}: {e}", cert_path.display())))?;
        client.resumption = rustls::client::Resumption::disabled();
        client.enable_secret_extraction = true;
        Ok(Self {
            mode,
            dir: dir.to_path_buf(),
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    /// The mode.
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// The directory the certificates came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether a client connection on `plane` is encrypted.
    pub fn encrypts(&self, plane: Plane) -> bool {
        match plane {
            Plane::Control => self.mode >= TlsMode::Control,
            Plane::Data => self.mode >= TlsMode::Data,
        }
    }

    /// The client configuration (the same for every plane).
    pub fn client_config(&self) -> &Arc<ClientConfig> {
        &self.client
    }

    /// What a server for `plane` does: the manager ([`Plane::Control`])
    /// requires TLS in every mode but off; a memory node ([`Plane::Data`])
    /// requires it with [`TlsMode::Data`] and also serves TLS (the
    /// manager's connections) but allows plain clients with
    /// [`TlsMode::Control`].
    pub fn server(&self, plane: Plane) -> ServerTls {
        ServerTls {
            config: Arc::clone(&self.server),
            required: self.encrypts(plane),
        }
    }
}

/// The record layer's sealing or opening alone, timed on this machine: see
/// [`seal_cost`] and [`open_cost`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CryptoCost {
    /// Plaintext bytes sealed or opened.
    pub bytes: u64,
    /// The time it took.
    pub elapsed: Duration,
}

impl CryptoCost {
    /// CPU seconds per GB (10⁹ bytes) of plaintext.
    pub fn secs_per_gb(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e9 / (self.bytes.max(1) as f64)
    }
}

/// Times what TLS adds to every byte a memory node sends, on this CPU:
/// `plaintext` is sealed again and again, on the calling thread, by the
/// same code a TLS write runs (copied behind each record's header and
/// sealed there with AES-128-GCM, the suite offered first), for at least
/// `min`, and never sent.
///
/// A sender's TLS costs at least this much more per byte than plain TCP, so
/// where the sender's CPU bounds throughput, plain's cost per byte `p` caps
/// TLS ÷ plain at `p / (p + cost)`; `remora bench net --tls` prints that cap.
pub fn seal_cost(plaintext: &[u8], min: Duration) -> io::Result<CryptoCost> {
    let (bytes, elapsed) = record::seal_only(plaintext, min)?;
    Ok(CryptoCost { bytes, elapsed })
}

/// Times what TLS adds to every byte a client reads, on this CPU: the
/// records of `plaintext` are opened again and again by the same code a
/// TLS read runs (opened in place in the read buffer, the plaintext copied
/// out), for at least `min`, less the time of copying the ciphertext in,
/// which stands for the socket read that plain TCP does too.
///
/// With one request in flight the reply's seal and open run one after the
/// other, so TLS adds at least `(seal + open) × size` to a round trip;
/// `remora bench net --tls` prints the p50 ratio that floor allows.
pub fn open_cost(plaintext: &[u8], min: Duration) -> io::Result<CryptoCost> {
    let (bytes, with_open, copy_in) = record::open_only(plaintext, min)?;
    Ok(CryptoCost {
        bytes,
        elapsed: with_open.saturating_sub(copy_in),
    })
}
