//! Byte patterns for raw reads and writes of regions, compared byte for byte.

/// Fills `buf`, found at `offset` (a multiple of 8) of its region, with
/// bytes that depend on `seed` and on each byte's position, so a misplaced,
/// stale or corrupted chunk never compares equal.
pub fn fill_pattern(seed: u64, offset: u64, buf: &mut [u8]) {
    debug_assert_eq!(offset % 8, 0);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let word = (offset / 8 + i as u64) ^ seed.rotate_left(32);
        let v = word.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
        chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
    }
}

/// A fresh buffer of `len` pattern bytes ([`fill_pattern`]).
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(seed, offset, &mut v);
    v
}

/// Asserts equality with a short message instead of dumping megabytes.
#[track_caller]
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i}: got {:#04x}, want {:#04x}",
            got[i], want[i]
        );
    }
}
