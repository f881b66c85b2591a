//! Throughput of the RS codec, SIMD and portable backends, single thread.
//!
//! `cargo bench -p remora-ec --bench codec [-- --secs S]` (S = seconds per measurement,
//! default 0.3). GB/s = 10^9 bytes per second; encode and decode count the `k` data shards
//! they read (k × shard size), apply_delta counts the delta bytes folded into one parity.

use remora_ec::{Backend, Codec, xor_into};
use std::hint::black_box;
use std::time::{Duration, Instant};

const K: usize = 4;
const M: usize = 2;

/// Runs `f` repeatedly for about `secs` in 5 slices and returns the best slice's seconds per
/// call (the least disturbed by the other core's load).
fn time_per_call(secs: f64, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let slice = Duration::from_secs_f64(secs / 5.0);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        let mut calls = 0u64;
        while start.elapsed() < slice {
            f();
            calls += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / calls as f64);
    }
    best
}

fn fill(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// GB/s of each operation for one backend and shard size, in a fixed order.
fn measure(codec: &Codec, len: usize, secs: f64) -> Vec<(&'static str, f64)> {
    let data: Vec<Vec<u8>> = (0..K).map(|i| fill(i as u64 + 1, len)).collect();
    let data_refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut parity = vec![vec![0u8; len]; M];
    let mut out = vec![vec![0u8; len]; 2];
    let gbs = |bytes: usize, t: f64| bytes as f64 / t / 1e9;
    let mut res = Vec::new();

    let t = time_per_call(secs, || {
        let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        codec.encode(black_box(&data_refs), &mut p).unwrap();
    });
    res.push(("encode", gbs(K * len, t)));

    // Survivors after losing data shards 0 and 1: 2, 3, P0, P1.
    let all: Vec<&[u8]> = data.iter().chain(&parity).map(Vec::as_slice).collect();
    let lost1: Vec<(usize, &[u8])> = [1, 2, 3, 4].iter().map(|&i| (i, all[i])).collect();
    let t = time_per_call(secs, || {
        codec.decode_data(black_box(&lost1), 0, &mut out[0]).unwrap();
    });
    assert_eq!(out[0], data[0]);
    res.push(("decode 1 lost", gbs(K * len, t)));

    // Two lost data shards rebuilt together in one pass over the survivors, into
    // caller-owned buffers (the recovery path of a failed memory node).
    let mut bufs: Vec<Vec<u8>> = all.iter().map(|s| s.to_vec()).collect();
    let present = [false, false, true, true, true, true];
    let t = time_per_call(secs, || {
        let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
        codec.reconstruct_slices(black_box(&mut views), &present).unwrap();
    });
    assert_eq!(bufs[0], data[0]);
    assert_eq!(bufs[1], data[1]);
    res.push(("decode 2 lost", gbs(K * len, t)));

    let template: Vec<Option<Vec<u8>>> = all
        .iter()
        .enumerate()
        .map(|(i, s)| (i >= 2).then(|| s.to_vec()))
        .collect();
    let mut shards = template.clone();
    let t = time_per_call(secs, || {
        shards[0] = None;
        shards[1] = None;
        codec.reconstruct(black_box(&mut shards)).unwrap();
    });
    assert_eq!(shards[1].as_deref(), Some(data[1].as_slice()));
    res.push(("reconstruct 2 lost (alloc)", gbs(K * len, t)));

    let mut delta = fill(99, len);
    xor_into(&mut delta, &data[2]).unwrap();
    let mut p = parity[1].clone();
    let t = time_per_call(secs, || {
        codec.apply_delta(2, 1, black_box(&delta), &mut p).unwrap();
    });
    res.push(("apply_delta", gbs(len, t)));

    // Memory baseline with the encode's traffic (read k shards, write m), no GF math:
    // P_j = D_j xor D_{j+2}. Encode cannot beat this once the shards leave the cache.
    let t = time_per_call(secs, || {
        for (j, p) in parity.iter_mut().enumerate() {
            p.copy_from_slice(black_box(&data[j]));
            xor_into(p, &data[j + M]).unwrap();
        }
    });
    res.push(("baseline read4/write2", gbs(K * len, t)));
    res
}

fn main() {
    let mut secs = 0.3;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--secs" {
            secs = args.next().and_then(|s| s.parse().ok()).unwrap_or(secs);
        }
    }
    let simd = Codec::new(K, M).unwrap();
    let portable = simd.to_backend(Backend::Portable).unwrap();
    println!(
        "RS({K},{M}) single thread, detected backend: {}, {secs} s per measurement",
        simd.backend()
    );
    if simd.backend() != Backend::Simd {
        println!("(SIMD backend unavailable: both columns are the portable backend)");
    }
    println!(
        "{:<36} {:>10} {:>14} {:>8}",
        "operation", "simd GB/s", "portable GB/s", "ratio"
    );
    for (len, name) in [(64 << 10, "64 KiB"), (1 << 20, "1 MiB")] {
        let a = measure(&simd, len, secs);
        let b = measure(&portable, len, secs);
        for ((op, x), (_, y)) in a.iter().zip(&b) {
            println!(
                "{:<36} {:>10.2} {:>14.2} {:>7.1}x",
                format!("{op} {K}x{name}"),
                x,
                y,
                x / y
            );
        }
    }
}
