//! Reed-Solomon erasure codec for remora spansets (being written).
