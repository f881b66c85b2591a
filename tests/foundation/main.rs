//! Foundation tests against real processes: a manager and memory nodes
//! started from the `remora` binary, spoken to over loopback TCP. One test
//! binary (each costs link time in CI), a module per component.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod cluster;
mod manager;
mod protocol;

/// One MiB, in the `u64` region sizes and offsets are given in.
const MIB: u64 = 1 << 20;
