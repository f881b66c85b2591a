//! Reading objects back and comparing them, and waiting on the runtime.

use std::time::{Duration, Instant};

use remora_runtime::{RemBox, Runtime, RuntimeError, Stats};

use crate::objects::Words;

/// How many objects of type `T` a loop reads between two renewals of its
/// scope (a scope keeps what it dereferenced local): about 64 KiB of them.
pub fn renew_every<T>() -> usize {
    (64 * crate::KIB / size_of::<T>()).max(1)
}

/// Reads every object back, object `i` expected to be `i` at `version(i)`,
/// and compares every word; returns the first error a read gave.
pub fn try_verify<const N: usize>(
    rt: &Runtime,
    objs: &[RemBox<Words<N>>],
    version: impl Fn(usize) -> u64,
) -> Result<(), RuntimeError> {
    let mut scope = rt.scope();
    for (i, o) in objs.iter().enumerate() {
        let got = o.deref(&scope)?;
        got.check(i as u64, version(i));
        if i % renew_every::<Words<N>>() == 0 {
            scope.renew();
        }
    }
    Ok(())
}

/// [`try_verify`], failing the test (naming `what`) on a read error.
#[track_caller]
pub fn verify<const N: usize>(rt: &Runtime, objs: &[RemBox<Words<N>>], version: impl Fn(usize) -> u64, what: &str) {
    if let Err(e) = try_verify(rt, objs, version) {
        panic!("{what}: {e}: {:?}", rt.stats());
    }
}

/// Node failures seen have all settled: at least `failures` recoveries
/// done and none under way.
pub fn recovered(st: &Stats, failures: u64) -> bool {
    st.scheme.recoveries >= failures && st.scheme.recovering == 0
}

/// Polls the runtime's stats until `done` holds of them and returns them;
/// fails the test after `limit` (generous limits: a loaded 2-core machine).
#[track_caller]
pub fn wait_stats(rt: &Runtime, what: &str, limit: Duration, done: impl Fn(&Stats) -> bool) -> Stats {
    let start = Instant::now();
    loop {
        let st = rt.stats();
        if done(&st) {
            return st;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}: {st:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `cond` until it holds; fails the test after `limit`.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
