//! Workloads that run while a test injects faults or watches the runtime.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use remora_runtime::{RemBox, Runtime, Stats};

use crate::objects::Words;
use crate::verify::{renew_every, verify};

/// Shared state of [`skewed_worker`]s: the objects, the version each was
/// last written at, the stop flag, what went wrong and the operations done.
pub struct Skewed<'a, const N: usize> {
    /// The runtime the objects live in.
    pub rt: &'a Runtime,
    /// Object `i` is `i` at `versions[i]`.
    pub objs: &'a [RwLock<RemBox<Words<N>>>],
    /// The version each object was last written at.
    pub versions: &'a [AtomicU64],
    /// Set to stop the workers.
    pub stop: AtomicBool,
    /// Every failed or wrong read or write.
    pub errors: Mutex<Vec<String>>,
    /// Operations done.
    pub ops: AtomicU64,
}

impl<'a, const N: usize> Skewed<'a, N> {
    /// The workload's state over `objs` at `versions`.
    pub fn new(rt: &'a Runtime, objs: &'a [RwLock<RemBox<Words<N>>>], versions: &'a [AtomicU64]) -> Self {
        Self {
            rt,
            objs,
            versions,
            stop: Default::default(),
            errors: Default::default(),
            ops: Default::default(),
        }
    }

    /// Asserts that no read or write of the workload failed or read wrong
    /// bytes, naming the first few that did.
    #[track_caller]
    pub fn assert_no_errors(&self) {
        let errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            errors.is_empty(),
            "{} errors, first: {:?}",
            errors.len(),
            &errors[..errors.len().min(5)]
        );
    }
}

/// Thread `t` of the workload the failure tests run while nodes die, until
/// `w.stop`. Thread 0 sweeps every object in turn, `sweep_pause` apart, so
/// cold spans come back from far memory (some from or around dead nodes);
/// the others mostly hit a hot 1/32 of the objects, and a quarter of their
/// accesses write. Every read is checked against the version last written.
pub fn skewed_worker<const N: usize>(t: u64, w: &Skewed<'_, N>, sweep_pause: Duration) {
    let n = w.objs.len() as u64;
    let mut x = t.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut sweep = 0u64;
    let fail = |m: String| w.errors.lock().unwrap().push(m);
    while !w.stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = if t == 0 {
            std::thread::sleep(sweep_pause);
            sweep += 1;
            sweep % n
        } else {
            (x >> 8) % (n / 32)
        };
        if let Err(e) = access(w.rt, w.objs, w.versions, i as usize, t != 0 && x % 4 == 0) {
            fail(e);
        }
        w.ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// One access to object `i` of `objs` (object `i` is `i` at
/// `versions[i]`): a write of the next version, or a read checked against
/// the version last written. Says what went wrong, if anything.
pub fn access<const N: usize>(
    rt: &Runtime,
    objs: &[RwLock<RemBox<Words<N>>>],
    versions: &[AtomicU64],
    i: usize,
    write: bool,
) -> Result<(), String> {
    let scope = rt.scope();
    if write {
        let mut g = objs[i].write().unwrap_or_else(|p| p.into_inner());
        let v = versions[i].load(Ordering::Relaxed) + 1;
        let o = g.deref_mut(&scope).map_err(|e| format!("write {i}: {e}"))?;
        *o = Words::new(i as u64, v);
        versions[i].store(v, Ordering::Relaxed);
    } else {
        let g = objs[i].read().unwrap_or_else(|p| p.into_inner());
        let v = versions[i].load(Ordering::Relaxed);
        let o = g.deref(&scope).map_err(|e| format!("read {i}: {e}"))?;
        if !o.is(i as u64, v) {
            return Err(format!("read {i}: got id {} v{}, want v{v}", o.id, o.version));
        }
    }
    Ok(())
}

/// Objects rewritten round after round so their spans come back dirty and
/// leave holes in their spansets for compaction to fold; object `i` is `i`
/// at `versions[i]`.
pub struct Churn<const N: usize> {
    /// The objects.
    pub objs: Vec<RemBox<Words<N>>>,
    /// The version each was last written at.
    pub versions: Vec<u64>,
    run: usize,
    round: usize,
    eviction: Duration,
}

impl<const N: usize> Churn<N> {
    /// `n` objects at version 0, once eviction has caught up (within
    /// `eviction`); each round rewrites runs of `run` objects (about a span).
    pub fn new(rt: &Runtime, n: usize, run: usize, eviction: Duration) -> Self {
        let objs = (0..n).map(|i| rt.alloc(Words::new(i as u64, 0)).unwrap()).collect();
        rt.wait_for_eviction(eviction).unwrap();
        Self {
            objs,
            versions: vec![0; n],
            run,
            round: 0,
            eviction,
        }
    }

    /// Rewrites one run of objects in every four (the next quarter each
    /// round) and waits for eviction to catch up.
    pub fn churn(&mut self, rt: &Runtime) {
        let r = self.round % 4;
        self.round += 1;
        let mut scope = rt.scope();
        for i in (0..self.objs.len()).filter(|i| (i / self.run) % 4 == r) {
            self.versions[i] += 1;
            *self.objs[i].deref_mut(&scope).unwrap() = Words::new(i as u64, self.versions[i]);
            if i % renew_every::<Words<N>>() == 0 {
                scope.renew();
            }
        }
        drop(scope);
        rt.wait_for_eviction(self.eviction).unwrap();
    }

    /// Churns until `done` holds of the stats, for up to `limit`.
    #[track_caller]
    pub fn until(&mut self, rt: &Runtime, what: &str, limit: Duration, done: impl Fn(&Stats) -> bool) -> Stats {
        let deadline = Instant::now() + limit;
        loop {
            let st = rt.stats();
            if done(&st) {
                return st;
            }
            assert!(Instant::now() < deadline, "{what}: never happened: {st:?}");
            self.churn(rt);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Reads every object back and compares it with its latest version.
    #[track_caller]
    pub fn verify(&self, rt: &Runtime, what: &str) {
        verify(rt, &self.objs, |i| self.versions[i], what);
    }
}

/// A load of reads (and one write in five) on objects chosen uniformly, so
/// most need far memory, its operations counted per 100 ms window since it
/// began: for tests that judge how far memory rides out a fault.
pub struct Uniform<'a, const N: usize> {
    /// The runtime the objects live in.
    pub rt: &'a Runtime,
    /// Object `i` is `i` at `versions[i]`.
    pub objs: &'a [RwLock<RemBox<Words<N>>>],
    /// The version each object was last written at.
    pub versions: &'a [AtomicU64],
    /// Set to stop the workers.
    pub stop: AtomicBool,
    /// Every failed or wrong read or write.
    pub errors: Mutex<Vec<String>>,
    windows: Vec<AtomicU64>,
    start: Instant,
}

impl<'a, const N: usize> Uniform<'a, N> {
    /// The load's state, counting `windows` windows of 100 ms from now.
    pub fn new(
        rt: &'a Runtime,
        objs: &'a [RwLock<RemBox<Words<N>>>],
        versions: &'a [AtomicU64],
        windows: usize,
    ) -> Self {
        Self {
            rt,
            objs,
            versions,
            stop: AtomicBool::new(false),
            errors: Mutex::new(Vec::new()),
            windows: (0..windows).map(|_| AtomicU64::new(0)).collect(),
            start: Instant::now(),
        }
    }

    /// Time since the load began.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// One worker, until `stop` (`t` seeds its choices).
    pub fn run(&self, t: u64) {
        let n = self.objs.len() as u64;
        let mut x = (t + 1).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
        while !self.stop.load(Ordering::Relaxed) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if let Err(e) = access(self.rt, self.objs, self.versions, ((x >> 8) % n) as usize, x % 5 == 0) {
                self.errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
            }
            let w = (self.start.elapsed().as_millis() / 100) as usize;
            self.windows[w.min(self.windows.len() - 1)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The operations of each 100 ms window between `from` and `to` since the start.
    pub fn windows_between(&self, from: Duration, to: Duration) -> Vec<u64> {
        let (a, b) = ((from.as_millis() / 100) as usize, (to.as_millis() / 100) as usize);
        self.windows[a.min(self.windows.len())..b.min(self.windows.len())]
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect()
    }

    /// The operations between `from` and `to` since the start.
    pub fn ops_between(&self, from: Duration, to: Duration) -> u64 {
        self.windows_between(from, to).iter().sum()
    }

    /// Fails the test if any operation failed.
    pub fn assert_no_errors(&self) {
        let errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            errors.is_empty(),
            "{} errors, first: {:?}",
            errors.len(),
            &errors[..errors.len().min(5)]
        );
    }

    /// Reads every object back and checks it is at its latest version.
    pub fn verify_all(&self) {
        let mut scope = self.rt.scope();
        for (i, o) in self.objs.iter().enumerate() {
            let v = self.versions[i].load(Ordering::Relaxed);
            let g = o.read().unwrap_or_else(|p| p.into_inner());
            let got = g.deref(&scope).unwrap_or_else(|e| panic!("object {i}: {e}"));
            assert!(
                got.is(i as u64, v),
                "object {i}: got id {} v{}, want v{v}",
                got.id,
                got.version
            );
            if i % renew_every::<Words<N>>() == 0 {
                scope.renew();
            }
        }
    }
}
