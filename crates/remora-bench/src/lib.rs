//! remora's benchmarks. Each benchmark starts its own
//! local cluster and prints what it measured next to a baseline measured in
//! the same run, as ratios.

pub mod drain;
pub mod micro;
pub mod net;
pub mod runtime_bench;
