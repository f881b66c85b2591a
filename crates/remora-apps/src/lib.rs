//! Applications built on remora's public API, as a user would build them,
//! and run through the `remora` binary. `remora demo` is the promise in one
//! run: a workload over remotable objects survives a memory node killed
//! with SIGKILL, and every object is verified at the end. `remora chaos` is
//! the same promise under a seeded schedule of kills, pauses and partitions.
//! [`kv`] is the paper's transactional KV store, run by `remora bench kv`.

pub mod chaos;
pub mod compute_worker;
pub mod demo;
pub mod kv;
mod plot;
pub mod throughput;
mod workload;
