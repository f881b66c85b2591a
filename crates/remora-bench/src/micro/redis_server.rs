//! `redis-server` processes for the Redis baseline of `remora bench micro`:
//! a primary and R replicas on loopback, each a child process on a free port
//! with a temporary working directory, persistence off.
//!
//! They never outlive the benchmark: dropping a [`RedisServer`] kills and
//! reaps it, and each child asks the kernel (`PR_SET_PDEATHSIG`) to be
//! killed when the thread that started it dies, which covers the benchmark
//! being killed itself. Start them from a thread that lives as long as they
//! should (the benchmark starts them from its main thread).

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

/// Environment variable naming the `redis-server` binary to use.
pub(crate) const SERVER_ENV: &str = "REMORA_REDIS_SERVER";
/// Environment variable that makes a missing `redis-server` an error instead of a skip.
pub(crate) const REQUIRE_ENV: &str = "REMORA_REQUIRE_REDIS";
/// How long a server gets to accept connections, and the replicas to link up.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Attempts at a free port before giving up (another process may take the one picked).
const PORT_TRIES: usize = 5;

/// How to get `redis-server`, for the message printed when it is missing.
pub(crate) const INSTALL_HINT: &str = "install it (Debian/Ubuntu: `sudo apt-get install redis-server`; macOS: \
     `brew install redis`), or put redis-server on PATH, or set REMORA_REDIS_SERVER=/path/to/redis-server";

/// The `redis-server` binary: `$REMORA_REDIS_SERVER`, else the first on `PATH`.
pub(crate) fn locate() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(SERVER_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(format!("{SERVER_ENV}={} is not an executable file", p.display()))
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("redis-server"))
        .find(|p| is_executable(p))
        .ok_or_else(|| "redis-server was not found on PATH".to_string())
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether `REMORA_REQUIRE_REDIS` asks for a missing server to be an error.
pub(crate) fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// One `redis-server` child process.
pub(crate) struct RedisServer {
    child: Child,
    port: u16,
    /// Its working directory (and log), removed after the process is reaped.
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server on a free loopback port, a replica of `primary`'s port if given.
    fn start(bin: &Path, primary: Option<u16>) -> anyhow::Result<Self> {
        let mut last = None;
        for _ in 0..PORT_TRIES {
            match Self::try_start(bin, primary) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("no attempt made")))
    }

    fn try_start(bin: &Path, primary: Option<u16>) -> anyhow::Result<Self> {
        let port = free_port()?;
        let dir = tempfile::Builder::new()
            .prefix("remora-redis-")
            .tempdir()
            .context("creating a working directory for redis-server")?;
        let out = File::create(dir.path().join("stdout.log")).context("creating redis-server's log")?;
        let err = out.try_clone().context("creating redis-server's log")?;
        let mut cmd = Command::new(bin);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(["--logfile", "redis.log", "--daemonize", "no"])
            // A replica links up at once instead of after the default 5 s delay.
            .args(["--repl-diskless-sync-delay", "0"]);
        if let Some(p) = primary {
            cmd.args(["--replicaof", "127.0.0.1", &p.to_string()]);
        }
        cmd.current_dir(dir.path()).stdin(Stdio::null()).stdout(out).stderr(err);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and only
        // calls async-signal-safe functions (prctl, getppid) and builds an
        // io::Error from a raw errno, which does not allocate. PR_SET_PDEATHSIG
        // takes a signal number and touches no memory of ours.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died between fork and prctl: do not run orphaned.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
        let mut s = Self { child, port, dir };
        s.wait_ready()?;
        Ok(s)
    }

    /// Waits until the server answers PING (or has exited: then its log is the error).
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "redis-server on port {} exited at start ({status}): {}",
                    self.port,
                    self.log_tail()
                );
            }
            let pong = self
                .connect()
                .and_then(|mut c| Ok(redis::cmd("PING").query::<String>(&mut c)?));
            if pong.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server on port {} did not answer within {START_TIMEOUT:?}: {}",
                    self.port,
                    self.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last lines of its log, for error messages.
    fn log_tail(&self) -> String {
        let mut text = String::new();
        for f in ["stdout.log", "redis.log"] {
            if let Ok(t) = std::fs::read_to_string(self.dir.path().join(f)) {
                text.push_str(&t);
            }
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new connection to it.
    pub(crate) fn connect(&self) -> anyhow::Result<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let c = client.get_connection_with_timeout(Duration::from_secs(5))?;
        Ok(c)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Err(e) = self.child.kill() {
            tracing::debug!("killing redis-server on port {}: {e}", self.port);
        }
        if let Err(e) = self.child.wait() {
            tracing::warn!("reaping redis-server on port {}: {e}", self.port);
        }
    }
}

/// A port free on loopback now (the kernel's pick for an ephemeral bind).
fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// A primary and its replicas.
pub(crate) struct RedisGroup {
    pub(crate) primary: RedisServer,
    pub(crate) replicas: Vec<RedisServer>,
}

impl RedisGroup {
    /// Starts a primary and `replicas` replicas of it, and waits until every
    /// replica reports `master_link_status:up`.
    pub(crate) fn start(bin: &Path, replicas: u32) -> anyhow::Result<Self> {
        let primary = RedisServer::start(bin, None)?;
        let mut g = Self {
            replicas: Vec::new(),
            primary,
        };
        for _ in 0..replicas {
            let r = RedisServer::start(bin, Some(g.primary.port()))?;
            g.replicas.push(r);
        }
        g.wait_linked()?;
        Ok(g)
    }

    fn wait_linked(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        for r in &self.replicas {
            let mut c = r.connect()?;
            loop {
                let info: String = redis::cmd("INFO").arg("replication").query(&mut c)?;
                if info_field(&info, "master_link_status") == Some("up") {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "replica on port {} did not link to its primary within {START_TIMEOUT:?}: {}",
                        r.port(),
                        r.log_tail()
                    );
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Every server, the primary first.
    pub(crate) fn servers(&self) -> impl Iterator<Item = &RedisServer> {
        std::iter::once(&self.primary).chain(&self.replicas)
    }
}

/// The value of `field` in the text of an `INFO` reply (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .filter_map(|l| l.trim_end().split_once(':'))
        .find(|(k, _)| *k == field)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_parse() {
        let info = "# Memory\r\nused_memory:1043000\r\nused_memory_human:1018.55K\r\n";
        assert_eq!(info_field(info, "used_memory"), Some("1043000"));
        assert_eq!(info_field(info, "used_memory_human"), Some("1018.55K"));
        assert_eq!(info_field(info, "maxmemory"), None);
    }
}
