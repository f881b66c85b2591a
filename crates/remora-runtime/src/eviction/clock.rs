//! CLOCK (second chance): an access sets the reference byte, a sweep clears
//! it; a span whose objects were not touched since the last sweep is cold.

use super::EvictionPolicy;

/// The CLOCK policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Clock;

impl EvictionPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn age(&self, _hotness: u8) -> u8 {
        0
    }

    fn span_score(&self, hotness: &[u8], object_size: usize) -> f64 {
        if hotness.is_empty() {
            return 0.0;
        }
        let referenced = hotness.iter().filter(|&&h| h > 0).count() as f64 / hotness.len() as f64;
        // Equal reference fractions: larger objects go first (a tie-breaker
        // worth less than one referenced object in a hundred).
        referenced - (object_size as f64).log2() * 1e-3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_and_large_rank_first() {
        let c = Clock;
        assert!(c.span_score(&[0, 0, 0], 64) < c.span_score(&[0, 255, 0], 64));
        assert!(c.span_score(&[0, 0], 4096) < c.span_score(&[0, 0], 64));
        assert!(c.span_score(&[255], 1 << 20) > c.span_score(&[0, 0], 16));
        assert_eq!(c.age(255), 0);
    }
}
