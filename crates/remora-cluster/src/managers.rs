//! The cluster's managers: starting a group, finding its leader, killing
//! and restarting members.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::ManagerConn;
use remora_proto::msg::{ManagerRole, MgrRequest, MgrResponse};

use crate::{ClusterError, LocalCluster};

impl LocalCluster {
    pub(crate) fn start_managers(&mut self) -> Result<(), ClusterError> {
        let n = self.cfg.managers.max(1);
        if n == 1 {
            let (slot, addr) = self.spawn_manager(0, "127.0.0.1:0")?;
            self.manager_addrs = vec![addr];
            self.manager_slots = vec![AtomicUsize::new(slot)];
            self.manager_addr = self.manager_addrs[0].clone();
            return Ok(());
        }
        // Every member's `--peers` names all the addresses up front, so the
        // ports are chosen here rather than by each child; the listeners are
        // held until all are bound, so that no port comes up twice.
        let listeners = (0..n)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ClusterError::Port)?;
        let addrs = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.to_string()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ClusterError::Port)?;
        drop(listeners);
        self.manager_addr = addrs.join(",");
        self.manager_addrs = addrs;
        for i in 0..n {
            let listen = self.manager_addrs[i].clone();
            let (slot, _) = self.spawn_manager(i, &listen)?;
            self.manager_slots.push(AtomicUsize::new(slot));
        }
        self.wait_for_leader(Duration::from_secs(10))?;
        Ok(())
    }

    /// Starts manager `i` listening on `listen`; returns its child slot and
    /// address.
    pub(crate) fn spawn_manager(&self, i: usize, listen: &str) -> Result<(usize, String), ClusterError> {
        let group = self.cfg.managers > 1;
        let (name, data) = if group {
            (format!("manager#{}", i + 1), format!("manager-data-{}", i + 1))
        } else {
            ("manager".to_string(), "manager-data".to_string())
        };
        let data = self.dir.path().join(data);
        let timeout = format!("{}ms", self.cfg.heartbeat_timeout.as_millis());
        let mut args = vec![
            "manager".to_string(),
            "--listen".into(),
            listen.into(),
            "--data-dir".into(),
            data.to_string_lossy().into_owned(),
            "--heartbeat-timeout".into(),
            timeout,
        ];
        if group {
            let peers: Vec<String> = self
                .manager_addrs
                .iter()
                .enumerate()
                .map(|(j, a)| format!("{}={a}", j + 1))
                .collect();
            args.extend(["--id".into(), (i + 1).to_string(), "--peers".into(), peers.join(",")]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.spawn(&name, &args, &[])
    }

    pub(crate) fn manager_slot(&self, i: usize) -> Result<usize, ClusterError> {
        self.manager_slots
            .get(i)
            .map(|s| s.load(Ordering::Acquire))
            .ok_or(ClusterError::NoSuchManager(i))
    }

    /// What manager `i` says of its own place in the group, if it answers
    /// within a short while.
    pub(crate) fn member_status(&self, i: usize) -> Option<remora_proto::msg::ManagerStatus> {
        let mut opts = self.conn_options();
        // A dead or stopped member must not hold up the others' answers.
        opts.connect_timeout = Duration::from_millis(300);
        opts.call_timeout = Duration::from_millis(500);
        let conn = ManagerConn::connect(self.manager_addrs.get(i)?, opts).ok()?;
        match conn.call(&MgrRequest::Member).ok()? {
            MgrResponse::Member(s) => Some(s),
            _ => None,
        }
    }

    /// The index of the manager that says it leads the group (the one with
    /// the highest term, should a deposed leader not know it yet), if any.
    pub fn leader(&self) -> Option<usize> {
        (0..self.managers())
            .filter_map(|i| self.member_status(i).map(|s| (i, s)))
            .filter(|(_, s)| s.role == ManagerRole::Leader)
            .max_by_key(|(_, s)| s.term)
            .map(|(i, _)| i)
    }

    /// Waits until some manager leads the group; returns its index.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<usize, ClusterError> {
        let start = Instant::now();
        loop {
            if let Some(i) = self.leader() {
                return Ok(i);
            }
            if start.elapsed() > timeout {
                return Err(ClusterError::Timeout(timeout, "a manager group leader".into()));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the manager (`kill -9`) and starts it again on the same port
    /// with the same data directory; in a group, the leader.
    pub fn restart_manager(&self) -> Result<(), ClusterError> {
        self.kill_manager();
        self.start_manager_again()
    }

    /// Kills the manager (`kill -9`); [`LocalCluster::start_manager_again`]
    /// brings it back. In a group it kills the leader, or member 0 when none
    /// is elected within 5 s: the caller asked for an outage either way.
    pub fn kill_manager(&self) {
        let i = if self.managers() > 1 {
            self.wait_for_leader(Duration::from_secs(5)).unwrap_or(0)
        } else {
            0
        };
        self.killed_manager.store(i, Ordering::Release);
        if let Ok(slot) = self.manager_slot(i) {
            self.kill_slot(slot);
        }
    }

    /// Starts the manager that [`LocalCluster::kill_manager`] killed again,
    /// on its port with its data directory.
    pub fn start_manager_again(&self) -> Result<(), ClusterError> {
        self.start_manager_member_again(self.killed_manager.load(Ordering::Acquire))
    }

    /// The index of the manager [`LocalCluster::kill_manager`] killed last
    /// (0 before any).
    pub fn last_killed_manager(&self) -> usize {
        self.killed_manager.load(Ordering::Acquire)
    }

    /// `kill -9` manager `i` (0-based; its member id is `i + 1`).
    ///
    /// # Panics
    ///
    /// If there is no manager `i`, as indexing would.
    pub fn kill_manager_member(&self, i: usize) {
        match self.manager_slot(i) {
            Ok(slot) => self.kill_slot(slot),
            Err(e) => panic!("{e} (the cluster has {})", self.managers()),
        }
    }

    /// Starts manager `i` again on its port with its data directory (after
    /// [`LocalCluster::kill_manager_member`]).
    pub fn start_manager_member_again(&self, i: usize) -> Result<(), ClusterError> {
        let addr = self.manager_addrs.get(i).ok_or(ClusterError::NoSuchManager(i))?.clone();
        let start = Instant::now();
        // The port may take a moment to be free again.
        loop {
            match self.spawn_manager(i, &addr) {
                Ok((slot, _)) => {
                    self.manager_slots[i].store(slot, Ordering::Release);
                    return Ok(());
                }
                Err(e) if start.elapsed() < Duration::from_secs(10) => {
                    tracing::debug!("manager restart: {e}");
                    thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }
}
