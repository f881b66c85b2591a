//! TCMalloc's size classes for 8 KiB pages (paper §3.3: "86 different size classes").
//!
//! The table is TCMalloc's `size_classes.cc` for `TCMALLOC_PAGE_SHIFT == 13`, the variant
//! compiled when `__STDCPP_DEFAULT_NEW_ALIGNMENT__ > 8` (the default on x86-64 and aarch64).
//! Like TCMalloc we count 86 classes including the sentinel class 0, which holds nothing; the
//! 85 usable classes are `1..=85`. We took this variant over the 8-byte-aligned one because
//! every class above 8 bytes is then a multiple of 16, so (spans being 8 KiB-aligned) every
//! object larger than 8 bytes is 16-byte aligned, which any Rust type up to `align(16)` needs.
//! TCMalloc's per-class batch size is left out: it sizes thread-cache transfers, which this
//! crate does not have.
//!
//! One change to the span lengths: far memory swaps whole spans in, so a longer span costs a
//! longer read on every miss (and brings in objects nobody asked for). Each class takes the
//! fewest pages whose tail waste, as a share of the span, is no larger than in TCMalloc's entry
//! ([`SIZE_CLASSES`] is derived from TCMalloc's table at compile time). Five classes change,
//! 1152 to 2688 bytes, from 2 pages to 1, with the same waste; their swap-ins read half as much.
//!
//! Size → class lookup is TCMalloc's `class_array`, one byte per entry, at two granularities:
//!
//! ```text
//!   size <= 1024:  index = (size + 7) >> 3                     (8-byte steps,    0..=128)
//!   size >  1024:  index = (size + 127 + (120 << 7)) >> 7      (128-byte steps, 129..=2168)
//! ```
//!
//! The second formula continues the first without a gap: 1025 maps to 129. It is exact only
//! because every class above 1024 bytes is a multiple of 128 and every class up to 1024 a
//! multiple of 8; both facts are checked when the table is built (at compile time).

/// log2 of the page size.
pub(crate) const PAGE_SHIFT: u32 = 13;
/// The page size: spans are made of whole pages and aligned to a page boundary.
pub const PAGE_SIZE: usize = 1 << PAGE_SHIFT;
/// Number of size classes, counting the unused class 0 as TCMalloc does.
pub(crate) const NUM_CLASSES: usize = 86;
/// The largest size served from a size class; larger objects get a dedicated span.
pub(crate) const MAX_SIZE: usize = 262_144;
/// A span of fewer objects than this is one the filtering threads leave alone, and one
/// [`SizeClass::for_object`] may replace by a span per object.
pub(crate) const MIN_SHARED_OBJECTS: usize = 4;
/// A dedicated span may cost up to `DEDICATED_MAX_NUM / DEDICATED_MAX_DEN` of the span
/// bytes per object of the class it replaces ([`SizeClass::for_object`]).
pub(crate) const DEDICATED_MAX_NUM: usize = 5;
/// See [`DEDICATED_MAX_NUM`].
pub(crate) const DEDICATED_MAX_DEN: usize = 4;
/// Sizes up to this one are looked up at 8-byte granularity.
const MAX_SMALL_SIZE: usize = 1024;

/// One size class: the object size and the length of the spans that hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeClass {
    size: u32,
    pages: u32,
}

impl SizeClass {
    const fn new(size: u32, pages: u32) -> Self {
        Self { size, pages }
    }

    /// The smallest class whose objects hold `bytes`, or `None` when `bytes > MAX_SIZE` (such an
    /// object gets a dedicated span of `pages_for(bytes)` pages). A zero-byte request gets the
    /// 8-byte class, so that every allocation has its own address.
    #[inline]
    pub fn for_size(bytes: usize) -> Option<ClassIndex> {
        if bytes > MAX_SIZE {
            return None;
        }
        Some(ClassIndex(CLASS_ARRAY[class_array_index(bytes)]))
    }

    /// Where a remotable object of `bytes` bytes (header included) goes: its size class, or
    /// `None` for a dedicated span of `pages_for(bytes)` pages.
    ///
    /// Besides the sizes above `MAX_SIZE` (256 KiB), an object gets its own span when its class puts
    /// fewer than `MIN_SHARED_OBJECTS` in a span and a dedicated span costs at most
    /// `DEDICATED_MAX_NUM / DEDICATED_MAX_DEN` of the class's span bytes per object.
    /// Filtering leaves such few-object spans alone (moving one object moves a large share of
    /// the span), so without this one hot object keeps its cold span-mates local, and a miss
    /// on it swaps them all in: with 16 KiB values (20 KiB class, two per 40 KiB span) the
    /// `bench micro` miss ratio was 1.55x an ideal LRU's; in spans of their own, 24 KiB each,
    /// close to it.
    pub fn for_object(bytes: usize) -> Option<ClassIndex> {
        let class = Self::for_size(bytes)?;
        let info = class.info();
        if info.objects() < MIN_SHARED_OBJECTS {
            let per_object = info.span_bytes() / info.objects();
            let dedicated = pages_for(bytes)? * PAGE_SIZE;
            if dedicated * DEDICATED_MAX_DEN <= per_object * DEDICATED_MAX_NUM {
                return None;
            }
        }
        Some(class)
    }

    /// The smallest class that holds `bytes` and whose objects all start at a multiple of
    /// `align` (a power of two). Objects sit at `span_start + i * size` with 8 KiB-aligned
    /// span starts, so that means a class size divisible by `align`. `None` when no class
    /// qualifies, which for `align <= PAGE_SIZE` means `bytes > MAX_SIZE` (a dedicated span,
    /// 8 KiB-aligned, serves those). Alignments above `PAGE_SIZE` are never met by a class.
    pub fn for_size_and_align(bytes: usize, align: usize) -> Option<ClassIndex> {
        debug_assert!(align.is_power_of_two());
        if align > PAGE_SIZE {
            return None;
        }
        let first = Self::for_size(bytes)?;
        (first.0 as usize..NUM_CLASSES)
            .find(|&c| SIZE_CLASSES[c].size() % align == 0)
            .map(|c| ClassIndex(c as u8))
    }

    /// Object size in bytes.
    #[inline]
    pub const fn size(&self) -> usize {
        self.size as usize
    }

    /// Pages in each span of this class.
    #[inline]
    pub const fn pages(&self) -> usize {
        self.pages as usize
    }

    /// Bytes in each span of this class.
    #[inline]
    pub const fn span_bytes(&self) -> usize {
        self.pages() * PAGE_SIZE
    }

    /// Objects in each span of this class (the tail that cannot hold a whole object is waste).
    #[inline]
    pub const fn objects(&self) -> usize {
        if self.size == 0 {
            0
        } else {
            self.span_bytes() / self.size()
        }
    }
}

/// Pages of a dedicated span for an object of `bytes` bytes (at least one page); `None` on
/// overflow.
#[inline]
pub(crate) const fn pages_for(bytes: usize) -> Option<usize> {
    match bytes.checked_add(PAGE_SIZE - 1) {
        Some(b) if bytes > 0 => Some(b >> PAGE_SHIFT),
        Some(_) => Some(1),
        None => None,
    }
}

/// Index of a usable size class, `1..NUM_CLASSES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassIndex(u8);

impl ClassIndex {
    /// The class with index `index`, if it is a usable one (`1..NUM_CLASSES`).
    pub const fn new(index: usize) -> Option<Self> {
        if index >= 1 && index < NUM_CLASSES {
            Some(Self(index as u8))
        } else {
            None
        }
    }

    /// The numeric index, `1..NUM_CLASSES`.
    #[inline]
    pub const fn get(self) -> usize {
        self.0 as usize
    }

    /// The class's entry in the size-class table.
    #[inline]
    pub fn info(self) -> &'static SizeClass {
        &SIZE_CLASSES[self.0 as usize]
    }

    /// Every usable class, smallest first.
    pub fn all() -> impl Iterator<Item = ClassIndex> {
        (1..NUM_CLASSES).map(|c| ClassIndex(c as u8))
    }
}

const fn c(size: u32, pages: u32) -> SizeClass {
    SizeClass::new(size, pages)
}

/// The table, indexed by class; entry 0 is TCMalloc's empty sentinel.
pub(crate) static SIZE_CLASSES: [SizeClass; NUM_CLASSES] = TABLE;

/// TCMalloc's table with each span shortened as far as it goes without more tail waste.
const TABLE: [SizeClass; NUM_CLASSES] = shortest_spans(TCMALLOC);

/// The fewest pages for each class whose tail waste, as a share of the span, is at most that of
/// TCMalloc's choice.
const fn shortest_spans(table: [SizeClass; NUM_CLASSES]) -> [SizeClass; NUM_CLASSES] {
    let mut out = table;
    let mut class = 1;
    while class < NUM_CLASSES {
        let (size, pages) = (table[class].size as u64, table[class].pages as u64);
        let mut p = 1;
        // tail_waste(p) / p <= tail_waste(pages) / pages, cross-multiplied.
        while p < pages && ((p * PAGE_SIZE as u64) < size || tail_waste(size, p) * pages > tail_waste(size, pages) * p)
        {
            p += 1;
        }
        out[class] = SizeClass::new(size as u32, p as u32);
        class += 1;
    }
    out
}

/// Bytes at the end of a span of `pages` pages that no object of `size` bytes fits in.
const fn tail_waste(size: u64, pages: u64) -> u64 {
    let span = pages * PAGE_SIZE as u64;
    span % size
}

#[rustfmt::skip]
const TCMALLOC: [SizeClass; NUM_CLASSES] = [
    c(0, 0),
    c(8, 1), c(16, 1), c(32, 1), c(48, 1), c(64, 1), c(80, 1), c(96, 1), c(112, 1),
    c(128, 1), c(144, 1), c(160, 1), c(176, 1), c(192, 1), c(208, 1), c(224, 1), c(240, 1),
    c(256, 1), c(272, 1), c(288, 1), c(304, 1), c(320, 1), c(336, 1), c(352, 1), c(368, 1),
    c(384, 1), c(400, 1), c(416, 1), c(448, 1), c(480, 1), c(512, 1), c(576, 1), c(640, 1),
    c(704, 1), c(768, 1), c(896, 1), c(1024, 1), c(1152, 2), c(1280, 2), c(1408, 2),
    c(1536, 2), c(1792, 2), c(2048, 2), c(2304, 2), c(2688, 2), c(2816, 3), c(3200, 2),
    c(3456, 3), c(3584, 4), c(4096, 1), c(4736, 3), c(5376, 2), c(6144, 3), c(6528, 4),
    c(6784, 5), c(7168, 7), c(8192, 1), c(9472, 5), c(10240, 4), c(12288, 3), c(13568, 5),
    c(14336, 7), c(16384, 2), c(20480, 5), c(24576, 3), c(28672, 7), c(32768, 4),
    c(40960, 5), c(49152, 6), c(57344, 7), c(65536, 8), c(73728, 9), c(81920, 10),
    c(90112, 11), c(98304, 12), c(106496, 13), c(122880, 15), c(131072, 16), c(139264, 17),
    c(155648, 19), c(163840, 20), c(180224, 22), c(204800, 25), c(221184, 27),
    c(237568, 29), c(262144, 32),
];

#[inline]
const fn class_array_index(size: usize) -> usize {
    if size <= MAX_SMALL_SIZE {
        (size + 7) >> 3
    } else {
        (size + 127 + (120 << 7)) >> 7
    }
}

const CLASS_ARRAY_LEN: usize = class_array_index(MAX_SIZE) + 1;

static CLASS_ARRAY: [u8; CLASS_ARRAY_LEN] = build_class_array();

/// Fills `class_array` the way TCMalloc's `SizeMap::Init` does, and refuses to compile if the
/// table breaks an assumption the lookup relies on.
const fn build_class_array() -> [u8; CLASS_ARRAY_LEN] {
    assert!(TABLE[NUM_CLASSES - 1].size() == MAX_SIZE);
    let mut array = [0u8; CLASS_ARRAY_LEN];
    let mut next_size = 0;
    let mut class = 1;
    while class < NUM_CLASSES {
        let size = TABLE[class].size();
        assert!(size > TABLE[class - 1].size(), "sizes must strictly increase");
        assert!(size % 8 == 0);
        assert!(size <= MAX_SMALL_SIZE || size % 128 == 0);
        assert!(TABLE[class].objects() >= 1);
        let mut s = next_size;
        while s <= size {
            array[class_array_index(s)] = class as u8;
            s += 8;
        }
        next_size = size + 8;
        class += 1;
    }
    array
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear_scan(bytes: usize) -> Option<usize> {
        (1..NUM_CLASSES).find(|&c| SIZE_CLASSES[c].size() >= bytes)
    }

    #[test]
    fn every_size_maps_to_the_smallest_class_that_fits() {
        for bytes in 1..=MAX_SIZE {
            let got = SizeClass::for_size(bytes).map(ClassIndex::get);
            assert_eq!(got, linear_scan(bytes), "size {bytes}");
        }
        assert_eq!(SizeClass::for_size(0).map(ClassIndex::get), Some(1));
        assert_eq!(SizeClass::for_size(MAX_SIZE + 1), None);
        assert_eq!(SizeClass::for_size(usize::MAX), None);
    }

    #[test]
    fn table_invariants() {
        assert_eq!(SIZE_CLASSES.len(), 86);
        assert_eq!(SIZE_CLASSES[0], SizeClass::new(0, 0));
        assert_eq!(SIZE_CLASSES[1].size(), 8);
        assert_eq!(SIZE_CLASSES[NUM_CLASSES - 1].size(), 262_144);
        for class in ClassIndex::all() {
            let info = class.info();
            let prev = SIZE_CLASSES[class.get() - 1];
            assert!(info.size() > prev.size(), "class {} not increasing", class.get());
            assert_eq!(info.size() % 8, 0);
            if info.size() > 8 {
                assert_eq!(info.size() % 16, 0, "class {} not 16-byte aligned", class.get());
            }
            assert!((1..=32).contains(&info.pages()));
            assert!(info.objects() >= 1);
            // A span is as short as possible for the objects it holds (no wasted whole page).
            let waste = info.span_bytes() - info.objects() * info.size();
            assert!(waste < PAGE_SIZE, "class {} wastes a page", class.get());
            assert!(info.objects() <= crate::span::MAX_OBJECTS_PER_SPAN);
        }
        // Spot checks against TCMalloc's table.
        let find = |size| SIZE_CLASSES.iter().find(|c| c.size() == size).copied();
        assert_eq!(find(2816).map(|c| (c.pages(), c.objects())), Some((3, 8)));
        assert_eq!(find(6784).map(|c| (c.pages(), c.objects())), Some((5, 6)));
        assert_eq!(find(1152).map(|c| (c.pages(), c.objects())), Some((1, 7)));
        assert_eq!(find(2688).map(|c| (c.pages(), c.objects())), Some((1, 3)));
        assert_eq!(find(3200).map(|c| (c.pages(), c.objects())), Some((2, 5)));
        assert_eq!(find(8).map(|c| c.objects()), Some(1024));
    }

    #[test]
    fn spans_are_no_longer_and_waste_no_more_than_tcmalloc() {
        let share = |c: SizeClass| (c.span_bytes() - c.objects() * c.size()) as f64 / c.span_bytes() as f64;
        let mut shortened = Vec::new();
        for class in ClassIndex::all() {
            let (ours, theirs) = (SIZE_CLASSES[class.get()], TCMALLOC[class.get()]);
            assert_eq!(ours.size(), theirs.size());
            assert!(ours.pages() <= theirs.pages());
            assert!(
                share(ours) <= share(theirs) + 1e-12,
                "class {} wastes more",
                class.get()
            );
            if ours.pages() < theirs.pages() {
                shortened.push(ours.size());
            }
            // One page fewer would hold nothing or waste more.
            if ours.pages() > 1 && ours.pages() < theirs.pages() {
                let shorter = SizeClass::new(ours.size() as u32, ours.pages() as u32 - 1);
                assert!(shorter.objects() == 0 || share(shorter) > share(theirs));
            }
        }
        assert_eq!(shortened, [1152, 1280, 1536, 2048, 2688]);
    }

    #[test]
    fn class_index_bounds() {
        assert_eq!(ClassIndex::new(0), None);
        assert_eq!(ClassIndex::new(NUM_CLASSES), None);
        assert_eq!(ClassIndex::new(85).map(ClassIndex::get), Some(85));
        assert_eq!(ClassIndex::all().count(), NUM_CLASSES - 1);
    }

    #[test]
    fn aligned_lookup_picks_a_class_divisible_by_align() {
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096, 8192] {
            for bytes in (0..=MAX_SIZE).step_by(97) {
                let class = SizeClass::for_size_and_align(bytes, align)
                    .expect("MAX_SIZE is a multiple of every alignment up to a page");
                let size = class.info().size();
                assert!(size >= bytes && size % align == 0);
                let smallest =
                    (1..NUM_CLASSES).find(|&c| SIZE_CLASSES[c].size() >= bytes && SIZE_CLASSES[c].size() % align == 0);
                assert_eq!(Some(class.get()), smallest);
            }
        }
        assert_eq!(SizeClass::for_size_and_align(8, 2 * PAGE_SIZE), None);
        assert_eq!(SizeClass::for_size_and_align(MAX_SIZE + 1, 8), None);
    }

    #[test]
    fn pages_for_rounds_up() {
        assert_eq!(pages_for(0), Some(1));
        assert_eq!(pages_for(1), Some(1));
        assert_eq!(pages_for(PAGE_SIZE), Some(1));
        assert_eq!(pages_for(PAGE_SIZE + 1), Some(2));
        assert_eq!(pages_for(MAX_SIZE + 1), Some(33));
        assert_eq!(pages_for(usize::MAX), None);
    }

    #[test]
    fn few_object_classes_give_way_to_dedicated_spans_when_cheap_enough() {
        // 16 KiB values: the 20 KiB class holds two per 40 KiB span; a 24 KiB span each is
        // 1.2x the bytes per object, within the 1.25x allowed.
        assert_eq!(SizeClass::for_object((16 << 10) + 8), None);
        // 12 000 bytes: the 12 KiB class (two per three pages); a dedicated 16 KiB span
        // would be 1.33x: the class stays.
        assert_eq!(SizeClass::for_object(12_000), SizeClass::for_size(12_000));
        assert_eq!(SizeClass::for_size(12_000).unwrap().info().objects(), 2);
        // Classes of four or more per span never change.
        assert_eq!(SizeClass::for_object(1032), SizeClass::for_size(1032));
        assert_eq!(SizeClass::for_object(64), SizeClass::for_size(64));
        // Above the table, as before.
        assert_eq!(SizeClass::for_object(MAX_SIZE + 1), None);
        for c in ClassIndex::all() {
            let info = c.info();
            let chosen = SizeClass::for_object(info.size());
            if info.objects() >= MIN_SHARED_OBJECTS {
                assert_eq!(chosen, Some(c), "class {}", info.size());
            } else if chosen.is_none() {
                let dedicated = pages_for(info.size()).unwrap() * PAGE_SIZE;
                let per_object = info.span_bytes() / info.objects();
                assert!(4 * dedicated <= 5 * per_object, "class {}", info.size());
            }
        }
    }
}
