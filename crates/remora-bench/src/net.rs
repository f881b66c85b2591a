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
mod cpu;
pub mod lanes;
mod latency;
mod pattern;
pub(crate) mod pin;
mod raw;
mod report;
pub(crate) mod stats;
mod throughput;
mod tls;

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use remora_cluster::{ClusterConfig, LocalCluster};
use remora_proto::rpc::Ticket;
use remora_proto::{ByteSize, Cap, ComputeSession, MemNodeClient, MemTransport, RegionGrant, parse_duration};
use serde_json::Value;

use self::latency::{LatencyRow, latency_phase};
use self::pattern::Image;
use self::raw::{RawChild, RawClient, RawServer};
use self::report::{Report, us};
use self::throughput::{Op, TputParams, TputRow, throughput_phase};

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
    /// Managers in the local cluster; more than one run as a Raft group (3 survive losing one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub managers: u32,
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
    /// latency at every size and READ throughput at every `--tls-tput-sizes` size,
    /// in the same run (the cluster then runs with `--tls control` and makes its
    /// own certificates).
    #[arg(long)]
    pub tls: bool,
    /// Request sizes of the TLS READ throughput comparison, comma-separated;
    /// each runs as a phase of its own.
    #[arg(long, value_delimiter = ',', default_value = "4KiB,16KiB,64KiB")]
    pub tls_tput_sizes: Vec<ByteSize>,
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
    cfg.managers = args.managers as usize;
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
                limits: Default::default(),
            })
            .context("starting an in-process memory node")?,
        ),
    };
    let (session, grant) = one_region(&cluster, "bench-net")?;
    if grant.size < region {
        bail!("granted region of {} bytes, wanted {region}", grant.size);
    }
    // Both sides of the TLS comparison talk to it: its CPU per byte tells
    // how far TLS can go while it bounds the phase.
    let memnode_pid = match args.memnode {
        Placement::Child => cluster.memnodes().first().map(|m| m.pid),
        Placement::InProcess => None,
    };
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
        let mut report = tls::TlsReport {
            latency,
            tput: Vec::new(),
            seal: None,
            open: None,
        };
        report.time_crypto(cpus)?;
        tls_report = Some(report);
    }

    let mut tput = Vec::new();
    if !args.no_throughput {
        for _ in 1..args.conns {
            rem.push(connect()?);
            raw.push(RawClient::connect(server.addr())?);
        }
        let tp = TputParams::new(args, args.tput_size)?;
        tput.push(throughput_phase(
            &tp,
            Op::Read,
            &mut raw,
            &mut rem,
            REMORA_VS_RAW,
            &image,
            &image,
            &mut verified,
            None,
        )?);
        if let Some(t) = &mut tls_report {
            for _ in 1..args.conns {
                tls_rem.push(tls::connect(&cluster, &grant)?);
            }
            for &size in &args.tls_tput_sizes {
                let row = throughput_phase(
                    &TputParams::new(args, size)?,
                    Op::Read,
                    &mut rem,
                    &mut tls_rem,
                    tls::PLAIN_VS_TLS,
                    &image,
                    &image,
                    &mut verified,
                    memnode_pid,
                )?;
                t.tput.push((size, row));
                t.time_crypto(cpus)?;
            }
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
            None,
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
    let mut tput_sizes = Vec::new();
    if !args.no_throughput {
        tput_sizes.push(args.tput_size);
        if args.tls {
            if args.tls_tput_sizes.is_empty() {
                bail!("--tls-tput-sizes needs at least one size");
            }
            tput_sizes.extend_from_slice(&args.tls_tput_sizes);
        }
    }
    sizes.extend_from_slice(&tput_sizes);
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
        if let Some(s) = tput_sizes.iter().find(|s| region / s.0 < u64::from(args.conns)) {
            bail!("the region holds fewer {s} blocks than there are connections");
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
