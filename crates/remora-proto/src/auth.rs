//! Who may join: the cluster key and the mutual challenge–response proof of
//! it that opens every authenticated connection.
//!
//! Every daemon and client of a cluster holds the same 32-byte [`ClusterKey`]
//! (made by `remora keygen`). Right after the protocol hello (see
//! [`crate::frame`]) and before any request, the two ends prove to each
//! other that they hold it, without sending it:
//!
//! ```text
//! client -> server   CHALLENGE  tag "Rm\xA7C" | nonce_c (32)                 36 bytes
//! server -> client   ANSWER     tag "Rm\xA7A" | nonce_s (32) | mac_s (32)    68 bytes
//! client -> server   PROOF      tag "Rm\xA7P" | mac_c (32)                   36 bytes
//!
//! mac_s = HMAC-SHA256(key, "remora-auth-v1 server" | nonce_c | nonce_s)
//! mac_c = HMAC-SHA256(key, "remora-auth-v1 client" | nonce_c | nonce_s)
//! ```
//!
//! Both nonces are fresh random values, so bytes recorded from one handshake
//! prove nothing on another connection (the other side's nonce differs), and
//! the direction labels stop a proof from being reflected back to its
//! sender. MACs are compared in constant time. The client checks the
//! server's proof before it sends its own, and a valid server proof means
//! both ends hold the same key, so the client's proof will pass: the client
//! sends its first request right behind it, without waiting for a verdict.
//! A server that finds a wrong proof (a replay, or bytes changed on the way)
//! closes the connection without serving the requests behind it. Byte 2 of
//! every tag (0xA7) is no protocol version, so a tag is never mistaken for a
//! frame header.
//!
//! The handshake costs one round trip at connection setup and nothing per
//! request. With no key on either side (`--insecure-no-auth`) nothing is
//! exchanged and the connection behaves as before.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Bytes in a cluster key.
pub const KEY_LEN: usize = 32;
/// Bytes in a handshake nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes in a key proof (an HMAC-SHA256 tag).
pub const MAC_LEN: usize = 32;
/// Bytes in a message tag.
pub const TAG_LEN: usize = 4;

/// Tag of the client's opening message.
pub const TAG_CHALLENGE: [u8; TAG_LEN] = *b"Rm\xA7C";
/// Tag of the server's nonce and proof.
pub const TAG_ANSWER: [u8; TAG_LEN] = *b"Rm\xA7A";
/// Tag of the client's proof.
pub const TAG_PROOF: [u8; TAG_LEN] = *b"Rm\xA7P";

/// Length of [`Challenge`] on the wire.
pub const CHALLENGE_LEN: usize = TAG_LEN + NONCE_LEN;
/// Length of [`Answer`] on the wire.
pub const ANSWER_LEN: usize = TAG_LEN + NONCE_LEN + MAC_LEN;
/// Length of [`Proof`] on the wire.
pub const PROOF_LEN: usize = TAG_LEN + MAC_LEN;

const SERVER_LABEL: &[u8] = b"remora-auth-v1 server";
const CLIENT_LABEL: &[u8] = b"remora-auth-v1 client";
const KEY_ID_LABEL: &[u8] = b"remora-auth-v1 key id";

/// The secret every member of a cluster holds. Its bytes never appear in
/// `Debug` output or logs; [`ClusterKey::id`] names it instead.
#[derive(Clone, Copy)]
pub struct ClusterKey([u8; KEY_LEN]);

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterKey(id {})", self.id())
    }
}

/// Why a key file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read.
    #[error("cannot read the cluster key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The file does not hold a key.
    #[error(
        "{path} holds no cluster key (expected {} hex digits, as written by `remora keygen --out FILE`)",
        KEY_LEN * 2
    )]
    Malformed {
        /// The file.
        path: PathBuf,
    },
    /// Users other than its owner can read the file.
    #[error(transparent)]
    Exposed(#[from] crate::secret::Exposed),
    /// The file could not be written (it may exist already: keygen never overwrites).
    #[error("cannot write the cluster key file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

impl ClusterKey {
    /// A fresh random key (from the thread's cryptographically secure generator).
    pub fn generate() -> Self {
        let mut k = [0u8; KEY_LEN];
        rand::rng().fill_bytes(&mut k);
        Self(k)
    }

    /// The key as 64 lowercase hex digits (the key file's format).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits; surrounding whitespace is ignored.
    pub fn from_hex(s: &str) -> Option<Self> {
        let s = s.trim();
        if s.len() != KEY_LEN * 2 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut k = [0u8; KEY_LEN];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(k))
    }

    /// A short public name of the key (a MAC of a fixed label, so it reveals
    /// nothing of the key): daemons log it so an operator can tell whether
    /// two nodes hold the same key.
    pub fn id(&self) -> String {
        let mut m = self.mac();
        m.update(KEY_ID_LABEL);
        m.finalize().into_bytes()[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Reads a key file written by [`ClusterKey::write_new`] (64 hex
    /// digits); refuses one that users other than its owner can read.
    pub fn read_file(path: &Path) -> Result<Self, KeyFileError> {
        crate::secret::check_private(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_hex(&text).ok_or_else(|| KeyFileError::Malformed {
            path: path.to_path_buf(),
        })
    }

    /// Writes the key to a new file readable by its owner only (mode 0600);
    /// an existing file is left alone and reported.
    pub fn write_new(&self, path: &Path) -> Result<(), KeyFileError> {
        let fail = |source| KeyFileError::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(path).map_err(fail)?;
        f.write_all(format!("{}\n", self.to_hex()).as_bytes()).map_err(fail)?;
        f.sync_all().map_err(fail)
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length: this cannot fail.
        <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC accepts any key length")
    }

    fn prover(&self, label: &[u8], nc: &[u8; NONCE_LEN], ns: &[u8; NONCE_LEN]) -> HmacSha256 {
        let mut m = self.mac();
        m.update(label);
        m.update(nc);
        m.update(ns);
        m
    }

    /// The proof that the side speaking with `label` holds the key.
    fn prove(&self, label: &[u8], nc: &[u8; NONCE_LEN], ns: &[u8; NONCE_LEN]) -> [u8; MAC_LEN] {
        self.prover(label, nc, ns).finalize().into_bytes().into()
    }

    /// Checks a proof in constant time.
    fn verify(&self, label: &[u8], nc: &[u8; NONCE_LEN], ns: &[u8; NONCE_LEN], mac: &[u8; MAC_LEN]) -> bool {
        self.prover(label, nc, ns).verify_slice(mac).is_ok()
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The peer sent something other than the message expected next.
    #[error("expected a {expected} message of the cluster-key handshake, got bytes starting {got:02x?}")]
    BadTag {
        /// The message expected.
        expected: &'static str,
        /// The tag received in its place.
        got: [u8; TAG_LEN],
    },
    /// The server got a request where the key challenge belongs: the client
    /// runs without a cluster key.
    #[error("the peer sent a request without proving the cluster key (is it started without --cluster-key-file?)")]
    NoChallenge {
        /// The bytes received in place of the challenge's tag.
        got: [u8; TAG_LEN],
    },
    /// The peer's proof does not match: it holds another key, or replays
    /// bytes from another handshake.
    #[error("the peer's proof of the cluster key is wrong (another key, or a replayed handshake)")]
    BadProof,
    /// The peer closed the connection in the middle of the handshake.
    #[error(
        "closed during the cluster-key handshake (the peer runs without a cluster key, \
         with --insecure-no-auth, or is shutting down)"
    )]
    Closed,
    /// A socket error or timeout.
    #[error("cluster-key handshake: {0}")]
    Io(#[from] io::Error),
}

/// The client's opening message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// The client's nonce.
    pub nonce: [u8; NONCE_LEN],
}

/// The server's nonce and its proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The server's nonce.
    pub nonce: [u8; NONCE_LEN],
    /// `mac_s` (see the module docs).
    pub mac: [u8; MAC_LEN],
}

/// The client's proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    /// `mac_c` (see the module docs).
    pub mac: [u8; MAC_LEN],
}

fn check_tag(b: &[u8], tag: [u8; TAG_LEN], expected: &'static str) -> Result<(), AuthError> {
    let mut got = [0u8; TAG_LEN];
    let n = b.len().min(TAG_LEN);
    got[..n].copy_from_slice(&b[..n]);
    if got != tag {
        return Err(AuthError::BadTag { expected, got });
    }
    Ok(())
}

fn take<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

fn too_short(what: &str) -> AuthError {
    AuthError::Io(io::Error::new(
        ErrorKind::UnexpectedEof,
        format!("truncated {what} message"),
    ))
}

impl Challenge {
    /// The message's bytes.
    pub fn encode(&self) -> [u8; CHALLENGE_LEN] {
        let mut b = [0u8; CHALLENGE_LEN];
        b[..TAG_LEN].copy_from_slice(&TAG_CHALLENGE);
        b[TAG_LEN..].copy_from_slice(&self.nonce);
        b
    }

    /// Parses a challenge; any other input is an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Self, AuthError> {
        check_tag(b, TAG_CHALLENGE, "challenge")?;
        if b.len() != CHALLENGE_LEN {
            return Err(too_short("challenge"));
        }
        Ok(Self {
            nonce: take(b, TAG_LEN),
        })
    }
}

impl Answer {
    /// The message's bytes.
    pub fn encode(&self) -> [u8; ANSWER_LEN] {
        let mut b = [0u8; ANSWER_LEN];
        b[..TAG_LEN].copy_from_slice(&TAG_ANSWER);
        b[TAG_LEN..TAG_LEN + NONCE_LEN].copy_from_slice(&self.nonce);
        b[TAG_LEN + NONCE_LEN..].copy_from_slice(&self.mac);
        b
    }

    /// Parses an answer; any other input is an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Self, AuthError> {
        check_tag(b, TAG_ANSWER, "answer")?;
        if b.len() != ANSWER_LEN {
            return Err(too_short("answer"));
        }
        Ok(Self {
            nonce: take(b, TAG_LEN),
            mac: take(b, TAG_LEN + NONCE_LEN),
        })
    }
}

impl Proof {
    /// The message's bytes.
    pub fn encode(&self) -> [u8; PROOF_LEN] {
        let mut b = [0u8; PROOF_LEN];
        b[..TAG_LEN].copy_from_slice(&TAG_PROOF);
        b[TAG_LEN..].copy_from_slice(&self.mac);
        b
    }

    /// Parses a proof; any other input is an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Self, AuthError> {
        check_tag(b, TAG_PROOF, "proof")?;
        if b.len() != PROOF_LEN {
            return Err(too_short("proof"));
        }
        Ok(Self { mac: take(b, TAG_LEN) })
    }
}

fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut n);
    n
}

/// Reads exactly `buf.len()` bytes; the peer hanging up is [`AuthError::Closed`].
fn read_msg(s: &mut impl Read, buf: &mut [u8]) -> Result<(), AuthError> {
    s.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => AuthError::Closed,
        _ => AuthError::Io(e),
    })
}

/// The connecting side of the handshake: checks that the server holds the
/// key and proves it holds it too; requests may follow at once. The caller
/// bounds the time (socket timeouts).
pub fn client_handshake(s: &mut (impl Read + Write), key: &ClusterKey) -> Result<(), AuthError> {
    let nc = nonce();
    s.write_all(&Challenge { nonce: nc }.encode())?;
    let mut b = [0u8; ANSWER_LEN];
    read_msg(s, &mut b)?;
    let answer = Answer::decode(&b)?;
    if !key.verify(SERVER_LABEL, &nc, &answer.nonce, &answer.mac) {
        return Err(AuthError::BadProof);
    }
    let proof = Proof {
        mac: key.prove(CLIENT_LABEL, &nc, &answer.nonce),
    };
    s.write_all(&proof.encode())?;
    Ok(())
}

/// The accepting side of the handshake: checks the client's proof of the
/// key and proves it back. On an error the caller closes the connection
/// without serving anything. The caller bounds the time (socket timeouts).
pub fn server_handshake(s: &mut (impl Read + Write), key: &ClusterKey) -> Result<(), AuthError> {
    let mut b = [0u8; CHALLENGE_LEN];
    read_msg(s, &mut b[..TAG_LEN])?;
    if b[..TAG_LEN] != TAG_CHALLENGE {
        return Err(AuthError::NoChallenge { got: take(&b, 0) });
    }
    read_msg(s, &mut b[TAG_LEN..])?;
    let challenge = Challenge::decode(&b)?;
    let ns = nonce();
    let answer = Answer {
        nonce: ns,
        mac: key.prove(SERVER_LABEL, &challenge.nonce, &ns),
    };
    s.write_all(&answer.encode())?;
    let mut p = [0u8; PROOF_LEN];
    read_msg(s, &mut p)?;
    let proof = Proof::decode(&p)?;
    if !key.verify(CLIENT_LABEL, &challenge.nonce, &ns, &proof.mac) {
        return Err(AuthError::BadProof);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
