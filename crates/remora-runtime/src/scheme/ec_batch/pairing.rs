//! Which spansets fold into which: the matching half of picking folds
//! ([`super::compaction`]), apart from the table it reads.
//!
//! Within one bucket (one stripe group, one row length) a spanset B with few
//! live spans folds into the fullest spanset A, at least as full as B, whose
//! holes cover B's live positions. Looking for A by scanning the bucket for
//! every B made picking quadratic in the spansets, under the scheme's lock:
//! 5 % of all cycles in a profile of `bench micro` (ec-batch, 1 KiB objects,
//! 8 KiB spans). Candidates for A are indexed here by their hole mask
//! instead; a B looks only at the heads of the masks that cover its live
//! positions, of which there are at most 2^k.

use std::collections::HashMap;

/// A spanset that may fold or be folded into: (id, live mask, hole mask).
pub(super) type Candidate = (u64, u64, u64);

/// Pairs for up to `max` folds among `v`, sorted by live spans ascending
/// (then by anything): each B with at most `limit` live spans, fewest first, goes
/// with the last spanset after it in `v` whose holes cover B's live
/// positions; each spanset is in at most one pair. Returns (A's index, B's
/// index) pairs.
pub(super) fn pair(v: &[Candidate], limit: u32, max: usize) -> Vec<(usize, usize)> {
    // Spansets with holes, by hole mask, last (fullest) first; with the
    // index of the first one not yet taken.
    let mut by_holes: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, &(_, _, holes)) in v.iter().enumerate().rev() {
        if holes != 0 {
            by_holes.entry(holes).or_default().push(i);
        }
    }
    let mut lists: Vec<(u64, Vec<usize>, usize)> = by_holes.into_iter().map(|(m, l)| (m, l, 0)).collect();
    greedy(v, limit, max, |bi, taken| {
        let live_b = v[bi].1;
        let mut best: Option<usize> = None;
        for (mask, list, head) in &mut lists {
            if *mask & live_b != live_b {
                continue;
            }
            while list.get(*head).is_some_and(|&i| taken[i]) {
                *head += 1;
            }
            if let Some(&ai) = list.get(*head)
                && ai > bi
                && best.is_none_or(|b| ai > b)
            {
                best = Some(ai);
            }
        }
        best
    })
}

/// Goes through the B candidates of `v` in order and pairs each with what
/// `find(b, taken)` gives.
fn greedy(
    v: &[Candidate],
    limit: u32,
    max: usize,
    mut find: impl FnMut(usize, &[bool]) -> Option<usize>,
) -> Vec<(usize, usize)> {
    let mut taken = vec![false; v.len()];
    let mut out = Vec::new();
    for bi in 0..v.len() {
        if v[bi].1.count_ones() > limit || out.len() == max {
            break;
        }
        if taken[bi] {
            continue;
        }
        if let Some(ai) = find(bi, &taken) {
            taken[ai] = true;
            taken[bi] = true;
            out.push((ai, bi));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan `pair` replaces: for each B, the last spanset after it that fits.
    fn by_scanning(v: &[Candidate], limit: u32, max: usize) -> Vec<(usize, usize)> {
        greedy(v, limit, max, |bi, taken| {
            let live_b = v[bi].1;
            (bi + 1..v.len())
                .rev()
                .find(|&ai| !taken[ai] && v[ai].1 & live_b == 0 && v[ai].2 & live_b == live_b)
        })
    }

    #[test]
    fn pairs_as_the_scan_did() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut pairs = 0;
        for round in 0..400 {
            let k = [2, 4, 6, 8][round % 4];
            let n = (next() % 300) as usize;
            let mut v: Vec<Candidate> = (0..n)
                .map(|id| {
                    let live = next() & ((1 << k) - 1);
                    // Some dead positions are not holes (a shorter span).
                    let holes = !live & next() | !live & next();
                    (id as u64, live, holes & ((1 << k) - 1))
                })
                .filter(|&(_, live, _)| live != 0)
                .collect();
            v.sort_by_key(|&(id, live, _)| (live.count_ones(), id));
            for limit in [1, k / 2] {
                for max in [1, 8, usize::MAX] {
                    let got = pair(&v, limit, max);
                    assert_eq!(got, by_scanning(&v, limit, max), "k {k} limit {limit} max {max}: {v:?}");
                    pairs += got.len();
                    for &(a, b) in &got {
                        assert!(a > b && v[a].2 & v[b].1 == v[b].1);
                    }
                }
            }
        }
        assert!(pairs > 1000, "the inputs hardly ever fold: {pairs}");
    }
}
