//! The Redis bank against a real `redis-server`: the invariant after
//! transfers from two threads, bounded version lists, corruption caught.
use std::sync::atomic::{AtomicU64, Ordering};

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;
use crate::micro::redis_server::{INSTALL_HINT, locate, required};

const SHAPE: Shape = Shape {
    branches: 4,
    accounts_per_branch: 20,
};

/// The `redis-server` binary, or `None` (skip) when it is missing and not required.
fn server() -> Option<std::path::PathBuf> {
    match locate() {
        Ok(p) => Some(p),
        Err(e) if required() => panic!("{e}; {INSTALL_HINT}"),
        Err(e) => {
            println!("skipping: {e}; {INSTALL_HINT}");
            None
        }
    }
}

#[test]
fn values_round_trip_and_reject_other_rows() {
    let k = Shape::key(Table::Account, 7);
    let mut f = Vec::new();
    push_filler(k, &mut f);
    assert_eq!(f.len(), VALUE_LEN - HEADER_LEN);
    for (version, balance) in [(0, INITIAL_BALANCE), (12, -3), (u64::from(u32::MAX), i64::MIN + 1)] {
        let v = encode(k, version, balance);
        assert_eq!(v.len(), VALUE_LEN);
        assert_eq!(decode(k, &v, &f), Some((version, balance)));
    }
    let v = encode(k, 3, 5);
    assert_eq!(
        &v[..HEADER_LEN],
        format!("k{k:016x} v{:020} b+{:019} |\n", 3, 5).as_bytes()
    );
    let other = Shape::key(Table::Account, 8);
    let mut g = Vec::new();
    push_filler(other, &mut g);
    assert_ne!(f, g);
    // Another row's value, under either row's filler.
    assert_eq!(decode(k, &encode(other, 3, 5), &f), None);
    assert_eq!(decode(k, &encode(other, 3, 5), &g), None);
    assert_eq!(decode(k, &v[..VALUE_LEN - 1], &f), None);
    for at in [0, 5, VERSION_AT, BALANCE_AT, 62, 100, VALUE_LEN - 1] {
        let mut bad = v.clone();
        bad[at] ^= 0x10;
        assert_eq!(decode(k, &bad, &f), None, "byte {at} flipped");
    }
    assert!(script().contains("string.format('%+020d'"));
}

/// Runs `n` transfers from 2 threads; the number committed.
fn run(bank: &RedisBank, n: u64) -> u64 {
    let committed = AtomicU64::new(0);
    thread::scope(|s| {
        for t in 0..2 {
            let committed = &committed;
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(40 + t);
                for _ in 0..n / 2 {
                    let tr = SHAPE.draw(&mut rng);
                    match bank.transfer(&tr) {
                        Ok(()) => committed.fetch_add(1, Ordering::Relaxed),
                        Err(e) => panic!("transfer {tr:?}: {e}"),
                    };
                }
            });
        }
    });
    committed.into_inner()
}

/// The length of every row's list.
fn list_lengths(bank: &RedisBank) -> Vec<usize> {
    let mut c = bank.group.primary.connect().unwrap();
    SHAPE
        .keys()
        .map(|k| redis::cmd("LLEN").arg(redis_key(k)).query::<usize>(&mut c).unwrap())
        .collect()
}

fn transfers_keep_the_invariant(wait: bool) {
    let Some(bin) = server() else { return };
    let bank = RedisBank::start(&bin, 1, wait, SHAPE, 2, 2).unwrap();
    let fresh = bank.audit().unwrap();
    fresh.check(&SHAPE, 0).unwrap();
    assert_eq!(fresh.values, SHAPE.rows());

    let committed = run(&bank, 2000);
    assert_eq!(committed, 2000);
    let a = bank.audit().unwrap();
    a.check(&SHAPE, committed).unwrap();
    assert_ne!(a.history, 0);
    let lens = list_lengths(&bank);
    assert!(lens.iter().all(|&l| (1..=2).contains(&l)), "{lens:?}");
    // 2000 transfers touch every branch and teller, so they hold both versions.
    assert!(
        lens[..(SHAPE.branches + SHAPE.tellers()) as usize]
            .iter()
            .all(|&l| l == 2)
    );
    assert!(bank.used_memory().unwrap() > 2 * SHAPE.rows() * VALUE_LEN as u64);

    // A corrupted head fails the audit and fails a transfer that reads it, changing nothing.
    let victim = redis_key(Shape::key(Table::Branch, 0));
    let mut raw = bank.group.primary.connect().unwrap();
    redis::cmd("LSET")
        .arg(&victim)
        .arg(0)
        .arg("not a value")
        .query::<()>(&mut raw)
        .unwrap();
    let bad = bank.audit().unwrap();
    assert_eq!(bad.bad_values, 1);
    assert_eq!(bad.values, SHAPE.rows());
    assert!(bad.check(&SHAPE, committed).is_err());
    let t = Transfer {
        account: 0,
        teller: 0,
        branch: 0,
        delta: 5,
    };
    let e = bank.transfer(&t).unwrap_err();
    assert!(matches!(&e, BankError::Backend(m) if m.contains("bad value")), "{e}");
    let after = bank.audit().unwrap();
    assert_eq!((after.history_records, after.accounts), (a.history_records, a.accounts));
    // The failed transfer dropped its connection; the next one opens another.
    let t = Transfer {
        branch: 1,
        teller: 10,
        ..t
    };
    bank.transfer(&t).unwrap();
}

#[test]
fn transfers_keep_the_invariant_async() {
    transfers_keep_the_invariant(false);
}

#[test]
fn transfers_keep_the_invariant_with_wait() {
    transfers_keep_the_invariant(true);
}
