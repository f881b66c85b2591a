//! remora's benchmarks. Each benchmark starts its own
//! local cluster and prints what it measured next to a baseline measured in
//! the same run, as ratios.

// The JSON records of `bench micro` are single `json!` literals of many
// fields, deeper than the default limit lets the macro expand.
#![recursion_limit = "256"]

pub mod collections;
pub mod drain;
pub mod kv;
pub mod micro;
pub mod net;
pub mod runtime_bench;
