//! Reed-Solomon RS(k, m) erasure coding over GF(2^8) for remora spansets (Carbink §3.4).
//!
//! A spanset's `k` equal-sized data spans are coded into `m` parity fragments; any `k` of the
//! `k + m` shards recover the rest. [`Codec`] offers full [`encode`](Codec::encode) (swap-out),
//! [`reconstruct`](Codec::reconstruct) / [`reconstruct_slices`](Codec::reconstruct_slices)
//! (memory-node failure), [`decode_data`](Codec::decode_data) (degraded read of one span from
//! `k` survivors) and the parity-delta primitive of remote compaction,
//! `P_j' = P_j + A_ij * (D_i' - D_i)`: [`coefficient`](Codec::coefficient),
//! [`apply_delta`](Codec::apply_delta) and [`xor_into`]. Bad arguments give an [`EcError`],
//! never a panic.
//!
//! ```
//! use remora_ec::{Codec, xor_into};
//! let codec = Codec::default(); // RS(4, 2)
//! let data: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 4096]).collect();
//! let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
//! let mut parity = codec.encode_to_vec(&refs)?;
//!
//! // Degraded read: span 1's node is down; rebuild it from spans 0, 2, 3 and P0.
//! let survivors = [(0, &data[0][..]), (2, &data[2][..]), (3, &data[3][..]), (4, &parity[0][..])];
//! let mut span = vec![0; 4096];
//! codec.decode_data(&survivors, 1, &mut span)?;
//! assert_eq!(span, data[1]);
//!
//! // Compaction: span 2 is replaced; patch each parity with A_2j * (new xor old).
//! let new = vec![0xEE; 4096];
//! let mut delta = new.clone();
//! xor_into(&mut delta, &data[2])?;
//! for (j, p) in parity.iter_mut().enumerate() {
//!     codec.apply_delta(2, j, &delta, p)?;
//! }
//! let refs = [refs[0], refs[1], &new[..], refs[3]];
//! assert_eq!(parity, codec.encode_to_vec(&refs)?);
//! # Ok::<(), remora_ec::EcError>(())
//! ```
//!
//! # Code and compatibility
//!
//! The generator is that of `reed-solomon-erasure` 6 (a `(k+m)×k` Vandermonde matrix times
//! the inverse of its top `k×k` block, so data shards are stored verbatim), over the field
//! with polynomial 0x11D. Shards coded here and by that library are interchangeable; a test
//! pins the RS(4, 2) coefficients.
//!
//! # Backends and CPUs without AVX2
//!
//! The GF(2^8) slice kernels come from one of two [`Backend`]s:
//!
//! * [`Backend::Simd`] (cargo feature `simd`, on by default) calls
//!   `reed_solomon_erasure::galois_8::mul_slice{,_xor}`, i.e. the library's `simd-accel` C
//!   code. Its build script compiles that C with `-march=haswell` on x86_64, and the C has
//!   no run-time dispatch: even its prologue uses AVX2, so calling it on an older CPU dies
//!   with `SIGILL`. This crate therefore calls it only after [`Backend::detect`] has seen
//!   AVX2 and the rest of the Haswell set (`is_x86_feature_detected!`). On aarch64 the C is
//!   built for baseline NEON and is always usable. On other targets (and msvc, Android,
//!   iOS) the library compiles no C and `Simd` is never selected.
//! * [`Backend::Portable`]: this crate's own table-driven kernels in safe Rust. They do not
//!   go through the library at all, so they stay safe even if another crate in the build
//!   turns on `simd-accel` (cargo unifies features). Without feature `simd` this is the only
//!   backend and this crate asks for no C code.
//!
//! [`Codec::new`] picks [`Backend::detect`]; [`Codec::with_backend`] forces one (tests
//! compare both byte for byte). Setting `RUST_REED_SOLOMON_ERASURE_ARCH` at build time makes
//! the library compile its C for that `-march` instead of Haswell; the run-time check still
//! only tests for the Haswell set, so whoever sets it must run on CPUs that match.
//!
//! On the 2-core Xeon (AVX-512 capable) dev machine, RS(4, 2) on 4×64 KiB encodes at about
//! 20 GB/s with `Simd` and 2.5 GB/s with `Portable` (`cargo bench -p remora-ec`); with 1 MiB
//! shards `Simd` runs close to the memory bound the benchmark also prints.
//!
//! This crate contains no `unsafe` code.

#![forbid(unsafe_code)]

mod backend;
mod gf;
#[cfg(test)]
mod tests;

pub use backend::Backend;

/// Default number of data shards (the paper's RS 4+2).
pub const DEFAULT_K: usize = 4;
/// Default number of parity shards (the paper's RS 4+2).
pub const DEFAULT_M: usize = 2;
/// Largest `k + m` a GF(2^8) code supports.
pub const MAX_SHARDS: usize = 256;

/// Bytes per shard processed per step of a multi-shard operation: the `k + m` blocks of one
/// step (24 KiB for RS(4, 2)) stay in L1 while large shards stream through. 4 KiB measured
/// slightly better than 8–32 KiB for 1 MiB shards and the same for 64 KiB.
const BLOCK: usize = 4 * 1024;

/// Scratch matrices of up to this many bytes live on the stack (k ≤ 16 for a k×2k pair).
const STACK_SCRATCH: usize = 512;

/// Errors returned by [`Codec`] and [`xor_into`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EcError {
    /// `k` or `m` is zero, or `k + m` exceeds [`MAX_SHARDS`].
    #[error("invalid code RS({k}, {m}): need k >= 1, m >= 1 and k + m <= {MAX_SHARDS}")]
    InvalidParameters {
        /// Requested number of data shards.
        k: usize,
        /// Requested number of parity shards.
        m: usize,
    },
    /// A slice of shards has the wrong number of entries.
    #[error("expected {expected} {what} shards, got {got}")]
    WrongShardCount {
        /// Which shards: `"data"`, `"parity"` or `"total"`.
        what: &'static str,
        /// Number required.
        expected: usize,
        /// Number given.
        got: usize,
    },
    /// A shard (or buffer) is not as long as the others.
    #[error("shard {index} is {len} bytes long, expected {expected}")]
    LengthMismatch {
        /// Shard index in code order (data `0..k`, parity `k..k+m`); for single-buffer
        /// operations see the method's documentation.
        index: usize,
        /// Its length.
        len: usize,
        /// The length all shards must have.
        expected: usize,
    },
    /// More shards are missing than the code can recover.
    #[error("{lost} shards lost, at most {max} can be recovered")]
    TooManyErasures {
        /// Shards missing.
        lost: usize,
        /// Parity count `m`.
        max: usize,
    },
    /// A shard index is out of range.
    #[error("index {index} out of range 0..{limit}")]
    IndexOutOfRange {
        /// The index given.
        index: usize,
        /// The exclusive upper bound.
        limit: usize,
    },
    /// The same shard index was passed twice.
    #[error("shard {index} given more than once")]
    DuplicateShard {
        /// The repeated index.
        index: usize,
    },
    /// The requested backend cannot run on this CPU or was not compiled in.
    #[error("backend `{0}` is not available on this CPU or build")]
    BackendUnavailable(Backend),
    /// A decoding matrix was singular. Cannot happen for this MDS code; reported rather
    /// than panicking should it ever (it would be a bug in this crate).
    #[error("internal error: singular decoding matrix")]
    SingularMatrix,
}

/// An RS(k, m) encoder/decoder. Cheap to clone; immutable and `Sync`, so one codec can be
/// shared by all threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Codec {
    k: usize,
    m: usize,
    /// Row-major `m × k`: `parity[j * k + i]` = `A_ij`, so `P_j = sum_i A_ij * D_i`.
    parity: Vec<u8>,
    backend: Backend,
}

impl Default for Codec {
    /// RS([`DEFAULT_K`], [`DEFAULT_M`]) on [`Backend::detect`].
    fn default() -> Self {
        match Codec::new(DEFAULT_K, DEFAULT_M) {
            Ok(c) => c,
            Err(_) => unreachable!("RS(4, 2) is a valid code"),
        }
    }
}

impl Codec {
    /// RS(k, m) on the fastest safe backend ([`Backend::detect`]).
    pub fn new(k: usize, m: usize) -> Result<Codec, EcError> {
        Codec::with_backend(k, m, Backend::detect())
    }

    /// RS(k, m) on a given backend; [`EcError::BackendUnavailable`] if it cannot run here.
    pub fn with_backend(k: usize, m: usize, backend: Backend) -> Result<Codec, EcError> {
        if k == 0 || m == 0 || k > MAX_SHARDS || m > MAX_SHARDS - k {
            return Err(EcError::InvalidParameters { k, m });
        }
        if backend == Backend::Simd && !Backend::simd_available() {
            return Err(EcError::BackendUnavailable(backend));
        }
        Ok(Codec {
            k,
            m,
            parity: parity_matrix(k, m)?,
            backend,
        })
    }

    /// The same code on another backend.
    pub fn to_backend(&self, backend: Backend) -> Result<Codec, EcError> {
        if backend == Backend::Simd && !Backend::simd_available() {
            return Err(EcError::BackendUnavailable(backend));
        }
        Ok(Codec {
            backend,
            ..self.clone()
        })
    }

    /// Number of data shards.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of parity shards.
    pub fn m(&self) -> usize {
        self.m
    }

    /// `k + m`.
    pub fn total(&self) -> usize {
        self.k + self.m
    }

    /// The backend this codec runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// `A_ij`: the coefficient of data shard `data_idx` (`i`, `0..k`) in parity shard
    /// `parity_idx` (`j`, `0..m`), so that `P_j = sum_i A_ij * D_i` over GF(2^8).
    pub fn coefficient(&self, data_idx: usize, parity_idx: usize) -> Result<u8, EcError> {
        check_index(data_idx, self.k)?;
        check_index(parity_idx, self.m)?;
        Ok(self.parity[parity_idx * self.k + data_idx])
    }

    /// The whole parity matrix, row-major `m × k` (`[j * k + i]` = `A_ij`).
    pub fn parity_matrix(&self) -> &[u8] {
        &self.parity
    }

    /// Computes the `m` parity shards of `k` data shards. All shards must have the same
    /// length (zero is allowed).
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), EcError> {
        check_count("data", self.k, data.len())?;
        check_count("parity", self.m, parity.len())?;
        let len = data[0].len();
        for (i, d) in data.iter().enumerate() {
            check_len(i, d.len(), len)?;
        }
        for (j, p) in parity.iter().enumerate() {
            check_len(self.k + j, p.len(), len)?;
        }
        self.combine(&self.parity, self.k, |i| data[i], parity, len);
        Ok(())
    }

    /// Convenience form of [`encode`](Codec::encode) that allocates and returns the parity.
    pub fn encode_to_vec(&self, data: &[&[u8]]) -> Result<Vec<Vec<u8>>, EcError> {
        let len = data.first().map_or(0, |d| d.len());
        let mut out = vec![vec![0u8; len]; self.m];
        let mut refs: Vec<&mut [u8]> = out.iter_mut().map(Vec::as_mut_slice).collect();
        self.encode(data, &mut refs)?;
        Ok(out)
    }

    /// Checks that the parity shards in `shards` (all `k + m`, in code order) match the data.
    pub fn verify(&self, shards: &[&[u8]]) -> Result<bool, EcError> {
        check_count("total", self.total(), shards.len())?;
        let len = shards[0].len();
        for (i, s) in shards.iter().enumerate() {
            check_len(i, s.len(), len)?;
        }
        let mut buf = vec![0u8; len.min(BLOCK)];
        for off in (0..len).step_by(BLOCK) {
            let end = (off + BLOCK).min(len);
            let b = &mut buf[..end - off];
            for j in 0..self.m {
                let row = &self.parity[j * self.k..(j + 1) * self.k];
                self.backend.mul(row[0], &shards[0][off..end], b);
                for (i, &c) in row.iter().enumerate().skip(1) {
                    self.backend.mul_xor(c, &shards[i][off..end], b);
                }
                if *b != shards[self.k + j][off..end] {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Rebuilds every erased (`None`) shard in place. `shards` has `k + m` slots in code
    /// order; present shards must share one length. Up to `m` erasures, data or parity, are
    /// recovered; more give [`EcError::TooManyErasures`] and leave `shards` unchanged.
    pub fn reconstruct(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), EcError> {
        let n = self.total();
        check_count("total", n, shards.len())?;
        let mut len = None;
        for (i, s) in shards.iter().enumerate() {
            if let Some(s) = s {
                check_len(i, s.len(), *len.get_or_insert(s.len()))?;
            }
        }
        let lost = shards.iter().filter(|s| s.is_none()).count();
        if lost > self.m {
            return Err(EcError::TooManyErasures { lost, max: self.m });
        }
        if lost == 0 {
            return Ok(());
        }
        let len = len.unwrap_or(0);
        let mut present = [false; MAX_SHARDS];
        for (p, s) in present.iter_mut().zip(shards.iter()) {
            *p = s.is_some();
        }
        let mut outs = vec![vec![0u8; len]; lost];
        {
            let mut free = outs.iter_mut();
            let mut views: Vec<&mut [u8]> = shards
                .iter_mut()
                .map(|s| match s {
                    Some(v) => v.as_mut_slice(),
                    None => free.next().map_or(&mut [][..], Vec::as_mut_slice),
                })
                .collect();
            self.rebuild(&mut views, &present[..n], len)?;
        }
        let mut outs = outs.into_iter();
        for s in shards.iter_mut().filter(|s| s.is_none()) {
            *s = outs.next();
        }
        Ok(())
    }

    /// [`reconstruct`](Codec::reconstruct) on caller-owned buffers, without allocating shard
    /// memory: `shards` holds all `k + m` shards (equal lengths, erased ones included) and
    /// every shard with `present[i] == false` is overwritten with its recovered contents.
    /// Errors ([`EcError::WrongShardCount`] with `what = "present"` for a wrong flag count,
    /// [`EcError::LengthMismatch`], [`EcError::TooManyErasures`]) leave `shards` unchanged.
    pub fn reconstruct_slices(&self, shards: &mut [&mut [u8]], present: &[bool]) -> Result<(), EcError> {
        let n = self.total();
        check_count("total", n, shards.len())?;
        check_count("present", n, present.len())?;
        let len = shards[0].len();
        for (i, s) in shards.iter().enumerate() {
            check_len(i, s.len(), len)?;
        }
        let lost = present.iter().filter(|p| !**p).count();
        if lost > self.m {
            return Err(EcError::TooManyErasures { lost, max: self.m });
        }
        if lost == 0 {
            return Ok(());
        }
        self.rebuild(shards, present, len)
    }

    /// Recomputes the shards not marked present (at most `m`, at least one; all arguments
    /// validated by the caller) from the first `k` present ones, in one blocked pass.
    fn rebuild(&self, shards: &mut [&mut [u8]], present: &[bool], len: usize) -> Result<(), EcError> {
        let k = self.k;
        // Survivors: the first k present shards in code order (data first: cheapest matrix).
        let mut survivors = [0usize; MAX_SHARDS];
        let mut missing = [0usize; MAX_SHARDS];
        let (mut ns, mut nm) = (0, 0);
        for (i, &p) in present.iter().enumerate() {
            if !p {
                missing[nm] = i;
                nm += 1;
            } else if ns < k {
                survivors[ns] = i;
                ns += 1;
            }
        }
        let (survivors, missing) = (&survivors[..k], &missing[..nm]);
        // Coefficient rows (over the survivors) of every missing shard; nm <= m <= 255.
        let mut rows_stack = [0u8; STACK_SCRATCH];
        let mut rows_heap = Vec::new();
        let rows: &mut [u8] = if nm * k <= STACK_SCRATCH {
            &mut rows_stack[..nm * k]
        } else {
            rows_heap.resize(nm * k, 0);
            &mut rows_heap
        };
        self.with_decode_matrix(survivors, |minv| {
            for (r, &t) in missing.iter().enumerate() {
                self.target_row(t, minv, &mut rows[r * k..(r + 1) * k]);
            }
        })?;
        // Split the borrows: survivors read, missing written.
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(k);
        let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(nm);
        for (s, &p) in shards.iter_mut().zip(present) {
            if !p {
                dsts.push(s);
            } else if srcs.len() < k {
                srcs.push(s);
            }
        }
        self.combine(rows, k, |s| srcs[s], &mut dsts, len);
        Ok(())
    }

    /// Degraded read: computes shard `want` (normally a lost data shard, `0..k`; a parity
    /// index `k..k+m` also works) into `out` from survivors `present` = `(shard index,
    /// bytes)`. Needs at least `k` distinct survivors (extra ones are ignored; data shards are
    /// preferred); all must be `out.len()` bytes. If `want` itself is present it is copied.
    ///
    /// Allocation-free for `k <= 16`: the `k × k` decoding matrix is built on the stack.
    pub fn decode_data(&self, present: &[(usize, &[u8])], want: usize, out: &mut [u8]) -> Result<(), EcError> {
        let n = self.total();
        check_index(want, n)?;
        // pos[shard] = position in `present` + 1 (0 = absent).
        let mut pos = [0u16; MAX_SHARDS];
        for (p, &(idx, bytes)) in present.iter().enumerate() {
            check_index(idx, n)?;
            if pos[idx] != 0 {
                return Err(EcError::DuplicateShard { index: idx });
            }
            // `present.len()` <= n <= 256 after the duplicate check, so p + 1 fits in u16.
            pos[idx] = p as u16 + 1;
            if bytes.len() != out.len() {
                return Err(EcError::LengthMismatch {
                    index: idx,
                    len: bytes.len(),
                    expected: out.len(),
                });
            }
        }
        if pos[want] != 0 {
            out.copy_from_slice(present[pos[want] as usize - 1].1);
            return Ok(());
        }
        if present.len() < self.k {
            return Err(EcError::TooManyErasures {
                lost: n - present.len(),
                max: self.m,
            });
        }
        let mut survivors = [0usize; MAX_SHARDS];
        let mut cnt = 0;
        for (i, &p) in pos.iter().enumerate().take(n) {
            if p != 0 && cnt < self.k {
                survivors[cnt] = i;
                cnt += 1;
            }
        }
        let survivors = &survivors[..self.k];
        let src = |s: usize| present[pos[survivors[s]] as usize - 1].1;

        let mut row_stack = [0u8; MAX_SHARDS];
        let row = &mut row_stack[..self.k];
        self.with_decode_matrix(survivors, |minv| self.target_row(want, minv, row))?;
        let len = out.len();
        self.combine(row, self.k, src, &mut [out], len);
        Ok(())
    }

    /// Parity-delta update for remote compaction: `parity ^= A_ij * delta`, where `delta` is
    /// `D_i(new) xor D_i(old)` ([`xor_into`]) for data shard `data_idx` (`i`) and `parity` is
    /// parity shard `parity_idx` (`j`). Applying it for every changed data shard and every
    /// parity shard gives the same parity as a full re-encode. On a length mismatch the error
    /// reports `index = k + parity_idx`, `len = parity.len()`, `expected = delta.len()`.
    pub fn apply_delta(
        &self,
        data_idx: usize,
        parity_idx: usize,
        delta: &[u8],
        parity: &mut [u8],
    ) -> Result<(), EcError> {
        let c = self.coefficient(data_idx, parity_idx)?;
        check_len(self.k + parity_idx, parity.len(), delta.len())?;
        self.backend.mul_xor(c, delta, parity);
        Ok(())
    }

    /// `dst = c * src` in GF(2^8): a data node's share `A_ij * delta` of a
    /// parity update, computed before it is sent to parity shard `j`. On
    /// unequal lengths returns [`EcError::LengthMismatch`] (`index = 1`).
    pub fn scale(&self, c: u8, src: &[u8], dst: &mut [u8]) -> Result<(), EcError> {
        check_len(1, src.len(), dst.len())?;
        self.backend.mul(c, src, dst);
        Ok(())
    }

    /// `dsts[r] = sum_s rows[r * nsrc + s] * src(s)`, block by block so that every block of
    /// every shard is touched while it is still in cache.
    fn combine<'a>(
        &self,
        rows: &[u8],
        nsrc: usize,
        src: impl Fn(usize) -> &'a [u8],
        dsts: &mut [&mut [u8]],
        len: usize,
    ) {
        let mut off = 0;
        while off < len {
            let end = (off + BLOCK).min(len);
            for (r, dst) in dsts.iter_mut().enumerate() {
                let row = &rows[r * nsrc..(r + 1) * nsrc];
                let d = &mut dst[off..end];
                self.backend.mul(row[0], &src(0)[off..end], d);
                for (s, &c) in row.iter().enumerate().skip(1) {
                    self.backend.mul_xor(c, &src(s)[off..end], d);
                }
            }
            off = end;
        }
    }

    /// Writes into `row` (k bytes) the coefficients over the survivors that produce shard
    /// `t`: row `t` of the generator times `minv` (the inverse of the survivors' rows).
    fn target_row(&self, t: usize, minv: &[u8], row: &mut [u8]) {
        let k = self.k;
        if t < k {
            row.copy_from_slice(&minv[t * k..(t + 1) * k]);
        } else {
            let a = &self.parity[(t - k) * k..(t - k + 1) * k];
            row.fill(0);
            for (i, &ai) in a.iter().enumerate() {
                for (c, r) in row.iter_mut().enumerate() {
                    *r ^= gf::mul(ai, minv[i * k + c]);
                }
            }
        }
    }

    /// Builds the `k × k` matrix of the survivors' generator rows, inverts it and hands the
    /// inverse to `f`. Uses the stack for small `k`.
    fn with_decode_matrix<R>(&self, survivors: &[usize], f: impl FnOnce(&[u8]) -> R) -> Result<R, EcError> {
        let k = self.k;
        let need = 2 * k * k;
        let mut stack = [0u8; STACK_SCRATCH];
        let mut heap = Vec::new();
        let scratch: &mut [u8] = if need <= STACK_SCRATCH {
            &mut stack[..need]
        } else {
            heap.resize(need, 0);
            &mut heap
        };
        let (mat, work) = scratch.split_at_mut(k * k);
        for r in 0..k {
            let s = survivors[r];
            let dst = &mut mat[r * k..(r + 1) * k];
            if s < k {
                dst.fill(0);
                dst[s] = 1;
            } else {
                dst.copy_from_slice(&self.parity[(s - k) * k..(s - k + 1) * k]);
            }
        }
        if !gf::invert(mat, k, work) {
            return Err(EcError::SingularMatrix);
        }
        Ok(f(mat))
    }
}

/// `dst ^= src` byte-wise (GF(2^8) addition); e.g. `delta = D_new xor D_old` for
/// [`Codec::apply_delta`]. On unequal lengths returns [`EcError::LengthMismatch`] with
/// `index = 1` (the source), `len = src.len()`, `expected = dst.len()`, and leaves `dst`
/// unchanged.
pub fn xor_into(dst: &mut [u8], src: &[u8]) -> Result<(), EcError> {
    check_len(1, src.len(), dst.len())?;
    gf::xor_slice(dst, src);
    Ok(())
}

/// The `m × k` parity part of the systematic generator `V · V_top^-1`, where `V` is the
/// `(k+m) × k` Vandermonde matrix `V[r][c] = r^c` (as `reed-solomon-erasure` builds it).
fn parity_matrix(k: usize, m: usize) -> Result<Vec<u8>, EcError> {
    let mut top: Vec<u8> = (0..k).flat_map(|r| (0..k).map(move |c| gf::pow(r as u8, c))).collect();
    let mut work = vec![0u8; k * k];
    if !gf::invert(&mut top, k, &mut work) {
        return Err(EcError::SingularMatrix);
    }
    let mut out = vec![0u8; m * k];
    for j in 0..m {
        let r = (k + j) as u8; // k + m <= 256 was checked, so this fits.
        for c in 0..k {
            let mut acc = 0u8;
            for t in 0..k {
                acc ^= gf::mul(gf::pow(r, t), top[t * k + c]);
            }
            out[j * k + c] = acc;
        }
    }
    Ok(out)
}

fn check_count(what: &'static str, expected: usize, got: usize) -> Result<(), EcError> {
    if expected == got {
        Ok(())
    } else {
        Err(EcError::WrongShardCount { what, expected, got })
    }
}

fn check_len(index: usize, len: usize, expected: usize) -> Result<(), EcError> {
    if len == expected {
        Ok(())
    } else {
        Err(EcError::LengthMismatch { index, len, expected })
    }
}

fn check_index(index: usize, limit: usize) -> Result<(), EcError> {
    if index < limit {
        Ok(())
    } else {
        Err(EcError::IndexOutOfRange { index, limit })
    }
}
