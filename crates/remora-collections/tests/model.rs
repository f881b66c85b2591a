//! Model-based tests: random operation sequences run on a far collection and
//! on std's, every result compared, with a local budget small enough that
//! most values are far (in-process memory nodes, `ec-batch`; the same
//! collections run against real processes in the workspace's `tests/`).

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use remora_collections::{RemHashMap, RemVec};
use remora_memnode::InProcessCluster;
use remora_runtime::Runtime;
use remora_runtime::scheme::SchemeOptions;
use remora_testkit::in_process;

/// 256 bytes, different for every (key, version).
type Val = [u64; 32];

fn val(k: u64, v: u64) -> Val {
    std::array::from_fn(|i| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (v << 20) ^ i as u64)
}

/// 1 KiB, different for every (key, version): the map's values.
type Big = [u64; 128];

fn big(k: u64, v: u64) -> Big {
    std::array::from_fn(|i| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (v << 20) ^ i as u64)
}

fn runtime(c: &InProcessCluster) -> Runtime {
    // 64 KiB of local memory: the sequences below hold up to 1 MiB.
    in_process::runtime(c, in_process::config("ec-batch", &SchemeOptions::default(), 64 << 10))
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    })
}

#[derive(Debug, Clone)]
enum VecOp {
    Push(u64),
    Extend(u64, usize),
    Pop,
    Get(usize),
    Set(usize, u64),
    Truncate(usize),
    Iter(usize),
}

fn vec_op() -> impl Strategy<Value = VecOp> {
    prop_oneof![
        4 => any::<u64>().prop_map(VecOp::Push),
        2 => (any::<u64>(), 0..40usize).prop_map(|(s, n)| VecOp::Extend(s, n)),
        2 => Just(VecOp::Pop),
        4 => (0..4000usize).prop_map(VecOp::Get),
        3 => (0..4000usize, any::<u64>()).prop_map(|(i, v)| VecOp::Set(i, v)),
        1 => (0..4000usize).prop_map(VecOp::Truncate),
        1 => (0..4000usize).prop_map(VecOp::Iter),
    ]
}

#[test]
fn rem_vec_behaves_like_vec() {
    let c = InProcessCluster::new(7, 64, 2 << 20);
    let rt = runtime(&c);
    let mut runner = runner();
    runner
        .run(&prop::collection::vec(vec_op(), 1..400), |ops| {
            // 2 KiB chunks (7 values each): many chunks, most of them far.
            let far = RemVec::<Val>::with_chunk_bytes(&rt, 2 << 10);
            let mut std_vec: Vec<Val> = Vec::new();
            for op in ops {
                match op {
                    VecOp::Push(x) => {
                        let i = far.push(val(x, 0)).unwrap();
                        prop_assert_eq!(i, std_vec.len());
                        std_vec.push(val(x, 0));
                    }
                    VecOp::Extend(s, n) => {
                        let vals: Vec<Val> = (0..n as u64).map(|j| val(s, j)).collect();
                        prop_assert_eq!(far.extend_from_slice(&vals).unwrap(), std_vec.len());
                        std_vec.extend_from_slice(&vals);
                    }
                    VecOp::Pop => prop_assert_eq!(far.pop().unwrap(), std_vec.pop()),
                    VecOp::Get(i) => prop_assert_eq!(far.get(i).unwrap(), std_vec.get(i).copied()),
                    VecOp::Set(i, x) => {
                        let ok = far.set(i, val(x, 1)).unwrap();
                        prop_assert_eq!(ok, i < std_vec.len());
                        if ok {
                            std_vec[i] = val(x, 1);
                        }
                    }
                    VecOp::Truncate(n) => {
                        far.truncate(n);
                        std_vec.truncate(n);
                    }
                    VecOp::Iter(from) => {
                        let got: Vec<Val> = far.iter_from(from).map(Result::unwrap).collect();
                        prop_assert_eq!(&got[..], std_vec.get(from..).unwrap_or(&[]));
                    }
                }
                prop_assert_eq!(far.len(), std_vec.len());
            }
            let all: Vec<Val> = far.iter().map(Result::unwrap).collect();
            prop_assert_eq!(all, std_vec);
            Ok(())
        })
        .unwrap();
    let st = rt.stats();
    assert!(
        st.traffic.swap_outs > 0 && st.traffic.swap_ins > 0,
        "values went far and came back: {st:?}"
    );
}

#[derive(Debug, Clone)]
enum MapOp {
    Insert(u64, u64),
    Get(u64),
    Contains(u64),
    Remove(u64),
    Take(u64),
    Update(u64, u64),
    Iter,
}

fn map_op() -> impl Strategy<Value = MapOp> {
    // Keys from a small range, so that operations meet existing keys.
    let key = 0..300u64;
    prop_oneof![
        5 => (key.clone(), any::<u64>()).prop_map(|(k, v)| MapOp::Insert(k, v)),
        5 => key.clone().prop_map(MapOp::Get),
        1 => key.clone().prop_map(MapOp::Contains),
        2 => key.clone().prop_map(MapOp::Remove),
        1 => key.clone().prop_map(MapOp::Take),
        2 => (key, any::<u64>()).prop_map(|(k, v)| MapOp::Update(k, v)),
        1 => Just(MapOp::Iter),
    ]
}

#[test]
fn rem_hash_map_behaves_like_hash_map() {
    let c = InProcessCluster::new(7, 64, 2 << 20);
    let rt = runtime(&c);
    let mut runner = runner();
    runner
        .run(&prop::collection::vec(map_op(), 1..600), |ops| {
            // Few shards for 300 keys: shards hold many entries each.
            let far = RemHashMap::<u64, Big>::with_shards(&rt, 4);
            let mut std_map: HashMap<u64, Big> = HashMap::new();
            for op in ops {
                match op {
                    MapOp::Insert(k, v) => {
                        let replaced = far.insert(k, big(k, v)).unwrap();
                        prop_assert_eq!(replaced, std_map.insert(k, big(k, v)).is_some());
                    }
                    MapOp::Get(k) => prop_assert_eq!(far.get(&k).unwrap(), std_map.get(&k).copied()),
                    MapOp::Contains(k) => prop_assert_eq!(far.contains_key(&k), std_map.contains_key(&k)),
                    MapOp::Remove(k) => prop_assert_eq!(far.remove(&k), std_map.remove(&k).is_some()),
                    MapOp::Take(k) => prop_assert_eq!(far.take(&k).unwrap(), std_map.remove(&k)),
                    MapOp::Update(k, v) => {
                        let f = |x: &mut Big| x[3] ^= v;
                        let had = far.update(&k, f).unwrap();
                        prop_assert_eq!(had, std_map.get_mut(&k).map(f).is_some());
                    }
                    MapOp::Iter => {
                        let mut got: Vec<(u64, Big)> = far.iter().map(Result::unwrap).collect();
                        got.sort_by_key(|e| e.0);
                        let mut want: Vec<(u64, Big)> = std_map.iter().map(|(k, v)| (*k, *v)).collect();
                        want.sort_by_key(|e| e.0);
                        prop_assert_eq!(got, want);
                    }
                }
            }
            prop_assert_eq!(far.len(), std_map.len());
            for (k, v) in &std_map {
                prop_assert_eq!(far.get(k).unwrap(), Some(*v));
            }
            Ok(())
        })
        .unwrap();
    let st = rt.stats();
    assert!(
        st.traffic.swap_outs > 0 && st.traffic.swap_ins > 0,
        "values went far and came back: {st:?}"
    );
}

/// Keys that are not `Copy` and looked up by a borrowed form, as with std.
#[test]
fn string_keys_are_looked_up_by_str() {
    let c = InProcessCluster::new(7, 16, 2 << 20);
    let rt = runtime(&c);
    let m = RemHashMap::<String, u64>::new(&rt);
    for i in 0..1000u64 {
        assert!(!m.insert(format!("key-{i}"), i * 3).unwrap());
    }
    assert_eq!(m.get("key-17").unwrap(), Some(51));
    assert!(m.contains_key("key-999"));
    assert!(!m.contains_key("key-1000"));
    assert!(m.remove("key-17"));
    assert_eq!(m.get("key-17").unwrap(), None);
    assert_eq!(m.len(), 999);
}

#[derive(Debug, Clone)]
enum TreeOp {
    Insert(u64, u64),
    InsertMany(u64, u64),
    Get(u64),
    Contains(u64),
    Remove(u64),
    RemoveMany(u64, u64),
    Range(u64, u64),
    Iter,
}

fn tree_op() -> impl Strategy<Value = TreeOp> {
    let key = 0..5000u64;
    prop_oneof![
        4 => (key.clone(), any::<u64>()).prop_map(|(k, v)| TreeOp::Insert(k, v)),
        2 => (key.clone(), 1..400u64).prop_map(|(k, n)| TreeOp::InsertMany(k, n)),
        4 => key.clone().prop_map(TreeOp::Get),
        1 => key.clone().prop_map(TreeOp::Contains),
        2 => key.clone().prop_map(TreeOp::Remove),
        1 => (key.clone(), 1..300u64).prop_map(|(k, n)| TreeOp::RemoveMany(k, n)),
        2 => (key, 0..600u64).prop_map(|(k, n)| TreeOp::Range(k, n)),
        1 => Just(TreeOp::Iter),
    ]
}

#[test]
fn rem_btree_map_behaves_like_btree_map() {
    use std::collections::BTreeMap;

    use remora_collections::RemBTreeMap;
    let c = InProcessCluster::new(7, 64, 2 << 20);
    let rt = runtime(&c);
    let mut runner = runner();
    runner
        .run(&prop::collection::vec(tree_op(), 1..200), |ops| {
            let far = RemBTreeMap::<u64, Val>::new(&rt);
            let mut std_map: BTreeMap<u64, Val> = BTreeMap::new();
            for op in ops {
                match op {
                    TreeOp::Insert(k, v) => {
                        let replaced = far.insert(k, val(k, v)).unwrap();
                        prop_assert_eq!(replaced, std_map.insert(k, val(k, v)).is_some());
                    }
                    TreeOp::InsertMany(k, n) => {
                        // Descending: splits on the left of full nodes too.
                        for j in (k..k + n).rev() {
                            let replaced = far.insert(j, val(j, n)).unwrap();
                            prop_assert_eq!(replaced, std_map.insert(j, val(j, n)).is_some());
                        }
                    }
                    TreeOp::Get(k) => prop_assert_eq!(far.get(&k).unwrap(), std_map.get(&k).copied()),
                    TreeOp::Contains(k) => prop_assert_eq!(far.contains_key(&k).unwrap(), std_map.contains_key(&k)),
                    TreeOp::Remove(k) => prop_assert_eq!(far.remove(&k).unwrap(), std_map.remove(&k).is_some()),
                    TreeOp::RemoveMany(k, n) => {
                        for j in k..k + n {
                            prop_assert_eq!(far.remove(&j).unwrap(), std_map.remove(&j).is_some());
                        }
                    }
                    TreeOp::Range(k, n) => {
                        let got: Vec<(u64, Val)> = far.range(k..k + n).map(Result::unwrap).collect();
                        let want: Vec<(u64, Val)> = std_map.range(k..k + n).map(|(k, v)| (*k, *v)).collect();
                        prop_assert_eq!(got, want);
                        let got: Vec<u64> = far.range(k..=k + n).map(|e| e.unwrap().0).collect();
                        let want: Vec<u64> = std_map.range(k..=k + n).map(|e| *e.0).collect();
                        prop_assert_eq!(got, want);
                        let got: Vec<u64> = far.range(k..).take(50).map(|e| e.unwrap().0).collect();
                        let want: Vec<u64> = std_map.range(k..).take(50).map(|e| *e.0).collect();
                        prop_assert_eq!(got, want);
                    }
                    TreeOp::Iter => {
                        let got: Vec<(u64, Val)> = far.iter().map(Result::unwrap).collect();
                        let want: Vec<(u64, Val)> = std_map.iter().map(|(k, v)| (*k, *v)).collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(far.len(), std_map.len());
            }
            let got: Vec<(u64, Val)> = far.iter().map(Result::unwrap).collect();
            let want: Vec<(u64, Val)> = std_map.iter().map(|(k, v)| (*k, *v)).collect();
            prop_assert_eq!(got, want);
            far.clear();
            prop_assert_eq!(far.iter().count(), 0);
            prop_assert_eq!(far.get(&1).unwrap(), None);
            Ok(())
        })
        .unwrap();
    let st = rt.stats();
    assert!(
        st.traffic.swap_outs > 0 && st.traffic.swap_ins > 0,
        "nodes and values went far and came back: {st:?}"
    );
}
