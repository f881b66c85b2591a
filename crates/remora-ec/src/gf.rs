//! GF(2^8) arithmetic and the portable (pure Rust, table-driven) slice kernels.
//!
//! The field is GF(2)[x] / (x^8 + x^4 + x^3 + x^2 + 1) (polynomial 0x11D, generator 2), the
//! same field `reed-solomon-erasure` uses, so both backends produce identical bytes.
//! All tables are built at compile time.

/// The reduction polynomial x^8 + x^4 + x^3 + x^2 + 1.
const POLY: u16 = 0x11D;

/// `LOG[a]` = discrete log of `a` to base 2 (`LOG[0]` is unused and 0).
pub(crate) static LOG: [u8; 256] = build_log_exp().0;

/// `EXP[i]` = 2^i, doubled in length so `EXP[LOG[a] + LOG[b]]` needs no reduction.
pub(crate) static EXP: [u8; 512] = build_log_exp().1;

/// Full product table: `MUL[a][b]` = a * b. 64 KiB; one 256-byte row per coefficient is what
/// the portable kernels touch, so it stays in L1.
static MUL: [[u8; 256]; 256] = build_mul();

const fn build_log_exp() -> ([u8; 256], [u8; 512]) {
    let mut log = [0u8; 256];
    let mut exp = [0u8; 512];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    // exp[510], exp[511] are never read (LOG values are < 255, so sums are < 509).
    (log, exp)
}

const fn build_mul() -> [[u8; 256]; 256] {
    let (log, exp) = build_log_exp();
    let mut t = [[0u8; 256]; 256];
    let mut a = 1;
    while a < 256 {
        let mut b = 1;
        while b < 256 {
            t[a][b] = exp[log[a] as usize + log[b] as usize];
            b += 1;
        }
        a += 1;
    }
    t
}

/// a * b in GF(2^8).
#[inline]
pub(crate) fn mul(a: u8, b: u8) -> u8 {
    MUL[a as usize][b as usize]
}

/// Multiplicative inverse; `None` for 0.
#[inline]
pub(crate) fn inv(a: u8) -> Option<u8> {
    if a == 0 {
        None
    } else {
        Some(EXP[255 - LOG[a as usize] as usize])
    }
}

/// a^n in GF(2^8), with 0^0 = 1 (as in a Vandermonde matrix).
pub(crate) fn pow(a: u8, n: usize) -> u8 {
    if n == 0 {
        1
    } else if a == 0 {
        0
    } else {
        EXP[(LOG[a as usize] as usize * n) % 255]
    }
}

/// `dst ^= src`, byte-wise. Written so LLVM vectorises it with the baseline ISA (SSE2 on
/// x86_64), which is safe on every CPU of the target.
#[inline]
pub(crate) fn xor_slice(dst: &mut [u8], src: &[u8]) {
    const W: usize = 32;
    let mut d = dst.chunks_exact_mut(W);
    let mut s = src.chunks_exact(W);
    for (d, s) in (&mut d).zip(&mut s) {
        for (x, y) in d.iter_mut().zip(s) {
            *x ^= *y;
        }
    }
    for (x, y) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *x ^= *y;
    }
}

/// Portable `dst = c * src` (lengths already checked equal by the caller).
pub(crate) fn mul_slice_portable(c: u8, src: &[u8], dst: &mut [u8]) {
    match c {
        0 => dst.fill(0),
        1 => dst.copy_from_slice(src),
        _ => {
            let row = &MUL[c as usize];
            let mut d = dst.chunks_exact_mut(8);
            let mut s = src.chunks_exact(8);
            for (d, s) in (&mut d).zip(&mut s) {
                let v = [
                    row[s[0] as usize],
                    row[s[1] as usize],
                    row[s[2] as usize],
                    row[s[3] as usize],
                    row[s[4] as usize],
                    row[s[5] as usize],
                    row[s[6] as usize],
                    row[s[7] as usize],
                ];
                d.copy_from_slice(&v);
            }
            for (x, y) in d.into_remainder().iter_mut().zip(s.remainder()) {
                *x = row[*y as usize];
            }
        }
    }
}

/// Portable `dst ^= c * src` (lengths already checked equal by the caller).
pub(crate) fn mul_slice_xor_portable(c: u8, src: &[u8], dst: &mut [u8]) {
    match c {
        0 => {}
        1 => xor_slice(dst, src),
        _ => {
            let row = &MUL[c as usize];
            let mut d = dst.chunks_exact_mut(8);
            let mut s = src.chunks_exact(8);
            for (d, s) in (&mut d).zip(&mut s) {
                let v = u64::from_ne_bytes([
                    row[s[0] as usize],
                    row[s[1] as usize],
                    row[s[2] as usize],
                    row[s[3] as usize],
                    row[s[4] as usize],
                    row[s[5] as usize],
                    row[s[6] as usize],
                    row[s[7] as usize],
                ]);
                let old = u64::from_ne_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
                d.copy_from_slice(&(old ^ v).to_ne_bytes());
            }
            for (x, y) in d.into_remainder().iter_mut().zip(s.remainder()) {
                *x ^= row[*y as usize];
            }
        }
    }
}

/// Inverts the `n`×`n` row-major matrix in `a` in place (Gauss-Jordan), using `work`
/// (at least `n*n` bytes) as scratch. Returns `false` if the matrix is singular.
pub(crate) fn invert(a: &mut [u8], n: usize, work: &mut [u8]) -> bool {
    let inv_m = &mut work[..n * n];
    inv_m.fill(0);
    for i in 0..n {
        inv_m[i * n + i] = 1;
    }
    for col in 0..n {
        // Find a pivot.
        let Some(p) = (col..n).find(|&r| a[r * n + col] != 0) else {
            return false;
        };
        if p != col {
            for c in 0..n {
                a.swap(p * n + c, col * n + c);
                inv_m.swap(p * n + c, col * n + c);
            }
        }
        // Scale the pivot row to 1.
        let Some(f) = inv(a[col * n + col]) else {
            return false;
        };
        for c in 0..n {
            a[col * n + c] = mul(a[col * n + c], f);
            inv_m[col * n + c] = mul(inv_m[col * n + c], f);
        }
        // Eliminate the column everywhere else.
        for r in 0..n {
            let g = a[r * n + col];
            if r == col || g == 0 {
                continue;
            }
            for c in 0..n {
                a[r * n + c] ^= mul(g, a[col * n + c]);
                inv_m[r * n + c] ^= mul(g, inv_m[col * n + c]);
            }
        }
    }
    a.copy_from_slice(inv_m);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_axioms_spot_checks() {
        for a in 0..=255u8 {
            assert_eq!(mul(a, 1), a);
            assert_eq!(mul(a, 0), 0);
            if a != 0 {
                assert_eq!(mul(a, inv(a).unwrap()), 1);
            }
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul(b, a));
            }
        }
        assert_eq!(inv(0), None);
        assert_eq!(pow(0, 0), 1);
        assert_eq!(pow(2, 8), 0x1D);
    }

    #[test]
    fn mul_table_matches_reed_solomon_erasure() {
        // galois_8::mul is scalar pure Rust in every build of the library: safe to call.
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), reed_solomon_erasure::galois_8::mul(a, b));
            }
        }
    }

    #[test]
    fn invert_round_trip() {
        // A 3x3 Vandermonde matrix over points 1, 2, 3 is invertible.
        let orig: Vec<u8> = (0..3).flat_map(|r| (0..3).map(move |c| pow(r as u8 + 1, c))).collect();
        let mut a = orig.clone();
        let mut work = vec![0; 9];
        assert!(invert(&mut a, 3, &mut work));
        for r in 0..3 {
            for c in 0..3 {
                let mut s = 0;
                for t in 0..3 {
                    s ^= mul(orig[r * 3 + t], a[t * 3 + c]);
                }
                assert_eq!(s, u8::from(r == c));
            }
        }
        let mut singular = vec![1, 2, 1, 2];
        assert!(!invert(&mut singular, 2, &mut work));
    }
}
