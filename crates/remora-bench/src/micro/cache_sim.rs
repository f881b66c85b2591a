//! Simulated caches over the measured access stream, so that every record of
//! `remora bench micro` puts its measured miss ratio beside what an ideal
//! object-granularity LRU and an S3-FIFO cache of the same number of objects
//! would have missed on exactly the same operations.
//!
//! The stream is the object index of every measured operation, the threads'
//! streams merged by issue time. Both simulated caches are first warmed, not
//! counted, by a stream of their own drawn from the same distribution (the
//! same Zipf over the same permutation, another seed) until they are full
//! and then for 4 more capacities' worth of accesses; then they are counted
//! over the measured stream. The measured stores were warmed by the fill and
//! a warm-up phase before measuring, so the simulated ones start from the
//! steady state too, not cold. (Warming on the measured stream itself is
//! wrong when it touches fewer distinct objects than the cache holds: a
//! second pass over it then hits every time.)
//!
//! Beside the two caches of the budget's size, the LRU's misses at every size
//! come from one pass of Mattson's stack algorithm over the same warm-up and
//! stream ([`LruCurve`]), so a record can say how large an LRU misses as
//! often as the store did (`LRU-eq objs`). Set beside the objects the store
//! kept locally, that splits a store's excess misses over the ideal LRU into
//! capacity it did not use and capacity it used on objects an LRU would not
//! keep.
//!
//! The LRU of the budget's size is read off that curve too (the `lru`
//! crate's LRU checks the curve in the tests). S3-FIFO (Yang et al., SOSP'23) is written here
//! after the paper's Algorithm 1 and the authors' reference simulator
//! (libCacheSim's `S3FIFOv0`): a small FIFO of 10 % of the objects, a main
//! FIFO of 90 % run as a CLOCK with 2-bit frequencies (capped at 3), and a
//! ghost FIFO of object ids (90 % of the capacity). New objects enter the
//! small queue (the main one if their id is in the ghost); an object leaving
//! the small queue moves to the main one if it was hit at least twice there,
//! else its id goes to the ghost; an object at the main queue's tail is
//! reinserted with its frequency decremented while that is above 0.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
#[cfg(test)]
use std::num::NonZeroUsize;

#[cfg(test)]
use lru::LruCache;

/// A cache that counts hits over object ids.
pub(crate) trait Policy {
    /// Accesses object `x` (inserting it on a miss); whether it was a hit.
    fn access(&mut self, x: u32) -> bool;
    /// Objects cached now.
    fn len(&self) -> usize;
}

/// Misses of `p` over `trace` (one pass, from its current state).
pub(crate) fn count_misses<P: Policy>(p: &mut P, trace: &[u32]) -> u64 {
    trace.iter().filter(|&&x| !p.access(x)).count() as u64
}

/// Accesses to warm a cache with after it is full, in capacities.
const WARM_AFTER_FULL: usize = 4;
/// Most warm-up accesses, in capacities (a skewed stream may never fill the cache).
const WARM_MAX: usize = 32;

/// Warms `p`, a cache of `capacity` objects, with accesses from `next` until
/// it is full and then [`WARM_AFTER_FULL`] capacities more; at most
/// [`WARM_MAX`] capacities (plus 2^20) in all. Returns the accesses made.
pub(crate) fn warm<P: Policy>(p: &mut P, capacity: usize, mut next: impl FnMut() -> u32) -> usize {
    let max = capacity.saturating_mul(WARM_MAX).saturating_add(1 << 20);
    let mut until = max;
    for done in 0..max {
        if done >= until {
            return done;
        }
        p.access(next());
        if until == max && p.len() >= capacity {
            until = (done + 1)
                .saturating_add(capacity.saturating_mul(WARM_AFTER_FULL))
                .min(max);
        }
    }
    max
}

/// Counts the distinct objects accessed: what any LRU holds while it fills
/// (it evicts nothing before), so it is warmed by as many accesses as an
/// LRU of the same capacity.
struct Seen {
    seen: Vec<bool>,
    distinct: usize,
}

impl Seen {
    fn new(ids: usize) -> Self {
        Self {
            seen: vec![false; ids],
            distinct: 0,
        }
    }
}

impl Policy for Seen {
    fn access(&mut self, x: u32) -> bool {
        match self.seen.get_mut(x as usize) {
            Some(s) if *s => true,
            Some(s) => {
                *s = true;
                self.distinct += 1;
                false
            }
            None => false,
        }
    }

    fn len(&self) -> usize {
        self.distinct
    }
}

/// An ideal LRU cache of a number of objects.
#[cfg(test)]
pub(crate) struct Lru(LruCache<u32, ()>);

#[cfg(test)]
impl Lru {
    /// An LRU cache of `capacity` objects (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        Self(LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN)))
    }
}

#[cfg(test)]
impl Policy for Lru {
    fn access(&mut self, x: u32) -> bool {
        if self.0.get(&x).is_some() {
            true
        } else {
            self.0.put(x, ());
            false
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Where an object is in the S3-FIFO cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loc {
    Out,
    Small,
    Main,
    Ghost,
}

/// An S3-FIFO cache of a number of objects with ids below a known bound;
/// see the module docs.
pub(crate) struct S3Fifo {
    capacity: usize,
    main_cap: usize,
    ghost_cap: usize,
    small: VecDeque<u32>,
    main: VecDeque<u32>,
    /// Ghost ids with the stamp they entered under; an entry is stale once
    /// its object left the ghost (hit, or re-entered under a newer stamp).
    ghost: VecDeque<(u32, u64)>,
    ghost_live: usize,
    stamp: u64,
    loc: Vec<Loc>,
    freq: Vec<u8>,
    ghost_stamp: Vec<u64>,
}

/// Frequencies count up to this.
const MAX_FREQ: u8 = 3;
/// Hits in the small queue an object needs to move to the main one.
const MOVE_TO_MAIN: u8 = 2;

impl S3Fifo {
    /// An S3-FIFO cache of `capacity` objects (at least 1) over ids `0..ids`.
    pub(crate) fn new(capacity: usize, ids: usize) -> Self {
        let capacity = capacity.max(1);
        let small_cap = (capacity / 10).max(1);
        Self {
            capacity,
            main_cap: capacity - small_cap.min(capacity),
            ghost_cap: capacity * 9 / 10,
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
            ghost_live: 0,
            stamp: 0,
            loc: vec![Loc::Out; ids],
            freq: vec![0; ids],
            ghost_stamp: vec![0; ids],
        }
    }

    fn insert(&mut self, x: u32, to_main: bool) {
        while self.len() >= self.capacity {
            self.evict();
        }
        let i = x as usize;
        self.freq[i] = 0;
        if to_main {
            self.main.push_back(x);
            self.loc[i] = Loc::Main;
        } else {
            self.small.push_back(x);
            self.loc[i] = Loc::Small;
        }
    }

    fn evict(&mut self) {
        if self.main.len() > self.main_cap || self.small.is_empty() {
            self.evict_main();
        } else {
            self.evict_small();
        }
    }

    /// Moves small-queue tails hit often enough to the main queue until one
    /// leaves for the ghost (or the small queue is empty).
    fn evict_small(&mut self) {
        while let Some(t) = self.small.pop_front() {
            let i = t as usize;
            if self.freq[i] >= MOVE_TO_MAIN {
                self.freq[i] = 0;
                self.main.push_back(t);
                self.loc[i] = Loc::Main;
            } else {
                self.push_ghost(t);
                return;
            }
        }
    }

    /// CLOCK over the main queue: reinserts tails with a frequency left
    /// (decremented) until one with none leaves the cache.
    fn evict_main(&mut self) {
        while let Some(t) = self.main.pop_front() {
            let i = t as usize;
            if self.freq[i] > 0 {
                self.freq[i] -= 1;
                self.main.push_back(t);
            } else {
                self.loc[i] = Loc::Out;
                return;
            }
        }
    }

    fn push_ghost(&mut self, x: u32) {
        let i = x as usize;
        if self.ghost_cap == 0 {
            self.loc[i] = Loc::Out;
            return;
        }
        while self.ghost_live >= self.ghost_cap {
            let Some((g, s)) = self.ghost.pop_front() else { break };
            let gi = g as usize;
            if self.loc[gi] == Loc::Ghost && self.ghost_stamp[gi] == s {
                self.loc[gi] = Loc::Out;
                self.ghost_live -= 1;
            }
        }
        self.stamp += 1;
        self.loc[i] = Loc::Ghost;
        self.ghost_stamp[i] = self.stamp;
        self.ghost.push_back((x, self.stamp));
        self.ghost_live += 1;
    }
}

impl Policy for S3Fifo {
    fn access(&mut self, x: u32) -> bool {
        let i = x as usize;
        match self.loc[i] {
            Loc::Small | Loc::Main => {
                self.freq[i] = (self.freq[i] + 1).min(MAX_FREQ);
                true
            }
            Loc::Ghost => {
                self.loc[i] = Loc::Out;
                self.ghost_live -= 1;
                self.insert(x, true);
                false
            }
            Loc::Out => {
                self.insert(x, false);
                false
            }
        }
    }

    fn len(&self) -> usize {
        self.small.len() + self.main.len()
    }
}

/// The simulated caches' misses over one record's access stream.
#[derive(Debug, Clone)]
pub(crate) struct SimMisses {
    /// Objects each simulated cache holds.
    pub(crate) capacity: u64,
    /// Operations of the stream (the measured ones, up to the trace cap).
    pub(crate) trace_ops: u64,
    /// Measured operations left out of the stream.
    pub(crate) dropped: u64,
    /// Accesses each simulated cache was warmed with before counting.
    pub(crate) warm_ops: u64,
    pub(crate) lru: u64,
    pub(crate) s3fifo: u64,
    /// An LRU's misses at every size over the same warm-up and stream.
    pub(crate) curve: LruCurve,
}

impl SimMisses {
    pub(crate) fn lru_ratio(&self) -> Option<f64> {
        (self.trace_ops > 0).then(|| self.lru as f64 / self.trace_ops as f64)
    }

    pub(crate) fn s3fifo_ratio(&self) -> Option<f64> {
        (self.trace_ops > 0).then(|| self.s3fifo as f64 / self.trace_ops as f64)
    }

    /// The fewest objects an LRU needs to miss at most `ratio` of the
    /// stream's operations (`None` without a stream, or if even an LRU of
    /// every object misses more: its first accesses miss at any size).
    pub(crate) fn lru_equivalent(&self, ratio: f64) -> Option<u64> {
        if self.trace_ops == 0 {
            return None;
        }
        self.curve.capacity_for((ratio * self.trace_ops as f64).round() as u64)
    }
}

/// An ideal LRU's misses over a stream at every cache size, from the stack
/// distance of each access (Mattson et al. 1970): an LRU of `c` objects hits
/// exactly the accesses whose object was used by fewer than `c` distinct
/// others since its last access. The distances come from a Fenwick tree
/// over access positions that marks each object's latest one.
#[derive(Debug, Clone, Default)]
pub(crate) struct LruCurve {
    /// `misses[c]`: misses of an LRU of `c` objects (`c` up to the ids).
    misses: std::sync::Arc<Vec<u64>>,
}

impl LruCurve {
    /// The curve over `trace` (ids below `ids`) after the warm-up accesses
    /// `warm` (not counted).
    pub(crate) fn new(trace: &[u32], ids: usize, warm: impl IntoIterator<Item = u32>) -> Self {
        let warm: Vec<u32> = warm.into_iter().collect();
        let n = warm.len() + trace.len();
        let mut tree = vec![0u32; n + 1];
        let add = |tree: &mut [u32], mut i: usize, up: bool| {
            i += 1;
            while i < tree.len() {
                if up {
                    tree[i] += 1;
                } else {
                    tree[i] -= 1;
                }
                i += i & i.wrapping_neg();
            }
        };
        // Marked positions before `i`.
        let before = |tree: &[u32], mut i: usize| {
            let mut sum = 0u64;
            while i > 0 {
                sum += u64::from(tree[i]);
                i &= i - 1;
            }
            sum
        };
        const NEVER: usize = usize::MAX;
        let mut last = vec![NEVER; ids];
        // hits[d]: counted accesses at stack distance d (a hit for every
        // LRU larger than d); the rest are first accesses.
        let mut hits = vec![0u64; ids + 1];
        for (p, &x) in warm.iter().chain(trace).enumerate() {
            let x = x as usize;
            let q = last[x];
            if q != NEVER {
                if p >= warm.len() {
                    let d = before(&tree, p) - before(&tree, q + 1);
                    hits[(d as usize).min(ids)] += 1;
                }
                add(&mut tree, q, false);
            }
            add(&mut tree, p, true);
            last[x] = p;
        }
        let mut misses = vec![0u64; ids + 1];
        let mut hit = 0u64;
        for c in 0..=ids {
            misses[c] = trace.len() as u64 - hit;
            hit += hits[c];
        }
        Self {
            misses: std::sync::Arc::new(misses),
        }
    }

    /// Misses of an LRU of `capacity` objects.
    pub(crate) fn misses(&self, capacity: usize) -> Option<u64> {
        let last = self.misses.len().checked_sub(1)?;
        Some(self.misses[capacity.min(last)])
    }

    /// The fewest objects an LRU needs to miss at most `misses` times.
    pub(crate) fn capacity_for(&self, misses: u64) -> Option<u64> {
        // Misses fall as the size grows.
        let c = self.misses.partition_point(|&m| m > misses);
        (c < self.misses.len()).then_some(c as u64)
    }
}

/// Runs both simulated caches of `capacity` objects (ids below `ids`) over
/// `trace`, each first warmed by the stream `warm_stream()` makes.
pub(crate) fn simulate<G: FnMut() -> u32>(
    trace: &[u32],
    dropped: u64,
    capacity: u64,
    ids: u64,
    warm_stream: impl Fn() -> G,
) -> SimMisses {
    let cap = usize::try_from(capacity).unwrap_or(usize::MAX);
    // The accesses that would warm an LRU of `cap` objects.
    let warm_ops = warm(&mut Seen::new(ids as usize), cap, warm_stream());
    let mut s3fifo = S3Fifo::new(cap, ids as usize);
    warm(&mut s3fifo, cap, warm_stream());
    let s3fifo = count_misses(&mut s3fifo, trace);
    let mut next = warm_stream();
    let curve = LruCurve::new(trace, ids as usize, (0..warm_ops).map(|_| next()));
    let lru = curve.misses(cap).unwrap_or(trace.len() as u64);
    SimMisses {
        capacity,
        trace_ops: trace.len() as u64,
        dropped,
        warm_ops: warm_ops as u64,
        lru,
        s3fifo,
        curve,
    }
}

/// Merges per-thread streams (issue times in ns, object indices; each in
/// time order) into one stream of indices in time order; ties go to the
/// lower-numbered thread.
pub(crate) fn merge(parts: Vec<(Vec<u64>, Vec<u32>)>) -> Vec<u32> {
    let total = parts.iter().map(|(_, i)| i.len()).sum();
    let mut out = Vec::with_capacity(total);
    let mut pos = vec![0usize; parts.len()];
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = parts
        .iter()
        .enumerate()
        .filter_map(|(k, (t, _))| t.first().map(|&t0| Reverse((t0, k))))
        .collect();
    while let Some(Reverse((_, k))) = heap.pop() {
        let (t, idx) = &parts[k];
        out.push(idx[pos[k]]);
        pos[k] += 1;
        if let Some(&next) = t.get(pos[k]) {
            heap.push(Reverse((next, k)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_counts_known_misses() {
        // Cyclic over one more object than fits: every access misses.
        let cyclic: Vec<u32> = (0..6).flat_map(|_| 0..3).collect();
        assert_eq!(count_misses(&mut Lru::new(2), &cyclic), 18);
        // Fits: only the compulsory misses, and none once warm.
        assert_eq!(count_misses(&mut Lru::new(3), &cyclic), 3);
        // Recency, not insertion order: 0 is touched before 2 arrives, so 1 goes.
        let mut l = Lru::new(2);
        assert_eq!(count_misses(&mut l, &[0, 1, 0, 2]), 3);
        assert!(l.access(0) && l.access(2) && !l.access(1));
    }

    #[test]
    fn s3fifo_follows_the_algorithm_by_hand() {
        // 10 objects: small 1, main 9, ghost 9.
        let mut c = S3Fifo::new(10, 100);
        let pass: Vec<u32> = (0..10).collect();
        assert_eq!(count_misses(&mut c, &pass), 10); // all in the small queue (the cache is not full)
        assert_eq!(count_misses(&mut c, &pass), 0); // each hit once
        // 10 evicts the small tail 0 (hit once, below 2): its id goes to the ghost.
        assert!(!c.access(10));
        assert_eq!(c.loc[0], Loc::Ghost);
        // 0 again: a ghost hit, a miss that enters the main queue; 1 goes to the ghost.
        assert!(!c.access(0));
        assert_eq!((c.loc[0], c.loc[1]), (Loc::Main, Loc::Ghost));
        assert!(c.access(0) && c.access(2));
        assert_eq!(c.len(), 10);
    }

    #[test]
    fn s3fifo_resists_a_scan_where_lru_does_not() {
        // A hot set of 5 hit three times, a scan of 100 one-hit wonders, the hot set again.
        let hot: Vec<u32> = (0..3).flat_map(|_| 0..5).collect();
        let mut trace = hot.clone();
        trace.extend(100..200);
        trace.extend(0..5);
        // LRU: the scan flushes the hot set. S3-FIFO: the hot objects moved to
        // the main queue when the scan pushed them out of the small one.
        assert_eq!(count_misses(&mut Lru::new(10), &trace), 5 + 100 + 5);
        let mut s = S3Fifo::new(10, 200);
        assert_eq!(count_misses(&mut s, &trace), 5 + 100);
        assert!((0..5).all(|x| s.loc[x] == Loc::Main));
        // The ghost never holds more than its share.
        assert!(s.ghost_live <= 9);
    }

    #[test]
    fn s3fifo_main_queue_is_a_clock() {
        // 3 objects: small 1, main 2, ghost 2. 0 and 1 are hit twice in the small
        // queue and move to the main one; 2 reaches it through the ghost; 1 is hit
        // once there. When 7 needs room the clock spares 1 (frequency 1 -> 0) and
        // evicts 2 (frequency 0) instead.
        let mut c = S3Fifo::new(3, 10);
        let trace = [0, 1, 2, 0, 0, 1, 1, 3, 1, 4, 2, 5, 6, 4, 7];
        assert_eq!(count_misses(&mut c, &trace), 10);
        assert_eq!(c.main.iter().copied().collect::<Vec<_>>(), vec![4, 1]);
        assert_eq!(c.small.iter().copied().collect::<Vec<_>>(), vec![7]);
        assert_eq!((c.loc[1], c.freq[1]), (Loc::Main, 0));
        assert_eq!((c.loc[0], c.loc[2], c.loc[3]), (Loc::Out, Loc::Out, Loc::Out));
        assert_eq!((c.loc[5], c.loc[6], c.ghost_live), (Loc::Ghost, Loc::Ghost, 2));
    }

    #[test]
    fn s3fifo_stays_bounded() {
        let mut c = S3Fifo::new(10, 1000);
        let mut misses = 0;
        for x in 0..2000u32 {
            misses += u64::from(!c.access(x % 1000));
        }
        assert_eq!(misses, 2000, "a cyclic scan larger than the cache misses every time");
        assert!(c.len() <= 10 && c.ghost_live <= 9);
        // A small Zipf-like stream: S3-FIFO never misses more than every access.
        let trace: Vec<u32> = (0..5000u32).map(|k| (k * k) % 37 % 20).collect();
        let s = simulate(&trace, 0, 10, 20, || {
            let mut k = 0u32;
            move || {
                k += 1;
                k % 20
            }
        });
        // Full after 10 accesses, then 40 more.
        assert_eq!(s.warm_ops, 50);
        assert!(s.s3fifo <= 5000 && s.lru <= 5000);
        // The LRU figure (read off the curve) is what an LRU warmed by the
        // same stream misses.
        let mut l = Lru::new(10);
        for k in 1..=50u32 {
            l.access(k % 20);
        }
        assert_eq!(s.lru, count_misses(&mut l, &trace));
        assert!(s.lru_ratio().unwrap() <= 1.0 && s.s3fifo_ratio().unwrap() <= 1.0);
    }

    #[test]
    fn warm_up_fills_then_turns_the_cache_over() {
        // Full after 10 distinct objects, then 4 x 10 more accesses.
        let mut l = Lru::new(10);
        let mut k = 0u32;
        let n = warm(&mut l, 10, || {
            k += 1;
            k % 100
        });
        assert_eq!((n, l.len()), (50, 10));
        // A warm cache hits what is hot; a cold one would miss it once.
        assert!(l.access(49) && !l.access(0));
        // A stream that can never fill the cache stops at the bound.
        let mut s = S3Fifo::new(10, 5);
        let mut k = 0u32;
        let n = warm(&mut s, 10, || {
            k += 1;
            k % 5
        });
        assert_eq!((n, s.len()), (10 * WARM_MAX + (1 << 20), 5));
        assert_eq!(count_misses(&mut s, &[0, 1, 2, 3, 4]), 0);
    }

    #[test]
    fn merge_orders_threads_by_time() {
        let a = (vec![1, 5, 9], vec![10, 11, 12]);
        let b = (vec![2, 5, 6], vec![20, 21, 22]);
        assert_eq!(merge(vec![a, b]), vec![10, 20, 11, 21, 22, 12]);
        assert!(merge(vec![(vec![], vec![])]).is_empty());
    }

    #[test]
    fn lru_curve_matches_an_lru_of_every_size() {
        // A skewed pseudo-random stream over 300 ids, warmed by another.
        let stream = |seed: u64, n: usize| {
            let mut x = seed;
            (0..n)
                .map(move |_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let u = (x >> 33) as f64 / (1u64 << 31) as f64;
                    (300.0 * u * u * u) as u32
                })
                .collect::<Vec<u32>>()
        };
        let (warmup, trace) = (stream(1, 2_000), stream(2, 5_000));
        let curve = LruCurve::new(&trace, 300, warmup.iter().copied());
        for cap in [1, 2, 7, 30, 100, 299, 300] {
            let mut l = Lru::new(cap);
            for &x in &warmup {
                l.access(x);
            }
            assert_eq!(curve.misses(cap), Some(count_misses(&mut l, &trace)), "LRU of {cap}");
        }
        assert_eq!(curve.misses(0), Some(5_000));
        // The inverse: the smallest size that misses at most so often.
        for cap in [1usize, 7, 30, 100] {
            let m = curve.misses(cap).unwrap();
            let c = curve.capacity_for(m).unwrap() as usize;
            assert!(c <= cap && curve.misses(c) == Some(m));
            assert!(c == 0 || curve.misses(c - 1).unwrap() > m);
        }
        // Fewer misses than an LRU of every object is impossible.
        let floor = curve.misses(300).unwrap();
        assert_eq!(curve.capacity_for(floor.saturating_sub(1)), None);
    }

    #[test]
    fn lru_curve_counts_known_distances() {
        // 0 1 2 0: the second 0 has 2 distinct others since; an LRU of 3 hits it, of 2 does not.
        let curve = LruCurve::new(&[0, 1, 2, 0, 0], 3, []);
        assert_eq!(curve.misses(0), Some(5));
        assert_eq!(curve.misses(1), Some(4)); // the last 0 (distance 0) hits
        assert_eq!(curve.misses(2), Some(4));
        assert_eq!(curve.misses(3), Some(3));
        // Warm-up accesses place objects but are not counted.
        let warm = LruCurve::new(&[0, 1], 2, [1, 0]);
        assert_eq!((warm.misses(1), warm.misses(2)), (Some(1), Some(0)));
        let sim = SimMisses {
            capacity: 2,
            trace_ops: 5,
            dropped: 0,
            warm_ops: 0,
            lru: 4,
            s3fifo: 4,
            curve,
        };
        assert_eq!(sim.lru_equivalent(0.6), Some(3));
        assert_eq!(sim.lru_equivalent(0.8), Some(1));
        assert_eq!(sim.lru_equivalent(0.4), None);
    }
}
