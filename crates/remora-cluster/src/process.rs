//! The cluster's child processes: spawning a daemon and reading the
//! address it reports, signals, the monitor that reports exits, and
//! killing every child when the cluster is dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::Duration;

use crate::child::CHILD_ENV;
use crate::{ClusterError, ClusterEvent, LocalCluster, lock};

pub(crate) struct ChildSlot {
    pub(crate) name: String,
    pub(crate) child: Child,
    /// Dropping it closes the child's lifeline.
    pub(crate) _lifeline: Option<ChildStdin>,
    pub(crate) expected_exit: bool,
    pub(crate) exited: bool,
}

impl LocalCluster {
    /// `--tls MODE --tls-dir DIR` for a child, or nothing.
    pub(crate) fn tls_args(&self) -> Vec<std::ffi::OsString> {
        match &self.tls {
            Some(t) => vec![
                "--tls".into(),
                t.mode().as_str().into(),
                "--tls-dir".into(),
                t.dir().as_os_str().to_owned(),
            ],
            None => Vec::new(),
        }
    }

    /// Starts a daemon with `args` and `envs` (secrets go in the
    /// environment, never on the command line) and waits for the address
    /// it reports.
    pub(crate) fn spawn(
        &self,
        name: &str,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<(usize, String), ClusterError> {
        let log_path = self.dir.path().join(format!("{}.log", name.replace('#', "")));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(ClusterError::Dir)?;
        let mut cmd = Command::new(&self.cfg.binary);
        if self.cfg.self_exec {
            cmd.env(CHILD_ENV, "1");
        }
        let mut child = cmd
            .args(args)
            .arg("--cluster-key-file")
            .arg(&self.key_file)
            .arg("--exit-with-parent")
            .args(self.tls_args())
            .env("RUST_LOG", &self.cfg.log_level)
            .env("NO_COLOR", "1")
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|source| ClusterError::Spawn {
                what: format!("{name} ({})", self.cfg.binary.display()),
                source,
            })?;
        let lifeline = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        let n2 = name.to_string();
        // Reads the readiness line, then keeps draining stdout so the child never blocks on it.
        let _ = thread::Builder::new().name(format!("{name}-stdout")).spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening on ").nth(1) {
                    if let Some(t) = tx.take() {
                        let _ = t.send(addr.trim().to_string());
                    }
                }
                tracing::trace!("{n2}: {line}");
            }
        });
        let mut children = lock(&self.children);
        children.push(ChildSlot {
            name: name.to_string(),
            child,
            _lifeline: lifeline,
            expected_exit: false,
            exited: false,
        });
        let slot = children.len() - 1;
        drop(children);
        match rx.recv_timeout(self.cfg.ready_timeout) {
            Ok(addr) => Ok((slot, addr)),
            Err(_) => {
                self.kill_slot(slot);
                Err(ClusterError::NotReady {
                    what: name.to_string(),
                    after: self.cfg.ready_timeout,
                    log: log_path.display().to_string(),
                })
            }
        }
    }

    pub(crate) fn kill_slot(&self, slot: usize) {
        let mut c = lock(&self.children);
        if let Some(s) = c.get_mut(slot) {
            s.expected_exit = true;
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
    }

    pub(crate) fn signal_slot(&self, slot: usize, sig: i32) {
        self.send_signal(slot, sig, true);
    }

    /// Sends `sig` to the child in `slot`; `exits` says whether the signal
    /// ends it (so the monitor does not report the exit as a crash).
    pub(crate) fn send_signal(&self, slot: usize, sig: i32, exits: bool) {
        let mut c = lock(&self.children);
        if let Some(s) = c.get_mut(slot) {
            s.expected_exit |= exits;
            if let Ok(pid) = i32::try_from(s.child.id()) {
                // SAFETY: kill(2) takes plain integers; the pid is our own
                // child, not yet reaped (we hold its `Child` and the lock that
                // the monitor needs to reap it), so it cannot name another process.
                unsafe {
                    libc::kill(pid, sig);
                }
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        {
            let mut c = lock(&self.children);
            for s in c.iter_mut() {
                s.expected_exit = true;
                let _ = s.child.kill();
            }
            for s in c.iter_mut() {
                let _ = s.child.wait();
            }
        }
        if let Some(m) = self.monitor.take() {
            let _ = m.join();
        }
        if std::env::var_os("REMORA_KEEP_CLUSTER_DIR").is_some() {
            let kept = std::mem::replace(&mut self.dir, tempfile::TempDir::new().expect("temp dir")).keep();
            eprintln!("remora cluster logs kept in {}", kept.display());
        }
    }
}

pub(crate) fn monitor(children: &Mutex<Vec<ChildSlot>>, stop: &AtomicBool, tx: &Sender<ClusterEvent>) {
    while !stop.load(Ordering::Acquire) {
        {
            let mut c = lock(children);
            for s in c.iter_mut().filter(|s| !s.exited) {
                if let Ok(Some(status)) = s.child.try_wait() {
                    s.exited = true;
                    if !s.expected_exit {
                        tracing::warn!("{} exited unexpectedly: {status}", s.name);
                    }
                    let _ = tx.send(ClusterEvent::Exited {
                        name: s.name.clone(),
                        status,
                        expected: s.expected_exit,
                    });
                }
            }
        }
        thread::sleep(Duration::from_millis(25));
    }
}
