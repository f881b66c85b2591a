//! The known contents of the benchmark region, and the check that a reply
//! carries them.
//!
//! Word `i` (bytes `8i..8i+8`) of generation `g` is `splitmix64(g << 56 ^ i)`
//! in little-endian order, so every 8-byte word of the region is distinct and
//! a reply from the wrong offset, a stale generation or a torn transfer shows
//! up as a mismatch.

use anyhow::bail;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A region-sized image of one generation of the pattern.
pub(super) struct Image {
    generation: u64,
    bytes: Vec<u8>,
}

impl Image {
    /// Generates `len` bytes of generation `generation`.
    pub(super) fn new(len: usize, generation: u64) -> Self {
        let mut bytes = vec![0u8; len];
        let mut chunks = bytes.chunks_exact_mut(8);
        let mut i = 0u64;
        for c in &mut chunks {
            c.copy_from_slice(&splitmix64(generation << 56 ^ i).to_le_bytes());
            i += 1;
        }
        let rest = chunks.into_remainder();
        let last = splitmix64(generation << 56 ^ i).to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&last[..n]);
        Self { generation, bytes }
    }

    /// The whole image.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The expected bytes at `offset`.
    pub(super) fn at(&self, offset: u64, len: usize) -> &[u8] {
        let o = offset as usize;
        &self.bytes[o..o + len]
    }

    /// Fails unless `got` equals the image at `offset`.
    pub(super) fn check(&self, what: &str, offset: u64, got: &[u8]) -> anyhow::Result<()> {
        let want = self.at(offset, got.len());
        if want == got {
            return Ok(());
        }
        let first = want.iter().zip(got).position(|(a, b)| a != b).unwrap_or(0);
        let differ = want.iter().zip(got).filter(|(a, b)| a != b).count();
        bail!(
            "{what}: wrong data in a {}-byte reply at region offset {offset}: first difference at +{first} \
             (expected {:#04x}, got {:#04x}); {differ} bytes differ from pattern generation {}",
            got.len(),
            want[first],
            got[first],
            self.generation
        )
    }
}

/// A small deterministic generator of offsets (xorshift64*), so that both
/// sides of a comparison visit the same offsets in the same order.
pub(super) struct Offsets {
    state: u64,
    slots: u64,
    size: u64,
}

impl Offsets {
    /// Offsets of `size`-byte blocks, aligned to `size`, in a region of `region` bytes.
    pub(super) fn new(seed: u64, region: u64, size: u64) -> Self {
        Self {
            state: splitmix64(seed) | 1,
            slots: (region / size).max(1),
            size,
        }
    }

    /// The next offset.
    pub(super) fn next_offset(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) % self.slots * self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_differ_and_check_finds_a_flip() {
        let a = Image::new(4099, 1);
        let b = Image::new(4099, 2);
        assert_ne!(a.bytes(), b.bytes());
        assert!(a.check("t", 8, a.at(8, 4000)).is_ok());
        let mut bad = a.at(8, 4000).to_vec();
        bad[17] ^= 1;
        assert!(a.check("t", 8, &bad).is_err());
        assert!(a.check("t", 16, a.at(8, 4000)).is_err());
    }

    #[test]
    fn offsets_are_aligned_and_in_range() {
        let mut o = Offsets::new(7, 1 << 20, 4096);
        for _ in 0..1000 {
            let x = o.next_offset();
            assert_eq!(x % 4096, 0);
            assert!(x + 4096 <= 1 << 20);
        }
    }
}
