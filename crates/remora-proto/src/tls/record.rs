//! The TLS 1.3 record layer (RFC 8446 §5) of an established connection,
//! sealing and opening records with ring's AEADs under the traffic secrets
//! rustls negotiated.
//!
//! rustls runs the handshake and keeps the key schedule (its kernel
//! connection API, made for kTLS); this module does what kTLS would do in
//! the kernel, because a record layer of our own copies less than rustls's
//! buffered one:
//!
//! - **receiving**, ciphertext read off the socket is opened in place in
//!   the reader's buffer and copied once, into the caller's buffer. rustls
//!   copies each byte three times (its deframer buffer, a `Vec` per record,
//!   the caller's buffer; its unbuffered API still makes the `Vec`);
//! - **sending**, a frame's plaintext is copied once, into the writer's
//!   buffer behind each record's header, sealed there, and the whole frame
//!   goes out in one send; no allocation per record, and nothing is copied
//!   out again when the socket is full.
//!
//! # Format
//!
//! Every record after the handshake (RFC 8446 §5.2):
//!
//! ```text
//! +------+-------+-------+----------------------------------+---------+
//! | 0x17 | 0x03 0x03     | length (u16, big-endian)         |         |
//! +------+-------+-------+----------------------------------+---------+
//! | AEAD(plaintext ‖ inner content type)                    | tag(16) |
//! +---------------------------------------------------------+---------+
//! ```
//!
//! - The 5-byte header is the AEAD's additional data. The nonce is the
//!   direction's IV XOR the record's sequence number (big-endian, right-
//!   aligned); the sequence starts at the number rustls hands over and at 0
//!   after each key update.
//! - Inner content types: 23 application data, 22 handshake (only
//!   KeyUpdate, and NewSessionTicket, which is ignored: sessions are never
//!   resumed), 21 alert. Padding (zeros after the type) is accepted on
//!   receipt and never sent.
//! - Plaintext per record ≤ 2^14 bytes; ciphertext ≤ 2^14 + 256.
//!
//! # Key updates
//!
//! A direction's keys change before its sequence number reaches half of the
//! cipher suite's confidentiality limit (2^24 records for AES-GCM, about
//! 275 GB: a busy data-path connection reaches it in minutes). The sender
//! seals a KeyUpdate under the old key, then seals with the next one; a
//! receiver that is asked to update too does so before its next record, as
//! RFC 8446 §4.6.3 allows (so a reader never waits for the write lock).

use std::io::{self, ErrorKind, IoSlice, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustix::net::SendFlags;
use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{ConnectionTrafficSecrets, SupportedCipherSuite};

/// Largest plaintext in one record.
pub(super) const MAX_PLAINTEXT: usize = 1 << 14;
/// Largest ciphertext a peer may send in one record (RFC 8446 §5.2).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// Record header: type, legacy version, length.
const HEADER: usize = 5;
/// The AEAD tag of every suite TLS 1.3 has.
const TAG: usize = 16;
/// The largest record on the wire, header included: a reader's buffer holds
/// at least one.
pub(super) const MAX_RECORD: usize = HEADER + MAX_CIPHERTEXT;

const APPLICATION_DATA: u8 = 23;
const HANDSHAKE: u8 = 22;
const ALERT: u8 = 21;
const KEY_UPDATE: u8 = 24;
const NEW_SESSION_TICKET: u8 = 4;
const CLOSE_NOTIFY: u8 = 0;

/// Plaintext a writer seals before it sends: a frame of up to this size
/// goes out in one send.
const SEAL_LIMIT: usize = 256 * 1024;

/// Times a writer found the socket's send buffer full and waited for it
/// (tests check that they exercise that path).
#[cfg(test)]
pub(crate) static SEND_BUFFER_FULL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Connections whose first plaintext rustls opened during the handshake
/// (tests check that they exercise that path).
#[cfg(test)]
pub(crate) static EARLY_PLAINTEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(super) fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, what.into())
}

/// rustls's key schedule after the handshake, for the client or the server
/// side of a connection.
pub(super) enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    fn suite(&self) -> SupportedCipherSuite {
        match self {
            Self::Client(k) => k.negotiated_cipher_suite(),
            Self::Server(k) => k.negotiated_cipher_suite(),
        }
    }

    /// The next keys of one direction, and the sequence number they start at.
    fn update(&mut self, tx: bool) -> io::Result<(u64, ConnectionTrafficSecrets)> {
        let next = match (self, tx) {
            (Self::Client(k), true) => k.update_tx_secret(),
            (Self::Client(k), false) => k.update_rx_secret(),
            (Self::Server(k), true) => k.update_tx_secret(),
            (Self::Server(k), false) => k.update_rx_secret(),
        };
        next.map_err(|e| io::Error::other(format!("TLS key update: {e}")))
    }

    /// When a sender must change its keys: half the suite's
    /// confidentiality limit, so a peer never sees a record past it.
    pub(super) fn update_at(&self) -> u64 {
        let limit = match self.suite() {
            SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            #[allow(unreachable_patterns)] // TLS 1.2 is not built in; only 1.3 is offered
            _ => 1 << 23,
        };
        (limit / 2).max(1)
    }
}

/// One direction's key and sequence number.
pub(super) struct Keys {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl Keys {
    pub(super) fn new(seq: u64, secrets: &ConnectionTrafficSecrets) -> io::Result<Self> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&aead::CHACHA20_POLY1305, key, iv),
            _ => {
                return Err(io::Error::other(
                    "the negotiated TLS cipher suite has no record layer here",
                ));
            }
        };
        Self::with(alg, key.as_ref(), iv.as_ref(), seq)
    }

    fn with(alg: &'static aead::Algorithm, key: &[u8], iv: &[u8], seq: u64) -> io::Result<Self> {
        let key = UnboundKey::new(alg, key).map_err(|_| io::Error::other("bad TLS traffic key"))?;
        let iv: [u8; 12] = iv.try_into().map_err(|_| io::Error::other("bad TLS IV"))?;
        Ok(Self {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The nonce of the next record; each sequence number is used once, as
    /// the sequence only grows and a key changes long before it could wrap.
    fn nonce(&self) -> Nonce {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        Nonce::assume_unique_for_key(n)
    }
}

fn header(ciphertext_len: usize) -> [u8; HEADER] {
    let [hi, lo] = u16::try_from(ciphertext_len).unwrap_or(u16::MAX).to_be_bytes();
    [APPLICATION_DATA, 3, 3, hi, lo]
}

/// The sending half: its keys and the sealed records on their way out.
pub(super) struct Tx {
    keys: Keys,
    update_at: u64,
    out: Vec<u8>,
    /// A write failed part-way: the peer has a cut record, so nothing more
    /// may follow it.
    broken: bool,
    /// Key updates sent.
    updates: u64,
}

impl Tx {
    pub(super) fn new(keys: Keys, update_at: u64) -> Self {
        Self {
            keys,
            update_at,
            out: Vec::with_capacity(SEAL_LIMIT + 32 * (HEADER + 1 + TAG)),
            broken: false,
            updates: 0,
        }
    }

    /// Key updates this side has sent.
    #[cfg(test)]
    pub(super) fn updates(&self) -> u64 {
        self.updates
    }

    /// Starts a record in `out`; returns where it starts.
    fn open_record(&mut self) -> usize {
        let start = self.out.len();
        self.out.extend_from_slice(&[0; HEADER]);
        start
    }

    /// Seals the record started at `start` (its plaintext already behind
    /// the header) as inner content type `typ`.
    fn seal_record(&mut self, start: usize, typ: u8) -> io::Result<()> {
        self.out.push(typ);
        let head = header(self.out.len() - start - HEADER + TAG);
        self.out[start..start + HEADER].copy_from_slice(&head);
        let tag = self
            .keys
            .key
            .seal_in_place_separate_tag(self.keys.nonce(), Aad::from(head), &mut self.out[start + HEADER..])
            .map_err(|_| io::Error::other("TLS seal failed"))?;
        self.out.extend_from_slice(tag.as_ref());
        self.keys.seq += 1;
        Ok(())
    }

    /// Seals a KeyUpdate under the current keys and moves on to the next.
    fn update_keys(&mut self, kernel: &Mutex<Kernel>, ask_peer: bool) -> io::Result<()> {
        let start = self.open_record();
        self.out.extend_from_slice(&[KEY_UPDATE, 0, 0, 1, u8::from(ask_peer)]);
        self.seal_record(start, HANDSHAKE)?;
        let (seq, secrets) = super::stream::lock(kernel).update(true)?;
        self.keys = Keys::new(seq, &secrets)?;
        self.updates += 1;
        Ok(())
    }

    /// Seals all of `bufs` and sends it, in records of up to 16 KiB and
    /// sends of up to [`SEAL_LIMIT`]; first a KeyUpdate if `update` (the
    /// peer asked for one) or the keys are due for one.
    pub(super) fn write(
        &mut self,
        sock: &TcpStream,
        kernel: &Mutex<Kernel>,
        update: bool,
        bufs: &[IoSlice<'_>],
    ) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::new(ErrorKind::BrokenPipe, "an earlier TLS write failed"));
        }
        let res = self.seal_and_send(sock, kernel, update, bufs);
        if res.is_err() {
            self.broken = true;
        }
        res
    }

    fn seal_and_send(
        &mut self,
        sock: &TcpStream,
        kernel: &Mutex<Kernel>,
        mut update: bool,
        bufs: &[IoSlice<'_>],
    ) -> io::Result<()> {
        self.out.clear();
        let mut rest = bufs.iter().map(|b| &b[..]).filter(|b| !b.is_empty());
        let mut cur: &[u8] = &[];
        let mut more = true;
        while more || update {
            if update || self.keys.seq >= self.update_at {
                self.update_keys(kernel, false)?;
                update = false;
            }
            let start = self.open_record();
            let mut n = 0;
            while n < MAX_PLAINTEXT {
                if cur.is_empty() {
                    match rest.next() {
                        Some(b) => cur = b,
                        None => {
                            more = false;
                            break;
                        }
                    }
                }
                let take = cur.len().min(MAX_PLAINTEXT - n);
                self.out.extend_from_slice(&cur[..take]);
                cur = &cur[take..];
                n += take;
            }
            if n == 0 {
                self.out.truncate(start);
                break;
            }
            self.seal_record(start, APPLICATION_DATA)?;
            if self.out.len() >= SEAL_LIMIT {
                self.send(sock)?;
            }
        }
        self.send(sock)
    }

    /// Sends a KeyUpdate that asks the peer to update too (tests).
    #[cfg(test)]
    pub(super) fn refresh(&mut self, sock: &TcpStream, kernel: &Mutex<Kernel>) -> io::Result<()> {
        self.out.clear();
        self.update_keys(kernel, true)?;
        self.send(sock)
    }

    /// Makes every key last `records` records (tests).
    #[cfg(test)]
    pub(super) fn set_update_at(&mut self, records: u64) {
        self.update_at = records;
    }

    /// Sends `out`: first without waiting, then, if the socket's buffer is
    /// full, the rest blocking (the write lock keeps records in order).
    fn send(&mut self, sock: &TcpStream) -> io::Result<()> {
        let mut sent = 0;
        while sent < self.out.len() {
            match rustix::net::send(sock, &self.out[sent..], SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
                Ok(n) => sent += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => {
                    #[cfg(test)]
                    SEND_BUFFER_FULL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut s = sock;
                    s.write_all(&self.out[sent..])?;
                    sent = self.out.len();
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.out.clear();
        Ok(())
    }
}

/// What opening a record left for the reader.
enum Opened {
    /// Application data, at this range of the buffer.
    Data(Range<usize>),
    /// A handshake message or nothing: no bytes for the reader.
    Nothing,
    /// The peer's close_notify.
    Closed,
}

/// Seals `plaintext` again and again, as [`Tx::write`] does (copied behind
/// each record's header, sealed there, in records of up to 16 KiB), under
/// a throwaway key of the suite remora offers first, AES-128-GCM, until
/// `min` has passed; nothing is sent. Returns the plaintext bytes sealed
/// and the time taken.
pub(super) fn seal_only(plaintext: &[u8], min: Duration) -> io::Result<(u64, Duration)> {
    let mut tx = Tx::new(Keys::with(&aead::AES_128_GCM, &[0x5a; 16], &[0xa5; 12], 0)?, u64::MAX);
    let started = Instant::now();
    let mut bytes = 0u64;
    loop {
        for chunk in plaintext.chunks(MAX_PLAINTEXT) {
            tx.out.clear();
            let start = tx.open_record();
            tx.out.extend_from_slice(chunk);
            tx.seal_record(start, APPLICATION_DATA)?;
            bytes += chunk.len() as u64;
        }
        let took = started.elapsed();
        if took >= min || plaintext.is_empty() {
            return Ok((bytes, took));
        }
    }
}

/// Opens the records of `plaintext` again and again as [`Rx::read`] opens
/// what a socket read put in its buffer: each record's ciphertext copied in
/// (standing for the socket read), opened in place, its plaintext copied
/// out to the reader's buffer; records of up to 16 KiB, sealed once under
/// a throwaway AES-128-GCM key. Runs whole passes until `min` has passed,
/// then the same passes with the copy in alone. Returns the plaintext
/// bytes, the time with the open and the copy out, and the time with the
/// copy in alone (its fastest pass times the passes): the difference is what TLS adds to a read, since a plain
/// read's socket call copies into the reader's buffer just once.
pub(super) fn open_only(plaintext: &[u8], min: Duration) -> io::Result<(u64, Duration, Duration)> {
    const KEY: [u8; 16] = [0x3c; 16];
    const IV: [u8; 12] = [0xc3; 12];
    let mut tx = Tx::new(Keys::with(&aead::AES_128_GCM, &KEY, &IV, 0)?, u64::MAX);
    let mut records = Vec::new();
    for chunk in plaintext.chunks(MAX_PLAINTEXT) {
        tx.out.clear();
        let start = tx.open_record();
        tx.out.extend_from_slice(chunk);
        tx.seal_record(start, APPLICATION_DATA)?;
        records.push(tx.out.clone());
    }
    let mut rx = Keys::with(&aead::AES_128_GCM, &KEY, &IV, 0)?;
    let mut work = vec![0u8; MAX_RECORD];
    let mut dst = vec![0u8; MAX_PLAINTEXT];
    let (mut bytes, mut passes) = (0u64, 0u32);
    let started = Instant::now();
    let opened = loop {
        for (seq, rec) in records.iter().enumerate() {
            let body = &mut work[..rec.len() - HEADER];
            body.copy_from_slice(&rec[HEADER..]);
            rx.seq = seq as u64;
            let head: [u8; HEADER] = rec[..HEADER].try_into().unwrap_or_default();
            let inner = rx
                .key
                .open_in_place(rx.nonce(), Aad::from(head), body)
                .map_err(|_| invalid("a record sealed for the open timing failed to open"))?;
            let n = inner.len() - 1;
            dst[..n].copy_from_slice(&inner[..n]);
            bytes += n as u64;
        }
        std::hint::black_box(&dst);
        passes += 1;
        let took = started.elapsed();
        if took >= min || records.is_empty() {
            break took;
        }
    };
    // The copy in is timed pass by pass and its fastest pass counted for
    // every pass: a pass the scheduler interrupts would otherwise make the
    // copy look as slow as (or slower than) the opens that contain it, and
    // the open's share of the time come out as nothing.
    let mut fastest = Duration::MAX;
    for _ in 0..passes {
        let started = Instant::now();
        for rec in &records {
            work[..rec.len() - HEADER].copy_from_slice(&rec[HEADER..]);
            std::hint::black_box(&work);
        }
        fastest = fastest.min(started.elapsed());
    }
    let copy_in = if passes == 0 { Duration::ZERO } else { fastest * passes };
    Ok((bytes, opened, copy_in))
}

/// The receiving half: its keys, the ciphertext read off the socket and
/// the plaintext opened in place there.
pub(super) struct Rx {
    keys: Keys,
    buf: Box<[u8]>,
    /// Plaintext opened and not yet read (before `pos`).
    plain: Range<usize>,
    /// Ciphertext not yet opened: `pos..end`.
    pos: usize,
    end: usize,
    /// Plaintext rustls opened during the handshake.
    early: Vec<u8>,
    eof: bool,
    closed: bool,
    /// A record that could not be opened: every later read reports it.
    broken: Option<(ErrorKind, String)>,
}

impl Rx {
    pub(super) fn new(keys: Keys, capacity: usize, ciphertext: &[u8], early: Vec<u8>) -> Self {
        #[cfg(test)]
        if !early.is_empty() {
            EARLY_PLAINTEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mut buf = vec![0u8; capacity.max(ciphertext.len()).max(MAX_RECORD)].into_boxed_slice();
        buf[..ciphertext.len()].copy_from_slice(ciphertext);
        Self {
            keys,
            buf,
            plain: 0..0,
            pos: 0,
            end: ciphertext.len(),
            early,
            eof: false,
            closed: false,
            broken: None,
        }
    }

    fn fail(&mut self, e: io::Error) -> io::Error {
        self.broken = Some((e.kind(), e.to_string()));
        e
    }

    /// Opens the next whole record in the buffer, if there is one.
    /// `answer` is set when the peer asks for our keys to change.
    fn open_next(&mut self, kernel: &Mutex<Kernel>, answer: &mut bool) -> io::Result<Option<Opened>> {
        if let Some((kind, msg)) = &self.broken {
            return Err(io::Error::new(*kind, msg.clone()));
        }
        if self.end - self.pos < HEADER {
            return Ok(None);
        }
        let head: [u8; HEADER] = self.buf[self.pos..self.pos + HEADER].try_into().unwrap_or_default();
        let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
        if head[0] != APPLICATION_DATA {
            let e = invalid(format!("unexpected TLS record type {} after the handshake", head[0]));
            return Err(self.fail(e));
        }
        if !(TAG + 1..=MAX_CIPHERTEXT).contains(&len) {
            return Err(self.fail(invalid(format!("TLS record of {len} bytes"))));
        }
        if self.end - self.pos < HEADER + len {
            return Ok(None);
        }
        let body = self.pos + HEADER..self.pos + HEADER + len;
        self.pos = body.end;
        let nonce = self.keys.nonce();
        let opened = match self
            .keys
            .key
            .open_in_place(nonce, Aad::from(head), &mut self.buf[body.clone()])
        {
            Ok(p) => p.len(),
            Err(_) => return Err(self.fail(invalid("a TLS record failed authentication"))),
        };
        self.keys.seq += 1;
        let inner = &self.buf[body.start..body.start + opened];
        let Some(at) = inner.iter().rposition(|&b| b != 0) else {
            return Err(self.fail(invalid("a TLS record with no content type")));
        };
        let content = body.start..body.start + at;
        match inner[at] {
            APPLICATION_DATA => Ok(Some(Opened::Data(content))),
            HANDSHAKE => match self.handshake(content, kernel, answer) {
                Ok(()) => Ok(Some(Opened::Nothing)),
                Err(e) => Err(self.fail(e)),
            },
            ALERT => {
                let a = &self.buf[content];
                if a.len() == 2 && a[1] == CLOSE_NOTIFY {
                    self.closed = true;
                    Ok(Some(Opened::Closed))
                } else {
                    // E.g. a server that refused this client's certificate
                    // after the client's side of the handshake was done.
                    let desc = rustls::AlertDescription::from(a.get(1).copied().unwrap_or(0));
                    let e = io::Error::new(
                        ErrorKind::ConnectionAborted,
                        format!("the peer sent TLS alert {desc:?}"),
                    );
                    Err(self.fail(e))
                }
            }
            t => Err(self.fail(invalid(format!("unexpected TLS content type {t}")))),
        }
    }

    /// Handshake messages after the handshake: KeyUpdate changes the keys
    /// the next record is opened with; a NewSessionTicket is dropped.
    fn handshake(&mut self, at: Range<usize>, kernel: &Mutex<Kernel>, answer: &mut bool) -> io::Result<()> {
        let mut msgs = &self.buf[at];
        while !msgs.is_empty() {
            let [typ, a, b, c, ref rest @ ..] = *msgs else {
                return Err(invalid("a cut TLS handshake message"));
            };
            let len = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            if rest.len() < len {
                return Err(invalid("a TLS handshake message split over records"));
            }
            let (body, tail) = rest.split_at(len);
            match (typ, body) {
                (KEY_UPDATE, [ask]) if *ask <= 1 => {
                    // Messages must not span a key change (RFC 8446 §5.1).
                    if !tail.is_empty() {
                        return Err(invalid("TLS data after a KeyUpdate in its record"));
                    }
                    *answer |= *ask == 1;
                    let (seq, secrets) = super::stream::lock(kernel).update(false)?;
                    self.keys = Keys::new(seq, &secrets)?;
                    return Ok(());
                }
                (NEW_SESSION_TICKET, _) => {}
                _ => {
                    return Err(invalid(format!(
                        "unexpected TLS handshake message {typ} after the handshake"
                    )));
                }
            }
            msgs = tail;
        }
        Ok(())
    }

    /// Whether a read would return at once: plaintext waits, the peer
    /// closed, or a record waits that cannot be opened (the read reports it).
    pub(super) fn ready(&mut self, kernel: &Mutex<Kernel>, answer: &mut bool) -> bool {
        loop {
            if !self.early.is_empty() || !self.plain.is_empty() || self.closed {
                return true;
            }
            match self.open_next(kernel, answer) {
                Ok(Some(Opened::Data(r))) => self.plain = r,
                Ok(Some(_)) => {}
                Ok(None) => return false,
                Err(_) => return true,
            }
        }
    }

    /// Fills `dst` from plaintext already received and the records already
    /// read; reads the socket (once) only when that gives nothing.
    pub(super) fn read(
        &mut self,
        sock: &TcpStream,
        kernel: &Mutex<Kernel>,
        answer: &mut bool,
        dst: &mut [u8],
    ) -> io::Result<usize> {
        if !self.early.is_empty() {
            let n = self.early.len().min(dst.len());
            dst[..n].copy_from_slice(&self.early[..n]);
            self.early.drain(..n);
            return Ok(n);
        }
        loop {
            let mut filled = 0;
            while filled < dst.len() {
                if self.plain.is_empty() {
                    match self.open_next(kernel, answer) {
                        Ok(Some(Opened::Data(r))) => self.plain = r,
                        Ok(Some(Opened::Nothing)) => continue,
                        Ok(Some(Opened::Closed)) | Ok(None) => break,
                        // Bytes already read are the caller's; the error
                        // comes with the next read (it is sticky).
                        Err(_) if filled > 0 => break,
                        Err(e) => return Err(e),
                    }
                    continue;
                }
                let n = self.plain.len().min(dst.len() - filled);
                dst[filled..filled + n].copy_from_slice(&self.buf[self.plain.start..self.plain.start + n]);
                self.plain.start += n;
                filled += n;
            }
            if filled > 0 || self.closed || self.eof {
                // The peer closed without close_notify: frames are
                // self-delimiting, so the frame layer tells a clean end
                // (between frames) from a cut one.
                return Ok(filled);
            }
            // Nothing opened is left before `pos`: keep the partial record.
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
            self.plain = 0..0;
            let mut s = sock;
            match io::Read::read(&mut s, &mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.end += n,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests;
