//! Who may join (issue 11), against real processes: a cluster made by
//! `LocalCluster` has its own key, and nothing without that key joins it,
//! takes a region, reads its status or drains a node.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::Duration;

use common::{BIN, await_refusals, cluster, refusals, run_remora, session, stderr};
use remora_proto::frame::{HEADER_LEN, hello};
use remora_proto::{ClusterKey, ComputeSession, ConnOptions, MemNodeClient, MemTransport, RemoteError, RpcError};

const MIB: u64 = 1 << 20;

fn opts(key: Option<ClusterKey>) -> ConnOptions {
    ConnOptions {
        cluster_key: key,
        ..ConnOptions::default()
    }
}

fn wrong_key_file(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("wrong.key");
    ClusterKey::generate().write_new(&p).unwrap();
    p
}

#[test]
fn daemons_refuse_to_start_without_a_key_and_keygen_makes_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = run_remora(
        &[
            "manager",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("remora keygen --out FILE"), "{}", stderr(&out));
    let out = run_remora(
        &[
            "memnode",
            "--manager",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "1GiB",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("remora keygen --out FILE"), "{}", stderr(&out));

    let key = dir.path().join("cluster.key");
    let out = run_remora(&["keygen", "--out", key.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    let k = ClusterKey::read_file(&key).unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&k.id()));
    let again = run_remora(&["keygen", "--out", key.to_str().unwrap()], &[]);
    assert!(!again.status.success(), "keygen overwrote a key");
    assert_eq!(ClusterKey::read_file(&key).unwrap().to_hex(), k.to_hex());

    // A key file others can read is refused: the daemon does not start.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run_remora(
        &[
            "manager",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--cluster-key-file",
            key.to_str().unwrap(),
        ],
        &[],
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "started on a key others can read: {err}");
    assert!(err.contains("mode 644") && err.contains("chmod 600"), "{err}");
}

#[test]
fn memory_nodes_without_the_key_never_join() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    let good = c.memnodes()[0].addr.clone();
    let wrong = wrong_key_file(c.dir());
    let manager = c.manager_addr().to_string();
    let base = [
        "memnode",
        "--manager",
        &manager,
        "--listen",
        "127.0.0.1:0",
        "--capacity",
        "256MiB",
        "--region-size",
        "64MiB",
    ];
    let keyless = run_remora(&[&base[..], &["--insecure-no-auth"]].concat(), &[]);
    assert!(!keyless.status.success());
    assert!(stderr(&keyless).contains("not authorized"), "{}", stderr(&keyless));
    let wrong_key = run_remora(
        &[&base[..], &["--cluster-key-file", wrong.to_str().unwrap()]].concat(),
        &[],
    );
    assert!(!wrong_key.status.success());
    assert!(
        stderr(&wrong_key).contains("proof of the cluster key"),
        "{}",
        stderr(&wrong_key)
    );
    assert_eq!(await_refusals(&c, "manager.log", 2), 2);

    let st = c.status().unwrap();
    let addrs: Vec<_> = st.memory_nodes.iter().map(|m| m.addr.clone()).collect();
    assert_eq!(addrs, vec![good.clone()], "only the keyed node is a member");
    // Every region the manager hands out is on the keyed node.
    let s = session(&c, "owner");
    let grants = s.alloc(2, false, &[]).unwrap();
    assert_eq!(grants.len(), 2);
    assert!(grants.iter().all(|g| g.addr == good), "{grants:?}");
    assert!(matches!(
        s.alloc(1, false, &[]),
        Err(RpcError::Remote(RemoteError::NoCapacity { .. }))
    ));
}

#[test]
fn compute_nodes_without_the_key_get_no_region() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    match ComputeSession::open(c.manager_addr(), "keyless", opts(None)) {
        Err(RpcError::Remote(RemoteError::Unauthorized)) => {}
        Err(e) => panic!("keyless session failed otherwise: {e}"),
        Ok(_) => panic!("keyless compute node registered"),
    }
    match ComputeSession::open(c.manager_addr(), "wrong", opts(Some(ClusterKey::generate()))) {
        Err(RpcError::Auth { .. }) => {}
        Err(e) => panic!("wrong-key session failed otherwise: {e}"),
        Ok(_) => panic!("wrong-key compute node registered"),
    }
    let mut rcfg = remora_runtime::RuntimeConfig::new(c.manager_addr(), 4 << 20);
    rcfg.name = "keyless-runtime".into();
    assert!(
        remora_runtime::Runtime::connect(rcfg).is_err(),
        "a runtime without the key connected"
    );
    assert_eq!(await_refusals(&c, "manager.log", 3), 3);

    // The keyed owner's two regions are all there is; nobody else holds one.
    let s = session(&c, "owner");
    let g = s.alloc(2, false, &[]).unwrap().remove(0);
    let st = c.status().unwrap();
    let names: Vec<_> = st.compute_nodes.iter().map(|n| n.name.clone()).collect();
    assert_eq!(names, vec!["owner".to_string()]);
    assert_eq!(st.memory_nodes[0].regions_free, 0);

    // Even with a valid capability, the memory node serves no one without the key.
    let data = vec![0x5au8; 4096];
    c.memnode_client(0).unwrap().write(g.cap, 0, &data).unwrap();
    let thief = MemNodeClient::connect(&g.addr, opts(None)).unwrap();
    let mut back = vec![0u8; 4096];
    match thief.read(g.cap, 0, &mut back) {
        Err(RpcError::Remote(RemoteError::Unauthorized)) => {}
        other => panic!("a keyless read was answered: {other:?}"),
    }
    assert!(back.iter().all(|&b| b == 0), "no byte of the region reached the thief");
    assert!(MemNodeClient::connect(&g.addr, opts(Some(ClusterKey::generate()))).is_err());
    assert_eq!(await_refusals(&c, "memnode0.log", 2), 2);
}

#[test]
fn status_and_drain_need_the_key() {
    let c = cluster(2, 128 * MIB, 64 * MIB);
    let manager = c.manager_addr().to_string();
    let node = c.memnodes()[1].addr.clone();
    let key = c.key_file().to_str().unwrap().to_string();
    let wrong = wrong_key_file(c.dir());

    let out = run_remora(&["status", "--manager", &manager], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("requires the cluster key"), "{}", stderr(&out));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&node),
        "status leaked to a keyless client"
    );
    let out = run_remora(
        &[
            "status",
            "--manager",
            &manager,
            "--cluster-key-file",
            wrong.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&node));
    let out = run_remora(&["drain", "--manager", &manager, "--node", &node], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("requires the cluster key"), "{}", stderr(&out));
    let out = run_remora(
        &[
            "drain",
            "--manager",
            &manager,
            "--node",
            &node,
            "--cluster-key-file",
            wrong.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    assert_eq!(await_refusals(&c, "manager.log", 4), 4);
    let st = c.status().unwrap();
    assert!(
        st.memory_nodes
            .iter()
            .all(|m| m.state == remora_proto::NodeState::Alive),
        "a refused drain changed the cluster: {st:?}"
    );

    // With the key (flag or environment) both work.
    let out = run_remora(&["status", "--manager", &manager, "--cluster-key-file", &key], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&node));
    let out = Command::new(BIN)
        .args(["drain", "--manager", &manager, "--node", &node])
        .env("REMORA_CLUSTER_KEY_FILE", &key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    c.wait_until(Duration::from_secs(5), "node 1 draining", |s| {
        s.memory_nodes
            .iter()
            .any(|m| m.addr == node && m.state == remora_proto::NodeState::Draining)
    })
    .unwrap();
}

#[test]
fn a_replayed_handshake_is_refused_by_the_manager() {
    let c = cluster(1, 128 * MIB, 64 * MIB);
    // A recording proxy between a keyed admin client and the manager.
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let paddr = proxy.local_addr().unwrap().to_string();
    let target = c.manager_addr().to_string();
    let recorder = thread::spawn(move || {
        let (mut client, _) = proxy.accept().unwrap();
        let mut server = TcpStream::connect(&target).unwrap();
        let (mut s2, mut c2) = (server.try_clone().unwrap(), client.try_clone().unwrap());
        let back = thread::spawn(move || {
            let _ = std::io::copy(&mut s2, &mut c2);
        });
        let mut recorded = Vec::new();
        let mut b = [0u8; 4096];
        while let Ok(n @ 1..) = client.read(&mut b) {
            recorded.extend_from_slice(&b[..n]);
            if server.write_all(&b[..n]).is_err() {
                break;
            }
        }
        let _ = server.shutdown(std::net::Shutdown::Both);
        let _ = back.join();
        recorded
    });
    let admin = remora_proto::ManagerConn::connect(&paddr, c.conn_options()).unwrap();
    assert_eq!(admin.status().unwrap().memory_nodes.len(), 1);
    drop(admin);
    let recorded = recorder.join().unwrap();
    let before = refusals(&c, "manager.log");

    // Everything the client sent (hello, challenge, proof, the status request)
    // replayed on a new connection: the manager's nonce differs, so the proof fails.
    let mut replay = TcpStream::connect(c.manager_addr()).unwrap();
    replay.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    replay.write_all(&recorded).unwrap();
    let mut got = Vec::new();
    let _ = replay.read_to_end(&mut got);
    assert_eq!(got.len(), HEADER_LEN + remora_proto::auth::ANSWER_LEN, "got {got:02x?}");
    assert_eq!(&got[..HEADER_LEN], &hello());
    assert_eq!(&got[HEADER_LEN..HEADER_LEN + 4], &remora_proto::auth::TAG_ANSWER);
    assert_eq!(await_refusals(&c, "manager.log", before + 1), before + 1);
    let log = std::fs::read_to_string(c.dir().join("manager.log")).unwrap();
    assert!(log.contains("replayed handshake"), "the refusal says why");
}
