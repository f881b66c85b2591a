//! Test objects: plain data whose every byte depends on (id, version).

use remora_runtime::{RemBox, Remotable};

/// Word `i` of object `id` at `version`: differs between objects, versions
/// and positions (the id goes through a multiplication first, so ids that
/// differ only in high bits differ in every word too).
pub fn word(id: u64, version: u64, i: usize) -> u64 {
    let x = (id.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ version.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 31)
}

/// An object of `16 + 8 * N` bytes: its id, its version, and `N` words
/// derived from both ([`word`]).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Words<const N: usize> {
    /// Which object this is.
    pub id: u64,
    /// How many times it was rewritten.
    pub version: u64,
    /// Word `i` is `word(id, version, i)`.
    pub words: [u64; N],
}
// SAFETY: integers only: the bytes are the whole value, valid anywhere.
unsafe impl<const N: usize> Remotable for Words<N> {}

/// 1 KiB (with the runtime's 8-byte header, the 1152-byte class).
pub type Obj = Words<126>;
/// 2 KiB (with the header, one 2304-byte slot).
pub type Obj2K = Words<254>;
/// 4 KiB (with the header, the 4736-byte class).
pub type Obj4K = Words<510>;

/// Object `id` at `version`, of whatever size the context wants.
pub fn obj<const N: usize>(id: u64, version: u64) -> Words<N> {
    Words::new(id, version)
}

impl<const N: usize> Words<N> {
    /// Object `id` at `version`.
    pub fn new(id: u64, version: u64) -> Self {
        Self {
            id,
            version,
            words: std::array::from_fn(|i| word(id, version, i)),
        }
    }

    /// Object `id` at `version`, built on the heap (for objects too large
    /// to pass around on a test thread's stack comfortably).
    pub fn boxed(id: u64, version: u64) -> Box<Self> {
        let mut b = Box::new(Self {
            id,
            version,
            words: [0; N],
        });
        b.rewrite(version);
        b
    }

    /// Makes this object its own id at `version`.
    pub fn rewrite(&mut self, version: u64) {
        self.version = version;
        for (i, w) in self.words.iter_mut().enumerate() {
            *w = word(self.id, version, i);
        }
    }

    /// Whether this is object `id` at `version`, every word of it.
    pub fn is(&self, id: u64, version: u64) -> bool {
        self.id == id && self.version == version && (0..N).all(|i| self.words[i] == word(id, version, i))
    }

    /// Asserts this is object `id` at `version`, naming the first wrong word.
    #[track_caller]
    pub fn check(&self, id: u64, version: u64) {
        assert_eq!((self.id, self.version), (id, version), "object {id}: header");
        if let Some(i) = (0..N).find(|&i| self.words[i] != word(id, version, i)) {
            panic!(
                "object {id} v{version} ({} bytes): word {i} is {:#x}, want {:#x}",
                16 + 8 * N,
                self.words[i],
                word(id, version, i)
            );
        }
    }
}

/// What every [`Text`] starts with, and what a proxy on the data path looks
/// for to tell whether it sees plaintext.
pub const MARK: &[u8] = b"REMORA-PLAINTEXT-MARK:";

/// A 2 KiB object whose text is readable: [`MARK`], its id and version,
/// over and over.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Text {
    /// Which object this is.
    pub id: u64,
    /// How many times it was rewritten.
    pub version: u64,
    /// The line, repeated.
    pub text: [u8; 2032],
}
// SAFETY: integers and bytes only.
unsafe impl Remotable for Text {}

impl Text {
    /// Text object `id` at `version`.
    pub fn new(id: u64, version: u64) -> Self {
        let line = format!("{}{id:08}/{version}|", String::from_utf8_lossy(MARK));
        let mut text = [0u8; 2032];
        for (i, b) in text.iter_mut().enumerate() {
            *b = line.as_bytes()[i % line.len()];
        }
        Self { id, version, text }
    }

    /// Asserts this is text object `id` at `version`, every byte.
    #[track_caller]
    pub fn check(&self, id: u64, version: u64) {
        assert_eq!((self.id, self.version), (id, version), "object {id}: header");
        assert!(
            self.text == Self::new(id, version).text,
            "object {id} v{version}: text differs"
        );
    }
}

/// A list node holding a `T`: a remotable pointer inside a remotable
/// object (valid while the object is far), and drop glue to run when one
/// is freed.
pub struct Node<T: Remotable> {
    /// The payload.
    pub value: T,
    /// The next node, if any.
    pub next: Option<RemBox<Node<T>>>,
}
// SAFETY: a remotable value and a remotable pointer.
unsafe impl<T: Remotable> Remotable for Node<T> {}
