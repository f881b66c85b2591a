//! The span checksum, shared by compute nodes (computed on eviction, checked
//! on swap-in) and memory nodes (computed over shards they rebuild, so the
//! compute node can verify a reconstruction without reading it back).

/// 64-bit checksum of a span, computed on eviction and checked on swap-in.
/// Four independent multiply-rotate lanes over 32-byte blocks: a single
/// chain would serialize on the multiply latency (measured as the dominant
/// cost of a 72 KiB swap-in), four lanes let the CPU overlap them.
pub fn checksum(bytes: &[u8]) -> u64 {
    const P: u64 = 0x0000_0100_0000_01B3;
    let mut h = [
        0xcbf2_9ce4_8422_2325u64,
        0x9E37_79B9_7F4A_7C15,
        0xD6E8_FEB8_6659_FD93,
        0x94D0_49BB_1331_11EB,
    ];
    let mut blocks = bytes.chunks_exact(32);
    for b in &mut blocks {
        for (lane, w) in h.iter_mut().zip(b.chunks_exact(8)) {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            *lane = (*lane ^ w).wrapping_mul(P).rotate_left(29);
        }
    }
    let mut acc = h[0] ^ h[1].rotate_left(16) ^ h[2].rotate_left(32) ^ h[3].rotate_left(48);
    for &b in blocks.remainder() {
        acc = (acc ^ b as u64).wrapping_mul(P);
    }
    acc ^ bytes.len() as u64
}

#[cfg(test)]
mod checksum_tests {
    use super::checksum;

    #[test]
    fn any_single_bit_flip_changes_the_checksum() {
        let mut v: Vec<u8> = (0..8192u32).map(|i| (i * 31 % 251) as u8).collect();
        let base = checksum(&v);
        for byte in [0, 7, 8, 31, 32, 4095, 8191] {
            for bit in 0..8 {
                v[byte] ^= 1 << bit;
                assert_ne!(checksum(&v), base, "flip of byte {byte} bit {bit} undetected");
                v[byte] ^= 1 << bit;
            }
        }
        assert_eq!(checksum(&v), base);
        assert_ne!(checksum(&v[..8191]), checksum(&v[..8190]));
    }
}
