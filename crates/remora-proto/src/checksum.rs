//! The span checksum, shared by compute nodes (computed on eviction, checked
//! on swap-in) and memory nodes (computed over shards they rebuild, so the
//! compute node can verify a reconstruction without reading it back).

/// 64-bit checksum of a span, computed on eviction and checked on swap-in:
/// XXH3-64, which runs at memory speed with SIMD, so a span's checksum costs
/// a small fraction of moving it over the network.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
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
