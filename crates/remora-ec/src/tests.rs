//! Unit and property tests: round trips, erasure patterns, delta updates, backend equality,
//! compatibility with `reed-solomon-erasure`, and typed errors for bad arguments.

use crate::backend::{self, HASWELL_FEATURES, SIMD_COMPILED};
use crate::*;
use proptest::prelude::*;

/// Small deterministic PRNG (splitmix64) so the tests need no extra dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    fn shards(&mut self, count: usize, len: usize) -> Vec<Vec<u8>> {
        (0..count).map(|_| self.bytes(len)).collect()
    }
}

/// The codec on every backend usable here (Portable always, Simd when the CPU allows).
fn codecs(k: usize, m: usize) -> Vec<Codec> {
    let mut v = vec![Codec::with_backend(k, m, Backend::Portable).unwrap()];
    if Backend::simd_available() {
        v.push(Codec::with_backend(k, m, Backend::Simd).unwrap());
    }
    v
}

/// Calling the library's own encoder is safe unless its AVX2 C code is linked and the CPU
/// cannot run it.
fn library_callable() -> bool {
    !SIMD_COMPILED || Backend::simd_available()
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(Vec::as_slice).collect()
}

fn encode_all(c: &Codec, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut all = data.to_vec();
    all.extend(c.encode_to_vec(&refs(data)).unwrap());
    all
}

/// All subsets of `0..n` with at most `max` elements.
fn subsets(n: usize, max: usize) -> Vec<Vec<usize>> {
    (0u64..1 << n)
        .filter(|b| b.count_ones() as usize <= max)
        .map(|b| (0..n).filter(|i| b >> i & 1 == 1).collect())
        .collect()
}

// ---------------------------------------------------------------- coefficients

/// RS(4, 2) coefficients `A_ij`, read once from `reed-solomon-erasure` 6.0.0 by encoding
/// unit vectors. A change here means stored parity would no longer decode.
const RS_4_2: [[u8; 4]; 2] = [[27, 28, 18, 20], [28, 27, 20, 18]];

#[test]
fn pinned_rs_4_2_coefficients() {
    for c in codecs(4, 2) {
        for (j, row) in RS_4_2.iter().enumerate() {
            for (i, &a) in row.iter().enumerate() {
                assert_eq!(c.coefficient(i, j), Ok(a), "A[{i}][{j}]");
            }
        }
        assert_eq!(c.parity_matrix(), RS_4_2.concat().as_slice());
    }
    // And the library still agrees with the pinned values.
    if library_callable() {
        assert_eq!(library_matrix(4, 2), RS_4_2.concat());
    }
}

/// The library's parity matrix (row-major m × k), read by encoding unit vectors.
fn library_matrix(k: usize, m: usize) -> Vec<u8> {
    let rs = reed_solomon_erasure::galois_8::ReedSolomon::new(k, m).unwrap();
    let mut out = vec![0u8; m * k];
    for i in 0..k {
        let mut sh = vec![vec![0u8; 1]; k + m];
        sh[i][0] = 1;
        rs.encode(&mut sh).unwrap();
        for j in 0..m {
            out[j * k + i] = sh[k + j][0];
        }
    }
    out
}

#[test]
fn matrix_matches_library() {
    if !library_callable() {
        return;
    }
    for (k, m) in [(1, 1), (2, 1), (3, 2), (4, 2), (6, 3), (10, 4), (17, 5), (64, 32)] {
        let c = Codec::new(k, m).unwrap();
        assert_eq!(c.parity_matrix(), library_matrix(k, m), "RS({k}, {m})");
    }
}

#[test]
fn encode_matches_library() {
    if !library_callable() {
        return;
    }
    let mut rng = Rng(7);
    for (k, m) in [(4, 2), (5, 3)] {
        let rs = reed_solomon_erasure::galois_8::ReedSolomon::new(k, m).unwrap();
        for len in [1, 31, 32, 33, 1000, 3 * BLOCK + 17] {
            let data = rng.shards(k, len);
            let mut lib = vec![vec![0u8; len]; m];
            rs.encode_sep(&refs(&data), &mut lib).unwrap();
            for c in codecs(k, m) {
                assert_eq!(c.encode_to_vec(&refs(&data)).unwrap(), lib, "{} len {len}", c.backend());
            }
        }
    }
}

// ---------------------------------------------------------------- backends

#[test]
fn backend_selection_without_avx2_is_portable() {
    // A CPU with everything but AVX2 (e.g. Sandy Bridge with a few extras): never Simd.
    let no_avx2 = |f: &str| f != "avx2";
    assert_eq!(backend::select(true, true, &no_avx2), Backend::Portable);
    // Missing any other Haswell feature also falls back.
    for missing in HASWELL_FEATURES {
        let cpu = |f: &str| f != *missing;
        assert_eq!(backend::select(true, true, &cpu), Backend::Portable, "{missing}");
    }
    assert_eq!(backend::select(true, true, &|_| true), Backend::Simd);
    // Not compiled in: portable whatever the CPU.
    assert_eq!(backend::select(false, true, &|_| true), Backend::Portable);
    // aarch64: NEON is baseline.
    assert_eq!(backend::select(true, false, &|_| false), Backend::Simd);
}

#[test]
fn detect_on_this_machine() {
    let d = Backend::detect();
    assert_eq!(Backend::simd_available(), d == Backend::Simd);
    assert_eq!(Codec::new(4, 2).unwrap().backend(), d);
    assert_eq!(Codec::default().backend(), d);
    #[cfg(target_arch = "x86_64")]
    if SIMD_COMPILED && std::arch::is_x86_feature_detected!("avx2") {
        // Every CPU with AVX2 we run on has the rest of the Haswell set.
        assert_eq!(d, Backend::Simd);
    }
    if !SIMD_COMPILED {
        assert_eq!(d, Backend::Portable);
    }
    // Forcing works, and Simd is refused exactly when unavailable.
    let p = Codec::with_backend(4, 2, Backend::Portable).unwrap();
    assert_eq!(p.backend(), Backend::Portable);
    match Codec::with_backend(4, 2, Backend::Simd) {
        Ok(c) => {
            assert!(Backend::simd_available());
            assert_eq!(c.backend(), Backend::Simd);
            assert_eq!(p.to_backend(Backend::Simd).unwrap(), c);
        }
        Err(e) => {
            assert!(!Backend::simd_available());
            assert_eq!(e, EcError::BackendUnavailable(Backend::Simd));
        }
    }
}

#[test]
fn kernels_agree_for_every_coefficient() {
    if !Backend::simd_available() {
        return;
    }
    let mut rng = Rng(1);
    for len in [0, 1, 31, 32, 33, 64, 100, 257] {
        let src = rng.bytes(len);
        let init = rng.bytes(len);
        for c in 0..=255u8 {
            let (mut a, mut b) = (init.clone(), init.clone());
            Backend::Simd.mul(c, &src, &mut a);
            Backend::Portable.mul(c, &src, &mut b);
            assert_eq!(a, b, "mul c={c} len={len}");
            let expect: Vec<u8> = src.iter().map(|&s| gf::mul(c, s)).collect();
            assert_eq!(a, expect);
            let (mut a, mut b) = (init.clone(), init.clone());
            Backend::Simd.mul_xor(c, &src, &mut a);
            Backend::Portable.mul_xor(c, &src, &mut b);
            assert_eq!(a, b, "mul_xor c={c} len={len}");
            let expect: Vec<u8> = src.iter().zip(&init).map(|(&s, &d)| d ^ gf::mul(c, s)).collect();
            assert_eq!(a, expect);
        }
    }
}

#[test]
fn backends_produce_identical_output() {
    if !Backend::simd_available() {
        return;
    }
    let mut rng = Rng(2);
    for (k, m) in [(4, 2), (3, 3), (8, 2)] {
        let simd = Codec::with_backend(k, m, Backend::Simd).unwrap();
        let port = simd.to_backend(Backend::Portable).unwrap();
        for len in [0, 1, 33, 4096, 2 * BLOCK + 5] {
            let data = rng.shards(k, len);
            let all_s = encode_all(&simd, &data);
            let all_p = encode_all(&port, &data);
            assert_eq!(all_s, all_p);
            // degraded read of shard 0 from the last k shards
            let present: Vec<(usize, &[u8])> = (m..k + m).map(|i| (i, all_s[i].as_slice())).collect();
            let (mut a, mut b) = (vec![0u8; len], vec![1u8; len]);
            simd.decode_data(&present, 0, &mut a).unwrap();
            port.decode_data(&present, 0, &mut b).unwrap();
            assert_eq!(a, b);
            assert_eq!(a, data[0]);
            // delta
            let delta = rng.bytes(len);
            let (mut pa, mut pb) = (all_s[k].clone(), all_s[k].clone());
            simd.apply_delta(k - 1, 0, &delta, &mut pa).unwrap();
            port.apply_delta(k - 1, 0, &delta, &mut pb).unwrap();
            assert_eq!(pa, pb);
        }
    }
}

// ---------------------------------------------------------------- round trips

#[test]
fn every_erasure_pattern_up_to_m_is_recovered() {
    let mut rng = Rng(3);
    for (k, m) in [(1, 1), (1, 3), (2, 1), (3, 2), (4, 2), (4, 3), (6, 3), (8, 4), (10, 4)] {
        let n = k + m;
        for c in codecs(k, m) {
            let len = if (k, m) == (4, 2) { 2 * BLOCK + 77 } else { 97 };
            let data = rng.shards(k, len);
            let all = encode_all(&c, &data);
            assert!(c.verify(&refs(&all)).unwrap());
            for lost in subsets(n, m) {
                let mut shards: Vec<Option<Vec<u8>>> = all.iter().cloned().map(Some).collect();
                for &i in &lost {
                    shards[i] = None;
                }
                c.reconstruct(&mut shards).unwrap();
                let got: Vec<Vec<u8>> = shards.into_iter().map(Option::unwrap).collect();
                assert_eq!(got, all, "RS({k},{m}) {} lost {lost:?}", c.backend());

                // Same on caller-owned buffers, erased ones full of garbage.
                let mut bufs = all.clone();
                let mut present = vec![true; n];
                for &i in &lost {
                    bufs[i].fill(0x5A);
                    present[i] = false;
                }
                let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
                c.reconstruct_slices(&mut views, &present).unwrap();
                assert_eq!(bufs, all, "slices RS({k},{m}) lost {lost:?}");

                // Degraded reads of every shard from the survivors, in reverse order and
                // from exactly k of them.
                let present: Vec<(usize, &[u8])> = (0..n)
                    .rev()
                    .filter(|i| !lost.contains(i))
                    .map(|i| (i, all[i].as_slice()))
                    .collect();
                for (want, expect) in all.iter().enumerate() {
                    let mut out = vec![0xAAu8; len];
                    c.decode_data(&present, want, &mut out).unwrap();
                    assert_eq!(&out, expect, "want {want} lost {lost:?}");
                    let mut out = vec![0u8; len];
                    let tail = &present[present.len() - k..];
                    c.decode_data(tail, want, &mut out).unwrap();
                    assert_eq!(&out, expect, "want {want} from {tail:?}");
                }
            }
        }
    }
}

#[test]
fn codec_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}
    assert_send_sync::<Codec>();
    assert_send_sync::<EcError>();
    let c = Codec::default();
    let parity = std::thread::scope(|s| {
        let h = s.spawn(|| c.encode_to_vec(&[&[1u8][..], &[2], &[3], &[4]]).unwrap());
        h.join().unwrap()
    });
    assert!(
        c.verify(&[&[1u8][..], &[2], &[3], &[4], &parity[0], &parity[1]])
            .unwrap()
    );
}

#[test]
fn zero_length_shards() {
    for c in codecs(4, 2) {
        let data = vec![Vec::new(); 4];
        let all = encode_all(&c, &data);
        assert!(all.iter().all(Vec::is_empty));
        let mut shards: Vec<Option<Vec<u8>>> = vec![None, Some(vec![]), None, Some(vec![])];
        shards.extend([Some(vec![]), Some(vec![])]);
        c.reconstruct(&mut shards).unwrap();
        assert!(shards.iter().all(|s| s.as_deref() == Some(&[][..])));
        let e: &[u8] = &[];
        let mut out: [u8; 0] = [];
        c.decode_data(&[(1, e), (3, e), (4, e), (5, e)], 0, &mut out).unwrap();
        c.apply_delta(0, 0, &[], &mut []).unwrap();
    }
}

#[test]
fn verify_detects_corruption() {
    let mut rng = Rng(4);
    for c in codecs(4, 2) {
        let mut all = encode_all(&c, &rng.shards(4, BLOCK + 3));
        assert_eq!(c.verify(&refs(&all)), Ok(true));
        all[5][BLOCK + 1] ^= 1;
        assert_eq!(c.verify(&refs(&all)), Ok(false));
    }
}

#[test]
fn large_codes() {
    let mut rng = Rng(5);
    for (k, m) in [(200, 56), (1, 255), (255, 1)] {
        let c = Codec::new(k, m).unwrap();
        let all = encode_all(&c, &rng.shards(k, 19));
        // lose the first min(m, k) data shards and read one back
        let lost = m.min(k);
        let present: Vec<(usize, &[u8])> = (lost..k + m).map(|i| (i, all[i].as_slice())).collect();
        let mut out = vec![0u8; 19];
        c.decode_data(&present, 0, &mut out).unwrap();
        assert_eq!(out, all[0]);
        let mut shards: Vec<Option<Vec<u8>>> = all.iter().cloned().map(Some).collect();
        for s in shards.iter_mut().take(lost) {
            *s = None;
        }
        c.reconstruct(&mut shards).unwrap();
        assert!(shards.iter().zip(&all).all(|(s, a)| s.as_ref() == Some(a)));
    }
}

// ---------------------------------------------------------------- errors

#[test]
fn invalid_parameters() {
    for (k, m) in [(0, 2), (4, 0), (0, 0), (255, 2), (257, 1), (usize::MAX, 1)] {
        assert_eq!(Codec::new(k, m), Err(EcError::InvalidParameters { k, m }));
    }
    assert!(Codec::new(255, 1).is_ok());
    assert!(Codec::new(1, 255).is_ok());
    let c = Codec::default();
    assert_eq!((c.k(), c.m(), c.total()), (DEFAULT_K, DEFAULT_M, 6));
}

#[test]
fn encode_bad_arguments() {
    let c = Codec::new(4, 2).unwrap();
    let d = [[1u8; 8]; 5];
    let mut p = [[0u8; 8]; 3];
    let data: Vec<&[u8]> = d.iter().map(|x| &x[..]).collect();
    let mut par: Vec<&mut [u8]> = p.iter_mut().map(|x| &mut x[..]).collect();
    let wrong = |what, expected, got| EcError::WrongShardCount { what, expected, got };
    assert_eq!(c.encode(&data[..3], &mut par[..2]), Err(wrong("data", 4, 3)));
    assert_eq!(c.encode(&data, &mut par[..2]), Err(wrong("data", 4, 5)));
    assert_eq!(c.encode(&[], &mut par[..2]), Err(wrong("data", 4, 0)));
    assert_eq!(c.encode(&data[..4], &mut par), Err(wrong("parity", 2, 3)));
    assert_eq!(c.encode(&data[..4], &mut []), Err(wrong("parity", 2, 0)));
    assert_eq!(c.encode_to_vec(&data[..1]), Err(wrong("data", 4, 1)));
    assert_eq!(c.encode_to_vec(&[]), Err(wrong("data", 4, 0)));

    let short = [1u8; 7];
    let bad = [data[0], data[1], &short, data[3]];
    let mismatch = |index, len, expected| EcError::LengthMismatch { index, len, expected };
    assert_eq!(c.encode(&bad, &mut par[..2]), Err(mismatch(2, 7, 8)));
    let mut p7 = [0u8; 7];
    let mut p8 = [0u8; 8];
    let mut par2: Vec<&mut [u8]> = vec![&mut p8, &mut p7];
    assert_eq!(c.encode(&data[..4], &mut par2), Err(mismatch(5, 7, 8)));
    assert_eq!(c.verify(&data[..4]), Err(wrong("total", 6, 4)));
    let six = [data[0], data[1], data[2], data[3], &short, data[0]];
    assert_eq!(c.verify(&six), Err(mismatch(4, 7, 8)));
}

#[test]
fn reconstruct_bad_arguments() {
    let c = Codec::new(4, 2).unwrap();
    let mut five: Vec<Option<Vec<u8>>> = vec![Some(vec![0; 4]); 5];
    assert_eq!(
        c.reconstruct(&mut five),
        Err(EcError::WrongShardCount {
            what: "total",
            expected: 6,
            got: 5
        })
    );
    assert_eq!(
        c.reconstruct(&mut []).unwrap_err().to_string(),
        "expected 6 total shards, got 0"
    );

    let mut uneven = vec![Some(vec![0; 4]); 6];
    uneven[0] = None;
    uneven[3] = Some(vec![0; 5]);
    assert_eq!(
        c.reconstruct(&mut uneven),
        Err(EcError::LengthMismatch {
            index: 3,
            len: 5,
            expected: 4
        })
    );

    let mut rng = Rng(6);
    let all = encode_all(&c, &rng.shards(4, 16));
    let mut three_lost: Vec<Option<Vec<u8>>> = all.iter().cloned().map(Some).collect();
    for i in [0, 2, 5] {
        three_lost[i] = None;
    }
    let before = three_lost.clone();
    assert_eq!(
        c.reconstruct(&mut three_lost),
        Err(EcError::TooManyErasures { lost: 3, max: 2 })
    );
    assert_eq!(three_lost, before, "unchanged on error");
    let mut bufs = all.clone();
    let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
    let flags = [false, true, false, true, true, false];
    assert_eq!(
        c.reconstruct_slices(&mut views, &flags),
        Err(EcError::TooManyErasures { lost: 3, max: 2 })
    );
    assert_eq!(
        c.reconstruct_slices(&mut views, &flags[..5]),
        Err(EcError::WrongShardCount {
            what: "present",
            expected: 6,
            got: 5
        })
    );
    assert_eq!(
        c.reconstruct_slices(&mut views[..5], &flags),
        Err(EcError::WrongShardCount {
            what: "total",
            expected: 6,
            got: 5
        })
    );
    let mut short = [0u8; 15];
    views[4] = &mut short;
    assert_eq!(
        c.reconstruct_slices(&mut views, &[true; 6]),
        Err(EcError::LengthMismatch {
            index: 4,
            len: 15,
            expected: 16
        })
    );
    drop(views);
    assert_eq!(bufs, all, "unchanged on error");
    let mut all_lost = vec![None; 6];
    assert_eq!(
        c.reconstruct(&mut all_lost),
        Err(EcError::TooManyErasures { lost: 6, max: 2 })
    );
}

#[test]
fn decode_data_bad_arguments() {
    let c = Codec::new(4, 2).unwrap();
    let mut rng = Rng(8);
    let all = encode_all(&c, &rng.shards(4, 16));
    let p = |i: usize| (i, all[i].as_slice());
    let mut out = [0u8; 16];

    assert_eq!(
        c.decode_data(&[p(1), p(2), p(3)], 0, &mut out),
        Err(EcError::TooManyErasures { lost: 3, max: 2 })
    );
    assert_eq!(
        c.decode_data(&[], 0, &mut out),
        Err(EcError::TooManyErasures { lost: 6, max: 2 })
    );
    assert_eq!(
        c.decode_data(&[p(1), p(2), p(3), p(4)], 6, &mut out),
        Err(EcError::IndexOutOfRange { index: 6, limit: 6 })
    );
    assert_eq!(
        c.decode_data(&[p(1), (9, &all[0]), p(3), p(4)], 0, &mut out),
        Err(EcError::IndexOutOfRange { index: 9, limit: 6 })
    );
    assert_eq!(
        c.decode_data(&[p(1), p(2), p(2), p(4)], 0, &mut out),
        Err(EcError::DuplicateShard { index: 2 })
    );
    // 300 entries: rejected as duplicates long before any index overflow.
    let many: Vec<(usize, &[u8])> = (0..300).map(|i| p(1 + i % 5)).collect();
    assert_eq!(
        c.decode_data(&many, 0, &mut out),
        Err(EcError::DuplicateShard { index: 1 })
    );
    let short = [0u8; 15];
    assert_eq!(
        c.decode_data(&[p(1), p(2), (3, &short), p(4)], 0, &mut out),
        Err(EcError::LengthMismatch {
            index: 3,
            len: 15,
            expected: 16
        })
    );
    let mut out_short = [0u8; 15];
    assert_eq!(
        c.decode_data(&[p(1), p(2), p(3), p(4)], 0, &mut out_short),
        Err(EcError::LengthMismatch {
            index: 1,
            len: 16,
            expected: 15
        })
    );
    // `want` present: plain copy.
    c.decode_data(&[p(0)], 0, &mut out).unwrap();
    assert_eq!(out, all[0].as_slice());
}

#[test]
fn delta_and_xor_bad_arguments() {
    let c = Codec::new(4, 2).unwrap();
    let delta = [1u8; 8];
    let mut par = [0u8; 8];
    assert_eq!(
        c.apply_delta(4, 0, &delta, &mut par),
        Err(EcError::IndexOutOfRange { index: 4, limit: 4 })
    );
    assert_eq!(
        c.apply_delta(0, 2, &delta, &mut par),
        Err(EcError::IndexOutOfRange { index: 2, limit: 2 })
    );
    assert_eq!(
        c.apply_delta(1, 1, &delta[..7], &mut par),
        Err(EcError::LengthMismatch {
            index: 5,
            len: 8,
            expected: 7
        })
    );
    assert_eq!(par, [0; 8], "unchanged on error");
    assert_eq!(
        c.coefficient(0, 2),
        Err(EcError::IndexOutOfRange { index: 2, limit: 2 })
    );
    assert_eq!(
        c.coefficient(usize::MAX, 0),
        Err(EcError::IndexOutOfRange {
            index: usize::MAX,
            limit: 4
        })
    );

    let mut dst = [3u8; 4];
    assert_eq!(
        xor_into(&mut dst, &[1, 2, 3]),
        Err(EcError::LengthMismatch {
            index: 1,
            len: 3,
            expected: 4
        })
    );
    assert_eq!(dst, [3; 4]);
    xor_into(&mut dst, &[1, 2, 3, 4]).unwrap();
    assert_eq!(dst, [2, 1, 0, 7]);
}

// ---------------------------------------------------------------- properties

fn code_params() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![Just((4, 2)), (1usize..=8, 1usize..=4)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Applying `A_ij * (new xor old)` to every parity for every changed data shard gives
    /// exactly the parity of a full re-encode of the new data.
    #[test]
    fn delta_update_equals_reencode(
        (k, m) in code_params(),
        len in 0usize..600,
        seed in any::<u64>(),
        changed_mask in any::<u8>(),
        portable in any::<bool>(),
    ) {
        let c = Codec::new(k, m).unwrap();
        let c = if portable { c.to_backend(Backend::Portable).unwrap() } else { c };
        let mut rng = Rng(seed);
        let old = rng.shards(k, len);
        let mut parity = c.encode_to_vec(&refs(&old)).unwrap();
        let mut new = old.clone();
        for i in 0..k {
            if changed_mask >> (i % 8) & 1 == 1 {
                new[i] = rng.bytes(len);
                let mut delta = new[i].clone();
                xor_into(&mut delta, &old[i]).unwrap();
                for (j, p) in parity.iter_mut().enumerate() {
                    c.apply_delta(i, j, &delta, p).unwrap();
                }
            }
        }
        prop_assert_eq!(parity, c.encode_to_vec(&refs(&new)).unwrap());
    }

    /// Random contents and random erasure patterns of up to m shards: reconstruct restores
    /// every shard, and each lost shard can also be read alone from the survivors.
    #[test]
    fn random_erasures_round_trip(
        (k, m) in code_params(),
        len in 0usize..300,
        seed in any::<u64>(),
        order in any::<u64>(),
        portable in any::<bool>(),
    ) {
        let c = Codec::new(k, m).unwrap();
        let c = if portable { c.to_backend(Backend::Portable).unwrap() } else { c };
        let n = k + m;
        let mut rng = Rng(seed);
        let all = encode_all(&c, &rng.shards(k, len));
        // A random permutation of 0..n; its first `lost` entries are erased.
        let mut perm: Vec<usize> = (0..n).collect();
        let mut o = Rng(order);
        for i in (1..n).rev() {
            perm.swap(i, (o.next() % (i as u64 + 1)) as usize);
        }
        let lost = (o.next() % (m as u64 + 1)) as usize;
        let mut shards: Vec<Option<Vec<u8>>> = all.iter().cloned().map(Some).collect();
        for &i in &perm[..lost] {
            shards[i] = None;
        }
        c.reconstruct(&mut shards).unwrap();
        for (s, a) in shards.iter().zip(&all) {
            prop_assert_eq!(s.as_ref(), Some(a));
        }
        let present: Vec<(usize, &[u8])> =
            perm[lost..].iter().map(|&i| (i, all[i].as_slice())).collect();
        for &want in &perm[..lost] {
            let mut out = vec![0u8; len];
            c.decode_data(&present, want, &mut out).unwrap();
            prop_assert_eq!(&out, &all[want]);
        }
        // One erasure too many is a typed error, not a panic.
        if lost == m {
            let mut out = vec![0u8; len];
            let fewer = &present[1..];
            prop_assert_eq!(
                c.decode_data(fewer, perm[0], &mut out),
                Err(EcError::TooManyErasures { lost: m + 1, max: m })
            );
        }
    }
}

#[test]
fn scaled_deltas_sent_separately_add_up_to_apply_delta() {
    // What a data node sends a parity node (A_ij * delta), xored in by the
    // parity node, must equal apply_delta and a full re-encode.
    let mut rng = Rng(9);
    for c in codecs(4, 2) {
        let old = rng.shards(4, BLOCK + 5);
        let mut new = old.clone();
        new[1] = rng.shards(1, BLOCK + 5).remove(0);
        new[3] = rng.shards(1, BLOCK + 5).remove(0);
        let mut parity = encode_all(&c, &old)[4..].to_vec();
        for i in [1, 3] {
            let mut delta = old[i].clone();
            xor_into(&mut delta, &new[i]).unwrap();
            for (j, p) in parity.iter_mut().enumerate() {
                let mut share = vec![0u8; delta.len()];
                c.scale(c.coefficient(i, j).unwrap(), &delta, &mut share).unwrap();
                xor_into(p, &share).unwrap();
            }
        }
        assert_eq!(parity, encode_all(&c, &new)[4..].to_vec());
        let mut short = vec![0u8; 3];
        assert!(c.scale(7, &[1, 2], &mut short).is_err());
    }
}
