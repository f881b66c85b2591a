//! `remora certs`: a fresh cluster CA and one node certificate signed by
//! it, which every node of the cluster presents (rcgen, ECDSA P-256).
//!
//! The CA's private key is not kept: a cluster that needs another
//! certificate makes a new set and hands it to every node, as with a new
//! cluster key.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

use super::{CA_FILE, CERT_FILE, KEY_FILE};

/// Why the certificates could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// A file is there already and `force` was not given.
    #[error("{path} exists already: choose another directory, or pass --force to replace the cluster's certificates")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// The directory could not be made or a file not written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A name for the certificate is not usable.
    #[error("cannot make the certificates: {0}")]
    Generate(#[from] rcgen::Error),
}

/// The files written by [`write_certs`].
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The CA certificate.
    pub ca: PathBuf,
    /// The node certificate.
    pub cert: PathBuf,
    /// The node's private key (mode 0600).
    pub key: PathBuf,
    /// The names the node certificate is valid for.
    pub names: Vec<String>,
}

/// Writes `ca.pem`, `node.pem` and `node.key` to `dir` (made if missing).
/// The node certificate is valid for `localhost`, `127.0.0.1` and `names`
/// (host names or IP addresses that nodes are reached at). Existing files
/// are replaced only with `force`.
pub fn write_certs(dir: &Path, names: &[String], force: bool) -> Result<CertFiles, CertsError> {
    let files = CertFiles {
        ca: dir.join(CA_FILE),
        cert: dir.join(CERT_FILE),
        key: dir.join(KEY_FILE),
        names: sans(names),
    };
    if !force {
        for p in [&files.ca, &files.cert, &files.key] {
            if p.exists() {
                return Err(CertsError::Exists { path: p.clone() });
            }
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Write {
        path: dir.to_path_buf(),
        source,
    })?;

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "remora cluster CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca.self_signed(&ca_key)?;

    let node_key = KeyPair::generate()?;
    let mut node = CertificateParams::new(files.names.clone())?;
    node.distinguished_name.push(DnType::CommonName, "remora node");
    node.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Every node is both: it serves, and it connects to other nodes.
    node.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let node = node.signed_by(&node_key, &ca, &ca_key)?;

    // The key first and private from its first byte: no moment where it is
    // readable by others.
    write_file(&files.key, node_key.serialize_pem().as_bytes(), 0o600, force)?;
    write_file(&files.cert, node.pem().as_bytes(), 0o644, force)?;
    write_file(&files.ca, ca.pem().as_bytes(), 0o644, force)?;
    Ok(files)
}

fn sans(names: &[String]) -> Vec<String> {
    let mut out = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    for n in names {
        let n = n.trim();
        if !n.is_empty() && !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    }
    out
}

fn write_file(path: &Path, bytes: &[u8], mode: u32, force: bool) -> Result<(), CertsError> {
    let err = |source| CertsError::Write {
        path: path.to_path_buf(),
        source,
    };
    if force {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                CertsError::Exists {
                    path: path.to_path_buf(),
                }
            } else {
                err(e)
            }
        })?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)
}
