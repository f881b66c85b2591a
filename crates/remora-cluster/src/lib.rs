//! A local remora cluster: a manager (or a Raft group of managers) and N
//! memory nodes started as child processes of the `remora` binary on
//! loopback with ephemeral ports.
//!
//! Used by integration tests, `remora bench` and `remora demo`. A child that
//! dies is reported on [`LocalCluster::events`], never a reason to tear the
//! cluster down. Every child is killed when the cluster is dropped (also
//! during a panic), and each child also watches a lifeline pipe from this
//! process and exits when it closes, so nothing outlives a parent that was
//! killed outright or interrupted with Ctrl-C.
//!
//! Each cluster makes its own cluster key (a file in its directory, given
//! to every child): [`LocalCluster::conn_options`] carries it for clients of
//! the cluster, which no other process can join. With
//! [`ClusterConfig::tls`] it also makes its own certificates
//! (`remora certs` in its directory) and runs every child with `--tls`.
//!
//! The children are normally the `remora` binary. A program that cannot rely
//! on that binary being built (an example, say) can run the daemons itself:
//! call [`serve_if_child`] first thing in `main` and start the cluster with
//! [`ClusterConfig::this_program`].

mod child;
mod managers;
mod process;

pub use child::serve_if_child;
use process::{ChildSlot, monitor};

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use remora_memnode::daemon::ADMIN_KEY_ENV;
use remora_proto::auth::KeyFileError;
use remora_proto::msg::PeerTraffic;
use remora_proto::tls::{CertsError, TlsError, write_certs};
use remora_proto::{
    AdminKey, ClusterKey, ClusterStatus, ConnOptions, Fault, ManagerConn, MemNodeClient, NodeState, RpcError,
    TlsConfig, TlsMode, Token,
};

/// Why the cluster could not be started or changed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A child could not be spawned.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// Which child.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A child did not report readiness in time (its log is named).
    #[error("{what} did not become ready within {after:?}; see {log}")]
    NotReady {
        /// Which child.
        what: String,
        /// How long we waited.
        after: Duration,
        /// Its log file.
        log: String,
    },
    /// Talking to the manager failed.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// No such memory node index.
    #[error("no memory node #{0}")]
    NoSuchNode(usize),
    /// No such manager index (0-based; the member id is one more).
    #[error("no manager #{0}")]
    NoSuchManager(usize),
    /// A wait for a cluster condition timed out.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    /// No free loopback port could be had for a manager of a group.
    #[error("cannot pick a free port: {0}")]
    Port(std::io::Error),
    /// Filesystem trouble with the cluster's directory.
    #[error("cluster directory: {0}")]
    Dir(std::io::Error),
    /// The cluster's key could not be written.
    #[error(transparent)]
    Key(#[from] KeyFileError),
    /// The cluster's certificates could not be written.
    #[error(transparent)]
    Certs(#[from] CertsError),
    /// The cluster's certificates could not be loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Parameters of a local cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The `remora` binary to run.
    pub binary: PathBuf,
    /// Number of managers: 1 is a manager on its own; more form a Raft
    /// group (3 or 5 survive a minority's loss).
    pub managers: usize,
    /// Number of memory nodes.
    pub memnodes: usize,
    /// Capacity of each memory node.
    pub capacity: u64,
    /// Region size.
    pub region_size: u64,
    /// The manager's heartbeat timeout.
    pub heartbeat_timeout: Duration,
    /// Log level of the children (`RUST_LOG` syntax).
    pub log_level: String,
    /// How long to wait for a child to become ready.
    pub ready_timeout: Duration,
    /// Children are this program itself (see [`serve_if_child`]).
    pub self_exec: bool,
    /// TLS mode of every child and of [`LocalCluster::conn_options`]; the
    /// cluster makes its own certificates.
    pub tls: TlsMode,
    /// More flags for every memory node (e.g. its connection limits).
    pub memnode_args: Vec<String>,
}

impl ClusterConfig {
    /// Defaults: one manager, 3 memory nodes of 256 MiB with 64 MiB regions,
    /// 1 s heartbeat timeout.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            managers: 1,
            memnodes: 3,
            capacity: 256 << 20,
            region_size: 64 << 20,
            heartbeat_timeout: Duration::from_secs(1),
            log_level: "info".into(),
            ready_timeout: Duration::from_secs(30),
            self_exec: false,
            tls: TlsMode::Off,
            memnode_args: Vec::new(),
        }
    }

    /// A cluster whose daemons are this very program (which must call
    /// [`serve_if_child`] at the start of `main`).
    pub fn this_program() -> Result<Self, ClusterError> {
        let exe = std::env::current_exe().map_err(ClusterError::Dir)?;
        let mut c = Self::new(exe);
        c.self_exec = true;
        Ok(c)
    }
}

/// Something that happened to a child.
#[derive(Debug, Clone)]
pub enum ClusterEvent {
    /// A child exited. `expected` is true if the cluster itself killed it.
    Exited {
        /// "manager" (or "manager#i", i from 1, in a group) or "memnode#i".
        name: String,
        /// Its exit status.
        status: ExitStatus,
        /// Whether the cluster asked for it.
        expected: bool,
    },
}

/// A memory node of the cluster.
#[derive(Debug, Clone)]
pub struct MemNodeInfo {
    /// Its data address.
    pub addr: String,
    /// Its admin key (for fault injection).
    pub admin: AdminKey,
    /// Its process id.
    pub pid: u32,
    /// Index into the cluster's child table.
    slot: usize,
}

/// A running local cluster; see the crate docs.
pub struct LocalCluster {
    cfg: ClusterConfig,
    dir: tempfile::TempDir,
    key: ClusterKey,
    key_file: PathBuf,
    tls: Option<TlsConfig>,
    /// Every manager's address, comma-joined: what clients are given.
    manager_addr: String,
    /// Each manager's address, by index.
    manager_addrs: Vec<String>,
    /// Each manager's child slot (a restart puts it in a new one).
    manager_slots: Vec<AtomicUsize>,
    /// The manager [`LocalCluster::kill_manager`] killed last, which
    /// [`LocalCluster::start_manager_again`] brings back.
    killed_manager: AtomicUsize,
    memnodes: Vec<MemNodeInfo>,
    children: Arc<Mutex<Vec<ChildSlot>>>,
    stop: Arc<AtomicBool>,
    events: Mutex<Option<Receiver<ClusterEvent>>>,
    monitor: Option<thread::JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LocalCluster {
    /// Starts the manager (or the manager group, and waits for its leader),
    /// then the memory nodes, and waits until all are registered.
    pub fn start(cfg: ClusterConfig) -> Result<Self, ClusterError> {
        let dir = tempfile::Builder::new()
            .prefix("remora-cluster-")
            .tempdir()
            .map_err(ClusterError::Dir)?;
        let key = ClusterKey::generate();
        let key_file = dir.path().join("cluster.key");
        key.write_new(&key_file)?;
        let tls = match cfg.tls {
            TlsMode::Off => None,
            mode => {
                let tls_dir = dir.path().join("tls");
                write_certs(&tls_dir, &[], false)?;
                Some(TlsConfig::load(mode, &tls_dir)?)
            }
        };
        let children = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let monitor = {
            let (c, s) = (Arc::clone(&children), Arc::clone(&stop));
            thread::Builder::new()
                .name("cluster-monitor".into())
                .spawn(move || monitor(&c, &s, &tx))
                .map_err(|source| ClusterError::Spawn {
                    what: "monitor thread".into(),
                    source,
                })?
        };
        let mut me = Self {
            cfg,
            dir,
            key,
            key_file,
            tls,
            manager_addr: String::new(),
            manager_addrs: Vec::new(),
            manager_slots: Vec::new(),
            killed_manager: AtomicUsize::new(0),
            memnodes: Vec::new(),
            children,
            stop,
            events: Mutex::new(Some(rx)),
            monitor: Some(monitor),
        };
        me.start_managers()?;
        for _ in 0..me.cfg.memnodes {
            me.add_memnode()?;
        }
        let n = me.cfg.memnodes;
        me.wait_until(Duration::from_secs(10), "all memory nodes registered", |s| {
            s.memory_nodes.iter().filter(|m| m.state == NodeState::Alive).count() >= n
        })?;
        Ok(me)
    }

    /// The manager's address; with a group, every member's, comma-separated
    /// (what [`ManagerConn::connect`] and the daemons' `--manager` take).
    pub fn manager_addr(&self) -> &str {
        &self.manager_addr
    }

    /// Each manager's address, by index (member id minus one).
    pub fn manager_addrs(&self) -> Vec<String> {
        self.manager_addrs.clone()
    }

    /// The number of managers.
    pub fn managers(&self) -> usize {
        self.manager_addrs.len()
    }

    /// The memory nodes started so far (including dead ones), by index.
    pub fn memnodes(&self) -> &[MemNodeInfo] {
        &self.memnodes
    }

    /// The directory holding the children's logs and the manager's store.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The cluster's key, which every daemon of the cluster requires.
    pub fn cluster_key(&self) -> ClusterKey {
        self.key
    }

    /// The file holding the cluster's key (for `--cluster-key-file`).
    pub fn key_file(&self) -> &Path {
        &self.key_file
    }

    /// Default connection options with the cluster's key: what a client
    /// (a runtime's `RuntimeConfig::conn`, an admin connection) of this
    /// cluster needs.
    pub fn conn_options(&self) -> ConnOptions {
        ConnOptions {
            cluster_key: Some(self.key),
            tls: self.tls.clone(),
            ..ConnOptions::default()
        }
    }

    /// The cluster's TLS settings (`None` unless [`ClusterConfig::tls`]);
    /// [`TlsConfig::dir`] holds its certificates, for `--tls-dir`.
    pub fn tls(&self) -> Option<&TlsConfig> {
        self.tls.as_ref()
    }

    /// Takes the receiver of child events (once).
    pub fn events(&self) -> Option<Receiver<ClusterEvent>> {
        lock(&self.events).take()
    }

    /// A fresh connection to the manager.
    pub fn manager(&self) -> Result<ManagerConn, ClusterError> {
        Ok(ManagerConn::connect(&self.manager_addr, self.conn_options())?)
    }

    /// The manager's view of the cluster.
    pub fn status(&self) -> Result<ClusterStatus, ClusterError> {
        Ok(self.manager()?.status()?)
    }

    /// What every memory node has sent to peers, summed, as of each one's
    /// last heartbeat (dead nodes included: what they sent still crossed
    /// the wire).
    pub fn peer_traffic(&self) -> Result<PeerTraffic, ClusterError> {
        Ok(PeerTraffic::sum(self.status()?.memory_nodes.iter().map(|m| m.peer)))
    }

    /// What the memory nodes that answer now have sent to peers, summed,
    /// asked of each directly: no heartbeat's delay, so a measured phase's
    /// boundaries are where they are. A node that does not answer (dead,
    /// say) counts nothing.
    pub fn peer_traffic_now(&self) -> PeerTraffic {
        let ask = |m: &MemNodeInfo| {
            let mut opts = self.conn_options();
            opts.call_timeout = Duration::from_secs(2);
            MemNodeClient::connect(&m.addr, opts).ok()?.stats().ok()
        };
        PeerTraffic::sum(self.memnodes.iter().filter_map(|m| ask(m).map(|s| s.peer)))
    }

    /// Polls the manager's status until `pred` holds.
    pub fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&ClusterStatus) -> bool,
    ) -> Result<ClusterStatus, ClusterError> {
        let start = Instant::now();
        loop {
            if let Ok(s) = self.status() {
                if pred(&s) {
                    return Ok(s);
                }
            }
            if start.elapsed() > timeout {
                return Err(ClusterError::Timeout(timeout, what.to_string()));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts one more memory node and returns its index.
    pub fn add_memnode(&mut self) -> Result<usize, ClusterError> {
        let i = self.memnodes.len();
        let m = self.spawn_memnode(i, "127.0.0.1:0")?;
        self.memnodes.push(m);
        Ok(i)
    }

    /// `kill -9` memory node `i` and start a new one at the same address at
    /// once, as a supervisor would: a new incarnation, empty, that registers
    /// with the manager (which then counts the old one dead).
    pub fn restart_memnode(&mut self, i: usize) -> Result<(), ClusterError> {
        self.kill_memnode(i)?;
        let addr = self.memnodes[i].addr.clone();
        self.memnodes[i] = self.spawn_memnode(i, &addr)?;
        Ok(())
    }

    fn spawn_memnode(&self, i: usize, listen: &str) -> Result<MemNodeInfo, ClusterError> {
        let admin = Token::random();
        let cap = self.cfg.capacity.to_string();
        let rs = self.cfg.region_size.to_string();
        let key = admin.to_hex();
        let manager = self.manager_addr.clone();
        let mut args = vec![
            "memnode",
            "--manager",
            &manager,
            "--listen",
            listen,
            "--capacity",
            &cap,
            "--region-size",
            &rs,
        ];
        let extra = self.cfg.memnode_args.clone();
        args.extend(extra.iter().map(String::as_str));
        let (slot, addr) = self.spawn(&format!("memnode#{i}"), &args, &[(ADMIN_KEY_ENV, &key)])?;
        let pid = lock(&self.children)[slot].child.id();
        Ok(MemNodeInfo { addr, admin, pid, slot })
    }

    fn memnode_slot(&self, i: usize) -> Result<usize, ClusterError> {
        self.memnodes.get(i).map(|m| m.slot).ok_or(ClusterError::NoSuchNode(i))
    }

    /// `kill -9` memory node `i`.
    pub fn kill_memnode(&self, i: usize) -> Result<(), ClusterError> {
        let slot = self.memnode_slot(i)?;
        self.kill_slot(slot);
        Ok(())
    }

    /// Sends SIGSTOP to memory node `i`: it stops dead, connections open,
    /// heartbeats and all (a zombie in the making, or a long scheduling
    /// hiccup), until [`LocalCluster::resume_memnode`].
    pub fn pause_memnode(&self, i: usize) -> Result<(), ClusterError> {
        let slot = self.memnode_slot(i)?;
        self.send_signal(slot, libc::SIGSTOP, false);
        Ok(())
    }

    /// Sends SIGCONT to memory node `i`, undoing [`LocalCluster::pause_memnode`].
    pub fn resume_memnode(&self, i: usize) -> Result<(), ClusterError> {
        let slot = self.memnode_slot(i)?;
        self.send_signal(slot, libc::SIGCONT, false);
        Ok(())
    }

    /// Sends SIGTERM to memory node `i` (planned departure: it drains).
    pub fn terminate_memnode(&self, i: usize) -> Result<(), ClusterError> {
        let slot = self.memnode_slot(i)?;
        self.signal_slot(slot, libc::SIGTERM);
        Ok(())
    }

    /// Waits for memory node `i`'s process to exit.
    pub fn wait_memnode_exit(&self, i: usize, timeout: Duration) -> Result<ExitStatus, ClusterError> {
        let slot = self.memnode_slot(i)?;
        let start = Instant::now();
        loop {
            {
                let mut c = lock(&self.children);
                if let Ok(Some(st)) = c[slot].child.try_wait() {
                    return Ok(st);
                }
            }
            if start.elapsed() > timeout {
                return Err(ClusterError::Timeout(timeout, format!("memnode#{i} to exit")));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// A data-path client for memory node `i`.
    pub fn memnode_client(&self, i: usize) -> Result<MemNodeClient, ClusterError> {
        let m = self.memnodes.get(i).ok_or(ClusterError::NoSuchNode(i))?;
        Ok(MemNodeClient::connect(&m.addr, self.conn_options())?)
    }

    /// Injects a fault into memory node `i` (needs a binary built with the
    /// `fault-injection` feature).
    pub fn fault(&self, i: usize, fault: Fault) -> Result<(), ClusterError> {
        let m = self.memnodes.get(i).ok_or(ClusterError::NoSuchNode(i))?;
        self.memnode_client(i)?.fault(m.admin, fault)?;
        Ok(())
    }
}
