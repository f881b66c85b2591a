//! `remora bench net`: the data path against raw TCP, measured in one run.
//!
//! The benchmark starts its own local cluster (a manager and one memory node,
//! child processes on loopback), allocates one region, fills it with a known
//! pattern and checks it, then measures two things, each next to a baseline
//! measured in the same run:
//!
//! 1. **READ latency.** One request outstanding at a time, through
//!    [`MemNodeClient::read`], for each `--sizes` entry; the baseline is a
//!    ping-pong on a plain blocking TCP connection to a server thread in this
//!    process that answers a 32-byte request with the same number of bytes
//!    (`raw`). Both sides read the same pseudo-random aligned offsets of a
//!    region-sized buffer. Warm-up first, then the two sides alternate in
//!    blocks of `--block` samples (which side goes first alternates too), so
//!    that machine noise hits both equally. Every reply is checked against
//!    the pattern outside the timed section. Reported: p50/p99/p999 with
//!    sample counts, 95 % confidence intervals of p50 and p99 (order
//!    statistics, as in Lancet), and remora/raw ratios.
//! 2. **READ and WRITE throughput.** `--depth` requests in flight, pipelined
//!    with [`MemNodeClient::send_read`]/[`MemNodeClient::wait_read`] (and the
//!    write pair) over `--conns` connections, one client thread each; the
//!    baseline streams the same requests over as many raw connections with the
//!    same depth. The measured time is split into `--slices` windows per side,
//!    alternating sides. One reply in `--verify-every` is checked; after the
//!    WRITE phase the whole region is read back and checked against the newly
//!    written pattern, on both sides.
//!
//! 3. **Connection setup** with and without the cluster-key proof
//!    (`connect`), `--connects` times each.
//!
//! A wrong byte anywhere ends the run with an error instead of numbers.
//! Latency is measured closed-loop on purpose: with one request outstanding
//! it *is* the round-trip time the goal compares against.
//!
//! **Placement.** On a two-CPU machine a loopback round trip costs ~4 µs when
//! the woken server runs on the client's CPU and ~15 µs when it is woken on
//! the other one, and the scheduler decides differently for a thread of this
//! process and for a child process: unpinned, the remora/raw ratio swings
//! from 0.4× to 4× between runs. By default (`--pin split`) every client
//! thread runs on one CPU and every server thread (memory node and baseline)
//! on another, so both sides pay the same cross-CPU wake-up, as a remote
//! server would (`pin`). `--memnode in-process` and `--raw-server child`
//! move either server across the process boundary to measure what that
//! boundary alone costs.

mod connect;
pub mod lanes;
mod pattern;
pub(crate) mod pin;
mod raw;
pub(crate) mod stats;
mod tls;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use remora_cluster::{ClusterConfig, LocalCluster};
use remora_proto::rpc::Ticket;
use remora_proto::{ByteSize, Cap, ComputeSession, MemNodeClient, MemTransport, RegionGrant, parse_duration};
use serde_json::{Value, json};

use self::pattern::{Image, Offsets};
use self::raw::{RawChild, RawClient, RawServer};
use self::stats::{Latency, Tally};

/// READ p50 goal: at most this many times the raw TCP round trip of the same size.
const GOAL_P50_RATIO: f64 = 1.3;

/// Flags of `remora bench net`.
#[derive(Debug, Clone, clap::Args)]
pub struct NetArgs {
    /// Read sizes of the latency phase, comma-separated (e.g. 4KiB,16KiB,64KiB).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,16KiB,64KiB")]
    pub sizes: Vec<ByteSize>,
    /// Latency samples kept per size and side (remora and raw TCP each).
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub samples: u64,
    /// Warm-up round trips per size and side before samples are kept.
    #[arg(long, default_value_t = 2_000)]
    pub warmup: u64,
    /// The two sides alternate in blocks of this many latency samples.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    pub block: u64,
    /// Requests in flight in the throughput phases (spread over `--conns`).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub depth: u32,
    /// Connections (each with its own client thread) of the throughput phases.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub conns: u32,
    /// Request size of the throughput phases.
    #[arg(long, default_value = "64KiB")]
    pub tput_size: ByteSize,
    /// Measured time per side in each throughput phase (READ, then WRITE).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Windows per side of a throughput phase; the sides alternate window by window.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub slices: u32,
    /// Throughput phases check one reply in this many (latency replies are all checked).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub verify_every: u64,
    /// Size of the region read and written (the working set of both sides).
    #[arg(long, default_value = "64MiB")]
    pub region_size: ByteSize,
    /// Where the memory node runs: a child process of a local cluster (the
    /// real deployment shape), or a thread of this process (to compare with
    /// an in-process baseline without a process boundary).
    #[arg(long, value_enum, default_value_t = Placement::Child)]
    pub memnode: Placement,
    /// Where the raw TCP baseline server runs: a thread of this process, or a
    /// child process (to see what the process boundary alone costs).
    #[arg(long, value_enum, default_value_t = Placement::InProcess)]
    pub raw_server: Placement,
    /// CPU pinning: `split` puts every client thread on one CPU and every
    /// server thread (memory node and raw baseline alike) on another, so each
    /// round trip wakes a thread on the other CPU, as with a remote server;
    /// `same` puts everything on one CPU; `none` leaves placement to the
    /// scheduler (which then treats the two servers differently).
    #[arg(long, value_enum, default_value_t = PinMode::Split)]
    pub pin: PinMode,
    /// Skip the throughput phases.
    #[arg(long)]
    pub no_throughput: bool,
    /// Also measure the data path over TLS (`--tls data`) against plain TCP: READ
    /// latency at every size and READ throughput, in the same run (the cluster then
    /// runs with `--tls control` and makes its own certificates).
    #[arg(long)]
    pub tls: bool,
    /// Connections to make with and without the cluster key, to time the key
    /// proof's cost at setup (0 skips it).
    #[arg(long, default_value_t = 400)]
    pub connects: u64,
    /// Also write all results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Internal: serve the raw baseline until stdin closes (see `--raw-server child`).
    #[arg(long, hide = true)]
    pub serve_raw: bool,
}

/// How the benchmark's threads are placed on CPUs; see `--pin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PinMode {
    /// Clients on one CPU, servers on another.
    Split,
    /// Everything on one CPU.
    Same,
    /// No pinning.
    None,
}

/// Where a server of the benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Placement {
    /// A separate process on the same machine.
    Child,
    /// A thread of the benchmark process.
    InProcess,
}

impl Placement {
    fn name(self) -> &'static str {
        match self {
            Self::Child => "child process",
            Self::InProcess => "thread in the bench process",
        }
    }
}

/// Runs the benchmark; see the module docs.
pub fn run(args: &NetArgs) -> anyhow::Result<()> {
    check_args(args)?;
    let region = args.region_size.0;
    if args.serve_raw {
        return raw::serve_until_stdin_closes(Image::new(to_usize(region)?, 1).bytes().to_vec());
    }
    let started = Instant::now();
    let machine_cpus = thread::available_parallelism().map_or(0, |n| n.get());
    let binary = std::env::current_exe().context("locating the remora binary")?;

    progress(format_args!(
        "starting a local cluster: manager + 1 memory node ({})",
        args.memnode.name()
    ));
    let mut cfg = ClusterConfig::new(&binary);
    cfg.memnodes = usize::from(args.memnode == Placement::Child);
    cfg.region_size = region;
    cfg.capacity = region.saturating_mul(4);
    cfg.log_level = "warn".into();
    // A busy two-core machine must not make the manager expire this compute node.
    cfg.heartbeat_timeout = Duration::from_secs(5);
    if args.tls {
        cfg.tls = remora_proto::TlsMode::Control;
    }
    let capacity = cfg.capacity;
    let cluster = LocalCluster::start(cfg).context("starting the local cluster")?;
    let in_process = match args.memnode {
        Placement::Child => None,
        Placement::InProcess => Some(
            remora_memnode::MemNode::start(remora_memnode::Config {
                manager: cluster.manager_addr().to_string(),
                listen: "127.0.0.1:0".into(),
                advertise: None,
                capacity,
                region_size: region,
                admin_key: None,
                manager_patience: Duration::from_secs(10),
                cluster_key: Some(cluster.cluster_key()),
                tls: cluster.tls().cloned(),
            })
            .context("starting an in-process memory node")?,
        ),
    };
    let (session, grant) = one_region(&cluster, "bench-net")?;
    if grant.size < region {
        bail!("granted region of {} bytes, wanted {region}", grant.size);
    }
    let cpus = choose_cpus(args.pin)?;
    if let Some((_, server_cpu)) = cpus {
        let pinned = match args.memnode {
            Placement::Child => {
                let pid = cluster
                    .memnodes()
                    .first()
                    .map(|m| m.pid)
                    .ok_or_else(|| anyhow!("no memory node"))?;
                pin::pin_threads(&pid.to_string(), server_cpu, |_| true)
            }
            // Its accept thread names itself once running; give it a moment.
            Placement::InProcess => {
                let mut tries = 0;
                loop {
                    let n = pin::pin_threads("self", server_cpu, |n| n == "memnode-accept");
                    if !matches!(n, Ok(0)) || tries == 100 {
                        break n;
                    }
                    tries += 1;
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
        .context("pinning the memory node")?;
        if pinned == 0 {
            bail!("found no memory-node thread to pin");
        }
    }
    let connect = || -> anyhow::Result<Remora> {
        Ok(Remora {
            client: MemNodeClient::connect(&grant.addr, cluster.conn_options())
                .with_context(|| format!("connecting to the memory node at {}", grant.addr))?,
            cap: grant.cap,
        })
    };

    progress(format_args!(
        "writing a {} pattern into the region and checking it",
        args.region_size
    ));
    let image = Image::new(to_usize(region)?, 1);
    let mut rem = vec![connect()?];
    fill_and_check(&mut rem[0], &image)?;
    let server = match args.raw_server {
        Placement::InProcess => {
            let cpu = cpus.map(|(_, s)| s);
            Baseline::Thread(RawServer::start(image.bytes().to_vec(), cpu).context("starting the raw TCP baseline")?)
        }
        Placement::Child => Baseline::Process(RawChild::spawn(&binary, region)?),
    };
    if let Some((client_cpu, server_cpu)) = cpus {
        if let Baseline::Process(c) = &server {
            pin::pin_threads(&c.pid().to_string(), server_cpu, |_| true).context("pinning the raw baseline server")?;
        }
        // Client threads started from here on (throughput phase) inherit this.
        pin::pin_current(client_cpu).context("pinning the client thread")?;
    }
    let mut raw = vec![RawClient::connect(server.addr())?];
    let mut verified = Checked { replies: 0 };

    let latency = latency_phase(args, &mut raw[0], &mut rem[0], REMORA_VS_RAW, &image, &mut verified)?;
    let mut tls_rem = Vec::new();
    let mut tls_report = None;
    if args.tls {
        progress(format_args!("TLS: the same READs over TLS against plain TCP"));
        tls_rem.push(tls::connect(&cluster, &grant)?);
        let latency = latency_phase(
            args,
            &mut rem[0],
            &mut tls_rem[0],
            tls::PLAIN_VS_TLS,
            &image,
            &mut verified,
        )?;
        tls_report = Some(tls::TlsReport { latency, tput: None });
    }

    let mut tput = Vec::new();
    if !args.no_throughput {
        for _ in 1..args.conns {
            rem.push(connect()?);
            raw.push(RawClient::connect(server.addr())?);
        }
        let tp = TputParams::new(args)?;
        tput.push(throughput_phase(
            &tp,
            Op::Read,
            &mut raw,
            &mut rem,
            REMORA_VS_RAW,
            &image,
            &image,
            &mut verified,
        )?);
        if let Some(t) = &mut tls_report {
            for _ in 1..args.conns {
                tls_rem.push(tls::connect(&cluster, &grant)?);
            }
            t.tput = Some(throughput_phase(
                &tp,
                Op::Read,
                &mut rem,
                &mut tls_rem,
                tls::PLAIN_VS_TLS,
                &image,
                &image,
                &mut verified,
            )?);
        }
        let image2 = Image::new(to_usize(region)?, 2);
        tput.push(throughput_phase(
            &tp,
            Op::Write,
            &mut raw,
            &mut rem,
            REMORA_VS_RAW,
            &image,
            &image2,
            &mut verified,
        )?);
    }
    let connect_cost = if args.connects > 0 {
        progress(format_args!(
            "timing {} connection setups with and without the cluster key",
            args.connects
        ));
        Some(connect::measure(args.connects)?)
    } else {
        None
    };
    let elapsed = started.elapsed();
    drop((raw, rem, tls_rem, server, session, in_process, cluster));

    let report = Report {
        args,
        cpus,
        machine_cpus,
        grant_addr: &grant.addr,
        latency: &latency,
        tput: &tput,
        verified: verified.replies,
        elapsed,
    };
    report.print();
    if let Some(t) = &tls_report {
        t.print();
    }
    if let Some(c) = &connect_cost {
        c.print();
    }
    if let Some(path) = &args.json {
        let mut v = report.to_json();
        if let (Some(c), Value::Object(m)) = (&connect_cost, &mut v) {
            m.insert("connect".into(), c.to_json());
        }
        if let (Some(t), Value::Object(m)) = (&tls_report, &mut v) {
            m.insert("tls".into(), t.to_json());
        }
        let text = serde_json::to_string_pretty(&v)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        progress(format_args!("results written to {}", path.display()));
    }
    Ok(())
}

/// (client CPU, server CPU) for `mode`, or `None` if nothing is pinned.
fn choose_cpus(mode: PinMode) -> anyhow::Result<Option<(usize, usize)>> {
    if mode == PinMode::None {
        return Ok(None);
    }
    let cpus = pin::allowed_cpus().context("reading this process's CPU affinity")?;
    match (mode, cpus.as_slice()) {
        (PinMode::Split, [c, s, ..]) => Ok(Some((*c, *s))),
        (PinMode::Same, [c, ..]) => Ok(Some((*c, *c))),
        (PinMode::Split, _) => bail!("--pin split needs two CPUs, this process may use {cpus:?}"),
        _ => bail!("no CPU to pin to"),
    }
}

/// The raw TCP baseline server, wherever it runs.
enum Baseline {
    Thread(RawServer),
    Process(RawChild),
}

impl Baseline {
    fn addr(&self) -> std::net::SocketAddr {
        match self {
            Self::Thread(s) => s.addr(),
            Self::Process(c) => c.addr(),
        }
    }
}

fn check_args(args: &NetArgs) -> anyhow::Result<()> {
    let region = args.region_size.0;
    if region == 0 {
        bail!("--region-size must be positive");
    }
    if args.sizes.is_empty() {
        bail!("--sizes needs at least one size");
    }
    let mut sizes = args.sizes.clone();
    if !args.no_throughput {
        sizes.push(args.tput_size);
    }
    for s in sizes {
        if s.0 == 0 || s.0 > region || s.0 > u64::from(u32::MAX) {
            bail!(
                "request size {s} must be positive and fit the {} region (and 4 GiB)",
                args.region_size
            );
        }
    }
    if !args.no_throughput {
        if args.conns > args.depth {
            bail!(
                "--conns {} exceeds --depth {}: every connection needs a request in flight",
                args.conns,
                args.depth
            );
        }
        if region / args.tput_size.0 < u64::from(args.conns) {
            bail!(
                "the region holds fewer {} blocks than there are connections",
                args.tput_size
            );
        }
        if args.duration.is_zero() {
            bail!("--duration must be positive");
        }
    }
    Ok(())
}

/// Registers as compute node `name` and takes one region; the session
/// must outlive the region's use.
fn one_region(cluster: &LocalCluster, name: &str) -> anyhow::Result<(ComputeSession, RegionGrant)> {
    let session = ComputeSession::open(cluster.manager_addr(), name, cluster.conn_options())
        .context("registering with the manager")?;
    let grant = session
        .alloc(1, false, &[])?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("the manager granted no region"))?;
    Ok((session, grant))
}

fn to_usize(n: u64) -> anyhow::Result<usize> {
    usize::try_from(n).map_err(|_| anyhow!("{n} does not fit this machine's address space"))
}

fn progress(msg: std::fmt::Arguments<'_>) {
    eprintln!("[bench net] {msg}");
}

/// One side of a comparison: a client that can pipeline reads and writes.
trait Endpoint: Send {
    /// Names the outstanding request.
    type Ticket: Send;
    /// Starts a read of `len` bytes at `offset`.
    fn send_read(&mut self, offset: u64, len: usize) -> anyhow::Result<Self::Ticket>;
    /// Finishes a read into `buf`.
    fn wait_read(&mut self, t: Self::Ticket, buf: &mut [u8]) -> anyhow::Result<()>;
    /// Starts a write of `data` at `offset`.
    fn send_write(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<Self::Ticket>;
    /// Finishes a write.
    fn wait_write(&mut self, t: Self::Ticket) -> anyhow::Result<()>;
    /// One blocking read.
    fn read(&mut self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()>;
}

/// remora's data path: a memory-node connection and the region's capability.
struct Remora {
    client: MemNodeClient,
    cap: Cap,
}

impl Endpoint for Remora {
    type Ticket = Ticket;

    fn send_read(&mut self, offset: u64, len: usize) -> anyhow::Result<Ticket> {
        Ok(self.client.send_read(self.cap, offset, len)?)
    }

    fn wait_read(&mut self, t: Ticket, buf: &mut [u8]) -> anyhow::Result<()> {
        Ok(self.client.wait_read(t, buf)?)
    }

    fn send_write(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<Ticket> {
        Ok(self.client.send_write(self.cap, offset, data)?)
    }

    fn wait_write(&mut self, t: Ticket) -> anyhow::Result<()> {
        Ok(self.client.wait_write(t)?)
    }

    fn read(&mut self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        Ok(self.client.read(self.cap, offset, buf)?)
    }
}

impl Endpoint for RawClient {
    type Ticket = ();

    fn send_read(&mut self, offset: u64, len: usize) -> anyhow::Result<()> {
        RawClient::send_read(self, offset, len)
    }

    fn wait_read(&mut self, (): (), buf: &mut [u8]) -> anyhow::Result<()> {
        self.recv_read(buf)
    }

    fn send_write(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        RawClient::send_write(self, offset, data)
    }

    fn wait_write(&mut self, (): ()) -> anyhow::Result<()> {
        self.recv_ack()
    }

    fn read(&mut self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        RawClient::send_read(self, offset, buf.len())?;
        self.recv_read(buf)
    }
}

/// Which side of a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Raw,
    Remora,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Raw => "raw TCP",
            Self::Remora => "remora",
        }
    }

    /// The two sides, the raw one first when `raw_first`.
    fn order(raw_first: bool) -> [Side; 2] {
        if raw_first {
            [Self::Raw, Self::Remora]
        } else {
            [Self::Remora, Self::Raw]
        }
    }
}

/// What the two sides of a comparison are called in progress lines and errors.
#[derive(Debug, Clone, Copy)]
struct Names {
    /// The baseline.
    base: &'static str,
    /// What is measured against it.
    subject: &'static str,
}

/// remora against raw TCP.
const REMORA_VS_RAW: Names = Names {
    base: "raw TCP",
    subject: "remora",
};

/// Count of replies checked against the pattern.
struct Checked {
    replies: u64,
}

/// Writes the whole image into the region through remora, then reads it back.
fn fill_and_check(rem: &mut Remora, image: &Image) -> anyhow::Result<()> {
    const CHUNK: usize = 1 << 20;
    let bytes = image.bytes();
    for (i, c) in bytes.chunks(CHUNK).enumerate() {
        rem.client
            .write(rem.cap, (i * CHUNK) as u64, c)
            .context("filling the region")?;
    }
    let mut buf = vec![0u8; CHUNK];
    for (i, c) in bytes.chunks(CHUNK).enumerate() {
        let b = &mut buf[..c.len()];
        rem.read((i * CHUNK) as u64, b).context("reading the region back")?;
        image.check("remora fill read-back", (i * CHUNK) as u64, b)?;
    }
    Ok(())
}

/// The latency results of one size.
struct LatencyRow {
    size: ByteSize,
    raw: Latency,
    remora: Latency,
}

impl LatencyRow {
    fn ratio(&self, q: f64) -> f64 {
        self.remora.at(q) as f64 / self.raw.at(q).max(1) as f64
    }
}

fn latency_phase<B: Endpoint>(
    args: &NetArgs,
    raw: &mut B,
    rem: &mut Remora,
    names: Names,
    image: &Image,
    verified: &mut Checked,
) -> anyhow::Result<Vec<LatencyRow>> {
    let region = args.region_size.0;
    let mut rows = Vec::new();
    // Per size: a read buffer and one offset sequence per side, identical for both.
    let mut state = Vec::new();
    for (i, &size) in args.sizes.iter().enumerate() {
        rows.push(LatencyRow {
            size,
            raw: Latency::new()?,
            remora: Latency::new()?,
        });
        let seed = 0x5eed_0000 + i as u64;
        state.push((
            vec![0u8; to_usize(size.0)?],
            Offsets::new(seed, region, size.0),
            Offsets::new(seed, region, size.0),
        ));
    }
    progress(format_args!(
        "latency: warming up ({} round trips per size and side)",
        args.warmup
    ));
    for (buf, raw_offs, rem_offs) in &mut state {
        sample_block(raw, names.base, raw_offs, buf, args.warmup, image, None)?;
        sample_block(rem, names.subject, rem_offs, buf, args.warmup, image, None)?;
        verified.replies += 2 * args.warmup;
    }
    let rounds = args.samples.div_ceil(args.block);
    progress(format_args!(
        "latency: {} samples per size and side in {rounds} interleaved blocks of up to {}",
        args.samples, args.block
    ));
    let mut next_report = 1;
    for r in 0..rounds {
        let n = args.block.min(args.samples - r * args.block);
        for (i, (row, (buf, raw_offs, rem_offs))) in rows.iter_mut().zip(&mut state).enumerate() {
            for side in Side::order((r + i as u64) % 2 == 0) {
                match side {
                    Side::Raw => sample_block(raw, names.base, raw_offs, buf, n, image, Some(&mut row.raw))?,
                    Side::Remora => sample_block(rem, names.subject, rem_offs, buf, n, image, Some(&mut row.remora))?,
                }
            }
            verified.replies += 2 * n;
        }
        if (r + 1) * 10 >= next_report * rounds {
            let p50: Vec<String> = rows
                .iter()
                .map(|row| format!("{} {:.2}×", row.size, row.ratio(0.5)))
                .collect();
            progress(format_args!(
                "latency: {}% done; p50 {}/{} so far: {}",
                next_report * 10,
                names.subject,
                names.base,
                p50.join(", ")
            ));
            while next_report * rounds <= (r + 1) * 10 {
                next_report += 1;
            }
        }
    }
    Ok(rows)
}

/// `n` timed round trips; each reply is checked after the clock stops.
fn sample_block<E: Endpoint>(
    e: &mut E,
    side: &str,
    offs: &mut Offsets,
    buf: &mut [u8],
    n: u64,
    image: &Image,
    mut hist: Option<&mut Latency>,
) -> anyhow::Result<()> {
    for _ in 0..n {
        let off = offs.next_offset();
        let t0 = Instant::now();
        e.read(off, buf)?;
        let dt = t0.elapsed();
        if let Some(h) = hist.as_deref_mut() {
            h.record(dt);
        }
        image.check(side, off, buf)?;
    }
    Ok(())
}

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Self::Read => "READ",
            Self::Write => "WRITE",
        }
    }
}

/// The part of the region one connection's requests cycle through: blocks
/// `first`, `first + step`, ... in order, wrapping around.
#[derive(Debug, Clone, Copy)]
struct Stripe {
    first: u64,
    step: u64,
    len: u64,
    size: u64,
    sent: u64,
}

impl Stripe {
    fn all(slots: u64, conns: u64, size: u64) -> Vec<Stripe> {
        (0..conns)
            .map(|first| Stripe {
                first,
                step: conns,
                len: (slots - first).div_ceil(conns),
                size,
                sent: 0,
            })
            .collect()
    }

    fn next_offset(&mut self) -> u64 {
        let k = self.sent % self.len;
        self.sent += 1;
        (self.first + k * self.step) * self.size
    }

    /// True once the stripe's `i`-th block has been the target of a request.
    fn touched(&self, i: u64) -> bool {
        self.sent > i
    }
}

/// Parameters shared by the throughput phases.
struct TputParams {
    size: usize,
    depth: u32,
    conns: u32,
    slices: u32,
    slice: Duration,
    warmup: Duration,
    verify_every: u64,
    slots: u64,
}

impl TputParams {
    fn new(args: &NetArgs) -> anyhow::Result<Self> {
        Ok(Self {
            size: to_usize(args.tput_size.0)?,
            depth: args.depth,
            conns: args.conns,
            slices: args.slices,
            slice: args.duration / args.slices,
            warmup: (args.duration / 10).clamp(Duration::from_millis(50), Duration::from_millis(300)),
            verify_every: args.verify_every,
            slots: args.region_size.0 / args.tput_size.0,
        })
    }

    /// Requests in flight on connection `j`.
    fn depth_of(&self, j: usize) -> usize {
        let (d, c) = (self.depth as usize, self.conns as usize);
        d / c + usize::from(j < d % c)
    }
}

/// The results of one throughput phase.
struct TputRow {
    op: Op,
    raw: Tally,
    remora: Tally,
    /// Each window pair's ratio (subject ÷ base), in the order they ran.
    windows: Vec<f64>,
}

impl TputRow {
    /// The whole phase's ratio: all bytes over all time, per side.
    fn ratio(&self) -> f64 {
        self.remora.gbps() / self.raw.gbps().max(1e-12)
    }

    /// The median of the window pairs' ratios (the whole ratio without
    /// windows): a window the machine disturbs moves it little.
    fn median_ratio(&self) -> f64 {
        stats::median(&self.windows).unwrap_or_else(|| self.ratio())
    }

    /// The smallest and largest window pair ratio.
    fn window_range(&self) -> (f64, f64) {
        stats::range(&self.windows).unwrap_or((self.ratio(), self.ratio()))
    }
}

/// Runs one throughput phase on both sides. Reads are checked against
/// `old`; writes store `new`, and afterwards each side's region is read
/// back and checked against `new` where it was written and `old` elsewhere.
#[allow(clippy::too_many_arguments)]
fn throughput_phase<B: Endpoint>(
    tp: &TputParams,
    op: Op,
    raw: &mut [B],
    rem: &mut [Remora],
    names: Names,
    old: &Image,
    new: &Image,
    verified: &mut Checked,
) -> anyhow::Result<TputRow> {
    let conns = u64::from(tp.conns);
    let mut raw_stripes = Stripe::all(tp.slots, conns, tp.size as u64);
    let mut rem_stripes = raw_stripes.clone();
    let src = if op == Op::Read { old } else { new };
    progress(format_args!(
        "throughput {}: warming up {:.1?} per side, then {} windows of {:.1?} per side",
        op.name(),
        tp.warmup,
        tp.slices,
        tp.slice
    ));
    let mut row = TputRow {
        op,
        raw: Tally::default(),
        remora: Tally::default(),
        windows: Vec::new(),
    };
    for (s, dur) in std::iter::once((None, tp.warmup)).chain((0..tp.slices).map(|s| (Some(s), tp.slice))) {
        let mut pair = [0.0f64; 2];
        for side in Side::order(s.unwrap_or(0) % 2 == 0) {
            let (t, checked) = match side {
                Side::Raw => run_side(tp, op, raw, &mut raw_stripes, dur, src)?,
                Side::Remora => run_side(tp, op, rem, &mut rem_stripes, dur, src)?,
            };
            verified.replies += checked;
            if s.is_some() {
                match side {
                    Side::Raw => {
                        pair[0] = t.gbps();
                        row.raw.add(t);
                    }
                    Side::Remora => {
                        pair[1] = t.gbps();
                        row.remora.add(t);
                    }
                }
            }
        }
        if s.is_some() && pair[0] > 0.0 {
            row.windows.push(pair[1] / pair[0]);
        }
    }
    progress(format_args!(
        "throughput {}: {} {:.2} GB/s, {} {:.2} GB/s",
        op.name(),
        names.subject,
        row.remora.gbps(),
        names.base,
        row.raw.gbps()
    ));
    if op == Op::Write {
        progress(format_args!(
            "throughput WRITE: reading both regions back to check what was written"
        ));
        verified.replies += read_back(tp, names.base, &mut raw[0], &raw_stripes, old, new)?;
        verified.replies += read_back(tp, names.subject, &mut rem[0], &rem_stripes, old, new)?;
    }
    Ok(row)
}

/// One window of one side: a pipeline per connection, each on its own thread.
/// Returns the tally and how many replies were checked.
fn run_side<E: Endpoint>(
    tp: &TputParams,
    op: Op,
    ends: &mut [E],
    stripes: &mut [Stripe],
    dur: Duration,
    src: &Image,
) -> anyhow::Result<(Tally, u64)> {
    thread::scope(|s| {
        let handles: Vec<_> = ends
            .iter_mut()
            .zip(stripes.iter_mut())
            .enumerate()
            .map(|(j, (e, st))| {
                let depth = tp.depth_of(j);
                thread::Builder::new()
                    .name(format!("bench-conn{j}"))
                    .spawn_scoped(s, move || pipeline(e, op, tp, depth, st, dur, src))
            })
            .collect::<Result<_, _>>()?;
        let mut total = Tally::default();
        let mut checked = 0;
        for h in handles {
            let (t, c) = h.join().map_err(|_| anyhow!("a benchmark thread panicked"))??;
            total.ops += t.ops;
            total.bytes += t.bytes;
            total.time = total.time.max(t.time);
            checked += c;
        }
        Ok((total, checked))
    })
}

/// Keeps `depth` requests in flight on one connection for `dur`. Only
/// replies that arrive before the window closes count; the rest are drained.
fn pipeline<E: Endpoint>(
    e: &mut E,
    op: Op,
    tp: &TputParams,
    depth: usize,
    stripe: &mut Stripe,
    dur: Duration,
    src: &Image,
) -> anyhow::Result<(Tally, u64)> {
    let size = tp.size;
    let mut buf = vec![0u8; size];
    let send = |e: &mut E, stripe: &mut Stripe| -> anyhow::Result<(E::Ticket, u64)> {
        let off = stripe.next_offset();
        let t = match op {
            Op::Read => e.send_read(off, size)?,
            Op::Write => e.send_write(off, src.at(off, size))?,
        };
        Ok((t, off))
    };
    let mut queue = VecDeque::with_capacity(depth);
    let start = Instant::now();
    let end = start + dur;
    for _ in 0..depth {
        queue.push_back(send(e, stripe)?);
    }
    let mut ops = 0u64;
    let mut checked = 0u64;
    let time = loop {
        let Some((t, off)) = queue.pop_front() else {
            bail!("pipeline emptied");
        };
        match op {
            Op::Read => {
                e.wait_read(t, &mut buf)?;
                if ops % tp.verify_every == 0 {
                    src.check("throughput read", off, &buf)?;
                    checked += 1;
                }
            }
            Op::Write => e.wait_write(t)?,
        }
        ops += 1;
        let now = Instant::now();
        if now >= end {
            break now - start;
        }
        queue.push_back(send(e, stripe)?);
    };
    for (t, _) in queue {
        match op {
            Op::Read => e.wait_read(t, &mut buf)?,
            Op::Write => e.wait_write(t)?,
        }
    }
    Ok((
        Tally {
            ops,
            bytes: ops * size as u64,
            time,
        },
        checked,
    ))
}

/// Reads every block of the throughput working set back and checks it
/// against `new` where a write was sent, `old` elsewhere.
fn read_back<E: Endpoint>(
    tp: &TputParams,
    side: &str,
    e: &mut E,
    stripes: &[Stripe],
    old: &Image,
    new: &Image,
) -> anyhow::Result<u64> {
    let conns = u64::from(tp.conns);
    let mut buf = vec![0u8; tp.size];
    for slot in 0..tp.slots {
        let written = stripes[(slot % conns) as usize].touched(slot / conns);
        let off = slot * tp.size as u64;
        e.read(off, &mut buf)?;
        let want = if written { new } else { old };
        want.check(&format!("{side} read-back after writes"), off, &buf)?;
    }
    Ok(tp.slots)
}

/// Everything the run produced, for printing and JSON.
struct Report<'a> {
    args: &'a NetArgs,
    cpus: Option<(usize, usize)>,
    machine_cpus: usize,
    grant_addr: &'a str,
    latency: &'a [LatencyRow],
    tput: &'a [TputRow],
    verified: u64,
    elapsed: Duration,
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

impl Report<'_> {
    fn print(&self) {
        let a = self.args;
        let cpus = self.machine_cpus;
        println!();
        println!(
            "remora bench net — 1 memory node at {} (loopback, {}), {cpus} CPUs",
            self.grant_addr,
            a.memnode.name()
        );
        println!(
            "region {}, every reply checked against a known pattern ({} checked); total run {:.1} s",
            a.region_size,
            self.verified,
            self.elapsed.as_secs_f64()
        );
        println!("{}", self.pinning());
        println!();
        println!(
            "READ latency, one request outstanding: {} samples per size and side, after {} warm-up, \
             sides alternating in blocks of {}",
            a.samples, a.warmup, a.block
        );
        println!(
            "raw TCP = blocking ping-pong to a server ({}), 32 B request, reply of the size",
            a.raw_server.name()
        );
        println!("µs; [95 % CI]");
        println!(
            "{:<7} {:<8} {:>8} {:>20} {:>20} {:>8} {:>8} {:>8}   goal: p50 ≤ {GOAL_P50_RATIO:.2}× raw",
            "size", "side", "samples", "p50", "p99", "p999", "p50 ×", "p99 ×"
        );
        for r in self.latency {
            for (side, h) in [(Side::Raw, &r.raw), (Side::Remora, &r.remora)] {
                let (l50, h50) = h.ci95(0.5);
                let (l99, h99) = h.ci95(0.99);
                let p50 = format!("{} [{}–{}]", us(h.at(0.5)), us(l50), us(h50));
                let p99 = format!("{} [{}–{}]", us(h.at(0.99)), us(l99), us(h99));
                let size = if side == Side::Raw {
                    r.size.to_string()
                } else {
                    String::new()
                };
                let tail = if side == Side::Remora {
                    let ratio = r.ratio(0.5);
                    format!(
                        "{:>8} {:>8}   {}",
                        format!("{ratio:.2}×"),
                        format!("{:.2}×", r.ratio(0.99)),
                        if ratio <= GOAL_P50_RATIO { "met" } else { "MISSED" }
                    )
                } else {
                    String::new()
                };
                println!(
                    "{size:<7} {:<8} {:>8} {p50:>20} {p99:>20} {:>8} {tail}",
                    side.name(),
                    h.samples(),
                    us(h.at(0.999))
                );
            }
        }
        if !self.tput.is_empty() {
            println!();
            println!(
                "throughput: {} requests, {} in flight over {} connection(s) (one client thread each), \
                 {:.1} s per side in {} alternating windows; 1 in {} read replies checked, written data read back",
                a.tput_size,
                a.depth,
                a.conns,
                a.duration.as_secs_f64(),
                a.slices,
                a.verify_every
            );
            println!(
                "{:<6} {:<8} {:>10} {:>10} {:>12} {:>12}",
                "op", "side", "ops", "GB/s", "ops/s", "remora/raw"
            );
            for r in self.tput {
                for (side, t) in [(Side::Raw, &r.raw), (Side::Remora, &r.remora)] {
                    let op = if side == Side::Raw { r.op.name() } else { "" };
                    let ratio = if side == Side::Remora {
                        format!("{:.2}×", r.ratio())
                    } else {
                        String::new()
                    };
                    println!(
                        "{op:<6} {:<8} {:>10} {:>10.2} {:>12.0} {ratio:>12}",
                        side.name(),
                        t.ops,
                        t.gbps(),
                        t.ops_per_sec()
                    );
                }
            }
        }
    }

    fn pinning(&self) -> String {
        match self.cpus {
            None => "CPU pinning: none (--pin none): placement left to the scheduler".into(),
            Some((c, s)) => format!(
                "CPU pinning (--pin {}): client threads on CPU {c}, server threads (memory node, raw baseline) on CPU {s}",
                if c == s { "same" } else { "split" }
            ),
        }
    }

    fn to_json(&self) -> Value {
        let a = self.args;
        let latency: Vec<Value> = self
            .latency
            .iter()
            .map(|r| {
                json!({
                    "size_bytes": r.size.0,
                    "size": r.size.to_string(),
                    "raw_tcp": r.raw.to_json(),
                    "remora": r.remora.to_json(),
                    "p50_ratio": r.ratio(0.5),
                    "p99_ratio": r.ratio(0.99),
                    "p999_ratio": r.ratio(0.999),
                    "goal_p50_ratio": GOAL_P50_RATIO,
                    "goal_met": r.ratio(0.5) <= GOAL_P50_RATIO,
                })
            })
            .collect();
        let tput: Vec<Value> = self
            .tput
            .iter()
            .map(|r| {
                json!({
                    "op": r.op.name(),
                    "size_bytes": a.tput_size.0,
                    "depth": a.depth,
                    "conns": a.conns,
                    "raw_tcp": r.raw.to_json(),
                    "remora": r.remora.to_json(),
                    "gbps_ratio": r.ratio(),
                })
            })
            .collect();
        json!({
            "benchmark": "remora bench net",
            "params": {
                "sizes_bytes": a.sizes.iter().map(|s| s.0).collect::<Vec<_>>(),
                "samples": a.samples,
                "warmup": a.warmup,
                "block": a.block,
                "depth": a.depth,
                "conns": a.conns,
                "tput_size_bytes": a.tput_size.0,
                "duration_s": a.duration.as_secs_f64(),
                "slices": a.slices,
                "verify_every": a.verify_every,
                "region_size_bytes": a.region_size.0,
                "memory_nodes": 1,
                "memnode_placement": format!("{:?}", a.memnode),
                "pin": format!("{:?}", a.pin),
                "client_cpu": self.cpus.map(|c| c.0),
                "server_cpu": self.cpus.map(|c| c.1),
                "raw_server_placement": format!("{:?}", a.raw_server),
                "cpus": self.machine_cpus,
            },
            "memnode_addr": self.grant_addr,
            "latency": latency,
            "throughput": tput,
            "replies_checked": self.verified,
            "elapsed_s": self.elapsed.as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tput_tests {
    use super::*;

    #[test]
    fn median_and_range_of_window_ratios() {
        let tally = |bytes| Tally {
            ops: 1,
            bytes,
            time: Duration::from_secs(1),
        };
        let mut row = TputRow {
            op: Op::Read,
            raw: tally(4),
            remora: tally(3),
            windows: Vec::new(),
        };
        assert_eq!(row.median_ratio(), 0.75, "no windows: the whole ratio");
        row.windows = vec![0.9, 0.5, 0.7, 1.3];
        assert!((row.median_ratio() - 0.8).abs() < 1e-12);
        assert_eq!(row.window_range(), (0.5, 1.3));
    }
}
