//! Adaptive compaction against real processes: `ec-batch` folds Remote
//! while its memory nodes are idle; a memory node made busy by fault
//! injection (threads spinning in its process) measures its own CPU going
//! up, and compaction switches to Local; once the fault is cleared it
//! switches back. Every object is compared with what was last written.
//! Needs the binary built with `--features fault-injection`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use remora_proto::Fault;
use remora_runtime::{RemBox, Runtime, RuntimeConfig, Stats, scheme};

/// Objects and the version each was last written at.
struct Objects {
    objs: Vec<RemBox<Obj>>,
    versions: Vec<u64>,
    round: usize,
}

impl Objects {
    /// 16 MiB of 2 KiB objects under a 2 MiB budget: most of them far.
    fn new(rt: &Runtime) -> Self {
        let n = 8192;
        let objs = (0..n).map(|i| rt.alloc(obj(i as u64, 0)).unwrap()).collect();
        rt.wait_for_eviction(Duration::from_secs(20)).unwrap();
        Self {
            objs,
            versions: vec![0; n],
            round: 0,
        }
    }

    /// Rewrites a run of 8 objects (about a span) in every 4: their spans
    /// come back dirty and leave holes in their spansets to fold.
    fn churn(&mut self, rt: &Runtime) {
        let r = self.round % 4;
        self.round += 1;
        let mut scope = rt.scope();
        for i in (0..self.objs.len()).filter(|i| (i / 8) % 4 == r) {
            self.versions[i] += 1;
            *self.objs[i].deref_mut(&scope).unwrap() = obj(i as u64, self.versions[i]);
            if i % 32 == 0 {
                scope.renew();
            }
        }
        drop(scope);
        rt.wait_for_eviction(Duration::from_secs(20)).unwrap();
    }

    fn verify(&self, rt: &Runtime, what: &str) {
        let mut scope = rt.scope();
        for (i, o) in self.objs.iter().enumerate() {
            let got = o.deref(&scope).unwrap_or_else(|e| panic!("{what}: object {i}: {e}"));
            let want = obj(i as u64, self.versions[i]);
            assert!(
                got.id == want.id && got.version == want.version && got.words == want.words,
                "{what}: object {i}: wrong bytes (version {} for {})",
                got.version,
                want.version
            );
            if i % 32 == 0 {
                scope.renew();
            }
        }
    }
}

/// Churns until `done` holds of the stats (up to a minute: the cores are
/// shared with other tests).
fn churn_until(rt: &Runtime, objs: &mut Objects, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = rt.stats();
        if done(&st) {
            return st;
        }
        assert!(Instant::now() < deadline, "{what}: never happened: {st:?}");
        objs.churn(rt);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ec_batch_switches_to_local_compaction_while_a_memory_node_is_busy() {
    let c = cluster(7, 64 << 20, 8 << 20);
    let mut cfg = RuntimeConfig::new(c.manager_addr(), 2 << 20);
    cfg.conn = c.conn_options();
    let opts = scheme::SchemeOptions {
        // Fold whenever there is a fold: each round makes few holes.
        compaction_trigger: 0.0,
        ..scheme::SchemeOptions::default()
    };
    cfg.scheme = scheme::make("ec-batch", &opts).unwrap();
    cfg.patience = Duration::from_secs(20);
    cfg.name = "adaptive-test".into();
    let rt = Runtime::connect(cfg).unwrap();
    let mut objs = Objects::new(&rt);

    let idle = churn_until(&rt, &mut objs, "remote folds", |s| s.compactions_remote >= 4);
    assert_eq!(idle.compaction_mode, Some("remote"), "{idle:?}");
    assert_eq!(idle.compactions_local, 0, "idle nodes: {idle:?}");
    // Remote folds send the compute node no delta: only small requests.
    assert_eq!(
        idle.txn_bytes, 0,
        "deltas crossed the compute node in Remote mode: {idle:?}"
    );
    let idle_cpu = c
        .status()
        .unwrap()
        .memory_nodes
        .iter()
        .map(|m| m.load.cpu_permille)
        .max();
    eprintln!("idle: busiest memory node at {idle_cpu:?}‰ of a core; {idle:?}");

    // A node holding our far data spins four threads: its own CPU use
    // goes up for real (its fair share of the two cores, whatever else runs).
    let addr = rt.regions()[0].1.addr.clone();
    let busy_node = c.memnodes().iter().position(|m| m.addr == addr).unwrap();
    c.fault(
        busy_node,
        Fault::Busy {
            threads: 4,
            millis: 120_000,
        },
    )
    .unwrap();
    let busy = churn_until(&rt, &mut objs, "switch to local", |s| {
        s.compaction_mode == Some("local") && s.compactions_local >= 4
    });
    assert!(busy.compaction_switches >= 1, "{busy:?}");
    assert!(busy.memnode_cpu_permille >= 500, "{busy:?}");
    // Local folds bring the deltas to the compute node.
    assert!(
        busy.txn_bytes > 0,
        "no delta reached the compute node in Local mode: {busy:?}"
    );
    // The manager sees it too, from the node's heartbeats.
    let st = c
        .wait_until(
            Duration::from_secs(10),
            "the busy node's heartbeat shows its load",
            |s| {
                s.memory_nodes
                    .iter()
                    .any(|m| m.addr == addr && m.load.cpu_permille >= 500)
            },
        )
        .unwrap();
    eprintln!(
        "busy: {:?}; memory nodes' CPU ‰: {:?}",
        busy,
        st.memory_nodes.iter().map(|m| m.load.cpu_permille).collect::<Vec<_>>()
    );
    let more = churn_until(&rt, &mut objs, "more local folds", |s| {
        s.compactions_local >= busy.compactions_local + 4
    });
    assert!(more.compactions_local > busy.compactions_local);
    assert_eq!(
        more.compactions,
        more.compactions_local + more.compactions_remote,
        "every fold ran in one mode: {more:?}"
    );
    objs.verify(&rt, "while busy");

    // Cleared: once the node calms down, Remote again.
    c.fault(busy_node, Fault::Resume).unwrap();
    let calm = churn_until(&rt, &mut objs, "switch back to remote", |s| {
        s.compaction_mode == Some("remote") && s.compactions_remote > more.compactions_remote
    });
    assert!(calm.compaction_switches >= 2, "{calm:?}");
    objs.verify(&rt, "after the fault");
    assert_eq!(rt.stats().compactions_aborted, 0, "no fold failed: {calm:?}");
}
