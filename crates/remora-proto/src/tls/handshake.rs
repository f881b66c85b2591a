//! The TLS handshake, run by rustls's unbuffered API on a blocking socket,
//! and the hand-over of the negotiated keys to the record layer
//! ([`super::record`]) through rustls's kernel connection.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;

use rustls::ExtractedSecrets;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, InsufficientSizeError, UnbufferedStatus};

use super::record::{Kernel, invalid};

/// First size of the handshake's buffers; a certificate chain that needs
/// more grows them, up to [`MAX_HANDSHAKE_BUF`].
const HANDSHAKE_BUF: usize = 16 * 1024;
/// No handshake flight of ours comes near this.
const MAX_HANDSHAKE_BUF: usize = 1 << 20;

/// What the handshake leaves for the record layer.
pub(super) struct Established {
    pub(super) secrets: ExtractedSecrets,
    pub(super) kernel: Kernel,
    /// Ciphertext read past the handshake's last record.
    pub(super) ciphertext: Vec<u8>,
    /// Application data rustls opened before the handshake reported done.
    pub(super) early: Vec<u8>,
}

/// The two sides of rustls's unbuffered API, for one handshake loop.
pub(super) trait Unbuffered {
    type Data;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error>;
}

impl Unbuffered for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        self.dangerous_into_kernel_connection()
            .map(|(s, k)| (s, Kernel::Client(k)))
    }
}

impl Unbuffered for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        self.dangerous_into_kernel_connection()
            .map(|(s, k)| (s, Kernel::Server(k)))
    }
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, e)
}

/// Runs the handshake to its end (the socket's timeouts bound each wait).
pub(super) fn run<C: Unbuffered>(sock: &mut TcpStream, mut conn: C) -> io::Result<Established> {
    let mut incoming = vec![0u8; HANDSHAKE_BUF];
    let mut used = 0;
    let mut outgoing = vec![0u8; HANDSHAKE_BUF];
    let mut queued = 0;
    let mut early = Vec::new();
    let mut failed = None;
    loop {
        let (discard, step) = 'status: {
            let UnbufferedStatus { discard, state } = conn.process(&mut incoming[..used]);
            let state = match state {
                Ok(s) => s,
                Err(e) => {
                    failed = Some(e);
                    break 'status (discard, Step::Again);
                }
            };
            let step = match state {
                ConnectionState::EncodeTlsData(mut st) => loop {
                    match st.encode(&mut outgoing[queued..]) {
                        Ok(n) => {
                            queued += n;
                            break Step::Again;
                        }
                        Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
                            if queued + required_size > MAX_HANDSHAKE_BUF {
                                return Err(invalid("a TLS handshake flight too large to send"));
                            }
                            outgoing.resize(queued + required_size, 0);
                        }
                        Err(e) => return Err(io::Error::other(e)),
                    }
                },
                ConnectionState::TransmitTlsData(st) => {
                    sock.write_all(&outgoing[..queued])?;
                    queued = 0;
                    st.done();
                    Step::Again
                }
                ConnectionState::ReadTraffic(mut st) => {
                    while let Some(rec) = st.next_record() {
                        early.extend_from_slice(rec.map_err(tls_error)?.payload);
                    }
                    Step::Again
                }
                ConnectionState::BlockedHandshake => Step::Read,
                ConnectionState::WriteTraffic(_) => Step::Done,
                ConnectionState::PeerClosed | ConnectionState::Closed => {
                    return Err(io::Error::new(
                        ErrorKind::ConnectionAborted,
                        "the peer closed the connection during the TLS handshake",
                    ));
                }
                _ => return Err(invalid("unexpected TLS state during the handshake")),
            };
            (discard, step)
        };
        incoming.copy_within(discard..used, 0);
        used -= discard;
        if let Some(e) = failed {
            send_alert(sock, &mut conn, &mut incoming[..used]);
            return Err(tls_error(e));
        }
        match step {
            Step::Again => {}
            Step::Done => break,
            Step::Read => {
                if used == incoming.len() {
                    if incoming.len() >= MAX_HANDSHAKE_BUF {
                        return Err(invalid("a TLS handshake message too large to receive"));
                    }
                    incoming.resize(incoming.len() * 2, 0);
                }
                match sock.read(&mut incoming[used..])? {
                    0 => {
                        return Err(io::Error::new(
                            ErrorKind::UnexpectedEof,
                            "the peer closed the connection during the TLS handshake",
                        ));
                    }
                    n => used += n,
                }
            }
        }
    }
    incoming.truncate(used);
    let (secrets, kernel) = conn.into_kernel().map_err(tls_error)?;
    Ok(Established {
        secrets,
        kernel,
        ciphertext: incoming,
        early,
    })
}

/// Sends the alert rustls queued when the handshake failed, so the peer
/// learns why (a client whose side of the handshake is already done reads
/// it as the answer to its first request). Best effort.
fn send_alert<C: Unbuffered>(sock: &mut TcpStream, conn: &mut C, incoming: &mut [u8]) {
    let mut out = vec![0u8; 1024];
    // Bytes rustls asks to discard are skipped, as the handshake loop
    // removes them.
    let mut start = 0;
    for _ in 0..4 {
        let UnbufferedStatus { discard, state } = conn.process(&mut incoming[start..]);
        match state {
            Ok(ConnectionState::EncodeTlsData(mut st)) => match st.encode(&mut out) {
                Ok(n) => {
                    let _ = sock.write_all(&out[..n]);
                }
                Err(_) => return,
            },
            Ok(ConnectionState::TransmitTlsData(st)) => st.done(),
            _ => return,
        }
        start += discard;
    }
}

enum Step {
    Again,
    Read,
    Done,
}
