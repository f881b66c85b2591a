//! The compute-node runtime: remotable pointers, spans and far memory (being written).
