//! The objects of `remora bench micro` (shared with `bench drain` and
//! `bench runtime`): the words object `i` holds at version `v`, derived from
//! `(i, v)` so every read can be checked without a copy; the parallel fill;
//! and the fixed random permutation that scatters hot ranks over spans.

use std::thread;

use anyhow::{Context, anyhow};
use indicatif::ProgressBar;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::STACK;

/// A fixed random permutation of `0..n`: rank `r` (1-based) maps to object `perm[r - 1]`.
pub(crate) fn permutation(n: u64, seed: u64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    p.shuffle(&mut StdRng::seed_from_u64(seed));
    p
}

/// Allocates objects `0..n` of `rt` from `threads` threads (named
/// `{name}-{t}`), object `i` at version 0, wrapped by `wrap`; returns them
/// in index order. Ticks `pb` every 1024 objects.
pub(crate) fn alloc_parallel<const W: usize, T: Send>(
    rt: &remora_runtime::Runtime,
    n: u64,
    threads: u64,
    name: &str,
    pb: &ProgressBar,
    wrap: impl Fn(remora_runtime::RemBox<[u64; W]>) -> T + Sync,
) -> anyhow::Result<Vec<T>> {
    let chunk = n.div_ceil(threads.max(1));
    let wrap = &wrap;
    let parts: Vec<anyhow::Result<Vec<T>>> = thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let range = (t * chunk).min(n)..((t + 1) * chunk).min(n);
                thread::Builder::new()
                    .name(format!("{name}-{t}"))
                    .stack_size(STACK)
                    .spawn_scoped(s, move || -> anyhow::Result<Vec<T>> {
                        let mut out = Vec::with_capacity(range.clone().count());
                        for i in range {
                            let mut v = [0u64; W];
                            fill(&mut v, base(i, 0));
                            let b = rt.alloc(v).with_context(|| format!("allocating object {i} of {n}"))?;
                            out.push(wrap(b));
                            if i % 1024 == 1023 {
                                pb.inc(1024);
                            }
                        }
                        Ok(out)
                    })
            })
            .collect();
        join_all(handles, "fill")
    });
    let mut all = Vec::with_capacity(usize::try_from(n)?);
    for p in parts {
        all.extend(p?);
    }
    Ok(all)
}

/// Joins scoped threads that return results; a panic or a failed spawn
/// becomes an error naming what the threads were for.
pub(crate) fn join_all<R>(
    handles: Vec<std::io::Result<thread::ScopedJoinHandle<'_, anyhow::Result<R>>>>,
    what: &str,
) -> Vec<anyhow::Result<R>> {
    handles
        .into_iter()
        .map(|h| match h {
            Ok(h) => h.join().unwrap_or_else(|_| Err(anyhow!("a {what} thread panicked"))),
            Err(e) => Err(anyhow!("cannot start a {what} thread: {e}")),
        })
        .collect()
}

pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of the words of object `index` at `version`.
pub(crate) fn base(index: u64, version: u64) -> u64 {
    splitmix(splitmix(index) ^ version.wrapping_mul(0xD6E8_FEB8_6659_FD93))
}

fn word(base: u64, j: usize) -> u64 {
    base ^ (j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

pub(crate) fn fill(obj: &mut [u64], base: u64) {
    for (j, w) in obj.iter_mut().enumerate() {
        *w = word(base, j);
    }
}

pub(crate) fn check(obj: &[u64], base: u64) -> bool {
    obj.iter().enumerate().all(|(j, &w)| w == word(base, j))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_depend_on_index_and_version() {
        let mut a = [0u64; 8];
        fill(&mut a, base(3, 0));
        assert!(check(&a, base(3, 0)));
        assert!(!check(&a, base(3, 1)));
        assert!(!check(&a, base(4, 0)));
        let p = permutation(1000, 7);
        let mut s = p.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<u32>>());
    }
}
