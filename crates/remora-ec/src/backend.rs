//! Choice of the GF(2^8) slice kernels: `reed-solomon-erasure`'s SIMD C code, or our portable
//! tables. See the crate documentation for why the SIMD code needs a run-time CPU check.

use crate::gf;

/// Which GF(2^8) slice kernels a [`Codec`](crate::Codec) runs.
///
/// Both backends compute bit-identical results; only speed differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `reed-solomon-erasure`'s C kernels (`simd-accel`): AVX2 on x86_64 (the C is compiled
    /// with `-march=haswell`), NEON on aarch64. Only selectable when
    /// [`Backend::simd_available`] is true.
    Simd,
    /// Pure Rust, table-driven kernels of this crate. Available on every CPU and target.
    Portable,
}

/// True when this build links the library's SIMD C code (mirrors the `cfg` in
/// `reed-solomon-erasure`'s build script, under which it compiles `simd_c/reedsolomon.c`).
macro_rules! if_simd_compiled {
    ($($item:item)*) => {$(
        #[cfg(all(
            feature = "simd",
            any(target_arch = "x86_64", target_arch = "aarch64"),
            not(target_env = "msvc"),
            not(any(target_os = "android", target_os = "ios"))
        ))]
        $item
    )*};
}

macro_rules! if_simd_not_compiled {
    ($($item:item)*) => {$(
        #[cfg(not(all(
            feature = "simd",
            any(target_arch = "x86_64", target_arch = "aarch64"),
            not(target_env = "msvc"),
            not(any(target_os = "android", target_os = "ios"))
        )))]
        $item
    )*};
}

/// x86 features implied by gcc's `-march=haswell`, which the library's build script uses
/// for its C code, restricted to those a compiler may emit without explicit intrinsics (plus
/// AVX2 itself). AES, PCLMUL, RDRND, FSGSBASE and XSAVE are only reachable through
/// intrinsics, which `reedsolomon.c` does not use.
pub(crate) const HASWELL_FEATURES: &[&str] = &[
    "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2", "lzcnt", "movbe", "f16c",
];

/// Pure selection logic, separated from the CPU probe so tests can feed it a CPU without
/// AVX2. `cpu_has(name)` answers for the names in [`HASWELL_FEATURES`].
pub(crate) fn select(simd_compiled: bool, x86: bool, cpu_has: &dyn Fn(&str) -> bool) -> Backend {
    if !simd_compiled {
        Backend::Portable
    } else if !x86 || HASWELL_FEATURES.iter().all(|f| cpu_has(f)) {
        // aarch64: NEON is part of the base ISA, the C code needs nothing else.
        Backend::Simd
    } else {
        Backend::Portable
    }
}

if_simd_compiled! {
    /// Whether this build links the library's SIMD C code.
    pub(crate) const SIMD_COMPILED: bool = true;

    #[cfg(target_arch = "x86_64")]
    fn cpu_has(name: &str) -> bool {
        match name {
            "sse3" => std::arch::is_x86_feature_detected!("sse3"),
            "ssse3" => std::arch::is_x86_feature_detected!("ssse3"),
            "sse4.1" => std::arch::is_x86_feature_detected!("sse4.1"),
            "sse4.2" => std::arch::is_x86_feature_detected!("sse4.2"),
            "popcnt" => std::arch::is_x86_feature_detected!("popcnt"),
            "avx" => std::arch::is_x86_feature_detected!("avx"),
            "avx2" => std::arch::is_x86_feature_detected!("avx2"),
            "fma" => std::arch::is_x86_feature_detected!("fma"),
            "bmi1" => std::arch::is_x86_feature_detected!("bmi1"),
            "bmi2" => std::arch::is_x86_feature_detected!("bmi2"),
            "lzcnt" => std::arch::is_x86_feature_detected!("lzcnt"),
            "movbe" => std::arch::is_x86_feature_detected!("movbe"),
            "f16c" => std::arch::is_x86_feature_detected!("f16c"),
            _ => false,
        }
    }

    fn detect() -> Backend {
        #[cfg(target_arch = "x86_64")]
        {
            select(SIMD_COMPILED, true, &cpu_has)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            select(SIMD_COMPILED, false, &|_| true)
        }
    }

    /// The library's SIMD kernels. Only reached through `Backend::Simd`, which a `Codec` holds
    /// only after `Backend::simd_available()` said yes.
    mod simd {
        use reed_solomon_erasure::galois_8;

        #[inline]
        pub(super) fn mul(c: u8, src: &[u8], dst: &mut [u8]) {
            // The library indexes `[0]`, so empty slices must not reach it.
            if !src.is_empty() {
                galois_8::mul_slice(c, src, dst);
            }
        }

        #[inline]
        pub(super) fn mul_xor(c: u8, src: &[u8], dst: &mut [u8]) {
            if !src.is_empty() {
                galois_8::mul_slice_xor(c, src, dst);
            }
        }
    }
}

if_simd_not_compiled! {
    /// Whether this build links the library's SIMD C code.
    pub(crate) const SIMD_COMPILED: bool = false;

    fn detect() -> Backend {
        select(SIMD_COMPILED, false, &|_| false)
    }
}

impl Backend {
    /// The fastest backend that is safe on this CPU with this build: [`Backend::Simd`] if the
    /// SIMD code is compiled in (feature `simd`) and, on x86_64, the CPU has AVX2 and the
    /// rest of the Haswell instruction set; otherwise [`Backend::Portable`].
    pub fn detect() -> Backend {
        detect()
    }

    /// Whether [`Backend::Simd`] may be used in this process.
    pub fn simd_available() -> bool {
        detect() == Backend::Simd
    }

    /// Short lowercase name, for logs and benchmark output.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Simd => "simd",
            Backend::Portable => "portable",
        }
    }

    /// `dst = c * src`. Lengths must be equal (checked by the callers).
    #[inline]
    pub(crate) fn mul(self, c: u8, src: &[u8], dst: &mut [u8]) {
        debug_assert_eq!(src.len(), dst.len());
        match (self, c) {
            (_, 0) => dst.fill(0),
            (_, 1) => dst.copy_from_slice(src),
            #[cfg(all(
                feature = "simd",
                any(target_arch = "x86_64", target_arch = "aarch64"),
                not(target_env = "msvc"),
                not(any(target_os = "android", target_os = "ios"))
            ))]
            (Backend::Simd, _) => simd::mul(c, src, dst),
            _ => gf::mul_slice_portable(c, src, dst),
        }
    }

    /// `dst ^= c * src`. Lengths must be equal (checked by the callers).
    #[inline]
    pub(crate) fn mul_xor(self, c: u8, src: &[u8], dst: &mut [u8]) {
        debug_assert_eq!(src.len(), dst.len());
        match (self, c) {
            (_, 0) => {}
            (_, 1) => gf::xor_slice(dst, src),
            #[cfg(all(
                feature = "simd",
                any(target_arch = "x86_64", target_arch = "aarch64"),
                not(target_env = "msvc"),
                not(any(target_os = "android", target_os = "ios"))
            ))]
            (Backend::Simd, _) => simd::mul_xor(c, src, dst),
            _ => gf::mul_slice_xor_portable(c, src, dst),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
