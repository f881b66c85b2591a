//! How objects of one size sit in local spans, so the benchmarks size the
//! data, the local budget and the simulated caches the way the runtime's
//! allocator will lay the objects out.

use remora_runtime::internals::{PAGE_SIZE, SizeClass};

/// How objects of one size sit in local spans (TCMalloc size classes, with
/// the runtime's 8-byte object header, or a span each: `SizeClass::for_object`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanLayout {
    /// The object's value size.
    pub object_size: usize,
    /// Bytes each object takes in its span (header included, rounded to its class).
    pub slot_bytes: usize,
    /// Bytes of each span.
    pub span_bytes: usize,
    /// Objects each span holds.
    pub objects_per_span: usize,
}

impl SpanLayout {
    /// The layout of objects whose value is `object_size` bytes.
    pub fn for_object(object_size: usize) -> Self {
        let need = object_size + 8;
        match SizeClass::for_object(need) {
            Some(c) => {
                let info = c.info();
                Self {
                    object_size,
                    slot_bytes: info.size(),
                    span_bytes: info.span_bytes(),
                    objects_per_span: info.objects(),
                }
            }
            None => {
                let bytes = need.div_ceil(PAGE_SIZE) * PAGE_SIZE;
                Self {
                    object_size,
                    slot_bytes: bytes,
                    span_bytes: bytes,
                    objects_per_span: 1,
                }
            }
        }
    }

    /// Span bytes that `n` objects occupy when packed.
    pub fn bytes_for(&self, n: u64) -> u64 {
        n.div_ceil(self.objects_per_span as u64) * self.span_bytes as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_size_classes() {
        let l = SpanLayout::for_object(4096);
        assert_eq!((l.slot_bytes, l.span_bytes, l.objects_per_span), (4736, 24576, 5));
        let l = SpanLayout::for_object(1024);
        assert_eq!((l.slot_bytes, l.span_bytes, l.objects_per_span), (1152, 8192, 7));
        let l = SpanLayout::for_object(64);
        assert_eq!((l.slot_bytes, l.objects_per_span), (80, 102));
        let l = SpanLayout::for_object(1 << 20);
        assert_eq!((l.span_bytes, l.objects_per_span), ((1 << 20) + PAGE_SIZE, 1));
        assert_eq!(SpanLayout::for_object(4096).bytes_for(11), 3 * 24576);
        // Few per span in their class (two per 40 KiB): a span each.
        let l = SpanLayout::for_object(16 << 10);
        assert_eq!((l.slot_bytes, l.span_bytes, l.objects_per_span), (24576, 24576, 1));
    }
}
