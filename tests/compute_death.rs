//! A compute node killed with SIGKILL in the middle of a swap-out, a
//! remote compaction (ec-batch-remote) and an in-place fill (ec-2pc), both
//! two-phase commits. The compute node is a real process (`remora
//! compute-worker`); a memory node that executes requests but drops its
//! replies holds the worker inside the step until the kill lands.
//!
//! Afterwards: the manager frees the dead node's regions (after its
//! heartbeat timeout); memory nodes keep nothing it staged; every
//! capability it held, and a delta a peer would still push for it, is
//! refused as stale; and a new compute node given the same regions reads
//! zeros and then exactly its own writes, through the raw data path and
//! through a runtime of the same scheme. A last test delays a memory
//! node so that a parity delta one of them pushes during a fold arrives
//! only after the revoke: the parity node refuses it (and counts it).

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use common::{Obj2K, Words, assert_bytes_eq, obj, pattern};
use remora_cluster::LocalCluster;
use remora_proto::msg::{ComputeState, Fault};
use remora_proto::{
    Cap, DeltaTarget, MemNodeClient, MemTransport, Member, RegionId, RemoteError, Rights, RpcError, Token, TxnId, TxnOp,
};
use remora_runtime::{RemBox, Runtime, scheme};

const MIB: u64 = 1 << 20;
const NODES: usize = 3;
/// Generous for a loaded 2-core machine running debug builds.
const PATIENCE: Duration = Duration::from_secs(120);

/// A region the worker printed: its owner capability and node.
#[derive(Debug, Clone)]
struct Held {
    cap: Cap,
    addr: String,
}

/// The compute-node process and what it has said.
struct Worker {
    child: Child,
    lines: Receiver<String>,
    filled: bool,
    held: BTreeMap<RegionId, Held>,
    stats: BTreeMap<String, u64>,
    wrong: Vec<String>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Worker {
    fn spawn(c: &LocalCluster, scheme: &str, compaction_threads: usize) -> Worker {
        let mut child = Command::new(common::BIN)
            .args([
                "--log",
                "warn",
                "compute-worker",
                "--manager",
                c.manager_addr(),
                "--scheme",
                scheme,
            ])
            .args([
                "--k",
                "2",
                "--m",
                "1",
                "--objects",
                "1500",
                "--budget",
                "1MiB",
                "--print-caps",
            ])
            .args(["--compaction-threads", &compaction_threads.to_string()])
            .env("REMORA_CLUSTER_KEY_FILE", c.key_file())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("worker starts");
        let out = child.stdout.take().expect("piped");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(l) = line else { return };
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Worker {
            child,
            lines: rx,
            filled: false,
            held: BTreeMap::new(),
            stats: BTreeMap::new(),
            wrong: Vec::new(),
        }
    }

    fn take(&mut self, line: &str) {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("filled") => self.filled = true,
            Some("cap") => {
                let f: Vec<&str> = words.collect();
                assert_eq!(f.len(), 4, "cap line {line:?}");
                let region = RegionId(f[0].parse().unwrap());
                let cap = Cap {
                    region,
                    rights: Rights::ReadWrite,
                    token: Token::from_hex(f[2]).expect("token hex"),
                    epoch: f[1].parse().unwrap(),
                };
                self.held.insert(
                    region,
                    Held {
                        cap,
                        addr: f[3].to_string(),
                    },
                );
            }
            Some("stats") => {
                for kv in words {
                    if let Some((k, v)) = kv.split_once('=') {
                        self.stats.insert(k.to_string(), v.parse().unwrap_or(0));
                    }
                }
            }
            Some("wrong") => self.wrong.push(line.to_string()),
            _ => {}
        }
    }

    /// Reads lines until `until` holds, or panics after `timeout`.
    fn wait(&mut self, timeout: Duration, what: &str, until: impl Fn(&Worker) -> bool) {
        let deadline = Instant::now() + timeout;
        while !until(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok(l) => self.take(&l),
                Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(e) => panic!("worker: {what}: {e:?} (exit: {:?})", self.child.try_wait()),
            }
        }
    }

    /// Reads whatever lines are waiting.
    fn drain(&mut self) {
        while let Ok(l) = self.lines.try_recv() {
            self.take(&l);
        }
    }

    fn stat(&self, k: &str) -> u64 {
        self.stats.get(k).copied().unwrap_or(0)
    }
}

/// Transactions staged on each memory node now.
/// Waits until the manager has declared the worker dead and freed every
/// region it held.
fn wait_reaped(c: &LocalCluster) {
    c.wait_until(PATIENCE, "the worker declared dead and its regions freed", |st| {
        st.compute_nodes
            .iter()
            .all(|n| n.state == ComputeState::Dead && n.regions == 0)
            && st.memory_nodes.iter().all(|m| m.regions_free == m.regions_total)
    })
    .unwrap();
}

fn staged(c: &LocalCluster) -> Vec<u64> {
    (0..NODES)
        .map(|i| c.memnode_client(i).unwrap().stats().unwrap().staged_txns)
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    SwapOut,
    Compaction,
    Fill,
}

fn die_during(step: Step) {
    let (scheme_name, compaction) = match step {
        Step::SwapOut => ("ec-batch", 0),
        Step::Compaction => ("ec-batch-remote", 1),
        Step::Fill => ("ec-2pc", 0),
    };
    let c = common::cluster(NODES, 24 * MIB, 2 * MIB);
    let mut w = Worker::spawn(&c, scheme_name, compaction);
    let busy = match step {
        Step::SwapOut => "swap_outs",
        Step::Compaction => "compactions",
        Step::Fill => "txn_requests",
    };
    let t0 = Instant::now();
    w.wait(PATIENCE, "filled and working", |w| w.filled && w.stat(busy) > 0);
    eprintln!(
        "{step:?}: worker filled and working after {:?}: {:?}",
        t0.elapsed(),
        w.stats
    );

    let silent = NODES - 1;
    let staged_at_kill = match step {
        Step::SwapOut => {
            // Node 2 executes writes but answers nothing. Eviction never
            // stops under this workload, and every spanset has a member
            // there: once a write reaches it, the swap-out that sent it
            // waits for a reply that never comes (until its call timeout,
            // far longer than the few milliseconds before the kill).
            c.fault(silent, Fault::DropReplies).unwrap();
            let node = c.memnode_client(silent).unwrap();
            let deadline = Instant::now() + PATIENCE;
            while node.stats().unwrap().unanswered_writes == 0 {
                assert!(Instant::now() < deadline, "no swap-out reached the silent node");
                std::thread::sleep(Duration::from_millis(5));
            }
            Vec::new()
        }
        Step::Compaction | Step::Fill => {
            // Node 2 answers late (ec-2pc) or not at all (compaction: a
            // silent node would stall the swap-ins that make new holes):
            // a transaction with a member there keeps its other members
            // staged meanwhile. Wait until one has stayed staged for half a
            // second: its owner waits on node 2.
            let fault = match step {
                Step::Fill => Fault::DropReplies,
                _ => Fault::Delay { micros: 2_000_000 },
            };
            c.fault(silent, fault).unwrap();
            let deadline = Instant::now() + PATIENCE;
            let mut since: Option<Instant> = None;
            loop {
                assert!(Instant::now() < deadline, "no transaction ever stuck: {:?}", staged(&c));
                if staged(&c).iter().sum::<u64>() > 0 {
                    let s = *since.get_or_insert_with(Instant::now);
                    if s.elapsed() > Duration::from_millis(500) {
                        break;
                    }
                } else {
                    since = None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            staged(&c)
        }
    };
    w.drain();
    eprintln!(
        "{step:?}: killing the worker at {:?}, staged {staged_at_kill:?}, {:?}",
        t0.elapsed(),
        w.stats
    );
    w.child.kill().unwrap();
    w.child.wait().unwrap();
    w.drain();
    assert!(w.wrong.is_empty(), "the worker read wrong bytes: {:?}", w.wrong);
    if step != Step::SwapOut {
        // Nobody can commit or abort it now: it is still there.
        let after = staged(&c);
        assert!(
            after.iter().sum::<u64>() > 0,
            "the kill did not land inside the transaction: staged {staged_at_kill:?}, then {after:?}"
        );
    }
    c.fault(silent, Fault::Resume).unwrap();

    // The manager frees the dead node's regions after its heartbeat timeout.
    wait_reaped(&c);
    eprintln!("{step:?}: regions freed at {:?}", t0.elapsed());
    // Memory nodes dropped what it had staged with its regions.
    assert_eq!(staged(&c), vec![0; NODES], "prepared state left after the revoke");

    // Every capability it held is stale now, and so is a delta a peer
    // would still push for it.
    assert!(!w.held.is_empty(), "the worker printed no capabilities");
    let held: Vec<Held> = w.held.values().cloned().collect();
    for h in &held {
        let cl = MemNodeClient::connect(&h.addr, common::quick_opts(&c)).unwrap();
        let mut buf = vec![0u8; 4096];
        expect_stale(cl.read(h.cap, 0, &mut buf), &h.cap, "late read");
        expect_stale(cl.write(h.cap, 0, &[7; 4096]), &h.cap, "late write");
        let apply = TxnOp::Apply {
            to: Member {
                cap: h.cap.apply_delta(),
                offset: 0,
                len: 4096,
                generation: 0,
            },
        };
        expect_stale(
            cl.prepare(TxnId(u64::MAX), apply, &[7; 4096], None),
            &h.cap,
            "late delta",
        );
    }
    // A data node asked (late) to change a member and push its delta to a
    // parity member on another node: refused at the data node already.
    if let Some((d, p)) = held
        .iter()
        .find_map(|d| held.iter().find(|p| p.addr != d.addr).map(|p| (d, p)))
    {
        let cl = MemNodeClient::connect(&d.addr, common::quick_opts(&c)).unwrap();
        let op = TxnOp::Put {
            to: Member {
                cap: d.cap,
                offset: 0,
                len: 4096,
                generation: 0,
            },
            return_delta: false,
            targets: vec![DeltaTarget {
                addr: p.addr.clone(),
                member: Member {
                    cap: p.cap.apply_delta(),
                    offset: 0,
                    len: 4096,
                    generation: 0,
                },
                coef: 1,
            }],
        };
        expect_stale(
            cl.prepare(TxnId(u64::MAX - 1), op, &[7; 4096], None),
            &d.cap,
            "late put",
        );
    }
    assert_eq!(staged(&c), vec![0; NODES], "a late request staged something");

    new_owner_sees_only_its_writes(&c, &held);
    new_runtime_reads_back_what_it_wrote(&c, scheme_name, compaction);
}

#[track_caller]
fn expect_stale(r: Result<(), RpcError>, cap: &Cap, what: &str) {
    match r {
        Err(RpcError::Remote(RemoteError::StaleEpoch {
            region,
            presented,
            current,
        })) => {
            assert_eq!(region, cap.region, "{what}");
            assert_eq!(presented, cap.epoch, "{what}");
            assert!(current > presented, "{what}: epoch {current} not past {presented}");
        }
        other => panic!("{what} of {}: expected StaleEpoch, got {other:?}", cap.region),
    }
}

/// A compute node that takes every region reads zeros in each (nothing of
/// the dead node's, applied or half-applied), then exactly what it wrote.
fn new_owner_sees_only_its_writes(c: &LocalCluster, held: &[Held]) {
    let total: u64 = c.status().unwrap().memory_nodes.iter().map(|m| m.regions_total).sum();
    let b = common::session(c, "next-owner");
    let grants = b.alloc(total as u32, false, &[]).unwrap();
    for h in held {
        let g = grants
            .iter()
            .find(|g| g.cap.region == h.cap.region)
            .unwrap_or_else(|| panic!("{} not handed out again", h.cap.region));
        assert!(g.cap.epoch > h.cap.epoch, "{}: epoch did not move on", g.cap.region);
    }
    for g in &grants {
        let cl = MemNodeClient::connect(&g.addr, common::quick_opts(c)).unwrap();
        let mut buf = vec![0xEEu8; g.size as usize];
        cl.read(g.cap, 0, &mut buf).unwrap();
        assert_bytes_eq(
            &buf,
            &vec![0u8; buf.len()],
            &format!("{} before the new owner wrote", g.cap.region),
        );
        let mine = pattern(g.cap.region.0, 0, g.size as usize);
        cl.write(g.cap, 0, &mine).unwrap();
        cl.read(g.cap, 0, &mut buf).unwrap();
        assert_bytes_eq(&buf, &mine, &format!("{} read back by the new owner", g.cap.region));
    }
    for g in &grants {
        b.free(g.cap.region).unwrap();
    }
}

/// A runtime of the same scheme on the freed regions: every object reads
/// back as written, after its own swap-outs and (by scheme) transactions.
fn new_runtime_reads_back_what_it_wrote(c: &LocalCluster, scheme_name: &str, compaction: usize) {
    let opts = scheme::SchemeOptions {
        k: 2,
        m: 1,
        compaction_threads: compaction,
        compaction_trigger: 0.0,
        ..scheme::SchemeOptions::default()
    };
    let mut cfg = common::runtime_config(c, "survivor", 512 << 10);
    cfg.scheme = scheme::make(scheme_name, &opts).unwrap();
    let rt = Runtime::connect(cfg).unwrap();
    let mut objs: Vec<RemBox<Obj2K>> = (0..1000).map(|i| rt.alloc(obj(i, 0)).unwrap()).collect();
    for round in 1..=2u64 {
        for (i, o) in objs.iter_mut().enumerate() {
            if i as u64 % 2 == round % 2 {
                let scope = rt.scope();
                *o.deref_mut(&scope).unwrap() = obj(i as u64, round);
            }
        }
    }
    for (i, o) in objs.iter().enumerate() {
        let scope = rt.scope();
        let want = if i % 2 == 0 { 2 } else { 1 };
        assert!(
            Words::is(o.deref(&scope).unwrap(), i as u64, want),
            "object {i} did not read back as version {want}"
        );
    }
    assert!(rt.stats().traffic.swap_outs > 0, "the survivor never used far memory");
}

#[test]
fn compute_node_killed_during_a_swap_out() {
    die_during(Step::SwapOut);
}

#[test]
fn compute_node_killed_during_a_remote_compaction() {
    die_during(Step::Compaction);
}

#[test]
fn compute_node_killed_during_an_ec_2pc_fill() {
    die_during(Step::Fill);
}

/// A parity delta still on its way between memory nodes when its compute
/// node dies. One memory node answers 8 s late: a data node that staged a
/// fold's move pushes its delta to it as the parity node, where it waits;
/// meanwhile the worker is killed and the manager revokes its regions. The
/// delta then arrives with the old epoch and is refused, staging nothing.
#[test]
fn late_peer_delta_of_a_dead_compute_node_is_refused() {
    const DELAY: Duration = Duration::from_secs(8);
    let c = common::cluster(NODES, 24 * MIB, 2 * MIB);
    let mut w = Worker::spawn(&c, "ec-batch-remote", 1);
    w.wait(PATIENCE, "filled and compacting", |w| {
        w.filled && w.stat("compactions") > 0
    });
    // Node 2 answers 8 s late: a delta pushed to it (it holds the parity
    // of some stripe groups) waits there, while folds elsewhere go on. One
    // pushed just before the delay was set may still be on its way
    // briefly, so wait for one stuck for a while.
    let slow = NODES - 1;
    c.fault(
        slow,
        Fault::Delay {
            micros: DELAY.as_micros() as u64,
        },
    )
    .unwrap();
    let in_flight = || -> u64 {
        (0..NODES)
            .map(|i| c.memnode_client(i).unwrap().stats().unwrap().deltas_in_flight)
            .sum()
    };
    let deadline = Instant::now() + PATIENCE;
    let mut since: Option<Instant> = None;
    loop {
        assert!(
            Instant::now() < deadline,
            "no delta pushed to the slow node ever got stuck there"
        );
        if in_flight() > 0 {
            if since.get_or_insert_with(Instant::now).elapsed() > Duration::from_millis(300) {
                break;
            }
        } else {
            since = None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let pushed_at = since.unwrap_or_else(Instant::now);
    w.child.kill().unwrap();
    w.child.wait().unwrap();
    w.drain();
    assert!(w.wrong.is_empty(), "the worker read wrong bytes: {:?}", w.wrong);
    wait_reaped(&c);
    let freed_after = pushed_at.elapsed();
    assert!(
        freed_after < DELAY,
        "the regions were freed only {freed_after:?} after the delta was pushed: the delta may have come first"
    );
    let stats = |i: usize| c.memnode_client(i).unwrap().stats().unwrap();
    // The delta arrives a delay after it was sent, whatever the machine's
    // speed; give it that and then some.
    let deadline = Instant::now() + DELAY + PATIENCE;
    while (0..NODES).map(|i| stats(i).stale_deltas_refused).sum::<u64>() == 0 {
        assert!(
            Instant::now() < deadline,
            "no late delta arrived (regions freed {freed_after:?} after the delta was pushed): {:?}",
            (0..NODES).map(stats).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(staged(&c), vec![0; NODES], "a late delta or move staged something");
    c.fault(slow, Fault::Resume).unwrap();
    let held: Vec<Held> = w.held.values().cloned().collect();
    new_owner_sees_only_its_writes(&c, &held);
}
