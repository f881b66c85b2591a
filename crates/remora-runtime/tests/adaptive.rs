//! Adaptive compaction (`ec-batch`) on in-process memory nodes whose load
//! the test sets: folds run Remote while the nodes are idle, Local once one
//! is busy (no Remote fold after the switch), Remote again once they calm
//! down, and every object keeps its bytes throughout. (Real processes made
//! busy by fault injection: `tests/adaptive.rs` of the workspace.)

use std::time::{Duration, Instant};

use remora_memnode::InProcessCluster;
use remora_runtime::scheme::SchemeOptions;
use remora_runtime::{RemBox, Runtime, RuntimeConfig, Stats, scheme};

mod common;

use common::{KIB, MIB, Obj, obj};

fn runtime(c: &InProcessCluster) -> Runtime {
    let opts = SchemeOptions {
        // Fold whenever there is a fold: each round makes few holes.
        compaction_trigger: 0.0,
        ..SchemeOptions::default()
    };
    let mut cfg = RuntimeConfig::new("unused:0", MIB);
    cfg.scheme = scheme::make("ec-batch", &opts).expect("known scheme");
    cfg.patience = Duration::from_secs(5);
    Runtime::with_backend(cfg, c.backend()).expect("runtime starts")
}

/// Objects and the version each was last written at.
struct Objects {
    objs: Vec<RemBox<Obj>>,
    versions: Vec<u64>,
    round: usize,
}

impl Objects {
    /// 8 MiB of objects under a 1 MiB budget: most of them far.
    fn new(rt: &Runtime) -> Self {
        let n = 8 * KIB;
        let objs = (0..n).map(|i| rt.alloc(obj(i as u64, 0)).unwrap()).collect();
        rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
        Self {
            objs,
            versions: vec![0; n],
            round: 0,
        }
    }

    /// Rewrites a run of 16 objects (about a span) in every 4: their spans
    /// come back dirty and leave holes in their spansets to fold.
    fn churn(&mut self, rt: &Runtime) {
        let r = self.round % 4;
        self.round += 1;
        let mut scope = rt.scope();
        for i in (0..self.objs.len()).filter(|i| (i / 16) % 4 == r) {
            self.versions[i] += 1;
            *self.objs[i].deref_mut(&scope).unwrap() = obj(i as u64, self.versions[i]);
            if i % 64 == 0 {
                scope.renew();
            }
        }
        drop(scope);
        rt.wait_for_eviction(Duration::from_secs(10)).unwrap();
    }

    fn verify(&self, rt: &Runtime) {
        let mut scope = rt.scope();
        for (i, o) in self.objs.iter().enumerate() {
            let got = o.deref(&scope).unwrap_or_else(|e| panic!("object {i}: {e}"));
            assert!(common::is(got, i as u64, self.versions[i]), "object {i}: wrong bytes");
            if i % 64 == 0 {
                scope.renew();
            }
        }
    }
}

/// Churns until `done` holds of the stats (up to 30 s).
fn churn_until(rt: &Runtime, objs: &mut Objects, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(30);
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
fn ec_batch_folds_remote_while_memory_nodes_are_idle_and_local_while_one_is_busy() {
    let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
    let rt = runtime(&c);
    let mut objs = Objects::new(&rt);

    let idle = churn_until(&rt, &mut objs, "remote folds", |s| s.compactions_remote >= 4);
    assert_eq!(idle.compaction_mode, Some("remote"), "{idle:?}");
    assert_eq!(
        (idle.compactions_local, idle.compaction_switches),
        (0, 0),
        "idle nodes: {idle:?}"
    );

    // One busy node is enough: every fold of its groups waits for it.
    let busy_node = rt.regions()[0].1.node;
    c.node(busy_node).unwrap().set_cpu_permille(900);
    let busy = churn_until(&rt, &mut objs, "switch to local", |s| {
        s.compaction_mode == Some("local") && s.compactions_local >= 4
    });
    assert_eq!(busy.compaction_switches, 1, "{busy:?}");
    assert_eq!(busy.memnode_cpu_permille, 900, "{busy:?}");
    // The switch drained the Remote folds in flight: none runs after it.
    let remote_at_switch = busy.compactions_remote;
    assert!(remote_at_switch >= idle.compactions_remote);
    let still = churn_until(&rt, &mut objs, "more local folds", |s| {
        s.compactions_local >= busy.compactions_local + 4
    });
    assert_eq!(
        still.compactions_remote, remote_at_switch,
        "a Remote fold ran while a node was busy"
    );
    assert_eq!(still.compaction_switches, 1, "{still:?}");
    assert_eq!(
        still.compactions,
        still.compactions_local + still.compactions_remote,
        "every fold runs in one mode: {still:?}"
    );
    objs.verify(&rt);

    // Calm again: after a few calm polls, back to Remote.
    c.node(busy_node).unwrap().set_cpu_permille(100);
    let calm = churn_until(&rt, &mut objs, "switch back to remote", |s| {
        s.compaction_mode == Some("remote") && s.compactions_remote >= remote_at_switch + 4
    });
    assert_eq!(calm.compaction_switches, 2, "{calm:?}");
    assert_eq!(calm.memnode_cpu_permille, 100, "{calm:?}");
    objs.verify(&rt);
}

/// Fixed modes never switch, whatever the nodes say.
#[test]
fn fixed_modes_ignore_memory_node_load() {
    for (name, mode) in [("ec-batch-local", "local"), ("ec-batch-remote", "remote")] {
        let c = InProcessCluster::new(7, 32, 2 * MIB as u64);
        for n in c.nodes() {
            n.set_cpu_permille(if mode == "remote" { 2000 } else { 0 });
        }
        let opts = SchemeOptions {
            compaction_trigger: 0.0,
            ..SchemeOptions::default()
        };
        let mut cfg = RuntimeConfig::new("unused:0", MIB);
        cfg.scheme = scheme::make(name, &opts).unwrap();
        cfg.patience = Duration::from_secs(5);
        let rt = Runtime::with_backend(cfg, c.backend()).unwrap();
        let mut objs = Objects::new(&rt);
        let st = churn_until(&rt, &mut objs, name, |s| s.compactions >= 4);
        assert_eq!(st.compaction_mode, Some(mode), "{name}: {st:?}");
        assert_eq!(st.compaction_switches, 0, "{name}: {st:?}");
        let in_mode = if mode == "local" {
            st.compactions_local
        } else {
            st.compactions_remote
        };
        assert_eq!(in_mode, st.compactions, "{name}: {st:?}");
        objs.verify(&rt);
    }
}
