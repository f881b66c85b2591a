//! TLS (issue 11) against real processes: a cluster run with `--tls data`
//! keeps every object, a proxy on the data path sees none of their bytes
//! (and, as a check that it could, sees them without TLS), nodes without a
//! certificate of the cluster's CA are refused, and a client of the wrong
//! kind fails at once with a reason.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    BIN, MARK, Text, cluster_config, memnode_holding_data, refusals, run_remora, runtime_config, spawn_daemon, stderr,
    stdout,
};
use remora_cluster::LocalCluster;
use remora_proto::{ComputeSession, ConnOptions, MemNodeClient, NodeState, RpcError, TlsConfig, TlsMode};
use remora_runtime::{RemBox, Runtime};

const MIB: u64 = 1 << 20;

fn tls_cluster(memnodes: usize, mode: TlsMode) -> LocalCluster {
    let mut cfg = cluster_config(memnodes, 64 * MIB, 8 * MIB, Duration::from_secs(3));
    cfg.tls = mode;
    LocalCluster::start(cfg).expect("cluster starts")
}

fn runtime(c: &LocalCluster, scheme: &str, budget: usize) -> Runtime {
    let mut cfg = runtime_config(c, &format!("tls-{scheme}"), budget);
    let opts = remora_runtime::scheme::SchemeOptions {
        k: 2,
        m: 1,
        ..Default::default()
    };
    cfg.scheme = remora_runtime::scheme::make(scheme, &opts).expect("known scheme");
    Runtime::connect(cfg).expect("runtime connects")
}

/// Writes `n` objects through a runtime whose budget holds a quarter of
/// them, rewrites every other one once evicted, and reads every object back.
fn store_and_check(rt: &Runtime, n: u64) {
    let mut objs: Vec<RemBox<Text>> = (0..n).map(|i| rt.alloc(Text::new(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    assert!(rt.stats().far.objects > n / 2, "{:?}", rt.stats());
    for (i, o) in objs.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
        let scope = rt.scope();
        *o.deref_mut(&scope).unwrap() = Text::new(i as u64, 1);
    }
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    for (i, o) in objs.iter().enumerate() {
        let scope = rt.scope();
        Text::check(o.deref(&scope).expect("deref"), i as u64, (i % 2 == 0) as u64);
    }
    assert!(rt.stats().traffic.bytes_read_remote > 0, "{:?}", rt.stats());
}

#[test]
fn a_tls_data_cluster_keeps_every_object() {
    let c = tls_cluster(3, TlsMode::Data);
    let rt = runtime(&c, "ec-2pc", 1 << 20);
    store_and_check(&rt, 2048);
    let st = c.status().unwrap();
    assert_eq!(
        st.memory_nodes.iter().filter(|m| m.state == NodeState::Alive).count(),
        3
    );
    // The memory nodes serve TLS clients only.
    let plain = ConnOptions {
        tls: None,
        ..c.conn_options()
    };
    match MemNodeClient::connect(&c.memnodes()[0].addr, plain) {
        Err(RpcError::Tls { reason, .. }) => assert!(reason.contains("requires TLS"), "{reason}"),
        other => panic!("a plain client reached a --tls data memory node: {other:?}"),
    }
}

/// Memory node to memory node over TLS: a node holding this runtime's data
/// dies, and a survivor rebuilds its spans by reading from its peers.
#[test]
fn a_tls_data_cluster_rebuilds_a_lost_node_from_its_peers() {
    let c = tls_cluster(4, TlsMode::Data);
    let rt = runtime(&c, "ec-batch", 1 << 20);
    let n = 2048;
    let objs: Vec<RemBox<Text>> = (0..n).map(|i| rt.alloc(Text::new(i, 0)).unwrap()).collect();
    rt.wait_for_eviction(Duration::from_secs(30)).unwrap();
    let victim = memnode_holding_data(&c, &rt);
    c.kill_memnode(victim).unwrap();
    let killed = Instant::now();
    loop {
        // Reads keep going through the failure: degraded reads, then the rebuilt spans.
        for (i, o) in objs.iter().enumerate() {
            let scope = rt.scope();
            Text::check(o.deref(&scope).expect("deref"), i as u64, 0);
        }
        let st = rt.stats();
        if st.scheme.recoveries >= 1 && st.scheme.recovering == 0 {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "recovery did not finish: {st:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let st = rt.stats();
    assert!(st.scheme.reconstructed_bytes > 0, "nothing was rebuilt: {st:?}");
    c.wait_until(Duration::from_secs(10), "peer rebuild traffic reported", |s| {
        s.memory_nodes.iter().map(|m| m.peer.rebuild_bytes).sum::<u64>() > 0
    })
    .unwrap();
    for (i, o) in objs.iter().enumerate() {
        let scope = rt.scope();
        Text::check(o.deref(&scope).expect("deref"), i as u64, 0);
    }
}

/// A forwarder that records every byte it passes, both ways.
struct Proxy {
    addr: String,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Proxy {
    fn start(target: String) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(client) = c else { return };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let seen = Arc::clone(&s2);
                    thread::spawn(move || {
                        let mut b = vec![0u8; 64 << 10];
                        while let Ok(n @ 1..) = from.read(&mut b) {
                            seen.lock().unwrap().extend_from_slice(&b[..n]);
                            if to.write_all(&b[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Self { addr, seen }
    }

    fn seen(&self) -> Vec<u8> {
        self.seen.lock().unwrap().clone()
    }
}

fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

/// A memory node of cluster `c` that listens at `listen` and advertises
/// `advertise`: every connection to it, the compute node's included, then
/// goes through whatever listens there.
fn memnode_behind(c: &LocalCluster, listen: &str, advertise: &str) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.args(["memnode", "--manager", c.manager_addr(), "--listen", listen])
        .args(["--advertise", advertise, "--capacity", "64MiB", "--region-size", "8MiB"])
        .arg("--cluster-key-file")
        .arg(c.key_file())
        .arg("--exit-with-parent");
    if let Some(t) = c.tls() {
        cmd.args(["--tls", t.mode().as_str(), "--tls-dir"]).arg(t.dir());
    }
    spawn_daemon(cmd.stderr(Stdio::null()))
}

/// Runs a runtime's objects through a recording proxy in front of the only
/// memory node and returns what the proxy saw.
fn proxied_bytes(mode: TlsMode) -> Vec<u8> {
    let c = tls_cluster(0, mode);
    let listen = free_port();
    let proxy = Proxy::start(listen.clone());
    let mut node = memnode_behind(&c, &listen, &proxy.addr);
    c.wait_until(Duration::from_secs(10), "the proxied node registered", |s| {
        s.memory_nodes
            .iter()
            .any(|m| m.addr == proxy.addr && m.state == NodeState::Alive)
    })
    .unwrap();
    let rt = runtime(&c, "non-ft", 1 << 20);
    store_and_check(&rt, 1024);
    let st = rt.stats();
    drop(rt);
    let _ = node.kill();
    let _ = node.wait();
    let seen = proxy.seen();
    assert!(
        seen.len() as u64 > st.traffic.bytes_evicted_data,
        "the objects did not go through the proxy: {} bytes seen, {} evicted",
        seen.len(),
        st.traffic.bytes_evicted_data
    );
    seen
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_proxy_on_the_data_path_sees_no_plaintext_with_tls_data() {
    let seen = proxied_bytes(TlsMode::Data);
    assert!(
        !contains(&seen, MARK),
        "the objects' text crossed the wire in the clear"
    );
    let hello = remora_proto::frame::hello();
    assert!(
        !contains(&seen, &hello),
        "the protocol hello crossed the wire in the clear"
    );
}

#[test]
fn a_proxy_on_the_data_path_sees_the_plaintext_without_tls() {
    // The check above can fail: without TLS the same objects are visible.
    let seen = proxied_bytes(TlsMode::Off);
    assert!(contains(&seen, MARK), "the proxy should see plain objects");
    assert!(contains(&seen, &remora_proto::frame::hello()));
}

#[test]
fn nodes_without_a_certificate_of_the_cluster_ca_are_refused() {
    let c = tls_cluster(1, TlsMode::Data);
    let good = c.memnodes()[0].addr.clone();
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca");
    let out = run_remora(&["certs", "--out", other.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));

    let manager = c.manager_addr().to_string();
    let key = c.key_file().to_str().unwrap().to_string();
    let base = [
        "memnode",
        "--manager",
        &manager,
        "--listen",
        "127.0.0.1:0",
        "--capacity",
        "64MiB",
        "--region-size",
        "8MiB",
        "--cluster-key-file",
        &key,
    ];
    let started = Instant::now();
    let plain = run_remora(&base, &[]);
    assert!(!plain.status.success(), "a memory node without TLS joined");
    assert!(stderr(&plain).contains("requires TLS"), "{}", stderr(&plain));
    let stranger = run_remora(
        &[&base[..], &["--tls", "data", "--tls-dir", other.to_str().unwrap()]].concat(),
        &[],
    );
    assert!(!stranger.status.success(), "a memory node of another CA joined");
    assert!(stderr(&stranger).contains("TLS"), "{}", stderr(&stranger));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );

    // Compute nodes likewise.
    let other_tls = TlsConfig::load(TlsMode::Data, &other).unwrap();
    for (what, tls) in [("plain", None), ("other CA", Some(other_tls))] {
        let opts = ConnOptions {
            tls,
            ..c.conn_options()
        };
        match ComputeSession::open(c.manager_addr(), what, opts) {
            Err(RpcError::Tls { .. }) => {}
            Err(e) => panic!("{what} compute node failed otherwise: {e}"),
            Ok(_) => panic!("{what} compute node registered"),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while refusals(&c, "manager.log") < 4 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(refusals(&c, "manager.log"), 4, "every stranger is logged as refused");

    let st = c.status().unwrap();
    let addrs: Vec<_> = st.memory_nodes.iter().map(|m| m.addr.clone()).collect();
    assert_eq!(
        addrs,
        vec![good.clone()],
        "only the node with the cluster's certificate is a member"
    );
    assert!(st.compute_nodes.is_empty(), "{:?}", st.compute_nodes);
    let s = ComputeSession::open(c.manager_addr(), "owner", c.conn_options()).unwrap();
    let grants = s.alloc(2, false, &[]).unwrap();
    assert!(grants.iter().all(|g| g.addr == good), "{grants:?}");
}

#[test]
fn admin_commands_take_tls_flags_and_a_plain_one_fails_quickly() {
    let c = tls_cluster(1, TlsMode::Control);
    let manager = c.manager_addr().to_string();
    let key = c.key_file().to_str().unwrap().to_string();
    let tls_dir = c.tls().unwrap().dir().to_path_buf();
    let node = c.memnodes()[0].addr.clone();

    let started = Instant::now();
    let out = run_remora(&["status", "--manager", &manager, "--cluster-key-file", &key], &[]);
    assert!(!out.status.success(), "a plain status was answered");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        stderr(&out).contains("requires TLS") && stderr(&out).contains("--tls"),
        "{}",
        stderr(&out)
    );
    assert!(!stdout(&out).contains(&node));

    let dir = tls_dir.to_str().unwrap();
    let out = run_remora(
        &[
            "status",
            "--manager",
            &manager,
            "--cluster-key-file",
            &key,
            "--tls",
            "control",
            "--tls-dir",
            dir,
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&node), "{}", stdout(&out));
    // The same through the environment.
    let out = Command::new(BIN)
        .args(["status", "--manager", &manager, "--cluster-key-file", &key])
        .env("REMORA_TLS", "control")
        .env("REMORA_TLS_DIR", &tls_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // Bad flags say what is wrong and how to fix it.
    let empty = tempfile::tempdir().unwrap();
    let out = run_remora(
        &[
            "status",
            "--manager",
            &manager,
            "--tls",
            "data",
            "--tls-dir",
            empty.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("ca.pem") && stderr(&out).contains("remora certs --out"),
        "{}",
        stderr(&out)
    );
    let out = run_remora(&["status", "--manager", &manager, "--tls", "data"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--tls-dir"), "{}", stderr(&out));
    let out = run_remora(&["status", "--manager", &manager, "--tls", "sometimes"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("off, control or data"), "{}", stderr(&out));
}

#[test]
fn certs_writes_a_ca_and_a_private_key_once() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("certs");
    let d = out_dir.to_str().unwrap();
    let out = run_remora(&["certs", "--out", d, "--name", "mem1.example"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("mem1.example"), "{}", stdout(&out));
    let key_mode = std::fs::metadata(out_dir.join("node.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(key_mode & 0o777, 0o600);
    let ca = std::fs::read(out_dir.join("ca.pem")).unwrap();
    let again = run_remora(&["certs", "--out", d], &[]);
    assert!(!again.status.success(), "certs overwrote a CA");
    assert!(
        stderr(&again).contains("exists already") && stderr(&again).contains("--force"),
        "{}",
        stderr(&again)
    );
    assert_eq!(std::fs::read(out_dir.join("ca.pem")).unwrap(), ca);
    let forced = run_remora(&["certs", "--out", d, "--force"], &[]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert_ne!(std::fs::read(out_dir.join("ca.pem")).unwrap(), ca);
    // A directory that cannot be made is named.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let bad = run_remora(&["certs", "--out", blocker.join("sub").to_str().unwrap()], &[]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("cannot write"), "{}", stderr(&bad));
}
